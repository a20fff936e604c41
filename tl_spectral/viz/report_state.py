"""A report's saved state: everything its renders read, in ``results/`` beside the files the
sections save, so that the page re-renders without the model
(:func:`tl_spectral.viz.sections.rerender`, ``tl-spectral render FOLDER``).

``results/report_state.json`` (:data:`STATE_FILE`) is the manifest: the section keys in
report order, the :class:`~tl_spectral.viz.context.ReportOptions`, the page's title and model
name, the :class:`~tl_spectral.viz.context.ModelDescription` (what the renders read of the
model), the token strings the views showed (``ctx.token_strings``' answers, replayed), the
windows (``results/state/windows.safetensors``: tokens and mask) and, per result the renders
read (:class:`ReadLog` records them), where it is:

* a :class:`~tl_spectral.results.Result`: a ``.safetensors`` file (``Result.save``); one a
  section already saved byte for byte under ``results/`` is not written twice;
* a plain JSON value (dict, list, str, number, bool, None): in the manifest, or in
  ``results/state/<key>.json.gz`` (gzip) when large;
* a flat dict of tensors and plain values (e.g. ``{layer: tensor}``): a ``.safetensors`` file
  of its tensors, the plain values and the keys' order in its metadata.

A result of another type is listed as unsaved (the report is written; re-rendering it says
which result it lacks).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any, Optional

#: the manifest of a report's saved state, in ``results/``
STATE_FILE = "report_state.json"
#: the folder (in ``results/``) of the state's own files
STATE_DIR = "state"
STATE_FORMAT = "tl_spectral.report_state/1"
#: plain values longer than this (characters of JSON) get a file of their own
INLINE_JSON = 20_000


class ReadLog(dict):
    """The results dict a render gets: it notes every key read (``[]``, ``get``, ``in``),
    in order of first read — what a re-render needs saved."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.read: dict[str, None] = {}

    def _note(self, key: Any) -> None:
        if dict.__contains__(self, key):
            self.read.setdefault(key, None)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self._note(key)
        return super().__contains__(key)


def is_plain(value: Any) -> bool:
    """Whether ``value`` is JSON as it is: dicts with str keys, lists, str, int, float,
    bool, None (a tuple is not: JSON would read it back as a list)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return type(value) in (type(None), str, bool, int, float)
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def _json_like(value: Any) -> Any:
    """A value made plain JSON where it can be (tuples as lists, numpy and 0-d scalars as
    Python numbers), else ``value`` itself."""
    try:
        return json.loads(json.dumps(value, default=_scalar))
    except (TypeError, ValueError):
        return value


def _scalar(obj: Any) -> Any:
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:
        return obj.item()
    raise TypeError(type(obj).__name__)


def as_saved(value: Any) -> Any:
    """``value`` as a re-render reads it back: plain values (and the plain entries of a
    dict of tensors) through JSON — what the run's render then reads too, so both see the
    same types (lists for tuples, Python numbers)."""
    if _is_tensor_dict(value):
        return {k: v if _is_tensor(v) else _json_like(v) for k, v in value.items()}
    if isinstance(value, (dict, list, tuple)) or _is_number(value):
        out = _json_like(value)
        return out if is_plain(out) else value
    return value


def _is_number(value: Any) -> bool:
    return hasattr(value, "item") and getattr(value, "ndim", None) == 0 and not _is_tensor(value)


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _is_tensor_dict(value: Any) -> bool:
    return isinstance(value, dict) and any(_is_tensor(v) for v in value.values()) and all(
        isinstance(k, (str, int)) and not isinstance(k, bool) for k in value)


def save_state(ctx: Any, sections: list, results: ReadLog, title: Optional[str]) -> Path:
    """Write the manifest and the files of the state into ``ctx.results_dir``; returns the
    manifest's path."""
    from tl_spectral.viz.context import ModelDescription

    folder = Path(ctx.results_dir)
    (folder / STATE_DIR).mkdir(parents=True, exist_ok=True)
    entries = {key: _save_value(dict.__getitem__(results, key), key, folder)
               for key in results.read}
    manifest = {
        "format": STATE_FORMAT,
        "sections": [s.key for s in sections],
        "title": title,
        "model_name": ctx.model_name,
        "model": ModelDescription.of(ctx.view).to_json(),
        "options": dataclasses.asdict(ctx.options),
        "windows": _save_windows(ctx, folder),
        "token_strings": [[list(k), list(v)] for k, v in ctx.token_record.items()],
        "results": entries,
    }
    path = folder / STATE_FILE
    # default=str: a header line given as another type (a Path) is saved as the page shows it
    path.write_text(json.dumps(manifest, indent=1, default=str), encoding="utf-8")
    return path


def _save_windows(ctx: Any, folder: Path) -> str:
    """The windows (tokens, and the mask when the context has one) as safetensors."""
    import torch
    from safetensors.torch import save_file

    tokens = ctx.tokens
    if not isinstance(tokens, torch.Tensor):  # a token file's lazy windows: read them
        from tl_spectral.probes.corpus import as_corpus

        corpus = as_corpus(tokens)
        tokens = torch.cat([corpus.batch(lo, min(lo + 64, len(corpus)))[0]
                            for lo in range(0, len(corpus), 64)])
    tensors = {"tokens": tokens.detach().cpu().contiguous()}
    if ctx.mask is not None:
        tensors["mask"] = torch.as_tensor(ctx.mask).detach().cpu().contiguous()
    rel = f"{STATE_DIR}/windows.safetensors"
    save_file(tensors, str(folder / rel))
    _user_mode(folder / rel)
    return rel


def _user_mode(path: Path) -> None:
    """The permissions of a file the user creates (safetensors writes 0o600)."""
    import os

    from tl_spectral.files import current_umask

    os.chmod(path, 0o666 & ~current_umask())


def _save_value(value: Any, key: str, folder: Path) -> dict:
    """One result of the state: written (or found already written) under ``folder``; its
    manifest entry."""
    from tl_spectral.results import Result

    if isinstance(value, Result):
        rel = f"{STATE_DIR}/{key}.safetensors"
        value.save(folder / rel, overwrite=True)
        return {"kind": "result", "file": _dedupe(folder, rel)}
    if is_plain(value):
        text = json.dumps(value)
        if len(text) <= INLINE_JSON:
            return {"kind": "json", "value": value}
        rel = f"{STATE_DIR}/{key}.json.gz"
        # no time stamp in the header: the same state gives the same bytes; level 6 (zlib's
        # default): 3% larger than 9 at a fifth of the time on the views' packed maps
        (folder / rel).write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=6,
                                                 mtime=0))
        return {"kind": "json", "file": rel}
    if _is_tensor_dict(value):
        plain = {str(k): v for k, v in value.items() if not _is_tensor(v)}
        if is_plain(plain):
            return _save_tensor_dict(value, plain, key, folder)
    return {"kind": "unsaved", "type": type(value).__name__}


def _save_tensor_dict(value: dict, plain: dict, key: str, folder: Path) -> dict:
    from safetensors.torch import save_file

    tensors = {str(k): v.detach().cpu().contiguous() for k, v in value.items() if _is_tensor(v)}
    order = [[k, isinstance(k, int)] for k in value]
    rel = f"{STATE_DIR}/{key}.safetensors"
    save_file(tensors, str(folder / rel),
              metadata={"tl_spectral_state": json.dumps({"plain": plain, "order": order})})
    _user_mode(folder / rel)
    return {"kind": "tensors", "file": rel}


def _dedupe(folder: Path, rel: str) -> str:
    """``rel``, or the name of a file of ``folder`` with the very same bytes (then ``rel``
    is removed): what a section saved already is not kept twice."""
    path = folder / rel
    data = path.read_bytes()
    for other in sorted(folder.glob("*.safetensors")):
        if other.stat().st_size == len(data) and other.read_bytes() == data:
            path.unlink()
            return other.name
    return rel


def read_manifest(folder: Path) -> dict:
    """The manifest of the report in ``folder`` (checked: a report with a saved state)."""
    path = Path(folder) / "results" / STATE_FILE
    if not path.is_file():
        raise ValueError(f"{folder} holds no saved report state (results/{STATE_FILE}): pass "
                         "a report folder written by tl-spectral analyze since re-rendering "
                         "exists, or run tl-spectral analyze again")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); run tl-spectral analyze again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != STATE_FORMAT:
        raise ValueError(f"{path} is not a report state of this version (format "
                         f"{STATE_FORMAT}); run tl-spectral analyze again")
    return manifest


def load_results(manifest: dict, folder: Path) -> dict[str, Any]:
    """The results of a manifest, read from ``folder`` (the report's ``results/``)."""
    out = {}
    for key, entry in manifest["results"].items():
        out[key] = _load_value(entry, key, Path(folder))
    return out


def _inside(folder: Path, rel: Any) -> Path:
    """``folder / rel``, refused unless it stays inside ``folder`` (a manifest names files
    of its own report only)."""
    path = (Path(folder) / str(rel)).resolve()
    if not path.is_relative_to(Path(folder).resolve()):
        raise ValueError(f"the report's state names {rel!r}, outside its results folder; "
                         "this is not a state tl-spectral wrote: run tl-spectral analyze again")
    return path


def _load_value(entry: dict, key: str, folder: Path) -> Any:
    from tl_spectral.results import Result

    kind = entry.get("kind")
    if "file" in entry:
        entry = {**entry, "file": _inside(folder, entry["file"])}
    if kind == "result":
        return Result.load(folder / entry["file"])
    if kind == "json":
        if "file" in entry:
            return json.loads(gzip.decompress((folder / entry["file"]).read_bytes()))
        return entry["value"]
    if kind == "tensors":
        from safetensors import safe_open

        with safe_open(str(folder / entry["file"]), framework="pt") as fh:
            meta = json.loads(fh.metadata()["tl_spectral_state"])
            out = {}
            for k, is_int in meta["order"]:
                name = str(k)
                out[int(k) if is_int else k] = (fh.get_tensor(name) if name not in meta["plain"]
                                                else meta["plain"][name])
        return out
    raise ValueError(f"the report's state could not save the result {key!r} (a "
                     f"{entry.get('type', kind)}): this report cannot be re-rendered; run "
                     "tl-spectral analyze again")


def load_windows(manifest: dict, folder: Path) -> tuple[Any, Any]:
    """The windows ``(tokens, mask or None)`` of a manifest."""
    from safetensors.torch import load_file

    t = load_file(str(_inside(folder, manifest["windows"])))
    return t["tokens"], t.get("mask")
