"""What every command line here shares: bad input is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse


class UsageError(ValueError):
    """A command-line argument argparse refused (unknown option, bad value, missing argument)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a usage error raises UsageError (one line, no usage dump), which the
    command's main turns into `error: ...` and exit status 2, like every other bad input."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")
