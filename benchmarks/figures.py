"""The part0 workload's figures, drawn from the committed results (altair; HTML and PNG via vl-convert):

- roofline: the A10's and the H200's ceilings (bandwidth x arithmetic intensity, capped by the
  fp16 matmul rate, from `core.roofline`) with each GPU's five numbers, and the points measured
  on the H200: every decode configuration of the cached, batched and continuous engines and
  every prefill (TTFT), at the FLOPs and bytes the results table counts (`report.decode_work`,
  `report.prefill_work`), medians of the recorded runs;
- batch-curve: decode tokens per second against the batch size (p256) of the batched engine
  (results/batched) and the continuous engine's closed batches (results/continuous-closed),
  median and range of the recorded runs, under the roofline's ceiling for the same steps;
- latency-vs-rate: the continuous engine's open runs of the part0 workload against the arrival
  rate, real and simulated (`sim compare`'s chart, from the same comparison it makes).

    python benchmarks/figures.py docs/figures [--results results] [--device "NVIDIA H200"]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.report import decode_work, load, measured_on, med, prefill_work  # noqa: E402
from core.config import get_preset  # noqa: E402
from core.roofline import GPUS, get_gpu, roofline  # noqa: E402

ROOFLINE_GPUS = ("a10", "h200")
DECODE_ENGINES = ("cached", "batched", "continuous")
MODEL = "qwen2.5-1.5b"


def preset_of(device: str) -> str | None:
    """The GPU preset named like a device the rows were measured on (the measured one first)."""
    return next((key for key, spec in GPUS.items() if spec.name == device), None)


def five_numbers(gpu_key: str, free_gib: float | None) -> list[str]:
    """The GPU's five numbers (`python -m engine roofline`), in two lines."""
    gpu = get_gpu(gpu_key)
    r = roofline(get_preset(MODEL), gpu, free_gib=free_gib)
    free = "measured" if r.free_measured else "estimated"
    return [f"{gpu.name} ({gpu.bandwidth_gbs:,.0f} GB/s, {gpu.fp16_tflops:,.0f} TFLOP/s; {gpu.source}): weights "
            f"{r.weight_bytes / 1e9:.2f} GB, batch-1 ceiling {r.batch1_ceiling_tok_s:,.0f} tok/s "
            f"({r.batch1_floor_ms:.3g} ms a step),",
            f"    KV {r.kv_bytes_per_token:,} B/token, ridge {r.ridge_flop_per_byte:.0f} FLOP/B, "
            f"{r.free_for_cache_gib:.1f} GiB free for the cache ({free}) = {r.cache_token_positions:,} positions "
            f"= {r.cache_requests:,} requests of {r.request_tokens:,} tokens"]


def roofline_points(groups: dict) -> pd.DataFrame:
    """One point per measured configuration: arithmetic intensity and achieved TFLOP/s."""
    model = get_preset(MODEL)
    rows = []
    for device, configs in groups.items():
        for (engine, mode, prompt, batch), runs in configs.items():
            if engine not in DECODE_ENGINES:
                continue
            flops, nbytes = decode_work(model, engine, runs[0])
            seconds = med(runs, "mean_itl_ms") / 1e3
            rows.append({"device": device, "engine": f"{engine} ({mode})", "case": f"decode {prompt} x{batch}",
                         "kind": "decode", "flop_per_byte": flops / nbytes, "tflops": flops / seconds / 1e12,
                         "ms": seconds * 1e3})
            if batch == 1:
                flops, nbytes = prefill_work(model, runs[0])
                seconds = med(runs, "mean_ttft_ms") / 1e3
                rows.append({"device": device, "engine": f"{engine} ({mode})", "case": f"prefill {prompt}",
                             "kind": "prefill", "flop_per_byte": flops / nbytes, "tflops": flops / seconds / 1e12,
                             "ms": seconds * 1e3})
    return pd.DataFrame(rows)


def ceilings(gpu_keys: list[str]) -> pd.DataFrame:
    """Each GPU's roof, min(bandwidth x intensity, peak), at log-spaced intensities and its ridge."""
    rows = []
    for key in gpu_keys:
        gpu = get_gpu(key)
        ridge = gpu.ridge_flop_per_byte
        for x in sorted({*(10 ** (k / 8) for k in range(-8, 33)), ridge}):
            rows.append({"gpu": gpu.name,
                         "flop_per_byte": x, "tflops": min(gpu.bandwidth_gbs * 1e9 * x, gpu.fp16_tflops * 1e12) / 1e12})
    return pd.DataFrame(rows)


def roofline_chart(groups: dict):
    import altair as alt

    points = roofline_points(groups)
    keys = list(dict.fromkeys([*ROOFLINE_GPUS, *(k for k in map(preset_of, groups) if k)]))
    free = {preset_of(d): med([r for runs in configs.values() for r in runs if r.get("free_gib_after_load")],
                              "free_gib_after_load")
            for d, configs in groups.items()
            if any(r.get("free_gib_after_load") for runs in configs.values() for r in runs)}
    x = alt.X("flop_per_byte:Q", scale=alt.Scale(type="log", domain=[0.1, 10000]), title="arithmetic intensity (FLOP/byte)")
    y = alt.Y("tflops:Q", scale=alt.Scale(type="log", domain=[0.05, 2000]), title="TFLOP/s")
    roof = alt.Chart(ceilings(keys)).mark_line(strokeWidth=2, color="#444").encode(
        x=x, y=y, strokeDash=alt.StrokeDash("gpu:N", title="ceiling", sort=[get_gpu(k).name for k in keys]))
    dots = alt.Chart(points).mark_point(filled=True, size=60, opacity=0.8).encode(
        x=x, y=y, shape=alt.Shape("kind:N", title=None),
        color=alt.Color("engine:N", title="measured on " + ", ".join(groups)),
        tooltip=["device", "engine", "case", alt.Tooltip("ms:Q", format=".3f"), alt.Tooltip("tflops:Q", format=".1f"),
                 alt.Tooltip("flop_per_byte:Q", format=".1f")])
    marked = points[points.case.isin(["decode p256 x1", "decode p256 x1024", "prefill p16",
                                      "prefill p4096"]) & points.engine.str.startswith(("cached (graph", "batched"))]
    marked = marked.drop_duplicates("case")
    labels = alt.Chart(marked).mark_text(align="left", dx=7, dy=-6, fontSize=11).encode(x=x, y=y, text="case:N")
    subtitle = [line for k in keys for line in five_numbers(k, free.get(k))]
    return alt.layer(roof, dots, labels).properties(
        width=620, height=380, title=alt.TitleParams(f"Roofline of {MODEL} (fp16): measured steps against the ceilings",
                                                     subtitle=subtitle, anchor="start")).configure_legend(
        labelLimit=400)


def batch_curve_chart(groups: dict):
    import altair as alt

    model = get_preset(MODEL)
    rows, roof = [], []
    for device, configs in groups.items():
        key = preset_of(device)
        for (engine, mode, prompt, batch), runs in configs.items():
            if engine not in ("batched", "continuous") or prompt != "p256":
                continue
            rates = [batch * 1e3 / r["mean_itl_ms"] for r in runs]
            # one line an engine: whether a graph's kernels use PDL depends on the batch (and rows
            # before 642a86d said graph+pdl at every batch); only the eager path is a line of its own
            label = f"{engine}{' (eager)' if mode == 'eager' else ''}, {device}"
            rows.append({"engine": label, "batch": batch, "tok_s": statistics.median(rates),
                         "low": min(rates), "high": max(rates), "runs": len(runs)})
            if key:
                gpu = get_gpu(key)
                flops, nbytes = decode_work(model, engine, runs[0])
                step = gpu.floor_s(nbytes, flops)
                roof.append({"engine": f"roofline ceiling, {gpu.name}", "batch": batch, "tok_s": batch / step})
    df = pd.DataFrame(rows)
    x = alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title="batch size (sequences decoding, p256)")
    y = alt.Y("tok_s:Q", scale=alt.Scale(type="log"), title="decode tokens per second")
    line = alt.Chart(df).mark_line(point=True).encode(
        x=x, y=y, color=alt.Color("engine:N", title=None),
        tooltip=["engine", "batch", alt.Tooltip("tok_s:Q", format=",.0f"), "runs"])
    spread = alt.Chart(df).mark_rule().encode(x=x, y="low:Q", y2="high:Q", color=alt.Color("engine:N", title=None))
    ceiling = alt.Chart(pd.DataFrame(roof).drop_duplicates(["engine", "batch"])).mark_line(strokeDash=[5, 4], color="gray").encode(
        x=x, y=y, detail="engine:N")
    return alt.layer(ceiling, spread, line).properties(
        width=520, height=340, title=alt.TitleParams(
            "The batch curve: decode throughput against the batch size",
            subtitle=["median of the recorded runs (bar: their range); dashed: the roofline's ceiling on the same GPU "
                      "for the same steps (weights + live KV over bandwidth, or FLOPs over peak)"], anchor="start"))


def latency_vs_rate(results: Path, out: Path, cost: str = "calibrated:h200") -> Path | None:
    """`sim compare`'s latency-against-rate chart of the part0 workload's open runs (one replica),
    real and simulated; None (with a note) where there are no such runs or no cost model."""
    from sim.compare import charts, compare, load_cost, select_runs
    from core.runstore import RunStore

    try:
        rows = [r for r in select_runs(results) if r["workload"] == "seed" and (r.get("replicas") or 1) == 1]
        model = load_cost(cost, MODEL)
    except (ValueError, FileNotFoundError) as e:
        print(f"no latency-vs-rate figure: {e}")
        return None
    if not rows:
        print(f"no latency-vs-rate figure: no open runs of the part0 workload under {results / 'continuous'}")
        return None
    store = RunStore(results / "continuous")
    comparisons = [compare(r, store, cost, model) for r in rows]
    with tempfile.TemporaryDirectory() as scratch:
        return charts(comparisons, out, Path(scratch)).get("latency-vs-rate")


def write_figures(results: Path, out: Path, groups: dict) -> list[Path]:
    """Every figure into a scratch directory, then into `out` (made if missing; files of the same
    names replaced), so that a failure leaves `out` as it was."""
    from sim.compare import save

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        tmp = Path(tmp)
        made = [save(roofline_chart(groups), tmp / "roofline"), save(batch_curve_chart(groups), tmp / "batch-curve")]
        latency = latency_vs_rate(results, tmp)
        if latency is not None:
            made.append(latency)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for png in made:
            for path in (png, png.with_suffix(".html")):
                path.replace(out / path.name)
            written.append(out / png.name)
    return written



def main(argv: list[str] | None = None) -> int:
    """Draw the figures of the rows under --results into DIR; an error line and 2 on bad input."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", metavar="DIR", help="where the figures go (HTML and PNG; e.g. docs/figures)")
    ap.add_argument("--results", default=str(ROOT / "results"), help="results directory (default results/)")
    ap.add_argument("--device", default=None, help="only rows measured on this device (as the rows name it)")
    args = ap.parse_args(argv)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"error: {args.out}: exists and is not a directory", file=sys.stderr)
        return 2
    groups = load(Path(args.results))
    devices = measured_on(groups, args.device)
    if not devices:
        print(f"error: no rows{' measured on ' + args.device if args.device else ' measured on a GPU'} under "
              f"{args.results}", file=sys.stderr)
        return 2
    written = write_figures(Path(args.results), Path(args.out), {d: groups[d] for d in devices})
    print("written " + ", ".join(str(p) for p in written) + " (and .html beside each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
