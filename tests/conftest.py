"""Test-wide setup: without a GPU, Triton kernels run in Triton's CPU interpreter.

Kept torch-free at import time when torch is absent: the simulator's tests run in an install
without the engine (CI proves it with a run of its own), and the engine's tests skip there.
"""
import os

try:
    import torch
except ImportError:  # the simulator-only install
    torch = None

if torch is None or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest


@pytest.fixture(autouse=True)
def user_calibrations(tmp_path, monkeypatch):
    """Each test's own calibrations folder ($LLMSIM_CALIBRATIONS): `calibrate fit` writes there by
    default, and `calibrated:NAME` looks there before the shipped ones; never the user's own."""
    folder = tmp_path / "calibrations"
    monkeypatch.setenv("LLMSIM_CALIBRATIONS", str(folder))
    return folder


@pytest.fixture(autouse=True)
def notes_said_afresh():
    """The simulator says some notes once per process (`sim.cost.say_once`: a projected or
    uncalibrated cost model); each test starts with none said, so that what a test sees on
    stderr does not depend on the tests that ran before it in the same worker."""
    import sys
    cost = sys.modules.get("sim.cost")  # (not imported here: the engine's tests need none of it)
    if cost is not None:
        cost.forget_notes()
    yield
