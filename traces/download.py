"""Public production traces by name: where they live on the internet, their pinned size and
SHA-256 where the project could check a copy, where a local copy may already be, and a plain
urllib downloader that checks what it fetched.

A known trace is looked up first in `$LLMSIM_TRACES` (a folder laid out like the public sources:
`azure2023/<file>`), then in the user cache, `$XDG_CACHE_HOME/llm-serving-sim/traces` (default
`~/.cache/llm-serving-sim/traces`), where downloads go; never in or beside the checkout. Public
traces are data, never committed to this repository. Licenses and citations are in
traces/README.md.
"""
from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from core.atomic import atomic_open

TRACES_ENV = "LLMSIM_TRACES"

_AZURE_2023 = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_AZURE_2024 = "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/"
_BURSTGPT = "https://github.com/HPMLL/BurstGPT/releases/download/v1.1/"
_MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/"


@dataclass(frozen=True)
class PublicTrace:
    """One public trace file: its address, its place under a traces folder, its format, how its
    first line starts (to catch an HTML error page or a Git LFS pointer), and its size in bytes
    and SHA-256 when pinned (None: not yet checked against a known copy, so unverified)."""

    url: str
    path: str
    fmt: str
    first_line: str
    size: int | None = None
    sha256: str | None = None


PUBLIC_TRACES: dict[str, PublicTrace] = {
    # pinned from the copy of data/AzureLLMInferenceTrace_conv.csv at AzurePublicDataset file commit 7909210
    "azure-conv-2023": PublicTrace(_AZURE_2023 + "AzureLLMInferenceTrace_conv.csv",
                                   "azure2023/AzureLLMInferenceTrace_conv.csv", "azure", "TIMESTAMP,", 719_188,
                                   "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"),
    # the others are not pinned: no copy of them could be checked where this registry was written
    "azure-code-2023": PublicTrace(_AZURE_2023 + "AzureLLMInferenceTrace_code.csv",
                                   "azure2023/AzureLLMInferenceTrace_code.csv", "azure", "TIMESTAMP,"),
    "azure-conv-2024": PublicTrace(_AZURE_2024 + "AzureLLMInferenceTrace_conv_1week.csv",
                                   "azure2024/AzureLLMInferenceTrace_conv_1week.csv", "azure", "TIMESTAMP,"),
    "azure-code-2024": PublicTrace(_AZURE_2024 + "AzureLLMInferenceTrace_code_1week.csv",
                                   "azure2024/AzureLLMInferenceTrace_code_1week.csv", "azure", "TIMESTAMP,"),
    "burstgpt": PublicTrace(_BURSTGPT + "BurstGPT_1.csv", "burstgpt/BurstGPT_1.csv", "burstgpt", "Timestamp,"),
    "burstgpt-2": PublicTrace(_BURSTGPT + "BurstGPT_2.csv", "burstgpt/BurstGPT_2.csv", "burstgpt", "Timestamp,"),
    "mooncake-arxiv": PublicTrace(_MOONCAKE + "arxiv-trace/mooncake_trace.jsonl",
                                  "mooncake/mooncake_trace.jsonl", "mooncake", "{"),
    "mooncake-conversation": PublicTrace(_MOONCAKE + "traces/conversation_trace.jsonl",
                                         "mooncake/conversation_trace.jsonl", "mooncake", "{"),
    "mooncake-synthetic": PublicTrace(_MOONCAKE + "traces/synthetic_trace.jsonl",
                                      "mooncake/synthetic_trace.jsonl", "mooncake", "{"),
    "mooncake-toolagent": PublicTrace(_MOONCAKE + "traces/toolagent_trace.jsonl",
                                      "mooncake/toolagent_trace.jsonl", "mooncake", "{"),
}


class DownloadError(RuntimeError):
    """A public trace could not be fetched or is not the file it should be; the message says why."""


def cache_dir() -> Path:
    """Where downloaded traces are kept: `$XDG_CACHE_HOME/llm-serving-sim/traces`, by default
    `~/.cache/llm-serving-sim/traces`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-serving-sim" / "traces"


def traces_dir() -> Path | None:
    """The folder named by `$LLMSIM_TRACES`, or None when it is unset or empty."""
    value = os.environ.get(TRACES_ENV)
    return Path(value) if value else None


def public_trace(name: str) -> PublicTrace:
    """The entry for `name`, or a KeyError listing the known names."""
    if name not in PUBLIC_TRACES:
        raise KeyError(f"unknown public trace {name!r}; known: {', '.join(PUBLIC_TRACES)}")
    return PUBLIC_TRACES[name]


def local_folders() -> tuple[Path, ...]:
    """The folders a known trace is looked up in, in order: `$LLMSIM_TRACES`, then the cache."""
    given = traces_dir()
    return ((given,) if given is not None else ()) + (cache_dir(),)


def find_local(name: str, folders: tuple[Path, ...] | None = None) -> Path | None:
    """A copy of trace `name` already on this machine: `<folder>/<subdir>/<file>` or
    `<folder>/<file>` in `folders` (default `local_folders()`). A copy of the wrong size is an
    error, not a copy; None when there is none."""
    entry = public_trace(name)
    for folder in local_folders() if folders is None else folders:
        for candidate in (Path(folder) / entry.path, Path(folder) / Path(entry.path).name):
            if candidate.is_file():
                size = candidate.stat().st_size
                if entry.size is not None and size != entry.size:
                    raise DownloadError(f"{candidate}: not the {name!r} trace: expected {entry.size:,} bytes, "
                                        f"got {size:,} (remove it, or download it again)")
                return candidate
    return None


def download(name: str, dest_dir: str | Path | None = None, use_local: bool = True,
             timeout_s: float = 60.0) -> Path:
    """Path to public trace `name`: a local copy if there is one (unless `use_local` is False),
    else fetched from its public address into `dest_dir/<subdir>/<file>` (default: the cache).
    The file appears only once complete and checked (first line, and size and SHA-256 where
    pinned: a mismatch keeps nothing); offline, a DownloadError says what to fetch and where."""
    entry = public_trace(name)
    dest_dir = cache_dir() if dest_dir is None else Path(dest_dir)
    target = dest_dir / entry.path
    if use_local:
        local = find_local(name, local_folders() + (dest_dir,))
        if local is not None:
            return local
    import http.client  # here, not at the top: every replay imports this module, few download
    import urllib.error
    import urllib.request

    from tqdm import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    digest, size, head = hashlib.sha256(), 0, b""
    try:
        with urllib.request.urlopen(entry.url, timeout=timeout_s) as response, atomic_open(target, "wb") as out:
            announced = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=announced, unit="B", unit_scale=True, desc=name, file=sys.stderr,
                      disable=not sys.stderr.isatty()) as bar:
                while chunk := response.read(1 << 20):
                    if len(head) < 200:
                        head += chunk[:200]
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
            if announced is not None and size != announced:
                raise DownloadError(f"{entry.url}: the download of {name!r} was cut short: expected {announced:,} "
                                    f"bytes, got {size:,}; nothing kept")
            _check_first_line(name, entry, head)
            _check_contents(name, entry, size, digest.hexdigest())
    except http.client.IncompleteRead as e:
        got = size + len(e.partial)
        expected = f"{got + e.expected:,} bytes" if isinstance(e.expected, int) else "more"
        raise DownloadError(f"{entry.url}: the download of {name!r} was cut short: expected {expected}, "
                            f"got {got:,}; nothing kept") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(
            f"could not download {name!r} from {entry.url} ({reason}). If this machine is offline "
            f"or cannot reach that address, download the URL elsewhere and place the file at "
            f"{target} (or under ${TRACES_ENV} as {entry.path})") from e
    if entry.sha256 is None:
        print(f"note: {name!r} is unverified (the project pins no checksum for it): {size:,} bytes, "
              f"SHA-256 {digest.hexdigest()}", file=sys.stderr)
    return target


def _check_first_line(name: str, entry: PublicTrace, head: bytes) -> None:
    first = head[:200].split(b"\n", 1)[0].decode("utf-8", errors="replace").lstrip("\ufeff")
    if not first.startswith(entry.first_line):
        raise DownloadError(f"{entry.url} did not return a {entry.fmt} trace for {name!r} (its first "
                            f"line is {first.strip()[:80]!r}); the address may have moved")


def _check_contents(name: str, entry: PublicTrace, size: int, sha256: str) -> None:
    """Refuse a body of the wrong size or hash (raised inside the write: nothing is kept)."""
    if entry.size is not None and size != entry.size:
        raise DownloadError(f"{entry.url}: not the {name!r} trace: expected {entry.size:,} bytes, got {size:,}")
    if entry.sha256 is not None and sha256 != entry.sha256:
        raise DownloadError(f"{entry.url}: not the {name!r} trace: expected SHA-256 {entry.sha256}, got {sha256}")


def resolve_trace(arg: str | Path) -> Path:
    """A trace argument as a file: a public trace's name (`azure-conv-2023`) is found on this
    machine or downloaded (see `download`), anything else is taken as a path."""
    if str(arg) in PUBLIC_TRACES:
        return download(str(arg))
    return Path(arg)
