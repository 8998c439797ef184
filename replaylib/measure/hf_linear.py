"""The transformers engine's linear layers on a CPU without bf16 instructions: native bf16 GEMM there runs at a
fifth of fp32 speed, so each linear is computed as an fp32 GEMM of the same bf16 values, rounded to bf16."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F


class Fp32AccumulateLinear(torch.nn.Module):
    """A bf16 linear computed as fp32 GEMM, output rounded to bf16: weights and activations stay bf16 values
    and accumulation is fp32, as in a GPU's bf16 GEMM; only the summation order of the kernel differs."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight32 = linear.weight.detach().float()
        self.bias32 = None if linear.bias is None else linear.bias.detach().float()
        self.out_dtype = linear.weight.dtype

    def forward(self, x):
        return F.linear(x.float(), self.weight32, self.bias32).to(self.out_dtype)


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def swap_linears(model) -> None:
    """Replace every linear layer of a model (the engine's own copy, never a caller's) by its fp32 GEMM."""
    for _, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, child_name, Fp32AccumulateLinear(child))
