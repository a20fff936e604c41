"""Old spellings of the public API, kept working for one release with a DeprecationWarning.

docs/api.md ("Conventions", "Deprecated spellings") lists each old spelling and its
replacement. Every helper here warns once per use, pointing at the caller's line, and
then does exactly what the new spelling does. Also: :func:`check_choice`, the one-line
error of a mode string that is not one of its ``Literal`` type's values.
"""

from __future__ import annotations

import functools
import typing
import warnings
from typing import Any, Callable, TypeVar

#: the release that drops the old spellings
REMOVED_IN = "0.3"

F = TypeVar("F", bound=Callable[..., Any])


def warn_deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """One DeprecationWarning: ``old`` is deprecated, use ``new``. ``stacklevel`` 3 points at
    the caller of the function that calls this."""
    warnings.warn(f"{old} is deprecated; use {new} ({old} is removed in tl_spectral "
                  f"{REMOVED_IN}; docs/api.md, 'Deprecated spellings')",
                  DeprecationWarning, stacklevel=stacklevel)


def renamed_arguments(**renames: str) -> Callable[[F], F]:
    """Decorator: keyword arguments renamed, ``old="new"``. A call with an old name warns and
    passes the value under the new name; both names at once is a TypeError."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got both {old}= and {new}=; pass "
                                        f"{new}= only ({old}= is its deprecated name)")
                    warn_deprecated(f"{fn.__name__}({old}=...)", f"{fn.__name__}({new}=...)")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def deprecated_method(new: str, old: str) -> Callable[..., Any]:
    """A method ``old`` that warns and calls ``self.<new>(...)`` (for a class body:
    ``rows = deprecated_method("to_rows", "rows")``)."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        warn_deprecated(f"{type(self).__name__}.{old}()", f"{type(self).__name__}.{new}()")
        return getattr(self, new)(*args, **kwargs)

    method.__name__ = old
    method.__doc__ = f"Deprecated: use :meth:`{new}` (removed in tl_spectral {REMOVED_IN})."
    return method


def deprecated_function(fn: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """``fn`` under its old name ``old``: warns, then calls it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warn_deprecated(old, new)
        return fn(*args, **kwargs)

    wrapper.__name__ = old.rsplit(".", 1)[-1].split("(")[0]
    wrapper.__doc__ = f"Deprecated: use ``{new}`` (removed in tl_spectral {REMOVED_IN})."
    return wrapper


def module_getattr(module: str, aliases: dict[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A PEP 562 ``__getattr__`` for old names of a module: ``{old: (new, "module.path")}``;
    each access warns and returns the new object (never cached, so every use warns)."""

    def __getattr__(name: str) -> Any:
        if name in aliases:
            new, where = aliases[name]
            warn_deprecated(f"{module}.{name}", f"{module}.{new}")
            import importlib

            return getattr(importlib.import_module(where), new)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def check_choice(name: str, value: Any, allowed: Any, hint: str = "") -> Any:
    """``value`` when it is one of ``allowed`` (a ``Literal[...]`` type or a sequence), else a
    one-line ValueError naming the argument and every allowed value (and ``hint``: what
    they mean)."""
    choices = typing.get_args(allowed) or tuple(allowed)
    if isinstance(value, str) and value in choices:
        return value
    listed = ", ".join(repr(c) for c in choices)
    raise ValueError(f"{name}={value!r} is not one of {listed}; pass one of those"
                     + (f" ({hint})" if hint else ""))


# ------------------------------------------------------------------ moved modules
#: modules that moved, old dotted name -> new; the old name imports (with one
#: DeprecationWarning) until :data:`REMOVED_IN`, through :class:`MovedModuleFinder`: no file
#: stays at the old place, so the package the module left never imports the one it went to
MOVED_MODULES: dict[str, str] = {
    "tl_spectral.models.surgery": "tl_spectral.interventions.surgery",
    "tl_spectral.models.ablations": "tl_spectral.interventions.ablations",
    "tl_spectral.probes.interventions": "tl_spectral.probes.damage",
}


class MovedModuleFinder:
    """A ``sys.meta_path`` finder of :data:`MOVED_MODULES`: importing an old name warns once
    (at the importing line) and binds the new module object itself under the old name."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        """The spec of an old name (None for every other module)."""
        if fullname not in MOVED_MODULES:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        """The new module itself (imported by name), after the warning."""
        import importlib

        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} is deprecated; use {new} ({spec.name} is removed in "
                      f"tl_spectral {REMOVED_IN}; docs/api.md, 'Deprecated spellings')",
                      DeprecationWarning, stacklevel=2)  # warnings skips the import machinery
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the new module is already imported."""


def install_moved_modules() -> None:
    """Put one :class:`MovedModuleFinder` on ``sys.meta_path`` (idempotent)."""
    import sys

    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


install_moved_modules()  # on the first import of tl_spectral's models, probes or results
