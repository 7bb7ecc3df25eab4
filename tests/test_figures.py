"""benchmarks/figures.py: the part0 workload's figures plot the committed rows' own figures."""
import shutil
import statistics
from pathlib import Path

import pytest

from benchmarks import figures
from benchmarks.report import load
from core.config import get_preset

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def groups():
    return load(ROOT / "results")


def test_roofline_points_are_the_tables_figures(groups):
    points = figures.roofline_points(groups).set_index(["engine", "case"])
    model = get_preset("qwen2.5-1.5b")
    runs = groups["NVIDIA H200"][("cached", "graph+pdl", "p256", 1)]
    itl = statistics.median(r["mean_itl_ms"] for r in runs) / 1e3
    decode = points.loc[("cached (graph+pdl)", "decode p256 x1")]
    # the results table's row: 2,592 GB/s counting weights and the mid-point KV cache
    step_bytes = model.weight_bytes_read_per_pass() + 384 * model.kv_bytes_per_token()
    assert decode.tflops * 1e12 / decode.flop_per_byte == pytest.approx(step_bytes / itl)
    assert round(step_bytes / itl / 1e9) == 2592
    assert decode.flop_per_byte == pytest.approx(model.flops_per_token(384) / step_bytes)
    prefill = points.loc[("cached (graph+pdl)", "prefill p4096")]
    assert round(prefill.tflops) == 607  # the table's 607 TFLOP/s
    assert {e.split(" ")[0] for e, _ in points.index} == {"cached", "batched", "continuous"}


def test_the_batch_curve_is_the_median_of_the_runs(groups):
    chart = figures.batch_curve_chart(groups).to_dict()
    drawn = [row for rows in chart["datasets"].values() for row in rows if "tok_s" in row and "runs" in row]
    b256 = next(r for r in drawn if r["batch"] == 256 and r["engine"].startswith("batched"))
    runs = groups["NVIDIA H200"][("batched", "graph", "p256", 256)]
    assert round(b256["tok_s"]) == 81980  # the table's figure
    assert b256["low"] == min(256e3 / r["mean_itl_ms"] for r in runs) and b256["runs"] == len(runs)
    for engine in ("batched", "continuous"):  # one line an engine, whichever batches' graphs use PDL
        assert len({r["engine"] for r in drawn if r["engine"].startswith(engine)}) == 1
    assert {r["batch"] for r in drawn if r["engine"].startswith("continuous")} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert {r["batch"] for r in drawn if r["engine"].startswith("batched")} == {1, 2, 4, 8, 16, 32, 64, 128, 256, 512,
                                                                              1024}


def test_figures_writes_the_figures(tmp_path, capsys):
    results = tmp_path / "results"
    for engine in ("cached", "batched"):  # rows only, no open runs: no latency figure, said so
        (results / engine).mkdir(parents=True)
        shutil.copy(ROOT / "results" / engine / "runs.jsonl", results / engine / "runs.jsonl")
    out = tmp_path / "figures"
    assert figures.main([str(out), "--results", str(results)]) == 0
    text = capsys.readouterr().out
    assert "no latency-vs-rate figure" in text
    assert sorted(p.name for p in out.iterdir()) == ["batch-curve.html", "batch-curve.png", "roofline.html",
                                                     "roofline.png"]
    for name in ("roofline.png", "batch-curve.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / name).stat().st_size > 10000
    html = (out / "roofline.html").read_text()
    assert "NVIDIA A10" in html and "batch-1 ceiling 1,344 tok/s" in html and "decode p256 x1024" in html
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".figures")]  # no scratch left


def test_figures_into_a_file_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert figures.main([str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'f'}") and err.count("\n") == 1
