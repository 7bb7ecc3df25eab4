"""What every command line here shares: bad input is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

SEED_MAX = 2**63 - 1  # the largest seed torch and numpy both take


class UsageError(ValueError):
    """A command-line argument argparse refused (unknown option, bad value, missing argument)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a usage error raises UsageError (one line, no usage dump), which the
    command's main turns into `error: ...` and exit status 2, like every other bad input."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def number(kind=float, *, low: float | None = None, above: float | None = None, high: float | None = None,
           infinite: bool = False):
    """An argparse type: a finite `kind` number (or `inf`, if `infinite`), >= low, > above, <= high;
    argparse names the option in its error (`argument --block-size: must be at least 1, got 0`)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a{' whole' if kind is int else ''} number, got {text!r}") \
                from None
        if math.isnan(value) or (math.isinf(value) and not infinite):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be more than {above:g}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g}, got {text}")
        return value
    return parse


def goodput_slo(text: str) -> str:
    """An argparse type for one `--goodput` SLO, `NAME:MS`, checked as core.metrics reads it."""
    from core.metrics import parse_goodput
    try:
        parse_goodput([text])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def metric_percentiles(text: str) -> tuple[float, ...]:
    """An argparse type for `--metric-percentiles` (vLLM's flag): comma-separated percentiles, each
    above 0 and below 100, e.g. "25,50,75,99"."""
    out = []
    for part in text.split(","):
        try:
            p = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a number (expected e.g. 25,50,99)") from None
        if not 0 < p < 100:
            raise argparse.ArgumentTypeError(f"a percentile must be above 0 and below 100, got {part}")
        out.append(p)
    return tuple(dict.fromkeys(out))


def check_writable_dir(path: str | Path, option: str = "--out") -> None:
    """Refuse, before any work, an output directory that is a file, lies under one, or is in a
    place this process cannot write (tried with a scratch directory, not read off permission
    bits, which root passes)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path}: exists and is not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check.", dir=parent))
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write in {parent} ({e.strerror})") from None


def percentile_metrics(text: str) -> tuple[str, ...]:
    """An argparse type for `--percentile-metrics` (vLLM's flag): comma-separated names of the
    latencies whose statistics the table prints, from ttft, tpot, itl, e2el."""
    from core.metrics import LATENCIES
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",")))
    unknown = [n for n in names if n not in LATENCIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown metric {unknown[0] if unknown else text!r}; "
                                         f"choose from {', '.join(LATENCIES)}, comma-separated")
    return names


def run_subcommand(prog: str, description: str, commands: dict[str, tuple[str, Callable[[list[str]], int]]],
                   argv: list[str]) -> int:
    """A command line of sub-commands, each its own `main(argv)`: `--help` lists them (a line each
    from `commands`: name -> (help, main)), the sub-command's own options go to its main (so that
    `PROG NAME --help` is its help), an unknown or missing one is a usage error, exit 2."""
    parser = ArgumentParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (text, _) in commands.items():
        sub.add_parser(name, help=text, add_help=False)
    try:
        args = parser.parse_args(argv[:1])
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return commands[args.command][1](argv[1:])
