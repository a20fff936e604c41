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


#: The largest ``--seed``: torch.manual_seed and the window draws take [0, 2**63).
MAX_SEED = 2**63 - 1


def seed(text: str) -> int:
    """``type=`` for a ``--seed`` option: an int in [0, 2**63) (a larger one overflowed in
    torch with an unreadable message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text} is out of range; pass an integer in "
                                         f"[0, {MAX_SEED:,}]")
    return value
