"""The public surface: `import tl_spectral as tls` gives every name of `__all__`, and
docs/api.md lists exactly those names."""

from __future__ import annotations

import re
from pathlib import Path

import tl_spectral as tls

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves():
    for name in tls.__all__:
        assert getattr(tls, name) is not None, name
    assert "run_probes" in dir(tls)


def test_api_doc_lists_exactly_all():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([\w.]+)` \|", text, flags=re.M)
    assert len(listed) == len(set(listed)), "a name is listed twice"
    assert sorted(listed) == sorted(tls.__all__)


def test_unknown_name_says_where_to_look():
    import pytest

    with pytest.raises(AttributeError, match="__all__"):
        tls.no_such_thing  # noqa: B018
