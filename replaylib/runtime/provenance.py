"""What a stage's manifest records of where and how it ran: the commit, the package versions, the device;
and the digests of what it wrote."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from ..core.files import sha256_file
from ..core.paths import REPO, out_root


def git_state() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return {"commit": commit or None, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for pkg in ["replaylib", "torch", "transformers", "vllm", "numpy", "pandas", "safetensors", "matplotlib", "seaborn",
                "pypdfium2"]:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def device_info() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}
    torch = sys.modules.get("torch")  # a stage that computed nothing with torch does not import it for this
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["cuda_device"] = gpu_name(torch)
    return info


def gpu_name(torch) -> str:
    """The first GPU's name, without creating a CUDA context in a process that has none (a stage whose
    engine runs in another process): NVML where it is installed."""
    if torch.cuda.is_initialized():
        return torch.cuda.get_device_name(0)
    try:
        import pynvml
        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no NVML: the name is worth a context
        return torch.cuda.get_device_name(0)


def product_digests(paths, out_dir=None) -> dict:
    """sha256 of files a stage writes outside its directory (tables, figures), named relative to the
    out root so that a moved or copied run still verifies (manifest key ``products``)."""
    root = out_root(out_dir).resolve()
    return {Path(p).resolve().relative_to(root).as_posix(): sha256_file(p) for p in sorted(set(paths))}


def changed_outputs(path: Path, outputs: dict) -> list[str]:
    """The outputs (file: sha256, as a stage's manifest records them) missing or changed in ``path``."""
    return [rel for rel, digest in outputs.items() if not (path / rel).exists() or sha256_file(path / rel) != digest]
