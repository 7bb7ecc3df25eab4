"""The GPU kernels compiled for a Hopper GPU (sm_90, the H200's) on any machine, with programmatic
dependent launch on: what Triton's CPU interpreter cannot show (it runs no `griddepcontrol`).
`tests/hopper_ptx.py` compiles each case to PTX and cubin with Triton's own compiler and `ptxas`,
no GPU needed; the tests read the order of the instructions that matter.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
pytest.importorskip("triton")
from engine.kernels.pdl import pdl_available  # noqa: E402

pytestmark = pytest.mark.skipif(not pdl_available(), reason="this Triton has no programmatic dependent launch")

WAIT = "griddepcontrol.wait"
PDL_CASES = ["gemv pdl", "b1 qkv pdl", "b1 gate_up pdl", "small linear pdl split 4", "small gate_up pdl",
             "small qkv pdl split 4", "paged attention pdl", "dense attention pdl"]


@pytest.fixture(scope="module")
def ptx() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, str(root / "tests" / "hopper_ptx.py")], capture_output=True, text=True,
                          env=env, cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def lines(code: str, text: str) -> list[int]:
    return [i for i, line in enumerate(code.splitlines()) if text in line]


@pytest.mark.parametrize("case", PDL_CASES)
def test_a_kernel_launched_with_pdl_reads_nothing_before_it_waits(ptx, case):
    """Launched with PDL a kernel may start while the one before still writes: every global load
    (activations, positions, lengths, block tables, the cache) comes after `griddepcontrol.wait`."""
    code = ptx[case]
    assert lines(code, WAIT) and lines(code, "ld.global")
    assert min(lines(code, "ld.global")) > min(lines(code, WAIT))


def test_without_pdl_a_kernel_does_not_wait(ptx):
    assert not lines(ptx["gemv"], WAIT) and lines(ptx["gemv"], "ld.global")
