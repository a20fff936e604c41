"""Result objects: dataclasses of tensors + JSON metadata, saved as safetensors.

Every analysis returns a subclass of :class:`Result`. A result is a dataclass whose
fields are either tensors (saved in one ``.safetensors`` file) or JSON-serialisable
values (saved in the safetensors metadata under ``"tl_spectral"``). ``Result.load``
never unpickles anything.
"""

from __future__ import annotations

import dataclasses
import json
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
    def save(self, path: str | Path) -> Path:
        """Write the result to ``path`` (a ``.safetensors`` file). Returns the path."""
        path = Path(path)
        if path.suffix != ".safetensors":
            path = path.with_suffix(".safetensors")
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
        save_file(tensors, str(path), metadata={"tl_spectral": json.dumps(header)})
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
        header = json.loads(raw)
        if header.get("format") != _FORMAT:
            raise ValueError(f"{path}: unknown result format {header.get('format')!r}")
        kind = header["kind"]
        if kind not in _REGISTRY:
            _import_result_modules()
        target = _REGISTRY.get(kind)
        if target is None:
            raise ValueError(f"{path}: unknown result kind {kind!r}; known: {sorted(_REGISTRY)}")
        if cls is not Result and not issubclass(target, cls):
            raise ValueError(f"{path} holds a {kind!r} result, not a {cls.kind!r} one")
        fields = dict(header["fields"])
        dict_names = fields.pop("__tensor_dicts__", [])
        for name in dict_names:
            fields[name] = {}
        for key, t in tensors.items():
            if "::" in key:
                name, sub = key.split("::", 1)
                fields.setdefault(name, {})[sub] = t
            else:
                fields[key] = t
        names = {f.name for f in dataclasses.fields(target)}
        return target(**{k: v for k, v in fields.items() if k in names})


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
