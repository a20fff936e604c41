"""Result.save / Result.load: file naming, overwrite protection, permissions, broken files."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from typing import ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from tl_spectral.results import Result, register_result, result_path


@register_result
@dataclasses.dataclass
class _Toy(Result):
    kind: ClassVar[str] = "test_results_toy"

    values: torch.Tensor
    label: str
    scale: float = 1.0


@register_result
@dataclasses.dataclass
class _Checked(Result):
    kind: ClassVar[str] = "test_results_checked"
    n: int

    def __post_init__(self):
        if self.n < 0:
            raise ValueError("n must be >= 0")
        self.n + 1  # TypeError on a string


def _toy(v: float = 1.0) -> _Toy:
    return _Toy(values=torch.full((3,), v), label="toy")


# ----------------------------------------------------------------------------- naming
@pytest.mark.parametrize(
    "given_name,written",
    [
        ("a.v1", "a.v1.safetensors"),
        ("a.v2", "a.v2.safetensors"),
        ("x", "x.safetensors"),
        ("x.safetensors", "x.safetensors"),
        ("run.2024.01", "run.2024.01.safetensors"),
    ],
)
def test_suffix_is_appended_not_substituted(tmp_path, given_name, written):
    out = _toy().save(tmp_path / given_name)
    assert out == tmp_path / written and out.is_file()
    assert result_path(tmp_path / given_name) == out
    assert torch.equal(Result.load(out).values, torch.ones(3))


def test_versioned_names_do_not_collide(tmp_path):
    a = _toy(1.0).save(tmp_path / "a.v1")
    b = _toy(2.0).save(tmp_path / "a.v2")
    assert a != b
    assert float(Result.load(a).values[0]) == 1.0
    assert float(Result.load(b).values[0]) == 2.0


@settings(max_examples=30, deadline=None)
@given(stem=st.text(alphabet="abcxyz019_-", min_size=1, max_size=8),
       suffixes=st.lists(st.text(alphabet="abv0123", min_size=1, max_size=3), max_size=3))
def test_distinct_names_give_distinct_files(tmp_path_factory, stem, suffixes):
    names = [stem + "".join("." + s for s in suffixes[:i]) for i in range(len(suffixes) + 1)]
    paths = {result_path(n) for n in names}
    assert len(paths) == len(set(names))
    assert all(p.name.endswith(".safetensors") for p in paths)


# ----------------------------------------------------------------------------- overwrite
def test_existing_file_is_refused_unless_overwrite(tmp_path):
    p = _toy(1.0).save(tmp_path / "r.safetensors")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        _toy(2.0).save(tmp_path / "r")
    assert float(Result.load(p).values[0]) == 1.0  # untouched
    assert _toy(3.0).save(tmp_path / "r", overwrite=True) == p
    assert float(Result.load(p).values[0]) == 3.0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.safetensors"]  # no temp left


def test_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        p = _toy().save(tmp_path / "perm")
        j = tmp_path / "side.json"
        j.write_text("{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o640 == stat.S_IMODE(j.stat().st_mode)
    old = os.umask(0o022)
    try:
        p2 = _toy().save(tmp_path / "perm2")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p2.stat().st_mode) == 0o644


# ----------------------------------------------------------------------------- broken files
def _write(path, meta: str | None, tensors=None):
    save_file(tensors if tensors is not None else {"values": torch.zeros(3)}, str(path),
              metadata=None if meta is None else {"tl_spectral": meta})
    return path


def _header(**fields):
    return json.dumps({"format": "tl_spectral.result/1", "kind": "test_results_toy",
                       "fields": fields})


@pytest.mark.parametrize(
    "meta,match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON list, not an object"),
        (json.dumps({"format": "tl_spectral.result/1", "fields": {}}), "no result kind"),
        (json.dumps({"format": "tl_spectral.result/1", "kind": "test_results_toy",
                     "fields": [1]}), "'fields'"),
        (_header(), r"lacks the field\(s\) \['label'\]"),
        (_header(label="x", bogus=1, __tensor_dicts__="values"), "__tensor_dicts__"),
        (json.dumps({"format": "other/9", "kind": "x", "fields": {}}), "unknown result format"),
    ],
)
def test_broken_metadata_gives_clear_value_error(tmp_path, meta, match):
    p = _write(tmp_path / "broken.safetensors", meta)
    with pytest.raises(ValueError, match=match) as info:
        Result.load(p)
    assert "broken.safetensors" in str(info.value)


def test_constructor_failure_is_reported_as_value_error(tmp_path):
    for bad, err in ((-1, "n must be"), ("seven", "field 'n' .* is str, the class holds int")):
        p = _write(tmp_path / f"c{err[:3]}.safetensors",
                   json.dumps({"format": "tl_spectral.result/1", "kind": "test_results_checked",
                               "fields": {"n": bad}}), tensors={})
        with pytest.raises(ValueError, match=err) as info:
            Result.load(p)
        assert p.name in str(info.value)


def test_round_trip_unchanged(tmp_path):
    r = _Toy(values=torch.arange(4.0), label="λ", scale=2.5)
    back = Result.load(r.save(tmp_path / "ok"))
    assert isinstance(back, _Toy) and back.label == "λ" and back.scale == 2.5
    assert torch.equal(back.values, r.values)
