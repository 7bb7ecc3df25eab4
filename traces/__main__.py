"""`python -m traces`: generate, convert, summarise, download, clip, scale and window traces.

Every command that reads a trace accepts any format `load_trace` knows (detected from the file)
and every command that writes one writes the project CSV. `--help` works on every subcommand.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from traces import generate
from traces.download import DEFAULT_DEST, PUBLIC_TRACES, DownloadError, download, resolve_trace
from traces.errors import TraceError
from traces.io import FORMATS, load_trace, save_trace
from traces.tools import clip_to_context, rate_per_window, scale_rate, summary, window
from traces.trace import Trace


def lengths(text: str) -> generate.Lengths:
    """A token-length argument: `256` (constant), `16,64,256` (drawn from these) or `64:512`
    (uniform, both ends included)."""
    try:
        if ":" in text:
            low, high = (int(x) for x in text.split(":"))
            return generate.uniform(low, high)
        if "," in text:
            return generate.choice([int(x) for x in text.split(",")])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, A,B,C or LOW:HIGH, got {text!r}") from None


def rates(text: str) -> list[float]:
    """A comma-separated list of rates."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rates like 1,5,2, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m traces", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="write a synthetic trace")
    kinds = gen.add_subparsers(dest="kind", required=True, metavar="KIND")
    helps = {"poisson": "Poisson arrivals at --rate",
             "gamma": "gamma gaps: --rate and --burstiness (vLLM's definition; 1 = Poisson)",
             "fixed": "the seed workload: prompts drawn from 16..4096, 256 output tokens",
             "onoff": "bursts: --rate-on for --on seconds, --rate-off for --off seconds",
             "ramp": "a rate that follows --rates (or a --daily curve) over --duration"}
    for kind, text in helps.items():
        sub = kinds.add_parser(kind, help=text, description=text)
        if kind in ("poisson", "gamma"):
            sub.add_argument("--rate", type=float, required=True, help="requests per second")
        if kind == "gamma":
            sub.add_argument("--burstiness", type=float, required=True,
                             help="gamma shape; gaps have CV 1/sqrt(burstiness)")
        if kind == "fixed":
            sub.add_argument("--rate", type=float, default=math.inf,
                             help="Poisson rate (default inf: all requests at t = 0)")
            sub.add_argument("--prompts", default=",".join(map(str, generate.SEED_PROMPTS)),
                             help="prompt lengths to draw from (default %(default)s)")
        if kind == "onoff":
            sub.add_argument("--rate-on", type=float, required=True)
            sub.add_argument("--on", type=float, required=True, help="seconds per burst")
            sub.add_argument("--off", type=float, required=True, help="seconds between bursts")
            sub.add_argument("--rate-off", type=float, default=0.0)
        if kind == "ramp":
            curve = sub.add_mutually_exclusive_group(required=True)
            curve.add_argument("--rates", type=rates, help="rates spread evenly over the duration, e.g. 1,8,2")
            curve.add_argument("--daily", type=rates, metavar="PEAK,TROUGH",
                               help="a day's cosine curve peaking at 14:00, squeezed into --duration")
            sub.add_argument("--duration", type=float, required=True, help="seconds")
        else:
            size = sub.add_mutually_exclusive_group(required=kind != "fixed")
            size.add_argument("--n", type=int, help="number of requests" +
                              (" (default 100)" if kind == "fixed" else ""))
            size.add_argument("--duration", type=float, help="seconds of arrivals")
        if kind != "fixed":
            sub.add_argument("--prompt", type=lengths, default=256,
                             help="prompt tokens: N, A,B,C or LOW:HIGH (default 256)")
        sub.add_argument("--output", type=lengths, default=256,
                         help="output tokens: N, A,B,C or LOW:HIGH (default 256)")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--out", type=Path, required=True, help="project CSV to write")

    conv = commands.add_parser("convert", help="convert a public trace to the project CSV")
    conv.add_argument("input", type=Path)
    conv.add_argument("--fmt", choices=FORMATS, help="input format (default: detect)")
    conv.add_argument("--out", type=Path, required=True)

    summ = commands.add_parser("summary", help="print requests, rate, busiest minute, token percentiles")
    summ.add_argument("input", type=Path)
    summ.add_argument("--fmt", choices=FORMATS, help="input format (default: detect)")
    summ.add_argument("--window", type=float, default=600.0,
                      help="also print the rate per window of this many seconds (default 600)")

    down = commands.add_parser("download", help="fetch a public trace by name",
                               description="Names: " + ", ".join(PUBLIC_TRACES))
    down.add_argument("name", choices=list(PUBLIC_TRACES), metavar="NAME")
    down.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="folder (default out/traces)")
    down.add_argument("--no-local", action="store_true", help="download even if ../shared/traces has it")

    clip = commands.add_parser("clip", help="fit every request into a model's context")
    clip.add_argument("input", type=Path)
    clip.add_argument("--context", type=int, required=True, help="context length in tokens")
    clip.add_argument("--out", type=Path, required=True)

    scale = commands.add_parser("scale", help="stretch or compress time to a target mean rate")
    scale.add_argument("input", type=Path)
    scale.add_argument("--rate", type=float, required=True, help="target requests per second")
    scale.add_argument("--out", type=Path, required=True)

    win = commands.add_parser("window", help="keep requests arriving in [--start, --end), times from --start")
    win.add_argument("input", type=Path)
    win.add_argument("--start", type=float, required=True, help="seconds")
    win.add_argument("--end", type=float, required=True, help="seconds")
    win.add_argument("--out", type=Path, required=True)
    return parser


def generated(args: argparse.Namespace) -> Trace:
    if args.kind == "poisson":
        return generate.poisson(args.rate, args.n, args.duration, args.prompt, args.output, args.seed)
    if args.kind == "gamma":
        return generate.gamma(args.rate, args.burstiness, args.n, args.duration, args.prompt,
                              args.output, args.seed)
    if args.kind == "fixed":
        prompts = [int(x) for x in args.prompts.split(",")]
        n = args.n if args.n is not None or args.duration is not None else 100
        return generate.fixed_prompts(n, args.rate, prompts, args.output, args.duration, args.seed)
    if args.kind == "onoff":
        return generate.on_off(args.rate_on, args.on, args.off, args.rate_off, args.n, args.duration,
                               args.prompt, args.output, args.seed)
    curve = args.rates or generate.daily_curve(*args.daily)
    return generate.ramp(curve, args.duration, args.prompt, args.output, args.seed)


def run(args: argparse.Namespace) -> None:
    if args.command == "generate":
        trace = generated(args)
        print(f"wrote {len(trace)} requests to {save_trace(trace, args.out)}")
    elif args.command == "convert":
        trace = load_trace(resolve_trace(args.input), args.fmt)
        print(f"wrote {len(trace)} requests to {save_trace(trace, args.out)}; {trace.notes}")
    elif args.command == "summary":
        trace = load_trace(resolve_trace(args.input), args.fmt)
        for key, value in summary(trace).items():
            print(f"{key:>26}  {value:.6g}" if isinstance(value, float) else f"{key:>26}  {value}")
        if trace.span_s >= args.window:
            per_window = ", ".join(f"{r:.2f}" for r in rate_per_window(trace, args.window))
            print(f"{'rate per ' + format(args.window, 'g') + ' s window':>26}  {per_window}")
    elif args.command == "download":
        print(download(args.name, args.dest, use_local=not args.no_local))
    elif args.command == "clip":
        trace, report = clip_to_context(load_trace(resolve_trace(args.input)), args.context)
        print(f"wrote {len(trace)} requests to {save_trace(trace, args.out)}; {report}")
    elif args.command == "scale":
        trace = scale_rate(load_trace(resolve_trace(args.input)), args.rate)
        print(f"wrote {len(trace)} requests at {trace.rate:.4g} req/s to {save_trace(trace, args.out)}")
    elif args.command == "window":
        trace = window(load_trace(resolve_trace(args.input)), args.start, args.end)
        print(f"wrote {len(trace)} requests to {save_trace(trace, args.out)}")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; bad input is reported in one line, not a traceback."""
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (TraceError, DownloadError, FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
