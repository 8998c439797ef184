"""Decode-time KV state on disk and in memory (the transformers engine's; vLLM keeps its own in its
prefix cache): per problem, rollout -> (keys, values) [layers, kv_heads, length, head_dim], saved as
safetensors with the sha256 of every rollout's tensors, taken when they were produced. Every resume
checks the tensors it places against those digests, not against the file's own metadata.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch


def state_digest(keys: torch.Tensor, values: torch.Tensor) -> str:
    """sha256 of a rollout's decode-time KV (dtype and shape included), on whatever device it is."""
    h = hashlib.sha256()
    for t in (keys, values):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update((t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.uint8)).numpy().tobytes())
    return h.hexdigest()


class ResidentState(dict):
    """rollout -> (keys, values) [layers, kv_heads, length, head_dim] on the engine's device, with the
    digests taken when the state was produced (rollout -> sha256)."""

    def __init__(self, kv: dict, expected: dict):
        super().__init__(kv)
        self.expected = {int(r): d for r, d in expected.items()}

    @classmethod
    def produced(cls, kv: dict) -> "ResidentState":
        """A state just produced in this process: its digests are taken now."""
        return cls(kv, {r: state_digest(k, v) for r, (k, v) in kv.items()})

    def verify(self, rollout: int) -> bool:
        """The tensors held now have the digest taken when they were produced."""
        return rollout in self and rollout in self.expected and state_digest(*self[rollout]) == self.expected[rollout]


def state_bytes(problem_state: dict) -> bytes:
    """One problem's decode-time KV (rollout -> (keys, values)) as safetensors, with the digests of its
    tensors; the same state gives the same bytes."""
    from safetensors.torch import save
    tensors, digests = {}, {}
    for r, (k, v) in sorted(problem_state.items()):
        tensors[f"r{r}.keys"], tensors[f"r{r}.values"] = k.contiguous().cpu(), v.contiguous().cpu()
        digests[f"digest.r{r}"] = state_digest(k.cpu(), v.cpu())
    return sorted_header(save(tensors, metadata=digests))


def save_state(problem_state: dict, path: Path) -> None:
    """Write one problem's decode-time KV to safetensors (state_bytes), atomically."""
    from ..core.files import atomic_write_bytes
    atomic_write_bytes(Path(path), state_bytes(problem_state))


def sorted_header(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys sorted: safetensors writes its metadata in the order
    of a hash map, which differs between calls, so identical states would give files of different sha256.
    The header is 8 bytes of its length (little-endian), then JSON padded with spaces to 8 bytes; the
    tensors' offsets count from its end, so reordering it moves nothing else."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + data[8 + n:]


def load_state(path: Path) -> tuple[dict, dict]:
    """Read a problem's saved KV; returns (rollout -> (keys, values), rollout -> loaded bits match saved)."""
    from safetensors import safe_open
    state, verified = {}, {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        rollouts = sorted({int(name[1:].split(".")[0]) for name in f.keys()})
        for r in rollouts:
            k, v = f.get_tensor(f"r{r}.keys"), f.get_tensor(f"r{r}.values")
            state[r] = (k, v)
            verified[r] = meta.get(f"digest.r{r}") == state_digest(k, v)
    return state, verified
