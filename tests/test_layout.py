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
            "tl_spectral.geometry.model, tl_spectral.models.surgery, tl_spectral.models.zoo; "
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


#: the floors of docs/architecture.md, lowest first; "leaf" is the plotting leaf
_GROUND_MODELS = {"gpt", "attention", "convert", "zoo", "train", "train_config", "loading",
                  "smollm2", "gguf", "hub"}


def floor(module: str):
    """The floor of a library module: 0 ground (results, model_view, usage, data, discovery,
    the model family), 1 maths (analysis, geometry), 2 probes and the experiments on models (surgery,
    ablations), "leaf" plotting (viz/*_plots, views, figures, plots), 3 the top (report
    sections, cli)."""
    parts = module.split(".")
    if module in ("tl_spectral.results", "tl_spectral.model_view", "tl_spectral.usage",
                  "tl_spectral.files", "tl_spectral._leftovers", "tl_spectral.outdirs",
                  "tl_spectral.progress", "tl_spectral._deprecation", "tl_spectral.types",
                  "tl_spectral.discovery") \
            or parts[:2] == ["tl_spectral", "data"]:
        return 0
    if parts[:2] == ["tl_spectral", "models"]:
        return 0 if len(parts) == 2 or parts[2] in _GROUND_MODELS else 2
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
             "tl_spectral.geometry.qk": {"tl_spectral.models.surgery"},
             "tl_spectral.viz.sections": {"tl_spectral.probes", "tl_spectral.viz.plots"}}
    assert upward_imports(graph) == [
        ("tl_spectral.analysis.pod", "tl_spectral.viz.scale_pod_plots"),
        ("tl_spectral.geometry.qk", "tl_spectral.models.surgery"),
        ("tl_spectral.results", "tl_spectral.probes.base"),
        ("tl_spectral.viz.scale_pod_plots", "tl_spectral.analysis.pod")]


def test_plotting_loads_on_the_first_figure_only():
    """Importing every maths module loads no matplotlib and no plotting module."""
    code = ("import sys, tl_spectral.analysis.scale_pod, tl_spectral.analysis.pod, "
            "tl_spectral.analysis.sinks, tl_spectral.analysis.contributions, "
            "tl_spectral.geometry.qk, tl_spectral.geometry.rotary, tl_spectral.geometry.cascade, "
            "tl_spectral.geometry.model, tl_spectral.probes, tl_spectral.probes.faithfulness, "
            "tl_spectral.models.surgery, tl_spectral.models.ablations; "
            "print(sorted(m for m in sys.modules if m.startswith(('matplotlib', "
            "'tl_spectral.viz'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_no_huge_file_and_long_functions_say_why():
    """No library file over 1,000 lines; a function over 150 lines opens with a comment
    saying why it is long ("# Long on purpose: ...")."""
    long_files, silent = [], []
    for p in LIB.rglob("*.py"):
        text = p.read_text(encoding="utf-8")
        lines = text.splitlines()
        if len(lines) > 1000:
            long_files.append((p.name, len(lines)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and node.end_lineno - node.lineno + 1 > 150:
                first = node.body[1] if ast.get_docstring(node) else node.body[0]
                head = "\n".join(lines[node.lineno - 1:first.lineno])
                if "# Long on purpose:" not in head:
                    silent.append(f"{p.name}:{node.name}")
    assert not long_files, long_files
    assert not silent, silent


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


def test_studies_are_registered_as_entry_points():
    from importlib.metadata import entry_points

    from tl_spectral_studies import STUDIES

    eps = {ep.name: ep.value for ep in entry_points(group="tl_spectral.studies")}
    assert eps == STUDIES
    import importlib

    for mod in STUDIES.values():
        m = importlib.import_module(mod)
        assert callable(m.main) and callable(m.markdown) and callable(m.run_study)


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
