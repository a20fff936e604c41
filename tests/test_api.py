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


def test_api_doc_probe_table_is_generated_from_the_probe_modules():
    """docs/api.md's probe table is what `python -m tl_spectral.api_doc docs/api.md` writes
    (the probe modules' public names, found by file), and every probe module's names are in
    tl_spectral.__all__ (nothing listed by hand)."""
    from tl_spectral.api_doc import blocks, fill
    from tl_spectral.probes import PROBE_MODULES

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert "<!-- generated: api-probes -->" in text
    assert fill(text, blocks(plugins=False)) == text, \
        "docs/api.md is stale: run python -m tl_spectral.api_doc docs/api.md"
    derived = {n for names in PROBE_MODULES.values() for n in names}
    assert derived <= set(tls.__all__) and len(derived) >= 12
    assert {m.rpartition(".")[2] for m in PROBE_MODULES} >= {
        "attention_stats", "contributions", "fields", "head_scores", "sinks"}
    assert tls._PUBLIC["SinkProbe"] == "tl_spectral.probes.sinks"


def test_import_stays_cheap():
    """`import tl_spectral` loads no torch, no probe and no plotting; the first look at a
    probe name (or at __all__) derives the probe modules' names."""
    import subprocess
    import sys

    code = ("import sys, tl_spectral as t; print(sorted(m for m in sys.modules if m == 'torch' "
            "or m.startswith(('matplotlib', 'tl_spectral.probes', 'tl_spectral.viz'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
