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
    #: the method :meth:`plot` calls (default: the first ``plot_*`` method of the class)
    main_plot: ClassVar[str | None] = None

    # ------------------------------------------------------------- the Result protocol
    # Every result kind answers the same calls: to_dict / to_frame / summary / repr /
    # _repr_html_ / plot / show / save / load. A kind customises it through ``rows()``
    # (its main table: the first of the methods ``rows``, ``to_rows``, ``summary_rows``,
    # ``table`` it defines), ``headline()`` (a few numbers), ``plot()`` and ``view()``.

    def _table(self) -> list[dict[str, Any]]:
        """The main table of the result, one dict per row (per layer, head, measure …)."""
        for name in ("rows", "to_rows", "summary_rows", "table"):
            f = getattr(self, name, None)
            if callable(f):
                return list(f())
        h = self.headline()
        if h:
            return [h]
        # no table of its own: one row of the scalar fields and the arrays' shapes
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if isinstance(getattr(self, f.name), (int, float, str, bool))}
        row.update({k: "×".join(map(str, v)) for k, v in _shape_fields(self)})
        return [row] if row else []

    def headline(self) -> dict[str, Any]:
        """A few headline numbers (plain Python), shown by :meth:`summary` and ``repr``."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python / numpy (tensors become ``numpy`` arrays)."""
        return {f.name: _to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_frame(self):
        """The main table (one row per layer, head, measure … of this kind) as a
        ``pandas.DataFrame``."""
        import pandas as pd

        return pd.DataFrame([{k: _to_plain(v) for k, v in r.items()} for r in self._table()])

    def summary(self) -> str:
        """A few lines of text: the kind, the shapes of its arrays, the headline numbers."""
        lines = [f"{type(self).__name__} ({self.kind})"]
        shapes = _shape_fields(self)
        if shapes:
            lines.append("  arrays: " + ", ".join(f"{k} {v}" for k, v in shapes[:8])
                         + (" …" if len(shapes) > 8 else ""))
        for k, v in list(self.headline().items())[:10]:
            lines.append(f"  {k}: {_fmt_value(v)}")
        n = len(self._table())
        lines.append(f"  table: {n} row{'s' if n != 1 else ''} (to_frame())")
        return "\n".join(lines)

    def __repr__(self) -> str:
        parts = [f"kind={self.kind!r}"]
        parts += [f"{k}={v}" for k, v in _shape_fields(self)[:4]]
        parts += [f"{k}={_fmt_value(v)}" for k, v in list(self.headline().items())[:4]]
        text = f"{type(self).__name__}({', '.join(parts)})"
        return text if len(text) <= 400 else text[:396] + " …)"

    def _repr_html_(self) -> str:
        """Jupyter: the summary table and the main figure inline (escaped, offline)."""
        import html as _html

        rows = self._table()
        head = "".join(f"<tr><th>{_html.escape(str(k))}</th><td>{_html.escape(_fmt_value(v))}"
                       "</td></tr>" for k, v in self.headline().items())
        table = ""
        if rows:
            keys = list(rows[0])
            body = "".join("<tr>" + "".join(f"<td>{_html.escape(_fmt_value(r.get(k)))}</td>"
                                            for k in keys) + "</tr>" for r in rows[:12])
            more = (f"<p>… {len(rows) - 12} more rows: <code>to_frame()</code></p>"
                    if len(rows) > 12 else "")
            table = ("<table><tr>" + "".join(f"<th>{_html.escape(str(k))}</th>" for k in keys)
                     + "</tr>" + body + "</table>" + more)
        img = ""
        try:
            fig = self.plot()
        except NotImplementedError:
            fig = None
        if fig is not None:
            img = f'<img alt="{_html.escape(self.kind)}" src="data:image/png;base64,' \
                  f'{_figure_png_base64(fig)}"/>'
        title = _html.escape(f"{type(self).__name__} ({self.kind})")
        return (f"<div><strong>{title}</strong><table>{head}</table>{table}{img}</div>")

    def plot(self, *args: Any, **kwargs: Any):
        """The main figure (a matplotlib ``Figure``)."""
        name = self.main_plot or next(
            (n for n in dir(type(self)) if n.startswith("plot_")
             and callable(getattr(type(self), n))), None)
        if name is None:
            raise NotImplementedError(f"{type(self).__name__} has no figure; use to_frame() "
                                      "or summary()")
        return getattr(self, name)(*args, **kwargs)

    def view(self, *args: Any, **kwargs: Any):
        """The circuitsvis view of this result, where one exists."""
        raise NotImplementedError(f"{type(self).__name__} has no circuitsvis view")

    def show(self, *args: Any, **kwargs: Any):
        """Display the result: its circuitsvis view where one exists (as inseq's ``show``),
        else its main figure. Returns what was shown."""
        try:
            shown = self.view(*args, **kwargs)
        except NotImplementedError:
            shown = self.plot()
        try:  # inside Jupyter: display it now
            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is not None:
                display(shown)
                _close_if_figure(shown)  # else the inline backend shows it a second time
        except ImportError:
            pass
        return shown

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


def _to_plain(value: Any) -> Any:
    """Tensors -> numpy arrays (0-d -> Python scalars), recursively through lists/dicts."""
    if isinstance(value, torch.Tensor):
        v = value.detach().cpu()
        if v.is_complex():
            arr = v.numpy()
        else:
            arr = v.numpy() if v.dtype != torch.bfloat16 else v.float().numpy()
        return arr.item() if arr.ndim == 0 else arr
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _shape_fields(result: Any) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for f in dataclasses.fields(result):
        v = getattr(result, f.name, None)
        if isinstance(v, torch.Tensor) and v.ndim > 0:
            out.append((f.name, tuple(v.shape)))
    return out


def _fmt_value(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        v = _to_plain(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, np.ndarray):
        return f"array{tuple(v.shape)}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_fmt_value(x) for x in list(v)[:6])
        return f"[{inner}{', …' if len(v) > 6 else ''}]"
    text = str(v)
    return text if len(text) <= 80 else text[:77] + "…"


def _close_if_figure(obj: Any) -> None:
    """Close a matplotlib figure (after it was displayed), leave anything else alone."""
    import sys

    if "matplotlib.figure" in sys.modules:
        from matplotlib.figure import Figure

        if isinstance(obj, Figure):
            import matplotlib.pyplot as plt

            plt.close(obj)


def _figure_png_base64(fig: Any) -> str:
    import base64
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


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
    "tl_spectral.geometry.rotary",
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
    """Class decorator: make ``Result.load`` able to rebuild ``cls``.

    Re-registering a class of the same module and name (a notebook cell run again) replaces
    the earlier definition; a *different* class claiming a registered ``kind`` is refused.
    The protocol's short ``__repr__`` replaces the dataclass one (no raw tensors)."""
    old = _REGISTRY.get(cls.kind)
    if old is not None and old is not cls and (
            old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(
            f"result kind {cls.kind!r} is already registered by {old.__module__}."
            f"{old.__qualname__}; give {cls.__qualname__} another kind")
    own = cls.__dict__.get("__repr__")
    params = cls.__dict__.get("__dataclass_params__")
    if own is not None and params is not None and params.repr and hasattr(own, "__wrapped__"):
        cls.__repr__ = Result.__repr__  # the dataclass-generated one (reprlib-wrapped)
    _REGISTRY[cls.kind] = cls
    return cls
