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


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) says the disk or the user's quota
    is full: an OSError with ENOSPC / EDQUOT, or a message with 'No space left' or 'Disk
    quota exceeded' (safetensors, torch and others re-raise the OS's error as text)."""
    import errno

    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            return True
        text = str(e).lower()
        if "no space left" in text or "disk quota exceeded" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


def disk_full_message(e: BaseException) -> str:
    """One line: what filled up, and (unless the error already says how) what to do."""
    where = getattr(e, "filename", None)
    msg = one_line(e)
    at = f" while writing {where}" if where and str(where) not in msg else ""
    advice = "" if "free" in msg.lower() else (
        "; free some space or pass an output folder (--out, -o) on another disk, and run "
        "again")
    return f"the disk is full or over quota{at}: {msg}{advice}"


def one_line(e: BaseException) -> str:
    """An exception's message on one line (a missing file's name added)."""
    msg = str(e) or type(e).__name__
    if isinstance(e, FileNotFoundError) and e.filename and str(e.filename) not in msg:
        msg = f"{msg}: {e.filename}"
    return " ".join(msg.split())
