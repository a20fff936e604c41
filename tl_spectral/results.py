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
import re
import sys
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch

try:
    from safetensors import SafetensorError as SafetensorsError
except ImportError:  # pragma: no cover
    SafetensorsError = Exception  # type: ignore[misc,assignment]
from safetensors.torch import load_file, save_file

from tl_spectral._deprecation import MOVED_MODULES
from tl_spectral.checks import is_int, is_real
from tl_spectral.files import current_umask

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
    #: the arrays of this kind: field name -> ``"dtype[dim, dim, …]"`` (alternatives joined by
    #: ``|``; a field holding a dict of tensors declares each entry). ``dtype``: ``float``,
    #: ``int``, ``bool``; ``float?``: may hold NaN/inf (else every value must be finite).
    #: ``dim``: a name (every dim of that name, in every field, has one size), ``name+1``
    #: (one more than ``name``), an integer (that size), ``_`` (any size); ``"A if flag else
    #: B"``: ``A`` where the bool metadata field ``flag`` is true. Checked by
    #: :meth:`load` (:func:`check_arrays`); every tensor field must be declared.
    array_shapes: ClassVar[dict[str, str]] = {}
    #: dims fixed by metadata fields: dim name -> field name(s); an int field is the size, a
    #: list field's length is.
    array_dims: ClassVar[dict[str, Any]] = {}

    # ------------------------------------------------------------- the Result protocol
    # Every result kind answers the same calls: to_dict / to_rows / to_frame / summary / repr
    # / _repr_html_ / plot / show / save / load. A kind customises it through ``to_rows()``
    # (its main table, a list of dicts), ``headline()`` (a few numbers), and its figures
    # (``plot`` / ``plot_*`` / ``view``, drawn by the plotting leaf through ``_draw``).

    def to_rows(self) -> list[dict[str, Any]]:
        """The main table, one dict per row (one row per layer, head, measure … of this
        kind): the one name for it in every kind, beside :meth:`to_dict` and
        :meth:`to_frame` (pandas). Kinds with a table override this; here: a kind of another
        package that still names its table ``rows()``, ``summary_rows()`` or ``table()``
        (the old names) is read with a DeprecationWarning; else the headline as one row, else
        one row of the scalar fields and the arrays' shapes."""
        legacy = next((n for n in ("rows", "summary_rows", "table")
                       if callable(getattr(self, n, None))), None)
        if legacy is not None:  # a kind written before to_rows() was the hook
            from tl_spectral._deprecation import warn_deprecated

            level, frame = 2, sys._getframe(1)  # the first caller outside this module
            while frame is not None and frame.f_code.co_filename == __file__:
                frame, level = frame.f_back, level + 1
            warn_deprecated(f"{type(self).__name__}.{legacy}() as the main table",
                            "to_rows() (the Result protocol's hook)", stacklevel=level + 1)
            return list(getattr(self, legacy)())
        h = self.headline()
        if h:
            return [h]
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if isinstance(getattr(self, f.name), (int, float, str, bool))}
        row.update({k: "×".join(map(str, v)) for k, v in _shape_fields(self)})
        return [row] if row else []

    def _table(self) -> list[dict[str, Any]]:
        return list(self.to_rows())

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

    def _draw(self, name: str, *args: Any, **kwargs: Any):
        """Draw the figure (or view) ``name`` of this kind: the one way every result reaches
        the plotting leaf (:func:`plotter`)."""
        return plotter(self.kind, name)(self, *args, **kwargs)

    def view(self, *args: Any, **kwargs: Any):
        """The circuitsvis view of this result, where one exists."""
        raise NotImplementedError(f"{type(self).__name__} has no circuitsvis view")

    def show(self, *args: Any, **kwargs: Any) -> None:
        """Display the result once: its circuitsvis view where one exists (as inseq's
        ``show``), else its main figure. Returns None, as matplotlib's ``show`` does, so a
        notebook cell ending in ``r.show()`` shows it once, not a second time as the cell's
        value; for the object itself call :meth:`view` or :meth:`plot`.

        In Jupyter it is displayed with ``IPython.display.display`` and a figure is then
        closed, so the inline backend does not add a copy at the end of the cell. Elsewhere
        (terminal IPython included) a figure goes to ``matplotlib.pyplot.show()`` on an
        interactive backend;
        with nothing to display to (a non-interactive backend such as Agg, or a circuitsvis
        view outside a notebook) a ``UserWarning`` says how to save it instead.
        """
        import warnings

        try:
            shown = self.view(*args, **kwargs)
        except NotImplementedError:
            shown = self.plot()
        is_fig = callable(getattr(shown, "savefig", None))
        try:
            from IPython import get_ipython
            from IPython.display import display

            ip = get_ipython()
        except ImportError:
            ip = None
        if ip is not None and type(ip).__name__ != "TerminalInteractiveShell":
            # inside Jupyter: display it now, once
            display(shown)
            if is_fig:
                import matplotlib.pyplot as plt

                plt.close(shown)
            return None
        if is_fig:
            import matplotlib
            import matplotlib.pyplot as plt

            backend = str(matplotlib.get_backend()).lower()
            if backend not in ("agg", "pdf", "ps", "svg", "cairo", "pgf", "template") \
                    and "inline" not in backend:
                plt.show()
                return None
            plt.close(shown)
            warnings.warn(f"{type(self).__name__}.show(): no display (matplotlib backend "
                          f"{backend!r}); save the figure with .plot().savefig(path)",
                          UserWarning, stacklevel=2)
            return None
        warnings.warn(f"{type(self).__name__}.show(): a circuitsvis view displays in Jupyter "
                      "only; outside it, write its HTML with open(path, 'w').write(str("
                      ".view()))", UserWarning, stacklevel=2)
        return None

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
        header = {"format": _FORMAT, "kind": self.kind, "module": type(self).__module__,
                  "fields": meta}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            save_file(tensors, str(tmp), metadata={"tl_spectral": json.dumps(header)})
            os.chmod(tmp, 0o666 & ~current_umask())
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
        """Load a result saved by :meth:`save`. Raises ``ValueError`` on foreign files.

        ``path``: the name given to :meth:`save` (``"x"`` finds the ``x.safetensors`` it
        wrote) or the file itself. Every field is checked against the dataclass before the
        result is returned: its kind (tensor, int, str, list …; :func:`_validate_fields`),
        each array's dtype kind, dims and finiteness against the kind's ``array_shapes``,
        with dims of one name one size across fields and metadata (:func:`check_arrays`),
        then the main table is built once."""
        # Long on purpose: the file's checks in reading order (header, format, kind, module,
        # fields, arrays), each a one-line error naming the file.
        path = Path(path)
        if not path.exists() and result_path(path).exists():
            path = result_path(path)  # the name save() was given
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
        except (json.JSONDecodeError, RecursionError) as exc:
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
        target = _result_class(kind, header.get("module"), path)
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
        _validate_fields(target, fields, path)
        check_arrays(target, fields, path)
        try:
            result = target(**{k: v for k, v in fields.items() if k in names})
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ValueError(
                f"{path}: cannot rebuild the {kind!r} result from its fields "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        _validate_built(result, path)
        return result


# ------------------------------------------------------- validation of a loaded result
# (issue 30 item 11; kept apart from Result.load so that changes to how load finds the
# result kind merge cleanly)
def _annotation_kinds(annotation: Any) -> tuple[set[str], bool] | None:
    """The value kinds a field annotation allows ({"tensor", "int", "float", "str", "bool",
    "list", "dict"}) and whether None is allowed; None when the annotation is not one of
    these simple forms (then the field is not checked)."""
    text = str(annotation).replace(" ", "")
    optional = False
    if text.startswith("Optional[") and text.endswith("]"):
        text, optional = text[len("Optional["):-1], True
    parts = text.split("|")
    if "None" in parts:
        optional = True
        parts = [p for p in parts if p != "None"]
    names = {"Tensor": "tensor", "torch.Tensor": "tensor", "int": "int", "float": "float",
             "str": "str", "bool": "bool"}
    kinds = set()
    for p in parts:
        base = p.split("[", 1)[0]
        if base in names:
            kinds.add(names[base])
        elif base in ("list", "List", "tuple", "Tuple", "Sequence"):
            kinds.add("list")
        elif base in ("dict", "Dict", "Mapping"):
            kinds.add("dict")
        else:
            return None
    return (kinds, optional) if kinds else None


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "tensor":
        return isinstance(value, torch.Tensor)
    if kind == "int":
        return is_int(value)
    if kind == "float":  # JSON writes 2.0 as 2.0, but an int is a fine float
        return is_real(value)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    return isinstance(value, dict)


def _validate_fields(cls: type, fields: dict[str, Any], path: Path) -> None:
    """Every field read from ``path`` has a kind its dataclass annotation allows: a tensor
    where the class holds a tensor (``Tensor``, ``Optional[Tensor]``), a number, string,
    list or dict where it holds one. ``ValueError`` naming the first field that does not
    (a damaged or crafted file), before the result is built. The arrays' dtypes, shapes and
    finiteness are checked next, against the kind's ``array_shapes`` (:func:`check_arrays`)."""
    for f in dataclasses.fields(cls):
        if f.name not in fields:
            continue
        allowed = _annotation_kinds(f.type)
        if allowed is None:
            continue
        kinds, optional = allowed
        value = fields[f.name]
        if value is None and optional:
            continue
        if not any(_is_kind(value, k) for k in kinds):
            got = (f"a tensor {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                   else type(value).__name__)
            raise ValueError(
                f"{path}: field {f.name!r} of this {cls.kind!r} result is {got}, the class "
                f"holds {' or '.join(sorted(kinds))}{' or None' if optional else ''}; the "
                "file is damaged or was not written by Result.save()")


_DIM = re.compile(r"(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\+(?P<plus>\d+))?|(?P<size>\d+))")
_SPEC = re.compile(r"(?P<dtype>float|int|bool)(?P<nan>\?)?\[(?P<dims>[^\]]*)\]")
_COND = re.compile(r"(?P<yes>.+?)\s+if\s+(?P<flag>[A-Za-z_][A-Za-z0-9_]*)\s+else\s+(?P<no>.+)")


def _resolve_shape(spec: str, fields: dict[str, Any]) -> str:
    """``"A if flag else B"``: ``A`` where the metadata field ``flag`` is true, else ``B``."""
    m = _COND.fullmatch(spec.strip())
    if m is None:
        return spec
    return m.group("yes") if fields.get(m.group("flag")) else m.group("no")


def _parse_shape(spec: str) -> list[tuple[str, bool, list[tuple[str | None, int]]]]:
    """``"float?[layer, head+1] | int[_]"`` -> ``[(dtype, may_be_nonfinite, [(name or None,
    offset or size)])]``; ``("_", 0)`` is a free dim, ``(None, n)`` a fixed size."""
    out = []
    for alt in spec.split("|"):
        m = _SPEC.fullmatch(alt.strip())
        if m is None:
            raise ValueError(f"bad array declaration {spec!r} (expected e.g. 'float[layer, head]')")
        dims: list[tuple[str | None, int]] = []
        for d in filter(None, (x.strip() for x in m.group("dims").split(","))):
            dm = _DIM.fullmatch(d)
            if dm is None:
                raise ValueError(f"bad dim {d!r} in the array declaration {spec!r}")
            if dm.group("size") is not None:
                dims.append((None, int(dm.group("size"))))
            else:
                dims.append((dm.group("name"), int(dm.group("plus") or 0)))
        out.append((m.group("dtype"), bool(m.group("nan")), dims))
    return out


def _dtype_kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_floating_point():
        return "float"
    if t.is_complex():
        return "complex"
    return "int"


def _fmt_alt(alt: tuple[str, bool, list[tuple[str | None, int]]],
             sizes: dict[str, int]) -> str:
    dtype, nan, dims = alt
    parts = []
    for name, k in dims:
        if name is None:
            parts.append(str(k))
        elif name == "_":
            parts.append("any")
        else:
            label = f"{name}+{k}" if k else name
            parts.append(f"{label}={sizes[name] + k}" if name in sizes else label)
    return f"{dtype}{'?' if nan else ''}[{', '.join(parts)}]"


def check_arrays(cls: type, fields: dict[str, Any], path: Any = "result") -> None:
    """The arrays of ``fields`` (read from ``path``) against ``cls.array_shapes``: dtype
    kind, number of dims, fixed sizes, finiteness (unless declared ``float?``), and every
    named dim one size across fields, dict entries and the metadata of ``cls.array_dims``.
    ``ValueError``, one line naming the field, the expected and the found shape and what to
    do; a dim two fields disagree on is blamed on the field(s) in the minority."""
    # Long on purpose: one declared-shape check: the sizes the metadata fixes, then every
    # array against its alternatives, then the named dimensions, each reading the one before.
    decl = getattr(cls, "array_shapes", None) or {}
    if not decl:
        return
    kind = getattr(cls, "kind", cls.__name__)
    fix = ("the file is truncated or was edited, or written by another version: re-save it "
           "with this version of tl_spectral")

    def fail(label: str, what: str) -> None:
        raise ValueError(f"{path}: field {label} of this {kind!r} result {what}; {fix}")

    # sizes the metadata fixes
    fixed: dict[str, tuple[int, str]] = {}
    for dim, names in (getattr(cls, "array_dims", None) or {}).items():
        for fname in ((names,) if isinstance(names, str) else names):
            v = fields.get(fname)
            n = len(v) if isinstance(v, (list, dict)) else v if is_int(v) else None
            if n is None:
                continue
            where = f"the metadata {fname!r}" + (f" ({n} entries)" if isinstance(
                v, (list, dict)) else f" = {n}")
            if dim in fixed and fixed[dim][0] != n:
                raise ValueError(f"{path}: this {kind!r} result's metadata disagree on its "
                                 f"{dim} ({fixed[dim][1]} vs {where}); {fix}")
            fixed.setdefault(dim, (n, where))
    # one entry per array: (label, tensor, chosen alternative)
    seen: list[tuple[str, torch.Tensor, Any]] = []
    for fname, spec in decl.items():
        value = fields.get(fname)
        if value is None:
            continue
        alts = _parse_shape(_resolve_shape(spec, fields))
        entries = ([(f"{fname!r}", value)] if isinstance(value, torch.Tensor) else
                   [(f"{fname}[{k!r}]", v) for k, v in value.items()]
                   if isinstance(value, dict) else [])
        for label, t in entries:
            if not isinstance(t, torch.Tensor):
                fail(label, f"is {type(t).__name__}, expected a tensor "
                            f"{' or '.join(_fmt_alt(a, {}) for a in alts)}")
            shape, dk = tuple(t.shape), _dtype_kind(t)
            fit = [a for a in alts if a[0] == dk and len(a[2]) == t.dim()]
            if not fit:
                fail(label, f"is a {str(t.dtype).replace('torch.', '')} tensor of shape "
                            f"{shape}, expected "
                            f"{' or '.join(_fmt_alt(a, {}) for a in alts)}")
            alt = fit[0]
            if len(fit) > 1:  # alternatives of one ndim and dtype: the first that fits sizes
                alt = next((a for a in fit if all(
                    name is not None or size == k for (name, k), size in zip(a[2], shape))),
                    fit[0])
            for (name, k), size in zip(alt[2], shape):
                if name is None and size != k:
                    fail(label, f"has shape {shape}, expected {_fmt_alt(alt, {})}")
            if dk == "float" and not alt[1] and t.numel():
                bad = int((~torch.isfinite(t)).sum())
                if bad:
                    fail(label, f"holds {bad} NaN/inf value{'s' if bad != 1 else ''} (of "
                                f"{t.numel()}), which this kind never writes there")
            seen.append((label, t, alt))
    # named dims: one size each
    votes: dict[str, dict[int, list[str]]] = {}
    for label, t, alt in seen:
        for (name, k), size in zip(alt[2], t.shape):
            if name is not None and name != "_":
                votes.setdefault(name, {}).setdefault(int(size) - k, [])
                if label not in votes[name][int(size) - k]:
                    votes[name][int(size) - k].append(label)
    sizes: dict[str, int] = {}
    for name, by_size in votes.items():
        if name in fixed:
            sizes[name] = fixed[name][0]
        else:  # the size most arrays agree on (ties: the first declared)
            sizes[name] = max(by_size, key=lambda n: len(by_size[n]))
    for label, t, alt in seen:
        for (name, k), size in zip(alt[2], t.shape):
            if name is None or name == "_" or int(size) - k == sizes[name]:
                continue
            if name in fixed:
                src = f"{fixed[name][1]} gives"
            else:
                agree = votes[name][sizes[name]]
                src = (f"field {agree[0]} gives" if len(agree) == 1 else
                       f"fields {', '.join(agree[:3])}{' …' if len(agree) > 3 else ''} give")
            fail(label, f"has shape {tuple(t.shape)}, expected {_fmt_alt(alt, sizes)}: its "
                        f"{name} is {int(size) - k} where {src} {sizes[name]}")


def _validate_built(result: "Result", path: Path) -> None:
    """The fields of a rebuilt result agree with each other: its main table and headline
    are built once (a mis-shaped array fails here, as ``ValueError``, not later in
    ``to_frame``)."""
    for f in dataclasses.fields(result):  # results held in a list (a scale POD's layers)
        value = getattr(result, f.name, None)
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Result):
                    check_arrays(type(item), {g.name: getattr(item, g.name)
                                              for g in dataclasses.fields(item)},
                                 f"{path} ({f.name}[{i}])")
    try:
        result._table()
        result.headline()
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError,
            ZeroDivisionError) as exc:
        raise ValueError(
            f"{path}: the fields of this {result.kind!r} result do not fit together "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); the file is "
            "damaged or was not written by Result.save()") from None


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

#: kind -> module, for files written before ``Result.save`` recorded the module (format
#: ``tl_spectral.result/1`` without ``"module"``). Frozen: new kinds never need a line here.
_LEGACY_KIND_MODULES: dict[str, str] = {
    "attention_stats": "tl_spectral.probes.attention_stats",
    "attention_fields": "tl_spectral.probes.fields",
    "streamed_attention_fields": "tl_spectral.probes.fields",
    "contribution_stats": "tl_spectral.probes.contributions",
    "faithfulness": "tl_spectral.probes.faithfulness",
    "sink_stats": "tl_spectral.probes.sinks",
    "sink_intervention": "tl_spectral.probes.sinks",
    "pod": "tl_spectral.analysis.pod",
    "scale_pod": "tl_spectral.analysis.scale_pod",
    "scale_pod_layer": "tl_spectral.analysis.scale_pod",
    "scale_pod_heads": "tl_spectral.analysis.scale_pod",
    "scale_pod_heads_layer": "tl_spectral.analysis.scale_pod",
    "contribution_maps": "tl_spectral.analysis.contributions",
    "sink_geometry": "tl_spectral.analysis.sinks",
    "qk_geometry": "tl_spectral.geometry.qk",
    "sd_geometry": "tl_spectral.geometry.qk",
    "rotary_qk_geometry": "tl_spectral.geometry.rotary",
    "routing_cascade": "tl_spectral.geometry.cascade",
    "routing_ablation": "tl_spectral.interventions.ablations",
    "rank_truncation": "tl_spectral.interventions.ablations",
    "linearization_curve": "tl_spectral.interventions.surgery",
    "cascade_allocation": "tl_spectral.interventions.surgery",
    "allocation_study": "tl_spectral.interventions.surgery",
}

#: modules that moved, old name -> new: a file written before the move names the old one
#: (read silently: a file is not the user's code, so no deprecation warning)
_MOVED_RESULT_MODULES: dict[str, str] = MOVED_MODULES

#: The library modules outside ``tl_spectral.probes`` that define result kinds: with the
#: modules of ``tl_spectral.probes`` (:func:`_loadable`; a probe module defines its result
#: kinds, so a new probe needs no line here), the only modules ``Result.load`` ever imports by
#: the name a file gives (an allow-list, not a prefix: a file naming ``tl_spectral.__main__``
#: or ``tl_spectral.cli`` is refused, never run). A test imports every module of the package
#: and checks that every library kind is loadable and no line here is stale.
_RESULT_MODULES: frozenset[str] = frozenset(_LEGACY_KIND_MODULES.values()) | {
    "tl_spectral.analysis.scale_pod_heads",
    "tl_spectral.probes.head_scores",
}

#: a module of the probes package (importing one runs nothing but definitions)
_PROBES_MODULE = re.compile(r"tl_spectral\.probes\.[A-Za-z_]\w*")


def _loadable(module: str) -> bool:
    """Whether ``Result.load`` may import ``module`` by the name a file gives."""
    return module in _RESULT_MODULES or _PROBES_MODULE.fullmatch(module) is not None


def _result_class(kind: str, module: Any, path: Path) -> type["Result"]:
    """The registered class of ``kind``, importing the module the file names if need be.

    Only a module of the allow-list (:func:`_loadable`: the library modules that define
    result kinds) is ever imported, and only if it defines the kind; a file without the entry
    (older files) falls back to the frozen kind -> module table. A kind of another package
    loads once its module is imported, or once the plugins are
    (:func:`tl_spectral.discovery.load_plugins`: a plugin's kinds register on its import)."""
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    if not (isinstance(module, str) and _loadable(module)) and kind not in _LEGACY_KIND_MODULES:
        from tl_spectral.discovery import load_plugins

        load_plugins()
        if kind in _REGISTRY:
            return _REGISTRY[kind]
    if module is None:
        module = _LEGACY_KIND_MODULES.get(kind)
        if module is None:
            raise ValueError(f"{path}: unknown result kind {kind!r}; known: {sorted(_REGISTRY)}"
                             " (import the module that defines it, then load again)")
    if not isinstance(module, str):
        raise ValueError(f"{path}: the metadata 'module' is {type(module).__name__}, not the "
                         "name of the module that defines the result kind")
    module = _MOVED_RESULT_MODULES.get(module, module)
    if not _loadable(module):
        raise ValueError(
            f"{path}: unknown result kind {kind!r}, said to be defined in {module!r}, which "
            "is not a module that defines result kinds and is never imported from a file; "
            "import the module that defines the kind yourself, then call Result.load again")
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"{path}: the result kind {kind!r} names the module {module!r}, "
                         f"which cannot be imported ({exc})") from None
    target = _REGISTRY.get(kind)
    if target is None or getattr(mod, target.__name__, None) is not target:
        raise ValueError(f"{path}: unknown result kind {kind!r}; the module {module!r} does not "
                         f"define it (known: {sorted(_REGISTRY)})")
    return target


def _import_result_modules() -> None:
    """Import every module that defines a library result kind (the allow-list and every
    probe module: ``tl_spectral.probes`` imports them all)."""
    import importlib

    for name in [*sorted(_RESULT_MODULES), "tl_spectral.probes"]:
        importlib.import_module(name)


def plotter(kind: str, name: str) -> Callable[..., Any]:
    """The function of the plotting leaf that draws the figure ``name`` of results of
    ``kind``: the one way from a result to plotting (the leaf is imported on the first
    figure; the maths modules never import it). Raises ``NotImplementedError`` if none."""
    from tl_spectral.viz.plots import FIGURES  # the plotting leaf: registers every figure

    try:
        return FIGURES[(kind, name)]
    except KeyError:
        raise NotImplementedError(f"no figure {name!r} is registered for result kind "
                                  f"{kind!r}") from None


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
