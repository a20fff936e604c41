"""The shared argument checks of the library: one-line errors in the project's style,
"``name`` must be <what>, got <value>; pass <what to pass>".

A ``bool`` is never a number here (``True`` is an ``int`` to Python, never a count to a
user). ``numpy=True`` also accepts numpy scalars (``numbers.Integral`` / ``numbers.Real``);
without it only Python's ``int`` (and ``float``) pass. Mode strings are checked by
:func:`tl_spectral._deprecation.check_choice`; counts of the probe runner by
:func:`tl_spectral.probes.corpus.check_count` (built on these). Importing this module needs
no torch.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

__all__ = ["check_int", "check_number", "is_int", "is_real"]


def is_int(value: Any, *, numpy: bool = False) -> bool:
    """Whether ``value`` is an integer and not a bool (``numpy``: numpy integers too)."""
    return isinstance(value, numbers.Integral if numpy else int) and not isinstance(value, bool)


def is_real(value: Any, *, numpy: bool = False) -> bool:
    """Whether ``value`` is an int or a float and not a bool (``numpy``: any real number,
    numpy scalars included). NaN and infinities count: check them with ``math.isfinite``."""
    kinds = numbers.Real if numpy else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


def _int_words(minimum: Optional[int], maximum: Optional[int], even: bool) -> str:
    kind = "an even int" if even else "an int"
    if minimum is not None and maximum is not None:
        return f"{kind} in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"{kind} >= {minimum}"
    if maximum is not None:
        return f"{kind} <= {maximum}"
    return kind


def check_int(name: str, value: Any, *, minimum: Optional[int] = None,
              maximum: Optional[int] = None, even: bool = False, numpy: bool = False,
              what: Optional[str] = None, hint: Optional[str] = None,
              error: type[Exception] = ValueError) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool; ``numpy``: numpy integers
    too) in ``[minimum, maximum]`` (either bound optional) and, with ``even``, even.

    Otherwise one line, raised as ``error``: "``name`` must be ``what``, got ``value!r``;
    pass ``hint``". ``what`` defaults to the bounds in words ("an int >= 1", "an even int in
    [2, 64]"); ``hint`` defaults to an example, ``name=<minimum>``.
    """
    ok = is_int(value, numpy=numpy) and (minimum is None or value >= minimum) \
        and (maximum is None or value <= maximum) and not (even and value % 2)
    if ok:
        return int(value)
    what = what or _int_words(minimum, maximum, even)
    if hint is None:
        example = minimum if minimum is not None else (maximum if maximum is not None else 0)
        example += 1 if even and example % 2 else 0
        hint = f"e.g. {name}={example}"
    raise error(f"{name} must be {what}, got {value!r}; pass {hint}")


def check_number(name: str, value: Any, *, above: Optional[float] = None,
                 minimum: Optional[float] = None, finite: bool = True, numpy: bool = False,
                 what: Optional[str] = None, hint: Optional[str] = None,
                 error: type[Exception] = ValueError) -> float:
    """``value`` as a ``float`` when it is a real number (not a bool; ``numpy``: numpy
    scalars too), finite unless ``finite=False``, ``> above`` and ``>= minimum`` (either
    optional); otherwise one line, raised as ``error``, in :func:`check_int`'s words."""
    ok = is_real(value, numpy=numpy) and (not finite or math.isfinite(value)) \
        and (above is None or value > above) and (minimum is None or value >= minimum)
    if ok:
        return float(value)
    if what is None:
        bounds = [f"> {above}"] * (above is not None) + [f">= {minimum}"] * (minimum is not None)
        what = " ".join(["a finite number" if finite else "a number", *bounds[:1],
                         *(f"and {b}" for b in bounds[1:])])
    if hint is None:
        example = above + 1 if above is not None else minimum if minimum is not None else 1.0
        hint = f"e.g. {name}={example}"
    raise error(f"{name} must be {what}, got {value!r}; pass {hint}")
