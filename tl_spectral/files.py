"""File-system helpers of the library (ground floor: imports nothing of it)."""

from __future__ import annotations

import os
import threading

__all__ = ["current_umask"]

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the system allows (Linux:
    ``/proc/self/status``); elsewhere set and restored under a lock (setting it to read it
    is racy against threads outside the library)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask
