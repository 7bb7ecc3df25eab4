"""Public production traces by name: where they live on the internet, where a local copy may
already be (`../shared/traces` next to the repository), and a plain urllib downloader.

Downloaded files go under `out/traces/` by default, which git ignores: public traces are data,
never committed to this repository. Licenses and citations are in traces/README.md.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces"
DEFAULT_DEST = REPO_ROOT / "out" / "traces"

_AZURE_2023 = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_AZURE_2024 = "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/"
_BURSTGPT = "https://github.com/HPMLL/BurstGPT/releases/download/v1.1/"
_MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/"


@dataclass(frozen=True)
class PublicTrace:
    """One public trace file: its address, its place under a traces folder, its format, and how
    its first line starts (to catch an HTML error page or a Git LFS pointer)."""

    url: str
    path: str
    fmt: str
    first_line: str


PUBLIC_TRACES: dict[str, PublicTrace] = {
    "azure-conv-2023": PublicTrace(_AZURE_2023 + "AzureLLMInferenceTrace_conv.csv",
                                   "azure2023/AzureLLMInferenceTrace_conv.csv", "azure", "TIMESTAMP,"),
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
    """A public trace could not be fetched; the message names the URL and where to put the file."""


def public_trace(name: str) -> PublicTrace:
    """The entry for `name`, or a KeyError listing the known names."""
    if name not in PUBLIC_TRACES:
        raise KeyError(f"unknown public trace {name!r}; known: {', '.join(PUBLIC_TRACES)}")
    return PUBLIC_TRACES[name]


def find_local(name: str, folders: tuple[Path, ...] = (SHARED_TRACES, DEFAULT_DEST)) -> Path | None:
    """A copy of trace `name` already on this machine: `<folder>/<subdir>/<file>` or
    `<folder>/<file>`, looking in ../shared/traces first. None when there is none."""
    entry = public_trace(name)
    for folder in folders:
        for candidate in (Path(folder) / entry.path, Path(folder) / Path(entry.path).name):
            if candidate.is_file():
                return candidate
    return None


def download(name: str, dest_dir: str | Path = DEFAULT_DEST, use_local: bool = True,
             timeout_s: float = 60.0) -> Path:
    """Path to public trace `name`: a local copy if there is one (unless `use_local` is False),
    else fetched from its public address into `dest_dir/<subdir>/<file>`. The file appears only
    once complete; offline or unreachable, a DownloadError says what to fetch and where to put it."""
    entry = public_trace(name)
    target = Path(dest_dir) / entry.path
    if use_local:
        local = find_local(name, (SHARED_TRACES, Path(dest_dir)))
        if local is not None:
            return local
    import urllib.error  # here, not at the top: every replay imports this module, few download
    import urllib.request

    from tqdm import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(entry.url, timeout=timeout_s) as response, open(partial, "wb") as out:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=size, unit="B", unit_scale=True, desc=name, file=sys.stderr,
                      disable=not sys.stderr.isatty()) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise DownloadError(
            f"could not download {name!r} from {entry.url} ({reason}). If this machine is offline "
            f"or cannot reach that address, download the URL elsewhere and place the file at "
            f"{target} (or at {SHARED_TRACES / entry.path})") from e
    _check_first_line(name, entry, partial)
    partial.replace(target)
    return target


def _check_first_line(name: str, entry: PublicTrace, path: Path) -> None:
    with open(path, "rb") as f:
        first = f.readline(200).decode("utf-8", errors="replace").lstrip("\ufeff")
    if not first.startswith(entry.first_line):
        path.unlink()
        raise DownloadError(f"{entry.url} did not return a {entry.fmt} trace for {name!r} (its first "
                            f"line is {first.strip()[:80]!r}); the address may have moved")


def resolve_trace(arg: str | Path) -> Path:
    """A trace argument as a file: a public trace's name (`azure-conv-2023`) is found on this
    machine or downloaded (see `download`), anything else is taken as a path."""
    if str(arg) in PUBLIC_TRACES:
        return download(str(arg))
    return Path(arg)
