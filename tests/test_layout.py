"""The house rules of the layout: the library (tl_spectral) never imports the studies
(tl_spectral_studies); no module of the library imports another that imports it back; every
import points down the floors of docs/architecture.md (the maths never imports plotting or
the report; the plotting leaf imports no maths); library code names no path outside the
installed package."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "tl_spectral"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _library_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in LIB.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of ``modules`` that ``path`` imports, at any depth of the file (function
    bodies and TYPE_CHECKING blocks included): ``from a.b import c`` counts as ``a.b.c`` when
    that is a module, else ``a.b``."""
    me = _module_name(path)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for a in node.names:
                full = f"{base}.{a.name}"
                names.append(full if full in modules else base)
        for n in names:
            while n and n not in modules:
                n = n.rpartition(".")[0]
            if n and n != me:
                out.add(n)
    return out


def test_import_tl_spectral_loads_no_study():
    code = ("import sys, tl_spectral, tl_spectral.cli, tl_spectral.viz.sections, "
            "tl_spectral.geometry.model, tl_spectral.interventions.surgery, "
            "tl_spectral.models.zoo; "
            "print(sorted(m for m in sys.modules if m.startswith('tl_spectral_studies')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_library_source_never_names_the_studies():
    for p in LIB.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(m.startswith("tl_spectral_studies") for m in mods), p


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return [sorted(c) for c in sccs if len(c) > 1]


def test_no_import_cycles_in_the_library():
    mods = _library_modules()
    graph = {m: _imports(p, mods) for m, p in mods.items()}
    assert not find_cycles(graph), f"import cycles: {find_cycles(graph)}"


def test_the_cycle_finder_can_fail():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def private_imports(path: Path, modules: dict[str, Path], me: str | None = None) -> set[str]:
    """The private names (one leading underscore, not a module) of another library module
    that ``path`` uses: ``from a.b import _c`` and ``b._c`` where ``b`` names module ``a.b``
    (by ``import a.b as b`` or ``from a import b``). A private module (``_deprecation``) is
    the library's own and may be imported anywhere in it; its private names may not."""
    me = me or _module_name(path)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound, out = {}, set()

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in modules:
                    bound[a.asname or a.name] = full
                elif private(a.name) and base != me and base in modules:
                    out.add(full)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    bound[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain, v = [], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in bound:
                target = ".".join([bound[v.id], *reversed(chain)])
                if target in modules and target != me and f"{target}.{node.attr}" not in modules:
                    out.add(f"{target}.{node.attr}")
    return out


#: private names still used across modules, each with its reason (remove the entry when the
#: reason goes)
PRIVATE_IMPORTS_ALLOWED: dict = {
}


def test_no_private_name_crosses_a_module_boundary():
    """A name with a leading underscore is its module's own: another module that needs it
    gets a public (documented) name or the code moves to where it is used."""
    mods = _library_modules()
    found = {(m, name) for m, p in mods.items() for name in private_imports(p, mods)}
    assert not found - set(PRIVATE_IMPORTS_ALLOWED), sorted(found - set(PRIVATE_IMPORTS_ALLOWED))
    assert not set(PRIVATE_IMPORTS_ALLOWED) - found, "stale allow-list entries: " + str(
        sorted(set(PRIVATE_IMPORTS_ALLOWED) - found))


def test_the_private_import_check_can_fail(tmp_path):
    mods = {"tl_spectral.a": tmp_path / "a.py", "tl_spectral.b": tmp_path / "b.py",
            "tl_spectral._c": tmp_path / "_c.py"}
    src = ("from tl_spectral.a import _x, y\nfrom tl_spectral import _c, b\n"
           "import tl_spectral.a as A\nb._z(A._w, _c.ok, _c._v, b.__doc__)\n")
    (tmp_path / "b.py").write_text(src, encoding="utf-8")
    found = private_imports(tmp_path / "b.py", mods, me="tl_spectral.b")
    assert found == {"tl_spectral.a._x", "tl_spectral.a._w", "tl_spectral._c._v"}


#: the floors of docs/architecture.md, lowest first; "leaf" is the plotting leaf
_GROUND_MODELS = {"gpt", "attention", "convert", "zoo", "train", "train_config", "loading",
                  "smollm2", "gguf", "hub"}
#: modules of models/ that are not the model family, each with its reason: the deprecated old
#: paths of the interventions (tl_spectral 0.3 removes them); each imports the module it
#: stands for, so it sits on that module's floor
_MOVED_MODELS = {"surgery": "tl_spectral.interventions.surgery",
                 "ablations": "tl_spectral.interventions.ablations"}


def floor(module: str):
    """The floor of a library module: 0 ground (results, model_view, usage, checks, data,
    discovery, the model family), 1 maths (analysis, geometry), 2 probes and the experiments
    on models (interventions/: surgery, ablations), "leaf" plotting (viz/*_plots, views,
    figures, plots), 3 the top (report sections, cli)."""
    parts = module.split(".")
    if module in ("tl_spectral.results", "tl_spectral.model_view", "tl_spectral.usage",
                  "tl_spectral.files", "tl_spectral._leftovers", "tl_spectral.outdirs",
                  "tl_spectral.progress", "tl_spectral._deprecation", "tl_spectral.types",
                  "tl_spectral.checks", "tl_spectral.discovery") \
            or parts[:2] == ["tl_spectral", "data"]:
        return 0
    if parts[:2] == ["tl_spectral", "models"]:
        if len(parts) == 2 or parts[2] in _GROUND_MODELS:
            return 0
        assert parts[2] in _MOVED_MODELS, f"{module}: not in _GROUND_MODELS nor _MOVED_MODELS"
        return floor(_MOVED_MODELS[parts[2]])
    if parts[:2] == ["tl_spectral", "interventions"]:
        return 2
    if parts[:2] in (["tl_spectral", "analysis"], ["tl_spectral", "geometry"]):
        return 1
    if parts[:2] == ["tl_spectral", "probes"]:
        return 2
    if parts[:2] == ["tl_spectral", "viz"] and len(parts) == 3 and (
            parts[2] in ("plots", "figures", "views", "multiples")
            or parts[2].endswith("_plots")):
        return "leaf"
    return 3


#: the one import that runs up: Result.plot() loads the plotting leaf on its first figure
_LAZY_DOOR = {("tl_spectral.results", "tl_spectral.viz.plots")}


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    bad = []
    for m, deps in graph.items():
        f = floor(m)
        for d in deps:
            g = floor(d)
            if (m, d) in _LAZY_DOOR:
                continue
            if f == "leaf":
                wrong = g not in (0, "leaf")  # plotting takes arrays or results, no maths
            elif g == "leaf":
                wrong = f != 3  # maths reaches plotting only through Result._draw
            else:
                wrong = f != 3 and (g == 3 or g > f)
            if wrong:
                bad.append((m, d))
    return sorted(bad)


def test_every_import_points_down_the_floors():
    """No upward import at any depth (function bodies included): analysis/, geometry/,
    probes/ and models/ import no plotting and no report module; the plotting leaf imports
    none of the maths; the ground imports nothing above it."""
    mods = _library_modules()
    graph = {m: _imports(p, mods) for m, p in mods.items()}
    assert not upward_imports(graph), upward_imports(graph)
    leaf = {m for m in mods if floor(m) == "leaf"}
    assert {"tl_spectral.viz.plots", "tl_spectral.viz.scale_pod_plots"} <= leaf
    # models and geometry: the weight geometry never imports the experiments on models
    assert not any(d.startswith("tl_spectral.models") for d in graph["tl_spectral.geometry.model"])


def test_the_floor_check_can_fail():
    graph = {"tl_spectral.analysis.pod": {"tl_spectral.viz.scale_pod_plots"},
             "tl_spectral.viz.scale_pod_plots": {"tl_spectral.analysis.pod"},
             "tl_spectral.results": {"tl_spectral.probes.base", "tl_spectral.viz.plots"},
             "tl_spectral.geometry.qk": {"tl_spectral.interventions.surgery"},
             "tl_spectral.viz.sections": {"tl_spectral.probes", "tl_spectral.viz.plots"}}
    assert upward_imports(graph) == [
        ("tl_spectral.analysis.pod", "tl_spectral.viz.scale_pod_plots"),
        ("tl_spectral.geometry.qk", "tl_spectral.interventions.surgery"),
        ("tl_spectral.results", "tl_spectral.probes.base"),
        ("tl_spectral.viz.scale_pod_plots", "tl_spectral.analysis.pod")]


def test_plotting_loads_on_the_first_figure_only():
    """Importing every maths module loads no matplotlib and no plotting module."""
    code = ("import sys, tl_spectral.analysis.scale_pod, tl_spectral.analysis.pod, "
            "tl_spectral.analysis.sinks, tl_spectral.analysis.contributions, "
            "tl_spectral.geometry.qk, tl_spectral.geometry.rotary, tl_spectral.geometry.cascade, "
            "tl_spectral.geometry.model, tl_spectral.probes, tl_spectral.probes.faithfulness, "
            "tl_spectral.interventions.surgery, tl_spectral.interventions.ablations; "
            "print(sorted(m for m in sys.modules if m.startswith(('matplotlib', "
            "'tl_spectral.viz'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


#: functions over the limit that others are rewriting now (issue 41): the lead removes each
#: entry as its rewrite lands ("file:function")
LONG_FUNCTIONS_BEING_REWRITTEN: set = set()

#: the longest a function may be without a stated reason at its top (docstring included)
MAX_FUNCTION_LINES = 80


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES, *, said: bool = False
                   ) -> list[str]:
    """``file:function`` of every function of ``path`` over ``limit`` lines whose top (its
    signature and docstring, then the first statement's line) has no comment saying why it
    is long ("# Long on purpose: ..."); with ``said``, those that have one too."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.end_lineno - node.lineno + 1 > limit:
            first = node.body[1] if ast.get_docstring(node) and len(node.body) > 1 \
                else node.body[0]
            head = "\n".join(lines[node.lineno - 1:first.lineno])
            if said or "# Long on purpose:" not in head:
                out.append(f"{path.name}:{node.name}")
    return out


def test_no_huge_file_and_long_functions_say_why():
    """No library file over 1,000 lines; a function over 80 lines opens with a comment
    saying why it is long ("# Long on purpose: ..."), apart from the ones being rewritten."""
    long_files, silent, over = [], [], []
    for p in LIB.rglob("*.py"):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > 1000:
            long_files.append((p.name, n))
        silent += long_functions(p)
        over += long_functions(p, said=True)
    assert not long_files, long_files
    assert not set(silent) - LONG_FUNCTIONS_BEING_REWRITTEN, sorted(
        set(silent) - LONG_FUNCTIONS_BEING_REWRITTEN)
    # an entry goes once its function is no longer over the limit (some of them already
    # carry a reason from the 150-line days; the rewrite decides whether it stays)
    stale = LONG_FUNCTIONS_BEING_REWRITTEN - set(over)
    assert not stale, f"rewritten: remove {sorted(stale)} from LONG_FUNCTIONS_BEING_REWRITTEN"


def test_the_long_function_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    (tmp_path / "m.py").write_text(
        f"def long():\n{body}\n\n\ndef said():\n    \"\"\"Doc.\"\"\"\n"
        f"    # Long on purpose: a test.\n{body}\n\n\ndef short():\n    return 1\n",
        encoding="utf-8")
    assert long_functions(tmp_path / "m.py") == ["m.py:long"]
    assert long_functions(tmp_path / "m.py", said=True) == ["m.py:long", "m.py:said"]


_OUTSIDE = re.compile(r"""(\.\./shared|["'](docs|runs)/|parents\[[2-9]\])""")


def test_library_code_names_no_path_outside_the_package():
    """No ../shared, docs/ or runs/ path and no walking up out of the package in library code
    (docstrings and messages may mention them; string constants used as values may not)."""
    hits = []
    for p in LIB.rglob("*.py"):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        doc_nodes = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                                 ast.AsyncFunctionDef)) and ast.get_docstring(node):
                doc_nodes.add(id(node.body[0].value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in doc_nodes:
                    continue
                if re.search(r"^(\.\./shared|docs/|runs/)", node.value):
                    hits.append((p.name, node.value))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if "parents[" in line and re.search(r"parents\[[2-9]\]", line):
                hits.append((p.name, i, line.strip()))
    assert not hits, hits


def _pyproject_studies() -> dict[str, str]:
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(meta["project"]["entry-points"]["tl_spectral.studies"])


def test_studies_are_registered_as_entry_points():
    """pyproject.toml's ``tl_spectral.studies`` entry points are STUDIES, and each module has
    the study contract (``main(argv, prog=...)``, ``markdown``, ``run_study``). Read from
    pyproject.toml, not the installed metadata: an install made before a study was added
    lists it only after a reinstall (it may list fewer, never other ones)."""
    import importlib
    import inspect
    from importlib.metadata import entry_points

    from tl_spectral_studies import STUDIES

    eps = _pyproject_studies()
    assert eps == STUDIES
    installed = {ep.name: ep.value for ep in entry_points(group="tl_spectral.studies")}
    assert all(eps.get(k) == v for k, v in installed.items()), installed
    for name, mod in STUDIES.items():
        m = importlib.import_module(mod)
        assert callable(m.main) and callable(m.markdown) and callable(m.run_study), name
        assert "prog" in inspect.signature(m.main).parameters, name
        assert getattr(m, "NAME", name) == name, (name, m.NAME)


@pytest.mark.parametrize("name", ["pod-depth", "gemma-window", "evidence", "real-decoder"])
def test_tl_spectral_study_dispatches_every_entry_point(name, monkeypatch, capsys):
    """``tl-spectral study NAME --help`` through the CLI's dispatcher, with the entry points of
    pyproject.toml (so a study added there is reachable before any reinstall)."""
    from importlib.metadata import EntryPoint

    from tl_spectral import cli

    eps = {k: EntryPoint(k, v, cli.STUDY_GROUP) for k, v in _pyproject_studies().items()}
    monkeypatch.setattr(cli, "_study_entry_points", lambda: eps)
    with pytest.raises(SystemExit) as e:
        cli.study([name, "--help"])
    assert e.value.code == 0
    assert f"tl-spectral study {name}" in capsys.readouterr().out


def test_architecture_doc_names_real_functions():
    """Every `tl_spectral....` name in docs/architecture.md resolves (one hop to the code)."""
    import importlib

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    names = set(re.findall(r"`(tl_spectral(?:_studies)?(?:\.\w+)+)`", text))
    for extra in re.findall(r"`(tl_spectral\.[\w.]+)`, ((?:`\w+`(?:, )?)+)", text):
        mod = extra[0].rsplit(".", 1)[0]
        names |= {f"{mod}.{n}" for n in re.findall(r"`(\w+)`", extra[1])}
    names -= {"tl_spectral.studies", "tl_spectral.plugins"}  # entry-point groups, not modules
    assert len(names) > 20
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(name)
            break
        else:
            missing.append(name)
    assert not missing, missing


def test_study_output_folder_never_deletes_a_foreign_folder(tmp_path):
    from tl_spectral_studies._common import MARKER, StudyUsageError, prepare_out

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me")
    for overwrite in (False, True):
        try:
            prepare_out(theirs, "routing", overwrite=overwrite)
        except StudyUsageError as e:
            assert "not an output" in str(e)
        else:
            raise AssertionError("a foreign folder was accepted")
    assert (theirs / "notes.txt").read_text() == "keep me"
    ours = prepare_out(tmp_path / "ours", "routing")
    (ours / "old.json").write_text("{}")
    assert prepare_out(ours, "routing") == ours and (ours / "old.json").exists()  # update
    try:
        prepare_out(ours, "routing", update=False)
    except StudyUsageError as e:
        assert "--overwrite" in str(e)
    prepare_out(ours, "routing", update=False, overwrite=True)
    assert not (ours / "old.json").exists() and (ours / MARKER).is_file()
    try:
        prepare_out(ours, "surgery")  # another study's folder is foreign too
    except StudyUsageError:
        pass
    else:
        raise AssertionError("another study's folder was accepted")
