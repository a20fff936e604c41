"""Temporary files and folders of killed runs: each name records the pid of the process
that made it, so a later run removes only what is provably a dead process's own."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a pid <= 0 counts as alive: never ours to clean)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: alive, another user's
        return True
    return True


def remove_dead_leftovers(folder: str | os.PathLike, patterns: list[str]) -> list[Path]:
    """Remove the entries of ``folder`` whose names match one of the regular expressions
    ``patterns`` in full (group ``pid``: the process that made them) and whose process is
    no longer alive: the temporary folders and files of a killed run. Returns what was
    removed."""
    folder = Path(folder)
    gone: list[Path] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return gone
    for name in names:
        for pat in patterns:
            m = re.fullmatch(pat, name)
            if m is None or pid_alive(int(m.group("pid"))):
                continue
            p = folder / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    p.unlink()
                except OSError:
                    pass
            gone.append(p)
            break
    return gone
