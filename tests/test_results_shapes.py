"""Issue 30 item 11: every result kind declares the shapes of its arrays (``array_shapes``:
``"float[layer, head]"``, dims named alike agree across fields and with metadata such as
``layers``), and ``Result.load`` refuses a file whose array was truncated, given an extra
axis, another dtype, or NaN where the kind never writes one — one line naming the file, the
field, the expected and the found shape. Every array field of every kind is declared; every
genuine result (and every result committed to the repository) still loads, equal."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_result_protocol import _instances

from tl_spectral.results import (
    _COND,
    _REGISTRY,
    Result,
    _annotation_kinds,
    _dtype_kind,
    _import_result_modules,
    _parse_shape,
    _resolve_shape,
    check_arrays,
)

ROOT = Path(__file__).resolve().parents[1]
#: container kinds: their arrays live in nested results (checked by the nested class)
CONTAINER_FIELDS = {("scale_pod", "_tensors"), ("scale_pod_heads", "_tensors")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One genuine saved file per result kind: ``{kind: (result, path)}``."""
    import warnings

    d = tmp_path_factory.mktemp("kinds")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inst = _instances(d)
    return {k: (r, r.save(d / k)) for k, r in inst.items()}


def _library_classes():
    _import_result_modules()
    import tl_spectral.analysis.scale_pod_heads  # noqa: F401

    return {k: c for k, c in _REGISTRY.items() if c.__module__.startswith("tl_spectral.")}


def _read(path):
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
    return load_file(str(path)), meta


def _arrays(kind, path):
    """The declared arrays of a saved file: ``[(file key, field, alternative)]``."""
    cls = _REGISTRY[kind]
    tensors, meta = _read(path)
    header = json.loads(meta["tl_spectral"])["fields"]
    out = []
    for key, t in tensors.items():
        field = key.split("::", 1)[0]
        if (kind, field) in CONTAINER_FIELDS:
            continue
        alts = _parse_shape(_resolve_shape(cls.array_shapes[field], header))
        alt = next(a for a in alts if a[0] == _dtype_kind(t) and len(a[2]) == t.dim())
        out.append((key, field, alt))
    return out


def _rewrite(src, dst, key, tensor):
    tensors, meta = _read(src)
    tensors[key] = tensor.contiguous()
    save_file(tensors, str(dst), metadata=meta)
    return dst


def _refused(path, field):
    with pytest.raises(ValueError) as e:
        Result.load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and field in msg, msg
    return msg


# ------------------------------------------------------------------ declarations
def test_every_array_field_of_every_kind_is_declared(saved):
    classes = _library_classes()
    assert set(saved) == set(classes)
    for kind, cls in classes.items():
        names = {f.name for f in dataclasses.fields(cls)}
        for field, spec in cls.array_shapes.items():
            assert field in names, f"{kind}: array_shapes names no field {field!r}"
            m = _COND.fullmatch(spec)
            assert m is None or m["flag"] in names, f"{kind}.{field}: no field {m['flag']!r}"
            for branch in (m["yes"], m["no"]) if m else (spec,):
                _parse_shape(branch)  # well formed
        for dim, fields in cls.array_dims.items():
            for f in (fields,) if isinstance(fields, str) else fields:
                assert f in names, f"{kind}: array_dims[{dim!r}] names no field {f!r}"
        # by annotation: every tensor field
        for f in dataclasses.fields(cls):
            allowed = _annotation_kinds(f.type)
            if allowed and "tensor" in allowed[0]:
                assert f.name in cls.array_shapes, f"declare {kind}.{f.name} in array_shapes"
        # by value: every field that holds tensors in a genuine file (dicts of tensors too)
        tensors, _ = _read(saved[kind][1])
        for key in tensors:
            field = key.split("::", 1)[0]
            if (kind, field) not in CONTAINER_FIELDS:
                assert field in cls.array_shapes, f"declare {kind}.{field} in array_shapes"


def test_a_bad_declaration_is_refused():
    for spec in ("float(layer)", "double[layer]", "float[layer-1]", "float[la yer]"):
        with pytest.raises(ValueError, match="array declaration"):
            _parse_shape(spec)


# ------------------------------------------------------------------ genuine files
def test_genuine_results_load_equal(saved):
    for kind, (r, path) in saved.items():
        back = Result.load(path)
        assert type(back) is type(r), kind
        for f in dataclasses.fields(r):
            a, b = getattr(r, f.name), getattr(back, f.name)
            if isinstance(a, torch.Tensor):
                assert torch.equal(a.cpu(), b) or (a.is_floating_point() and torch.allclose(
                    a.cpu(), b, equal_nan=True)), (kind, f.name)


def test_every_committed_result_still_loads():
    """The results shipped with the docs (files of earlier versions among them)."""
    files = sorted((ROOT / "docs" / "results").rglob("*.safetensors"))
    n = 0
    for f in files:
        _, meta = _read(f)
        if meta and "tl_spectral" in meta:
            Result.load(f)
            n += 1
    assert n >= 40, n


# ------------------------------------------------------------------ corrupted files
def test_an_extra_axis_another_dtype_or_nan_is_refused_for_every_array(saved, tmp_path):
    n = 0
    for kind, (_, path) in saved.items():
        tensors, _ = _read(path)
        for key, field, alt in _arrays(kind, path):
            t = tensors[key]
            bad = tmp_path / f"{kind}-{n}.safetensors"
            n += 1
            msg = _refused(_rewrite(path, bad, key, t.unsqueeze(0)), field)
            assert "expected" in msg and "re-save it with this version" in msg
            other = {"float": torch.int64, "int": torch.float32, "bool": torch.float32}
            msg = _refused(_rewrite(path, bad, key, t.to(other[alt[0]])), field)
            assert str(tuple(t.shape)) in msg
            if alt[0] == "float" and not alt[1] and t.numel():
                nan = t.clone().reshape(-1)
                nan[nan.numel() // 2] = float("nan")
                msg = _refused(_rewrite(path, bad, key, nan.reshape(t.shape)), field)
                assert "NaN" in msg
    assert n > 150


def _checkable_axes(kind, path):
    """``[(key, field, axis)]``: the axes whose size another array or the metadata fixes."""
    cls = _REGISTRY[kind]
    arrays = _arrays(kind, path)
    count: dict[str, int] = {}
    for _, _, alt in arrays:
        for name, _k in alt[2]:
            if name not in (None, "_"):
                count[name] = count.get(name, 0) + 1
    out = []
    for key, field, alt in arrays:
        for axis, (name, _k) in enumerate(alt[2]):
            if name is None or (name != "_" and (count[name] >= 2 or name in cls.array_dims)):
                out.append((key, field, axis))
    return out


def test_a_truncated_axis_is_refused_for_every_array(saved, tmp_path):
    n = 0
    for kind, (_, path) in saved.items():
        tensors, _ = _read(path)
        for key, field, axis in _checkable_axes(kind, path):
            t = tensors[key]
            if t.shape[axis] < 1:
                continue
            short = t.narrow(axis, 0, t.shape[axis] - 1)
            # named in the message: as the field out of line, or (a tie of two fields) as the
            # field the one blamed disagrees with
            msg = _refused(_rewrite(path, tmp_path / f"t{n}.safetensors", key, short), field)
            assert "expected" in msg and " is " in msg, msg
            n += 1
    assert n > 150


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_axis_resized_is_refused(saved, tmp_path, data):
    kind = data.draw(st.sampled_from(sorted(k for k in saved if saved[k][0].array_shapes)))
    path = saved[kind][1]
    axes = _checkable_axes(kind, path)
    key, field, axis = data.draw(st.sampled_from(axes))
    t = load_file(str(path))[key]
    size = data.draw(st.integers(0, t.shape[axis] + 3).filter(lambda s: s != t.shape[axis]))
    if size < t.shape[axis]:
        new = t.narrow(axis, 0, size)
    else:
        new = torch.cat([t, t.narrow(axis, 0, 1).expand(
            *t.shape[:axis], size - t.shape[axis], *t.shape[axis + 1:])], axis) \
            if t.shape[axis] else torch.zeros(*t.shape[:axis], size, *t.shape[axis + 1:],
                                              dtype=t.dtype)
    _refused(_rewrite(path, tmp_path / "h.safetensors", key, new), field)


def test_metadata_that_disagrees_with_the_arrays_is_refused(saved, tmp_path):
    """A dim fixed by metadata: ``layers`` one entry short of the arrays' layer axis."""
    _, path = saved["attention_stats"]
    tensors, meta = _read(path)
    header = json.loads(meta["tl_spectral"])
    header["fields"]["layers"] = header["fields"]["layers"][:1]
    bad = tmp_path / "meta.safetensors"
    save_file(tensors, str(bad), metadata={"tl_spectral": json.dumps(header)})
    msg = _refused(bad, "entropy")
    assert "the metadata 'layers' (1 entries) gives 1" in msg


def test_a_nested_layer_of_a_scale_pod_is_checked(saved, tmp_path):
    for kind in ("scale_pod", "scale_pod_heads"):
        _, path = saved[kind]
        tensors, _ = _read(path)
        key = next(k for k in tensors if k.endswith("/scalogram"))
        t = tensors[key]
        bad = _rewrite(path, tmp_path / f"{kind}.safetensors", key, t[..., :-1])
        msg = _refused(bad, "scalogram")
        assert "layers[0]" in msg


def test_check_arrays_names_the_minority_field():
    from tl_spectral.probes.attention_stats import AttentionStatsResult

    ok = {"entropy": torch.zeros(2, 3), "distance": torch.zeros(2, 3),
          "first_token_mass": torch.zeros(2, 4), "mean_pattern": torch.zeros(2, 3, 5, 5),
          "n_queries": torch.ones(2, dtype=torch.long), "layers": [0, 1]}
    with pytest.raises(ValueError, match=r"field 'first_token_mass' .* shape \(2, 4\), expected "
                                         r"float\[layer=2, head=3\]: its head is 4 where fields "
                                         r"'entropy', 'distance', 'mean_pattern' give 3"):
        check_arrays(AttentionStatsResult, ok, "x.safetensors")
