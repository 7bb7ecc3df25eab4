"""`python -m calibrate run`: sweep, heat and fit in one command. A real run takes minutes (a
GPU's sweep and heat run; on this project's 2-core CPU the tiny model's too), so the tests of its
orchestration replace the steps through the seam `calibrate.__main__.run_step` (each step's own
tests cover what the step does); one test runs a real step's process through it, and the whole
run on the CPU is the slow test at the end (-m slow)."""
import io
import json

import pytest

pytest.importorskip("torch", reason="calibrate run sits above the engine (its grid is the engine's shapes)")

import calibrate.__main__ as cli  # noqa: E402
from core.roofline import get_gpu  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.__main__ import REPO  # noqa: E402
from sim.cost import parse_cost  # noqa: E402

SHIPPED = REPO / "sim" / "calibrations" / "qwen2.5-1.5b" / "h200.json"


class Steps:
    """Stand-ins for the three steps: the sweep writes a sweep row of `gpu` (as the real one does
    under --out), the fit the shipped calibration relabelled for the model where --out says;
    `fail` makes that step fail with an error line."""

    def __init__(self, gpu="NVIDIA H200", fail=None):
        self.calls, self.gpu, self.fail = [], gpu, fail

    def __call__(self, step, argv):
        self.calls.append((step, argv))
        if step == self.fail:
            return 2, f"the {step} broke"
        value = dict(zip(argv, argv[1:]))
        if step == "sweep":
            RunStore(cli.Path(value["--out"]) / "calibration").append_row(
                {"run_id": "sweep-new", "kind": "sweep", "gpu": self.gpu, "device": "cpu" if "CPU" in self.gpu else "cuda"})
        if step == "fit":
            doc = json.loads(SHIPPED.read_text()) | {"model": value["--model"]}
            path = cli.Path(value["--out"]) / value["--model"] / f"{value['--name']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc))
        return 0, None


def test_help_describes_the_one_command(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "sweep`, `heat` and `fit` in turn" in text and "--quick" in text and "held-out" in text


def test_the_command_list_names_run(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "run" in capsys.readouterr().out


def test_run_does_sweep_heat_fit_in_turn_and_reports_the_held_out_error(tmp_path, monkeypatch, capsys):
    steps = Steps()
    monkeypatch.setattr(cli, "run_step", steps)
    out = tmp_path / "calibrations"
    assert cli.main(["run", "--model", "tiny", "--device", "cpu", "--quick", "--results", str(tmp_path / "results"),
                     "--out", str(out), "--no-charts"]) == 0
    assert [s for s, _ in steps.calls] == ["sweep", "fit"]  # (a CPU's heat run is skipped: the heat is a GPU's)
    sweep, fit = (dict(zip(a, a[1:])) for _, a in steps.calls)
    assert sweep["--model"] == fit["--model"] == "tiny" and "--no-heat-run" in steps.calls[1][1]
    assert sweep["--out"] == fit["--results"] == str(tmp_path / "results")
    assert "--quick" in steps.calls[0][1] and sweep["--max-batch"] == "64" and sweep["--repeats"] == "1"  # the CPU's grid
    assert fit["--sweep"] == "sweep-new" and fit["--name"] == "h200" and fit["--out"] == str(out)
    assert "--schedule" not in steps.calls[1][1]  # (a CPU's sweep has no batch that fills a GPU to fit it on)
    text = capsys.readouterr().out
    assert text.index("calibrate run: tiny on the CPU: sweep") < text.index("== calibrate sweep")  # the plan first
    assert "== calibrate heat: skipped on a CPU" in text
    assert "calibrated tiny on NVIDIA H200" in text and str(out / "tiny" / "h200.json") in text
    assert "python -m sim run --model tiny uses it" in text
    assert "decode   held-out" in text.split("held-out) and on its own")[-1]  # the report, at the end
    # the simulator finds it by --model and the GPU
    monkeypatch.setenv("LLMSIM_CALIBRATIONS", str(out))
    cost, gpu = parse_cost("calibrated:h200", model="tiny")
    assert cost.model == "tiny" and gpu.name == "NVIDIA H200"


def test_on_a_gpu_the_full_grid_and_the_committed_calibrations_form(tmp_path, monkeypatch, capsys):
    import torch

    import engine.provenance
    monkeypatch.setattr(engine.provenance, "resolve_device", lambda name: torch.device("cuda"))  # (no CUDA touched)
    monkeypatch.setattr(cli, "cuda_card", lambda: (get_gpu("h200"), "NVIDIA H200"))
    steps = Steps()
    monkeypatch.setattr(cli, "run_step", steps)
    assert cli.main(["run", "--model", "qwen2.5-1.5b", "--quick", "--results", str(tmp_path / "r"),
                     "--out", str(tmp_path / "c")]) == 0
    sweep, heat, fit = (a for _, a in steps.calls)
    assert "--max-batch" not in sweep and sweep[sweep.index("--repeats") + 1] == "2" and "--quick" in sweep
    assert heat[heat.index("--repeats") + 1] == "1" and "--rest" not in heat
    assert "--schedule" in fit and "--mixed" in fit and sweep[sweep.index("--dtype") + 1] == "float16"
    assert "estimated" in capsys.readouterr().out.splitlines()[0]


def test_a_failing_step_is_one_error_line_naming_it_and_the_old_calibration_stays(tmp_path, monkeypatch, capsys):
    out = tmp_path / "calibrations"
    old = out / "tiny" / "h200.json"
    old.parent.mkdir(parents=True)
    old.write_text('{"old": 1}\n')
    import torch

    import engine.provenance
    monkeypatch.setattr(engine.provenance, "resolve_device", lambda name: torch.device("cuda"))  # (no CUDA touched)
    monkeypatch.setattr(cli, "cuda_card", lambda: (None, None))
    for failing in ("sweep", "heat", "fit"):
        steps = Steps(fail=failing)
        monkeypatch.setattr(cli, "run_step", steps)
        assert cli.main(["run", "--model", "tiny", "--results", str(tmp_path / failing), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == f"error: calibrate run: the {failing} step failed: the {failing} broke; no calibration was written\n"
        assert [s for s, _ in steps.calls] == list(cli.STEPS[:cli.STEPS.index(failing) + 1])  # none after it
        assert old.read_text() == '{"old": 1}\n'


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt-5"], "--model: unknown model preset 'gpt-5'"),
    (["--name", "a/b"], "argument --name: a calibration's name is a plain file name"),
    (["--device", "tpu"], "--device 'tpu': expected auto, cpu, cuda or cuda:N"),
])
def test_bad_input_is_refused_before_any_step(tmp_path, monkeypatch, capsys, argv, message):
    steps = Steps()
    monkeypatch.setattr(cli, "run_step", steps)
    assert cli.main(["run", "--device", "cpu", "--results", str(tmp_path / "results")] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert steps.calls == [] and not (tmp_path / "results").exists()


def test_a_step_runs_in_its_own_process_and_its_error_line_is_handed_back(tmp_path, capfd):
    code, error = cli.run_step("fit", ["--results", str(tmp_path)])
    assert code == 2 and error.startswith("no sweep under")
    assert "error:" not in capfd.readouterr().err  # said once, by `calibrate run`, naming the step


def test_pass_through_forwards_progress_and_keeps_the_error_line():
    out = io.StringIO()
    stream = io.BufferedReader(io.BytesIO(b"sweep:  10%\rsweep:  20%\rdone\nerror: it broke\nafter"))
    assert cli.pass_through(stream, out) == "it broke"
    assert out.getvalue() == "sweep:  10%\rsweep:  20%\rdone\nafter"


def test_the_estimate_prices_the_plan_on_the_card(monkeypatch):
    """The full grid and the quick one, the 1.5B model and one of twice its layers: each estimate
    in minutes, the quick one a fraction of the full one, the deeper model's longer."""
    monkeypatch.setattr(cli, "cuda_card", lambda: (get_gpu("h200"), "NVIDIA H200"))
    common = ["--model", "qwen2.5-1.5b"]

    def minutes(model, sweep, heat):
        text = cli.estimate(model, sweep, heat, gpu=True)
        assert "on NVIDIA H200: sweep" in text, text
        return float(text.split("estimated ")[1].split(" min")[0])
    full = minutes("qwen2.5-1.5b", common, common)
    quick = minutes("qwen2.5-1.5b", common + ["--quick", "--repeats", "2"], common + ["--repeats", "1"])
    assert 3 <= full <= 20 and quick < full / 2
    from dataclasses import replace
    from core.config import PRESETS
    monkeypatch.setitem(PRESETS, "deep", replace(PRESETS["qwen2.5-1.5b"], num_hidden_layers=56, name="deep"))
    assert minutes("deep", common, common) > full


def test_a_large_model_gets_a_grid_and_a_heat_run_that_fit_its_cache_and_keep_the_heat_runs_length(
        tmp_path, monkeypatch, capsys):
    """An 8B model's KV cache takes 131 kB a position: the grid's 2,000,000-position batches (262 GB)
    and the heat run's 512 x 2,048 decode batch are left out on an H200, and its heat sequences are
    cut to about the 1.5B's busy time (a 4,096-token prompt pass takes about five times as long)."""
    from calibrate.response import segments
    from calibrate.sweep import default_shapes, tokens_that_fit
    from core.config import resolve_model
    big, small = resolve_model("llama-3.1-8b"), resolve_model("qwen2.5-1.5b")
    held = cli.held_on_h200(big)
    assert held == tokens_that_fit(big, 141e9 - big.weight_bytes(2) - 2**30) and 500_000 < held < 1_000_000
    assert cli.held_on_h200(small) == 2_000_000
    assert len(default_shapes(1024, 16384, held)) < len(default_shapes(1024, 16384, 2_000_000))
    names = {name for name, _ in cli.heat_plan(1.0, held)}
    assert "after 30, b512 c2048" not in names and len(names) == len(segments()) - 1
    scale = cli.heat_scale("llama-3.1-8b")
    assert 0.1 < scale < 0.5 and cli.heat_scale("qwen2.5-1.5b") == 1.0
    import torch

    import engine.provenance
    monkeypatch.setattr(engine.provenance, "resolve_device", lambda name: torch.device("cuda"))  # (no CUDA touched)
    monkeypatch.setattr(cli, "cuda_card", lambda: (get_gpu("h200"), "NVIDIA H200"))
    steps = Steps()
    monkeypatch.setattr(cli, "run_step", steps)
    assert cli.main(["run", "--model", "llama-3.1-8b", "--results", str(tmp_path / "r"),
                     "--out", str(tmp_path / "c")]) == 0
    heat = steps.calls[1][1]
    assert steps.calls[1][0] == "heat" and float(heat[heat.index("--scale") + 1]) == pytest.approx(scale, rel=1e-2)
    assert "heat 18 sequences" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.slow
def test_a_whole_quick_run_on_the_cpu(tmp_path, capsys):
    """The real thing with the tiny model on the CPU: the sweep and the fit each in its own process
    (a CPU's heat run skipped), the fit on what the sweep timed, its held-out error reported (72 s
    on this 2-core machine when idle, 10 minutes and more when it is shared)."""
    out = tmp_path / "calibrations"
    assert cli.main(["run", "--model", "tiny", "--quick", "--device", "cpu", "--results", str(tmp_path / "results"),
                     "--out", str(out), "--no-charts"]) == 0
    doc = json.loads((out / "tiny" / "cpu.json").read_text())
    assert doc["model"] == "tiny" and {e["split"] for e in doc["error"]} == {"held-out", "fitted"}
    assert "decode   held-out" in capsys.readouterr().out
