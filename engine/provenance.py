"""Where a measurement came from: GPU, torch version, git commit, time. Every result row carries it."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """The commit the code ran at: $GIT_COMMIT when set (a copy of the tree without .git, as on a
    rented GPU), else `git rev-parse HEAD`, with "-dirty" when tracked files differ from it."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


def gpu_uuids(device: torch.device, count: int = 1) -> str | None:
    """The cards a run ran on, as nvidia-smi names them ("GPU-" and the UUID; `count` GPUs from
    the device's index, space-separated), so that runs on one card can be told from runs on
    another of the same model: None on the CPU or where this torch does not tell."""
    if device.type != "cuda":
        return None
    first = device.index or 0
    try:
        return " ".join(f"GPU-{torch.cuda.get_device_properties(first + i).uuid}" for i in range(count))
    except (AttributeError, RuntimeError):
        return None


def provenance(device: torch.device, gpus: int = 1) -> dict:
    """The fields every result row carries (`gpus`: how many cards from `device` the run used)."""
    return {
        "gpu": device_name(device),
        "gpu_uuid": gpu_uuids(device, gpus),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "git_commit": git_commit(),
        "host": platform.node(),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def device_memory(device: torch.device) -> int:
    """Bytes of memory the device has in all (a GPU's, or the host's for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` (a GPU when torch sees one), `cpu`, `cuda` or `cuda:N`; anything else is an error
    naming --device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name!r}: this engine runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: asked for, but torch sees no CUDA device")
    return device
