"""The shared argument checks (tl_spectral.checks): a bool is never a number, numpy scalars
only where asked, and every refusal is one line "NAME must be ..., got ...; pass ..."."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tl_spectral.checks import check_int, check_number, is_int, is_real


def test_a_bool_is_never_a_number_and_numpy_only_when_asked():
    assert is_int(3) and not is_int(True) and not is_int(3.0) and not is_int("3")
    assert not is_int(np.int64(3)) and is_int(np.int64(3), numpy=True)
    assert not is_int(np.bool_(True), numpy=True)
    assert is_real(2) and is_real(2.5) and is_real(math.nan) and not is_real(False)
    assert not is_real(np.float32(1.0)) and is_real(np.float32(1.0), numpy=True)


@pytest.mark.parametrize("value, kw, ok", [
    (1, dict(minimum=1), True), (0, dict(minimum=1), False), (True, dict(minimum=0), False),
    (2.0, {}, False), (np.int32(4), dict(numpy=True, minimum=1), True),
    (np.int32(4), dict(minimum=1), False), (8, dict(minimum=2, maximum=8, even=True), True),
    (9, dict(minimum=2, maximum=10, even=True), False), (11, dict(maximum=10), False),
])
def test_check_int_accepts_exactly_the_integers_in_range(value, kw, ok):
    if ok:
        assert check_int("n", value, **kw) == int(value)
        assert type(check_int("n", value, **kw)) is int
    else:
        with pytest.raises(ValueError) as e:
            check_int("n", value, **kw)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("n must be ") and f"got {value!r}; pass " in msg


def test_the_error_names_the_bounds_and_an_example():
    with pytest.raises(ValueError, match=r"^rank must be an int >= 1, got 0; pass e.g. rank=1$"):
        check_int("rank", 0, minimum=1)
    with pytest.raises(ValueError, match=r"an even int in \[2, 8\], got 3; pass e.g. rd=2$"):
        check_int("rd", 3, minimum=2, maximum=8, even=True)
    with pytest.raises(TypeError, match="k must be 0 or more, got 'a'; pass k=0"):
        check_int("k", "a", minimum=0, what="0 or more", hint="k=0", error=TypeError)


def test_check_number():
    assert check_number("lr", 3, above=0) == 3.0
    assert check_number("x", math.inf, finite=False) == math.inf
    for bad in (0, -1, math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match=r"^lr must be a finite number > 0, got .*; pass "):
            check_number("lr", bad, above=0)
    with pytest.raises(ValueError, match=r"a finite number > -3 and >= 0, got -1"):
        check_number("lr", -1, above=-3, minimum=0)
