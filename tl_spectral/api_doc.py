"""docs/api.md's generated tables, derived from the code (nothing listed by hand).

``python -m tl_spectral.api_doc FILE`` fills the generated blocks of a Markdown file
(``<!-- generated: KEY -->`` … ``<!-- /generated -->``) whose key is one of :func:`blocks`;
``--check`` only reports a stale block (exit status 1); without ``FILE`` it prints every
block. The blocks:

- ``api-probes``: every probe module of ``tl_spectral.probes`` (``PROBE_MODULES``) and its
  public names (what ``tl_spectral.__all__`` gets from it), each with the first paragraph of
  its docstring;
- ``api-plugins``: what the installed plugins add (the ``tl_spectral.plugins`` entry points,
  :func:`tl_spectral.discovery.load_plugins`): their public names, figures and report
  sections (``tl-spectral analyze --sections KEY``).

docs/api.md holds ``api-probes`` only, so the page never depends on what is installed;
``tests/test_api.py`` keeps it current.
"""

from __future__ import annotations

import inspect
import re
import sys
from argparse import ArgumentParser
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Sequence

__all__ = ["blocks", "fill", "main", "plugin_rows", "probe_rows", "table"]

_BLOCK = re.compile(r"(<!-- generated: (?P<key>[^ ]+) -->\n)(?P<body>.*?)\n?<!-- /generated -->",
                    re.S)


def summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring on one line (``x`` code as Markdown)."""
    doc = inspect.getdoc(obj) or ""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    return first.replace("``", "`").replace("|", "\\|")


def _returned_by(module: ModuleType, cls: type) -> list[str]:
    """The probe classes of ``module`` whose ``result()`` is annotated to return ``cls``."""
    from tl_spectral.probes import Probe

    out = []
    for name, obj in vars(module).items():
        if isinstance(obj, type) and issubclass(obj, Probe) and obj is not Probe:
            ann = inspect.signature(obj.result).return_annotation
            if ann is cls or (isinstance(ann, str) and ann.strip("'\"") == cls.__name__):
                out.append(name)
    return out


def describe(module: ModuleType, name: str) -> str:
    """The "what" of one public name of a probe module: its kind (probe, result kind) and
    the first paragraph of its docstring."""
    from tl_spectral.probes import Probe
    from tl_spectral.results import Result

    obj = getattr(module, name)
    text = summary(obj)
    if isinstance(obj, type) and issubclass(obj, Probe):
        return f"probe (`{module.__name__}`): {text}"
    if isinstance(obj, type) and issubclass(obj, Result):
        by = _returned_by(module, obj)
        what = f"result kind `{obj.kind}`" + (
            ", what " + " / ".join(f"`{p}`" for p in by) + " returns" if by else "")
        return f"{what}: {text}"
    return text


def table(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column Markdown table, ``| name | what |``."""
    lines = ["| name | what |", "|---|---|"]
    lines += [f"| `{n}` | {w} |" for n, w in rows]
    return "\n".join(lines)


def probe_rows() -> list[tuple[str, str]]:
    """(name, what) of every public name of every probe module, module by module."""
    import importlib

    from tl_spectral.probes import PROBE_MODULES

    rows = []
    for mod_name, names in PROBE_MODULES.items():
        mod = importlib.import_module(mod_name)
        rows += [(n, describe(mod, n)) for n in sorted(names, key=lambda n: _rank(mod, n))]
    return rows


def _rank(module: ModuleType, name: str) -> int:
    """Probes first, then result kinds, then the rest (a stable sort keeps the module's
    order within each)."""
    from tl_spectral.probes import Probe
    from tl_spectral.results import Result

    obj = getattr(module, name)
    if isinstance(obj, type) and issubclass(obj, Probe):
        return 0
    return 1 if isinstance(obj, type) and issubclass(obj, Result) else 2


def plugin_rows() -> list[tuple[str, str]]:
    """(name, what) of what the installed plugins add: each plugin module's public names
    (``module.Name``), its figures and its report sections."""
    from tl_spectral.discovery import load_plugins
    from tl_spectral.probes import public_names
    from tl_spectral.viz.plots import FIGURES
    from tl_spectral.viz.sections import SECTIONS

    rows = []
    for ep_name, mod in load_plugins().items():
        pkg = mod.__name__

        def mine(where: str, pkg: str = pkg) -> bool:
            return where == pkg or where.startswith(pkg + ".")

        rows += [(f"{pkg}.{n}", describe(mod, n))
                 for n in sorted(public_names(mod, imported=True),
                                 key=lambda n: _rank(mod, n))]
        rows += [(f"{pkg}: {kind}.{fig}", f"figure `{fig}` of result kind `{kind}` (plugin "
                                          f"`{ep_name}`): {summary(fn)}")
                 for (kind, fig), fn in FIGURES.items() if mine(fn.__module__)]
        rows += [(f"--sections {s.key}", f"report section \"{s.title}\" (plugin `{ep_name}`, "
                                        f"`{s.__module__}`): {summary(s)}")
                 for s in SECTIONS if mine(s.__module__)]
    return rows


def blocks(plugins: bool = True) -> dict[str, str]:
    """{block key: Markdown}: ``api-probes`` and, with ``plugins``, ``api-plugins``."""
    out = {"api-probes": table(probe_rows())}
    if plugins:
        rows = plugin_rows()
        out["api-plugins"] = table(rows) if rows else "(no tl_spectral plugin is installed)"
    return out


def fill(text: str, generated: dict[str, str]) -> str:
    """``text`` with the body of every generated block replaced by ``generated[key]``; a
    block of another key is left alone."""
    def sub(m: re.Match) -> str:
        if m["key"] not in generated:
            return m.group(0)
        return m.group(1) + generated[m["key"]] + "\n<!-- /generated -->"

    return _BLOCK.sub(sub, text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tl_spectral.api_doc [FILE [--check]]``."""
    ap = ArgumentParser(prog="python -m tl_spectral.api_doc",
                        description="Fill the generated API tables of a Markdown file "
                                    "(docs/api.md), or print them.")
    ap.add_argument("file", nargs="?", help="the Markdown file to update (default: print)")
    ap.add_argument("--check", action="store_true",
                    help="only check: exit 1 naming the stale blocks")
    args = ap.parse_args(argv)
    if args.file is None:
        for key, body in blocks().items():
            print(f"<!-- generated: {key} -->\n{body}\n<!-- /generated -->\n")
        return 0
    path = Path(args.file)
    text = path.read_text(encoding="utf-8")
    keys = {m["key"] for m in _BLOCK.finditer(text)}
    new = fill(text, blocks(plugins="api-plugins" in keys))
    if new == text:
        return 0
    if args.check:
        print(f"{path}: stale generated tables; run python -m tl_spectral.api_doc {path}",
              file=sys.stderr)
        return 1
    path.write_text(new, encoding="utf-8")
    print(f"{path}: generated tables updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
