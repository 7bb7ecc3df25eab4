"""`python -m traces`: generate, convert, summarise, download, clip, scale and window traces.

Every command that reads a trace accepts any format `load_trace` knows (detected from the file)
and every command that writes one writes the project CSV. `--help` works on every subcommand.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

from core.cli import ArgumentParser, number
from traces import generate
from traces.download import DEFAULT_DEST, PUBLIC_TRACES, DownloadError, download, resolve_trace
from traces.errors import TraceError
from traces.io import FORMATS, load_trace, save_trace
from traces.tools import clip_to_context, rate_per_window, scale_rate, summary, window
from traces.trace import MAX_ARRIVAL_S, Trace

MAX_WINDOWS = 10_000  # `summary --window` prints at most this many per-window rates

COUNT = number(int, low=1, high=generate.MAX_REQUESTS)
SECONDS = number(above=0, high=MAX_ARRIVAL_S)
RATE = number(above=0)  # requests per second, finite


def lengths(text: str) -> generate.Lengths:
    """A token-length argument: `256` (constant), `16,64,256` (drawn from these) or `64:512`
    (uniform, both ends included); every length at least 1."""
    try:
        if ":" in text:
            low, high = (int(x) for x in text.split(":"))
            values, made = [low, high], generate.uniform(low, high)
        elif "," in text:
            values = [int(x) for x in text.split(",")]
            made = generate.choice(values)
        else:
            made = int(text)
            values = [made]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, A,B,C or LOW:HIGH, got {text!r}") from None
    if min(values) < 1 or (":" in text and values[0] > values[1]):
        raise argparse.ArgumentTypeError(f"token lengths must be at least 1 (and LOW <= HIGH), got {text!r}")
    return made


def rates(text: str) -> list[float]:
    """A comma-separated list of at least two rates, each finite and >= 0, not all zero."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rates like 1,5,2, got {text!r}") from None
    if len(values) < 2 or not all(math.isfinite(v) and v >= 0 for v in values) or not max(values) > 0:
        raise argparse.ArgumentTypeError(f"expected two or more rates, finite, >= 0 and not all zero, got {text!r}")
    return values


def peak_trough(text: str) -> list[float]:
    """`--daily PEAK,TROUGH`: two rates, as `rates` checks them."""
    values = rates(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected PEAK,TROUGH, got {text!r}")
    return values


def check_out_file(path: Path) -> None:
    """Refuse an --out that is a directory, or in a place this process cannot write, before any work."""
    if path.is_dir():
        raise ValueError(f"--out {path}: is a directory; name the trace file to write")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"--out {path}: {parent} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent))
    except OSError as e:
        raise ValueError(f"--out {path}: cannot write in {parent} ({e.strerror})") from None


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m traces", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="write a synthetic trace")
    kinds = gen.add_subparsers(dest="kind", required=True, metavar="KIND")
    helps = {"poisson": "Poisson arrivals at --rate",
             "gamma": "gamma gaps: --rate and --burstiness (vLLM's definition; 1 = Poisson)",
             "fixed": "the part0 workload: prompts drawn from p16 ... p4096, 256 output tokens",
             "onoff": "bursts: --rate-on for --on seconds, --rate-off for --off seconds",
             "ramp": "a rate that follows --rates (or a --daily curve) over --duration"}
    for kind, text in helps.items():
        sub = kinds.add_parser(kind, help=text, description=text)
        if kind in ("poisson", "gamma"):
            sub.add_argument("--rate", type=number(above=0, infinite=True), required=True,
                             help="requests per second (inf: all at t = 0)")
        if kind == "gamma":
            sub.add_argument("--burstiness", type=number(above=0), required=True,
                             help="gamma shape; gaps have CV 1/sqrt(burstiness)")
        if kind == "fixed":
            sub.add_argument("--rate", type=number(above=0, infinite=True), default=math.inf,
                             help="Poisson rate (default inf: all requests at t = 0)")
            sub.add_argument("--prompts", type=prompt_list, default=list(generate.SEED_PROMPTS),
                             help=f"prompt lengths to draw from (default {','.join(map(str, generate.SEED_PROMPTS))})")
        if kind == "onoff":
            sub.add_argument("--rate-on", type=RATE, required=True)
            sub.add_argument("--on", type=SECONDS, required=True, help="seconds per burst")
            sub.add_argument("--off", type=number(low=0, high=MAX_ARRIVAL_S), required=True,
                             help="seconds between bursts")
            sub.add_argument("--rate-off", type=number(low=0), default=0.0)
        if kind == "ramp":
            curve = sub.add_mutually_exclusive_group(required=True)
            curve.add_argument("--rates", type=rates, help="rates spread evenly over the duration, e.g. 1,8,2")
            curve.add_argument("--daily", type=peak_trough, metavar="PEAK,TROUGH",
                               help="a day's cosine curve peaking at 14:00, squeezed into --duration")
            sub.add_argument("--duration", type=SECONDS, required=True, help="seconds")
        else:
            size = sub.add_mutually_exclusive_group(required=kind != "fixed")
            size.add_argument("--n", type=COUNT, help="number of requests" +
                              (" (default 100)" if kind == "fixed" else ""))
            size.add_argument("--duration", type=SECONDS, help="seconds of arrivals")
        if kind != "fixed":
            sub.add_argument("--prompt", type=lengths, default=256,
                             help="prompt tokens: N, A,B,C or LOW:HIGH (default 256)")
        sub.add_argument("--output", type=lengths, default=256,
                         help="output tokens: N, A,B,C or LOW:HIGH (default 256)")
        sub.add_argument("--seed", type=number(int, low=0), default=0)
        sub.add_argument("--out", type=Path, required=True, help="project CSV to write")

    conv = commands.add_parser("convert", help="convert a public trace to the project CSV")
    conv.add_argument("input", type=Path)
    conv.add_argument("--fmt", choices=FORMATS, help="input format (default: detect)")
    conv.add_argument("--out", type=Path, required=True)

    summ = commands.add_parser("summary", help="print requests, rate, busiest minute, token percentiles")
    summ.add_argument("input", type=Path)
    summ.add_argument("--fmt", choices=FORMATS, help="input format (default: detect)")
    summ.add_argument("--window", type=number(above=0), default=None,
                      help=f"also print the rate per window of this many seconds (default 600, when that makes "
                           f"at most {MAX_WINDOWS:,} windows)")

    down = commands.add_parser("download", help="fetch a public trace by name",
                               description="Names: " + ", ".join(PUBLIC_TRACES))
    down.add_argument("name", choices=list(PUBLIC_TRACES), metavar="NAME")
    down.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="folder (default out/traces)")
    down.add_argument("--no-local", action="store_true", help="download even if the $LLMSIM_TRACES directory has it")

    clip = commands.add_parser("clip", help="fit every request into a model's context")
    clip.add_argument("input", type=Path)
    clip.add_argument("--context", type=number(int, low=2), required=True, help="context length in tokens")
    clip.add_argument("--out", type=Path, required=True)

    scale = commands.add_parser("scale", help="stretch or compress time to a target mean rate")
    scale.add_argument("input", type=Path)
    scale.add_argument("--rate", type=RATE, required=True, help="target requests per second")
    scale.add_argument("--out", type=Path, required=True)

    win = commands.add_parser("window", help="keep requests arriving in [--start, --end), times from --start")
    win.add_argument("input", type=Path)
    win.add_argument("--start", type=number(), required=True, help="seconds")
    win.add_argument("--end", type=number(), required=True, help="seconds")
    win.add_argument("--out", type=Path, required=True)
    return parser


def generated(args: argparse.Namespace) -> Trace:
    if args.kind == "poisson":
        return generate.poisson(args.rate, args.n, args.duration, args.prompt, args.output, args.seed)
    if args.kind == "gamma":
        return generate.gamma(args.rate, args.burstiness, args.n, args.duration, args.prompt,
                              args.output, args.seed)
    if args.kind == "fixed":
        n = args.n if args.n is not None or args.duration is not None else 100
        return generate.fixed_prompts(n, args.rate, args.prompts, args.output, args.duration, args.seed)
    if args.kind == "onoff":
        return generate.on_off(args.rate_on, args.on, args.off, args.rate_off, args.n, args.duration,
                               args.prompt, args.output, args.seed)
    curve = args.rates or generate.daily_curve(*args.daily)
    return generate.ramp(curve, args.duration, args.prompt, args.output, args.seed)


def prompt_list(text: str) -> list[int]:
    """`--prompts 16,64,256`: prompt lengths, each at least 1."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected lengths like 16,64,256, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"prompt lengths must be at least 1, got {text!r}")
    return values


def summary_window(trace: Trace, given: float | None) -> float | None:
    """`summary --window`: the window to print rates for (None: none), refusing a given window that
    would print more than MAX_WINDOWS rates (the default of 600 s is then left out)."""
    window_s = given or 600.0
    windows = trace.span_s / window_s
    if windows <= MAX_WINDOWS:
        return window_s if trace.span_s >= window_s else None
    if given is None:
        return None
    raise ValueError(f"--window {window_s:g}: the trace spans {trace.span_s:g} s, which makes {windows:.3g} "
                     f"windows; at most {MAX_WINDOWS:,} are printed (give a longer --window)")


def run(args: argparse.Namespace) -> None:
    if getattr(args, "out", None) is not None:
        check_out_file(args.out)
    if args.command == "window" and not args.end > args.start:
        raise ValueError(f"--end {args.end:g} must be after --start {args.start:g}")
    if args.command == "generate":
        trace = generated(args)
        print(f"wrote {len(trace)} requests to {save_trace(trace, args.out)}")
    elif args.command == "convert":
        trace = load_trace(resolve_trace(args.input), args.fmt)
        print(f"wrote {len(trace)} requests to {save_trace(trace, args.out)}; {trace.notes}")
    elif args.command == "summary":
        trace = load_trace(resolve_trace(args.input), args.fmt)
        window_s = summary_window(trace, args.window)
        for key, value in summary(trace).items():
            print(f"{key:>26}  {value:.6g}" if isinstance(value, float) else f"{key:>26}  {value}")
        if window_s is not None:
            per_window = ", ".join(f"{r:.2f}" for r in rate_per_window(trace, window_s))
            print(f"{'rate per ' + format(window_s, 'g') + ' s window':>26}  {per_window}")
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
        if not len(trace):
            raise ValueError(f"--start {args.start:g} --end {args.end:g}: no request of {args.input} arrives "
                             "in that window")
        print(f"wrote {len(trace)} requests to {save_trace(trace, args.out)}")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; bad input is reported in one line (exit status 2), not a traceback."""
    try:
        run(build_parser().parse_args(argv))
    except (TraceError, DownloadError, FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
