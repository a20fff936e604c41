"""Issue 30 item 11: Result.load checks every field against its dataclass (kind of value,
arrays that fit together) before returning, reports hostile metadata as ValueError, and
finds the file save() wrote under the name save() was given."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_native
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tl_spectral.results import Result


@pytest.fixture(scope="module")
def stats(tmp_path_factory):
    from tl_spectral.probes import AttentionStatsProbe, run_probes

    m = make_native(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=32, d_vocab=20)
    toks = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    r = run_probes(m, toks, [AttentionStatsProbe()], progress=False)["attention_stats"]
    return r.save(tmp_path_factory.mktemp("r") / "stats")


def _rewrite(src, dst, tensors=None, fields=None):
    t = load_file(str(src))
    with safe_open(str(src), "pt") as fh:
        header = json.loads(fh.metadata()["tl_spectral"])
    t.update(tensors or {})
    header["fields"].update(fields or {})
    save_file(t, str(dst), metadata={"tl_spectral": json.dumps(header)})
    return dst


def test_a_mis_shaped_array_fails_at_load_not_in_to_frame(stats, tmp_path):
    good = Result.load(stats)
    bad = _rewrite(stats, tmp_path / "bad.safetensors",
                   tensors={"entropy": good.entropy[:1].contiguous()})
    with pytest.raises(ValueError, match=r"bad.safetensors: field 'entropy' of this "
                                         r"'attention_stats' result has shape \(1, 2\), "
                                         r"expected float\[layer=2, head=2\]"):
        Result.load(bad)
    # arrays that agree with each other but not with the rows they build still fail at load
    from tl_spectral.results import _validate_built

    good.entropy = good.entropy[:1]
    with pytest.raises(ValueError, match="do not fit together"):
        _validate_built(good, tmp_path / "x")


@pytest.mark.parametrize("fields,tensors,msg", [
    ({"model_name": 5}, None, "field 'model_name' .* is int, the class holds str"),
    ({"layers": "0,1"}, None, "field 'layers' .* is str, the class holds list"),
    ({"causal": "yes"}, None, "field 'causal' .* is str, the class holds bool"),
    ({"entropy": [1, 2]}, None, "field 'entropy' .* is list, the class holds tensor"),
    (None, {"model_name": torch.zeros(2)}, r"field 'model_name' .* is a tensor \(2,\)")])
def test_a_field_of_the_wrong_kind_is_refused(stats, tmp_path, fields, tensors, msg):
    t = load_file(str(stats))
    if fields and "entropy" in fields:
        t.pop("entropy")
        with safe_open(str(stats), "pt") as fh:
            header = json.loads(fh.metadata()["tl_spectral"])
        header["fields"].update(fields)
        save_file(t, str(tmp_path / "bad.safetensors"),
                  metadata={"tl_spectral": json.dumps(header)})
        bad = tmp_path / "bad.safetensors"
    else:
        bad = _rewrite(stats, tmp_path / "bad.safetensors", tensors=tensors, fields=fields)
    with pytest.raises(ValueError, match=msg):
        Result.load(bad)


def test_deeply_nested_metadata_is_a_value_error(tmp_path):
    p = tmp_path / "deep.safetensors"
    save_file({"x": torch.zeros(1)}, str(p), metadata={"tl_spectral": "[" * 100_000})
    with pytest.raises(ValueError, match="not valid JSON"):
        Result.load(p)


def test_load_takes_the_name_save_took(stats, tmp_path):
    r = Result.load(stats)
    written = r.save(tmp_path / "x")
    assert written.name == "x.safetensors"
    back = Result.load(tmp_path / "x")
    assert torch.equal(back.entropy, r.entropy)
    assert Result.load(str(tmp_path / "x")).kind == "attention_stats"
    with pytest.raises(FileNotFoundError):
        Result.load(tmp_path / "y")
