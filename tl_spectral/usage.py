"""User errors of the command line: :class:`UsageError` and an ``ArgumentParser`` whose
errors are one line (no usage dump) — shared by ``tl-spectral`` and the studies."""

from __future__ import annotations

import argparse


class UsageError(ValueError):
    """Bad input from the user: the command line prints its message as one line, exit 2."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that raises :class:`UsageError` instead of printing the
    usage and exiting, so every user error is one line with exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")
