"""Every command in every README runs as written: the shell blocks are read out of the READMEs and
each command that runs on a CPU is run, from a copy of the repository's root (so the commands'
outputs land in a scratch directory and the committed results stay as they are).

Commands that need a GPU, a Modal account or a fresh virtual environment are listed with the
reason they are not run here; install commands are covered by .ci/run, which runs the README's
test command on a clean checkout. Commands that take more than a few seconds are marked slow
(`python -m pytest -m slow tests/test_readme_commands.py` runs them)."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
READMES = sorted({REPO / "README.md", *REPO.glob("*/README.md"), *REPO.glob("results/*/README.md")})
TRACES = os.environ.get("LLMSIM_TRACES")  # where the known public traces are found (.ci/run sets it)

# (pattern, reason): commands not run here
NOT_HERE = [
    (r"^modal ", "needs a Modal account"),
    (r"(^|\s)bash benchmarks/(h200|gpu_)", "a device script: needs the GPU machine"),
    (r"^GIT_COMMIT=", "a device script: needs the GPU machine"),
    (r"python3? -m venv", "makes a fresh virtual environment and installs (.ci/run does it)"),
    (r"^pip install", "installs packages (.ci/run does it)"),
    (r"python -m pytest", "runs the test suite itself"),
    (r"^python3? -m engine (bench|serve-trace|generate)(?!.*--model tiny)", "needs a GPU (the default model)"),
    (r"benchmarks/profile_decode.py", "needs a GPU"),
    (r"^python3? -m calibrate run(?!.*--model tiny)", "needs a GPU: a calibration times the engine for minutes"),
    (r"^\$ ", "shown with its output, run in its own block"),
    (r"^cd ", "changes directory"),
    (r"--modal", "needs a Modal account"),
]
# commands that run the engine (on a CPU with the tiny model): not run where torch is not installed
NEEDS_TORCH = [r"^python3? -m calibrate (heat|sweep|run)"]
# commands that take long on a 2-core machine: run with -m slow
SLOW = [r"sim_speed", r"capacity_check", r"--rate-scale .*1,16,32", r"calibrate fit", r"sim compare", r"sim capacity",
        r"sweep .*azure", r"--scale", r"figures", r"out/azure-sweep", r"attention_forms", r"ttft_stages", r"heat_segments", r"closed_ttft", *NEEDS_TORCH]
# the engine's own commands: they too need its extra, but run on a CPU in a while (not slow)
RUNS_THE_ENGINE = [r"^python3? -m engine (bench|serve-trace|generate)"]
HAS_TORCH = importlib.util.find_spec("torch") is not None
# commands that read the Azure trace, or what a command reading it wrote (azure_conv.csv: what
# traces/README.md converts the trace to; out/azure-sweep: the README's sweep of it, which `sim plot` draws)
NEEDS_AZURE = [r"azure-conv-2023", r"azure_conv\.csv", r"out/azure-sweep"]


def commands(readme: Path) -> list[str]:
    """The commands of a README's ```bash blocks: comments dropped, continuation lines joined."""
    out = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", readme.read_text(), re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                out.append(line)
    return out


def cases():
    for readme in READMES:
        for i, cmd in enumerate(commands(readme)):
            reason = next((why for pat, why in NOT_HERE if re.search(pat, cmd)), None)
            if reason is None and not HAS_TORCH and any(re.search(p, cmd) for p in (*NEEDS_TORCH, *RUNS_THE_ENGINE)):
                reason = "runs the engine: needs its extra (torch)"
            if reason is None and not TRACES and any(re.search(p, cmd) for p in NEEDS_AZURE):
                reason = "LLMSIM_TRACES is unset, so the Azure trace is not here (and not downloadable offline)"
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            if any(re.search(p, cmd) for p in SLOW):
                marks.append(pytest.mark.slow)
            yield pytest.param(readme, cmd, marks=marks, id=f"{readme.relative_to(REPO)}:{i}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The repository's top-level entries linked into a scratch directory, results/ copied (some
    commands write into it), so that what commands write stays out of the checkout."""
    root = tmp_path_factory.mktemp("readme")
    for entry in REPO.iterdir():
        if entry.name in (".git", ".venv", "out", "results") or entry.name.startswith(".pytest"):
            continue
        (root / entry.name).symlink_to(entry)
    shutil.copytree(REPO / "results", root / "results")
    return root


@pytest.mark.parametrize("readme,cmd", list(cases()))
def test_readme_command_runs(readme, cmd, workdir):
    argv = shlex.split(cmd)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    env = dict(os.environ, PYTHONPATH=str(workdir))
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{readme.name}: {cmd}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
