"""Issue 41 item 4: a probe, its figure and its report section from a package of someone
else's, picked up through the ``tl_spectral.plugins`` entry-point group with nothing listed
in tl_spectral: the CLI's ``--sections`` (help, errors, a report built with it), the report,
``Result.load`` and the API tables (``python -m tl_spectral.api_doc``).

The plugin is written into a temporary folder with a ``.dist-info/entry_points.txt``, as pip
would install it, and put on ``sys.path``; every registration it made is undone after."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = "toy_tl_plugin"

_FILES = {
    "__init__.py": '''
        """A toy tl_spectral plugin: importing it registers its figure and report section."""
        from toy_tl_plugin import plots, section  # noqa: F401 - each registers itself
        from toy_tl_plugin.probe import ToyProbe, ToyResult  # noqa: F401 - its public names
        ''',
    "probe.py": '''
        """The toy probe: how much attention each head puts on the current token."""
        from dataclasses import dataclass, field
        from typing import ClassVar

        import torch

        from tl_spectral.probes import Probe
        from tl_spectral.results import Result, register_result


        @register_result
        @dataclass
        class ToyResult(Result):
            """Mean attention of every head on the query's own token."""

            kind: ClassVar[str] = "toy_self_attention"
            main_plot: ClassVar[str] = "plot"
            array_shapes = {"self_mass": "float[layer, head]"}
            self_mass: torch.Tensor
            layers: list = field(default_factory=list)

            def to_rows(self):
                return [{"layer": lay, "head": h, "self_mass": float(self.self_mass[i, h])}
                        for i, lay in enumerate(self.layers)
                        for h in range(self.self_mass.shape[1])]

            def plot(self):
                return self._draw("plot")


        class ToyProbe(Probe):
            """Toy probe: the attention each head puts on the current token."""

            name = "toy"

            def requires(self, view):
                return {layer: {"pattern"} for layer in range(view.n_layers)}

            def update(self, cap):
                diag = cap.pattern.diagonal(dim1=-2, dim2=-1)  # [batch, head, pos]
                mass = (diag * cap.mask[:, None, :]).sum(dim=(0, 2)).double()
                row = torch.zeros(self.view.n_layers, self.view.n_heads, dtype=torch.float64)
                row[cap.layer] = mass
                count = torch.zeros(self.view.n_layers, dtype=torch.float64)
                count[cap.layer] = cap.mask.sum()
                self.accumulate("mass", row)
                self.accumulate("count", count)

            def result(self) -> ToyResult:
                self._require_state()
                s = self.state
                return ToyResult((s["mass"] / s["count"][:, None]).float(),
                                 layers=list(range(self.view.n_layers)))
        ''',
    "plots.py": '''
        """The toy result's figure."""
        from tl_spectral.viz.figures import register_plot


        @register_plot("toy_self_attention", "plot")
        def toy_plot(res):
            """Heads by layer: the attention on the current token."""
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(3, 2))
            ax.imshow(res.self_mass.numpy(), aspect="auto", vmin=0, vmax=1)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            return fig
        ''',
    "section.py": '''
        """The toy report section."""
        from tl_spectral.viz.context import register_section
        from toy_tl_plugin.probe import ToyProbe


        @register_section
        class ToySection:
            """Attention on the current token, per head."""

            key = "toy"
            title = "Toy: attention on the current token"
            order = 60
            glossary = {"self_mass": "mean attention of the head on the query's own token"}

            def probes(self, ctx):
                return [ToyProbe()]

            def render(self, report, results, ctx):
                res = results["toy"]
                res.save(ctx.results_dir / "toy.safetensors")
                report.section(self.title)
                report.text("TOY-SECTION-TEXT: the mean attention of each head on the "
                            "query's own token.")
                report.figure(res.plot(), "Attention on the current token.")
                report.table(res.to_rows(), "per-head self attention", name="toy_heads")
        ''',
}


def write_plugin(site: Path) -> Path:
    """The toy plugin, installed into ``site`` as pip would (package + dist-info)."""
    pkg = site / PKG
    pkg.mkdir(parents=True)
    for name, text in _FILES.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    info = site / f"{PKG}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-tl-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tl_spectral.plugins]\ntoy = {PKG}\n")
    return site


def _ours(module: str) -> bool:
    return module == PKG or module.startswith(PKG + ".")


@pytest.fixture
def toy_plugin(tmp_path, monkeypatch):
    """The plugin on sys.path and loaded (as a fresh process would at ``import
    tl_spectral.viz.sections``); afterwards its section, figure, kind and modules are gone."""
    import tl_spectral.discovery as discovery
    from tl_spectral.results import _REGISTRY
    from tl_spectral.viz.figures import FIGURES
    from tl_spectral.viz.sections import SECTIONS

    site = write_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    before = discovery._PLUGINS
    discovery._forget_plugins()
    try:
        yield site
    finally:
        SECTIONS[:] = [s for s in SECTIONS if not _ours(s.__module__)]
        for key in [k for k, fn in FIGURES.items() if _ours(fn.__module__)]:
            del FIGURES[key]
        for kind in [k for k, c in _REGISTRY.items() if _ours(c.__module__)]:
            del _REGISTRY[kind]
        for name in [m for m in sys.modules if _ours(m)]:
            del sys.modules[name]
        discovery._PLUGINS = before


def test_the_plugin_is_discovered_and_registers_itself(toy_plugin):
    from tl_spectral.discovery import load_plugins
    from tl_spectral.probes import public_names
    from tl_spectral.results import plotter
    from tl_spectral.viz.sections import section_keys

    mods = load_plugins()
    assert list(mods) == ["toy"] and mods["toy"].__name__ == PKG
    keys = section_keys()
    assert keys[-1] == "toy" and keys.index("surgery") < keys.index("toy")  # order 60: last
    assert plotter("toy_self_attention", "plot").__module__ == f"{PKG}.plots"
    # its public names: the probe and result kinds it defines (no __all__ in the toy)
    assert public_names(mods["toy"]) == ["ToyProbe", "ToyResult"]
    # a plugin module that imports its probe from elsewhere (imported=True, as the API
    # tables read a plugin; tl_spectral's own classes are never its names)
    section_module = sys.modules[f"{PKG}.section"]
    assert public_names(section_module) == []
    assert public_names(section_module, imported=True) == ["ToyProbe"]
    import tl_spectral as tls

    assert "ToyProbe" not in tls.__all__  # a plugin's names stay in its own package


def test_the_cli_lists_and_checks_the_plugin_section(toy_plugin, capsys):
    from tl_spectral.cli import main
    from tl_spectral.discovery import load_plugins

    load_plugins()
    assert main(["analyze", "--sections", "toy,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown sections ['nope']" in err
    assert "toy" in err.split("known:")[1] and "attention_stats" in err
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "surgery, toy) or 'all'" in help_text


def test_a_report_with_the_plugin_section_from_a_fresh_process(toy_plugin, tmp_path):
    """``python -m tl_spectral analyze --sections toy``: found by entry point alone (the
    plugin is only on PYTHONPATH), run in the one probe pass, rendered, saved, reloadable."""
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_plugin), str(ROOT)]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "tl_spectral", "analyze", "--model",
                        "char-shakespeare", "--sections", "toy", "--n-docs", "2", "--length",
                        "16", "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "Toy: attention on the current token" in html and "TOY-SECTION-TEXT" in html
    assert "data:image/png;base64," in html
    # its table's column is defined by the section itself (tooltip and glossary)
    assert 'title="mean attention of the head on the query&#x27;s own token"' in html \
        or "title=\"mean attention of the head on the query's own token\"" in html
    assert "(not defined)" not in html
    assert (out / "tables" / "toy-heads.csv").read_text().startswith("layer,head,self_mass")
    # the saved result reloads in this process: its kind registers when the plugins load
    from tl_spectral.results import Result

    res = Result.load(out / "results" / "toy.safetensors")
    assert type(res).__name__ == "ToyResult" and type(res).__module__ == f"{PKG}.probe"
    assert res.self_mass.shape[1] > 0 and float(res.self_mass.min()) >= 0.0


def test_the_api_tables_list_the_plugin(toy_plugin):
    from tl_spectral.api_doc import blocks, fill, main

    got = blocks()
    table = got["api-plugins"]
    assert f"| `{PKG}.ToyProbe` | probe (`{PKG}`): Toy probe:" in table
    assert f"| `{PKG}.ToyResult` | result kind `toy_self_attention`, what `ToyProbe` returns:" \
        in table
    assert "| `--sections toy` | report section \"Toy: attention on the current token\"" in table
    assert f"| `{PKG}: toy_self_attention.plot` | figure `plot`" in table
    assert "ToyProbe" not in got["api-probes"]  # docs/api.md's table: the library's only
    doc = toy_plugin / "API.md"
    doc.write_text("# My plugin\n\n<!-- generated: api-plugins -->\n<!-- /generated -->\n")
    assert main([str(doc), "--check"]) == 1
    assert main([str(doc)]) == 0 and main([str(doc), "--check"]) == 0
    text = doc.read_text()
    assert f"`{PKG}.ToyProbe`" in text and fill(text, got) == text


def test_a_broken_plugin_warns_and_the_library_still_works(toy_plugin):
    import tl_spectral.discovery as discovery

    (toy_plugin / PKG / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    discovery._forget_plugins()
    with pytest.warns(RuntimeWarning, match="plugin 'toy'.*broken on purpose"):
        assert discovery.load_plugins() == {}
