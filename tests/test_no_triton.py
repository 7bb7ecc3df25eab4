"""Without triton (PyTorch's CPU build) every engine runs on its eager kernels: nothing but the
kernels themselves imports triton, and asking for them falls back with one line on stderr."""
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import torch  # noqa: E402

import engine.kernels as kernels  # noqa: E402
from engine.continuous import ModelRunner, Request, serve  # noqa: E402
from engine.paged import PagedKVCache  # noqa: E402
from engine.weights import build_random  # noqa: E402

BLOCK_TRITON = """
import sys
class NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoTriton())
"""


@pytest.fixture
def no_triton(monkeypatch):
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    kernels._say_no_triton.cache_clear()
    yield
    kernels._say_no_triton.cache_clear()


def test_the_engine_commands_import_without_triton():
    code = BLOCK_TRITON + ("import engine.serve, engine.bench, engine.continuous, calibrate.__main__, calibrate.sweep\n"
                           "from engine.kernels import choose_kernels, triton_available\n"
                           "assert not triton_available() and choose_kernels('triton') == 'eager'\n"
                           "assert 'triton' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("triton is not installed") == 1


def test_asking_for_triton_without_it_falls_back_to_eager_and_says_so_once(no_triton, capsys):
    assert kernels.choose_kernels("triton") == "eager"
    assert kernels.choose_kernels("triton") == "eager"
    assert kernels.choose_kernels("eager") == "eager"
    err = capsys.readouterr().err
    assert err == kernels.NO_TRITON + "\n"


def test_a_runner_asked_for_triton_without_it_serves_on_the_eager_kernels(no_triton, capsys):
    model = build_random("tiny", dtype="float32", seed=0, std=0.3)
    from core.kv import BlockPool
    from core.scheduler import ContinuousBatching

    cache = PagedKVCache(model.config, 32, 4, torch.float32, "cpu")
    runner = ModelRunner(model, cache, max_num_seqs=4, kernels="triton")
    assert runner.kernels == "eager" and runner.fast is None and not runner.graphs
    res = serve([Request("r0", 0.0, [5, 7, 11], 3)], ContinuousBatching(BlockPool(32, 4), max_num_seqs=4,
                                                                         max_model_len=32), runner, realtime=False)
    assert {p.mode for p in res.passes} == {"eager"} and res.requests[0].output_tokens == 3
    assert capsys.readouterr().err.count("triton is not installed") == 1


def test_the_triton_free_rules_match_the_kernels():
    triton = pytest.importorskip("triton", reason="compares with the triton kernels' own rules")
    from engine.kernels.attention import PagedDecodeAttention
    from engine.kernels.tiles import DECODE_SLICES, FILLS_GPU, chunk_tile

    assert PagedDecodeAttention.SLICES == DECODE_SLICES and PagedDecodeAttention.FILLS_GPU == FILLS_GPU
    from sim.calibrated import CalibratedCost
    from test_sim_cost import calibration
    for kv_heads in (2, 8):  # the simulator slices as the kernel launches, from the slicing it records
        attn = PagedDecodeAttention(512, 4 * kv_heads, kv_heads, 64, 1 << 20, 16, "cpu")
        cost = CalibratedCost(calibration(decode_attention=attn.slicing()))
        for b in range(1, 513):
            assert cost.slicing_at(b) == (attn.slices_for(b), attn.slice_min(b)), (kv_heads, b)
    for group in (1, 6, 7):
        for q in (0, 1, 2, 3, 17, 100):
            assert chunk_tile(group, q) == min(128, max(16, triton.next_power_of_2(q * group)))
