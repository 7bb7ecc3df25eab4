"""The results table: what each engine measured, against the card's floors and Hugging Face.

Reads results/<engine>/runs.jsonl (the rows `python -m engine bench` writes), takes the median of
the recorded runs of each configuration, and prints one markdown table per GPU: engine, case, ms,
tok/s, GB/s or TFLOP/s, % of the floor, and the Hugging Face figure beside it where there is one.
Rows from different devices are never mixed in one table; rows measured on a CPU are left out
(they are smoke runs) unless --device names the CPU.

    python benchmarks/report.py [--results results] [--gpu-spec h200] [--device "NVIDIA H200"]

The same rows' charts: `benchmarks/figures.py` (which reads them through `load` here).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import get_preset  # noqa: E402
from core.roofline import get_gpu  # noqa: E402
from core.runstore import RunStore  # noqa: E402


def load(results: Path, model: str = "qwen2.5-1.5b") -> dict[str, dict]:
    """device name -> (engine, mode, prompt, batch) -> list of ok rows of `model`, only the rows of
    the configuration's latest measurement (the run id's stamp: one bench command; eager
    runs apart from graph runs, whose mode the rows of one engine have named differently over time),
    so that a configuration measured again on a changed engine shows the engine of now, not a pool."""
    groups: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for f in sorted(results.glob("*/runs.jsonl")):
        for r in RunStore(f.parent).rows():
            # (open runs and sweeps have no prompt; rows from before the model was recorded are the 1.5B's)
            if r.get("status") == "ok" and "prompt" in r and r.get("model", "qwen2.5-1.5b") == model:
                groups[r["gpu"]][(r["engine"], r["mode"] == "eager", r["prompt"], r["batch_size"])].append(r)
    out: dict[str, dict] = {}
    for device, cases in groups.items():
        out[device] = {}
        for (engine, _, prompt, batch), rows in cases.items():
            last = max(stamp(r) for r in rows)
            rows = [r for r in rows if stamp(r) == last]
            out[device][(engine, rows[0]["mode"], prompt, batch)] = rows
    return out


def stamp(row: dict) -> str:
    """When the bench command that measured a row started (its run id's last part, e.g.
    20261204T144832.820Z; the same for every run of one command)."""
    return row["run_id"].rsplit("-", 1)[-1]


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def decode_work(model, engine: str, row: dict) -> tuple[float, float]:
    """FLOPs and bytes of one decode step of a closed run, at the run's mid-point context: a step
    reads the weights and the live KV cache and does the matmuls; a naive step recomputes the
    whole sequence (a prefill's work, the weights read once)."""
    batch = row["batch_size"]
    context = row["prompt_tokens"] + row["new_tokens"] / 2
    if engine == "naive":
        return batch * model.prefill_flops(int(context)), model.weight_bytes_read_per_pass()
    return (batch * model.flops_per_token(int(context)),
            model.weight_bytes_read_per_pass() + batch * context * model.kv_bytes_per_token())


def prefill_work(model, row: dict) -> tuple[float, float]:
    """FLOPs and bytes of a run's prefill (batch 1): the prompt's matmuls and attention, the
    weights read once."""
    return model.prefill_flops(row["prompt_tokens"]), model.weight_bytes_read_per_pass()


def table(groups: dict, gpu_name: str, model_name: str = "qwen2.5-1.5b") -> str:
    model, gpu = get_preset(model_name), get_gpu(gpu_name)
    weights, kv = model.weight_bytes_read_per_pass(), model.kv_bytes_per_token()
    hf = {(p, b): rows for (e, _, p, b), rows in groups.items() if e == "hf"}
    out = ["| engine | mode | case | ms | tok/s | achieved | % of floor | Hugging Face | commit |",
           "|---|---|---|---:|---:|---:|---:|---|---|"]

    def hf_cell(prompt, batch, key, fmt):
        rows = hf.get((prompt, batch))
        return fmt(med(rows, key)) if rows else ""

    order = {"cached": 0, "batched": 1, "continuous": 2, "naive": 3}

    def key(item):
        (engine, mode, prompt, batch), _ = item
        length = int(prompt[1:]) if prompt[1:].isdigit() else 1 << 30  # a mix of prompts after the single ones
        return order.get(engine, 9), mode == "eager", length, batch

    for (engine, mode, prompt, batch), rows in sorted(groups.items(), key=key):
        if engine == "hf":
            continue
        itl = med(rows, "mean_itl_ms") / 1e3
        flops, step_bytes = decode_work(model, engine, rows[0])
        floor = gpu.floor_s(step_bytes, flops)
        achieved = f"{flops / itl / 1e12:,.0f} TFLOP/s" if engine == "naive" else f"{step_bytes / itl / 1e9:,.0f} GB/s"
        out.append(f"| {engine} | {mode} | decode {prompt} x{batch} | {itl * 1e3:.3f} | {batch / itl:,.0f} | "
                   f"{achieved} | {100 * floor / itl:.0f}% | "
                   + hf_cell(prompt, batch, "mean_itl_ms", lambda v: f"{v:.3f} ms, {batch * 1e3 / v:,.0f} tok/s")
                   + f" | {commits(rows)} |")
        if batch == 1:
            ttft = med(rows, "mean_ttft_ms") / 1e3
            flops, _ = prefill_work(model, rows[0])
            out.append(f"| {engine} | {mode} | prefill {prompt} (TTFT) | {ttft * 1e3:.2f} | "
                       f"{rows[0]['prompt_tokens'] / ttft:,.0f} | {flops / ttft / 1e12:,.0f} TFLOP/s | "
                       f"{100 * gpu.floor_s(weights, flops) / ttft:.0f}% | "
                       + hf_cell(prompt, batch, "mean_ttft_ms", lambda v: f"{v:.2f} ms") + f" | {commits(rows)} |")
    floors = (f"Floors on {gpu.name}: {gpu.bandwidth_gbs:,.0f} GB/s and {gpu.fp16_tflops:,.0f} TFLOP/s "
              f"({gpu.source}). Decode moves {weights / 1e9:.2f} GB of weights plus {kv:,} bytes per cached "
              "token; the decode rows count both at the run's mid-point context, and a floor is the larger of "
              "bytes over bandwidth and FLOPs over peak (a naive step recomputes the whole sequence, so its "
              "floor is a prefill's). Medians of the recorded runs of each case's latest measurement, at the commit named.")
    return "\n".join(out) + "\n\n" + floors


def commits(rows: list[dict]) -> str:
    return ", ".join(sorted({str(r.get("git_commit") or "?")[:7] for r in rows}))


def measured_on(groups: dict, device: str | None) -> list[str]:
    """The devices of `groups` to report: `device` if named, else every GPU (not the CPU's rows)."""
    return [d for d in groups if (d == device if device else not d.startswith("CPU"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "results"), help="results directory (default results/)")
    ap.add_argument("--gpu-spec", default="h200", help="GPU preset for the floors (default h200)")
    ap.add_argument("--device", default=None, help="only rows measured on this device (as the rows name it)")
    ap.add_argument("--model", default="qwen2.5-1.5b", help="the model whose rows to report (default qwen2.5-1.5b)")
    args = ap.parse_args(argv)
    groups = load(Path(args.results), args.model)
    devices = measured_on(groups, args.device)
    if not devices:
        print(f"error: no rows{' measured on ' + args.device if args.device else ' measured on a GPU'} under "
              f"{args.results}", file=sys.stderr)
        return 2
    for device in devices:
        if len(devices) > 1:
            print(f"\n### {device}\n")
        print(table(groups[device], args.gpu_spec, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
