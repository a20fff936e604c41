"""Result objects: dataclasses of tensors + JSON metadata, saved as safetensors.

Every analysis returns a subclass of :class:`Result`. A result is a dataclass whose
fields are either tensors (saved in one ``.safetensors`` file) or JSON-serialisable
values (saved in the safetensors metadata under ``"tl_spectral"``). ``Result.load``
never unpickles anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

try:
    from safetensors import SafetensorError as SafetensorsError
except ImportError:  # pragma: no cover
    SafetensorsError = Exception  # type: ignore[misc,assignment]
from safetensors.torch import load_file, save_file

_REGISTRY: dict[str, type["Result"]] = {}

_FORMAT = "tl_spectral.result/1"


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    return value


@dataclasses.dataclass
class Result:
    """Base class. Subclasses are dataclasses; register them with ``@register_result``."""

    kind: ClassVar[str] = "result"

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the result to a ``.safetensors`` file. Returns the path written.

        The suffix ``.safetensors`` is appended unless ``path`` already ends with it, never
        substituted for another one: ``"a.v1"`` and ``"a.v2"`` write ``a.v1.safetensors`` and
        ``a.v2.safetensors``; ``"x"`` and ``"x.safetensors"`` both write ``x.safetensors``.
        An existing file is refused (``FileExistsError``) unless ``overwrite=True``. The
        file is written beside its target and renamed into place (a crash leaves the old
        file whole), with the permissions of any file the user creates (``0o666`` less
        the umask), not safetensors' ``0o600``.
        """
        path = result_path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(
                f"{path} exists; pass overwrite=True to replace it, or choose another name"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                tensors[f.name] = value.detach().cpu().contiguous()
            elif isinstance(value, dict) and value and all(
                isinstance(v, torch.Tensor) for v in value.values()
            ):
                for k, v in value.items():
                    tensors[f"{f.name}::{k}"] = v.detach().cpu().contiguous()
                meta.setdefault("__tensor_dicts__", []).append(f.name)
            else:
                meta[f.name] = _to_jsonable(value)
        header = {"format": _FORMAT, "kind": self.kind, "fields": meta}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            save_file(tensors, str(tmp), metadata={"tl_spectral": json.dumps(header)})
            os.chmod(tmp, 0o666 & ~_umask())
            if overwrite:
                os.replace(tmp, path)
            else:
                _link_exclusive(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Result":
        """Load a result saved by :meth:`save`. Raises ``ValueError`` on foreign files."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no result file at {path}")
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as fh:
                raw = (fh.metadata() or {}).get("tl_spectral")
            tensors = load_file(str(path))
        except (SafetensorsError, OSError, ValueError) as exc:
            raise ValueError(
                f"{path} is not a readable safetensors file ({exc}); pass a file written by "
                "Result.save()"
            ) from exc
        if raw is None:
            raise ValueError(f"{path} is a safetensors file but not a tl_spectral result")
        try:
            header = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}: the tl_spectral metadata is not valid JSON ({exc}); the file is "
                "damaged or was not written by Result.save()"
            ) from None
        if not isinstance(header, dict):
            raise ValueError(
                f"{path}: the tl_spectral metadata is a JSON {type(header).__name__}, not an "
                "object with 'format', 'kind' and 'fields'"
            )
        if header.get("format") != _FORMAT:
            raise ValueError(f"{path}: unknown result format {header.get('format')!r}")
        kind = header.get("kind")
        if not isinstance(kind, str):
            raise ValueError(f"{path}: the metadata has no result kind (got {kind!r})")
        if kind not in _REGISTRY:
            _import_result_modules()
        target = _REGISTRY.get(kind)
        if target is None:
            raise ValueError(f"{path}: unknown result kind {kind!r}; known: {sorted(_REGISTRY)}")
        if cls is not Result and not issubclass(target, cls):
            raise ValueError(f"{path} holds a {kind!r} result, not a {cls.kind!r} one")
        fields = header.get("fields")
        if not isinstance(fields, dict):
            raise ValueError(
                f"{path}: the metadata 'fields' of this {kind!r} result is "
                f"{type(fields).__name__}, not an object of field values"
            )
        fields = dict(fields)
        dict_names = fields.pop("__tensor_dicts__", [])
        if not isinstance(dict_names, list) or not all(isinstance(n, str) for n in dict_names):
            raise ValueError(f"{path}: metadata '__tensor_dicts__' must be a list of field names")
        for name in dict_names:
            fields[name] = {}
        for key, t in tensors.items():
            if "::" in key:
                name, sub = key.split("::", 1)
                if not isinstance(fields.setdefault(name, {}), dict):
                    raise ValueError(f"{path}: tensor {key!r} belongs to field {name!r}, which "
                                     "the metadata holds as a plain value")
                fields[name][sub] = t
            else:
                fields[key] = t
        names = {f.name for f in dataclasses.fields(target)}
        required = {
            f.name
            for f in dataclasses.fields(target)
            if f.init
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        }
        missing = sorted(required - set(fields))
        if missing:
            raise ValueError(
                f"{path}: this {kind!r} result lacks the field(s) {missing}; the file is "
                "damaged or was written by an incompatible version"
            )
        try:
            return target(**{k: v for k, v in fields.items() if k in names})
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ValueError(
                f"{path}: cannot rebuild the {kind!r} result from its fields "
                f"({type(exc).__name__}: {exc})"
            ) from exc


def result_path(path: str | Path) -> Path:
    """The file :meth:`Result.save` writes for ``path``: ``.safetensors`` appended unless
    already there (``"a.v1"`` → ``a.v1.safetensors``)."""
    path = Path(path)
    if not path.name.endswith(".safetensors"):
        path = path.with_name(path.name + ".safetensors")
    return path


def _umask() -> int:
    """The process umask (read from /proc where possible: setting it to read it is racy
    under threads)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _link_exclusive(tmp: Path, path: Path) -> None:
    """Move ``tmp`` to ``path`` unless ``path`` exists (atomically where hard links work)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(
            f"{path} exists; pass overwrite=True to replace it, or choose another name"
        ) from None
    except OSError:  # no hard links on this file system
        if path.exists():
            raise FileExistsError(
                f"{path} exists; pass overwrite=True to replace it, or choose another name"
            ) from None
        os.replace(tmp, path)

_RESULT_MODULES = (
    "tl_spectral.probes",
    "tl_spectral.analysis.pod",
    "tl_spectral.analysis.scale_pod",
    "tl_spectral.analysis.contributions",
    "tl_spectral.analysis.sinks",
    "tl_spectral.geometry.qk",
    "tl_spectral.geometry.cascade",
    "tl_spectral.models.ablations",
    "tl_spectral.models.surgery",
)


def _import_result_modules() -> None:
    """Import every module that defines Result kinds, so ``Result.load`` knows them all."""
    import importlib

    for name in _RESULT_MODULES:
        importlib.import_module(name)


def register_result(cls: type[Result]) -> type[Result]:
    """Class decorator: make ``Result.load`` able to rebuild ``cls``."""
    if cls.kind in _REGISTRY and _REGISTRY[cls.kind] is not cls:
        raise ValueError(f"result kind {cls.kind!r} registered twice")
    _REGISTRY[cls.kind] = cls
    return cls
