"""Give the C heap's free pages back to the operating system between the stages of a run.

glibc keeps memory freed by the many short-lived ``T × T`` buffers of a probe pass inside its
heap (``malloc``'s arenas), below blocks still in use: the process's resident set then holds
the probes' states plus these holes, which grow layer after layer (about 100 MiB over the 30
layers of SmolLM2-135M at T = 1,024). :func:`release_free_heap` calls glibc's
``malloc_trim(0)``, which returns every whole free page of the heap to the system; the runner
calls it after a pass, before the results are built, and during the pass once per
:data:`TRIM_BYTES` of attention patterns its layers captured (:func:`note_freed`: a trim costs
milliseconds, worth it only after large buffers came and went; issue 42). Elsewhere (macOS,
musl, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any, Optional


@functools.lru_cache(maxsize=1)
def _trim() -> Optional[Any]:
    """glibc's ``malloc_trim`` (None where there is none)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_free_heap() -> bool:
    """``malloc_trim(0)``: True when glibc gave pages back, False when it had none to give
    or there is no glibc."""
    fn = _trim()
    return bool(fn(0)) if fn is not None else False


#: attention-pattern bytes captured between two trims during a pass (128 MiB: four layers of
#: SmolLM2-135M at T = 1,024, batch 1)
TRIM_BYTES = 128 << 20


def note_freed(counter: list[int], nbytes: int) -> None:
    """Add ``nbytes`` (a layer's capture, just freed) to ``counter[0]``; trim the heap and
    restart the count once it reaches :data:`TRIM_BYTES`."""
    counter[0] += int(nbytes)
    if counter[0] >= TRIM_BYTES:
        counter[0] = 0
        release_free_heap()
