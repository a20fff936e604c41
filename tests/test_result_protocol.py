"""One Result protocol for every result kind: to_dict (plain Python/numpy), to_frame (pandas),
summary (a few lines), a short repr (no raw tensors), _repr_html_ (table + figure inline),
plot (main figure), show (view or figure), save/load; register_result idempotent for a class
re-defined in a notebook."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_native

from tl_spectral.results import _REGISTRY, Result, _import_result_modules, register_result


def _instances(tmp_path) -> dict[str, Result]:
    """One real instance of every registered kind, from small computations."""
    from tl_spectral.analysis.contributions import contribution_weights
    from tl_spectral.analysis.pod import pod
    from tl_spectral.analysis.sinks import sink_geometry
    from tl_spectral.geometry.cascade import CascadeResult
    from tl_spectral.geometry.qk import qk_geometry, sd_geometry
    from tl_spectral.interventions.ablations import ablation_table, rank_truncation_curve
    from tl_spectral.interventions.surgery import (
        AllocationStudy,
        cascade_allocation,
        linearization_curve,
    )
    from tl_spectral.models import GPT, GPTConfig
    from tl_spectral.probes import (
        AttentionFieldProbe,
        AttentionStatsProbe,
        ContributionProbe,
        HeadScoresProbe,
        SinkProbe,
        run_probes,
    )
    from tl_spectral.probes.contributions import layer_maps
    from tl_spectral.probes.faithfulness import faithfulness
    from tl_spectral.probes.sinks import zero_sink_value

    g = torch.Generator().manual_seed(0)
    model = make_native(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=32, d_vocab=20)
    toks = torch.randint(0, 20, (3, 12), generator=g)
    res = run_probes(model, toks, [AttentionStatsProbe(), ContributionProbe(keep_docs=[0]),
                                   SinkProbe(), AttentionFieldProbe(),
                                   HeadScoresProbe(token_sets={"low": [0, 1]})], progress=False)
    out: dict[str, Result] = {r.kind: r for r in res.values()}
    sp = res["attention_fields"].scale_pod(n_heads=2)
    out[sp.kind] = sp
    out[sp.layers[0].kind] = sp.layers[0]
    ph = run_probes(model, toks, [AttentionFieldProbe(per_head=True)],
                    progress=False)["attention_fields"].scale_pod(n_heads=2)
    out[ph.kind] = ph
    out[ph.layers[0].kind] = ph.layers[0]
    st = run_probes(model, toks, [AttentionFieldProbe(streaming=True, rank=4)],
                    progress=False)["attention_fields"]
    out[st.kind] = st
    p = pod(torch.randn(10, 30, generator=g, dtype=torch.float64))
    out[p.kind] = p
    maps = layer_maps(model, toks[:1], layers=[0])[0]
    out[maps.kind] = maps
    f = faithfulness(model, toks[:2], measures=("attention", "random"), fractions=[0.0, 0.5],
                     batch_size=2)
    out[f.kind] = f
    z = zero_sink_value(model, toks[:2], batch_size=2)
    out[z.kind] = z
    pat = torch.softmax(torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64)
                        .masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -math.inf), -1)
    sg = sink_geometry(pat, torch.randn(2, 6, 2, 4, generator=g, dtype=torch.float64),
                       torch.randn(2, 4, 8, generator=g, dtype=torch.float64))
    out[sg.kind] = sg
    q = qk_geometry(torch.randn(2, 2, 8, 4, generator=g), torch.randn(2, 2, 8, 4, generator=g))
    out[q.kind] = q
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry

    rq = rotary_qk_geometry(torch.randn(2, 2, 8, 4, generator=g),
                            torch.randn(2, 1, 8, 4, generator=g), RotarySpec.from_base(2),
                            offsets=[0, -1, -3], n_ctx=6)
    out[rq.kind] = rq
    A = torch.randn(2, 2, 4, 4, generator=g)
    sd = sd_geometry(A - A.mT, torch.rand(2, 2, 4, generator=g))
    out[sd.kind] = sd
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16,
                        d_mlp=32)).eval()
    w = torch.randint(0, 20, (2, 9), generator=g)
    a = ablation_table(gpt, w, per_layer=False)
    out[a.kind] = a
    rt = rank_truncation_curve(gpt, w, ranks=[2, 4])
    out[rt.kind] = rt
    c = linearization_curve(gpt, w, ks=[0, 1])
    out[c.kind] = c
    al = cascade_allocation(gpt, 0.9, multiple=2)
    out[al.kind] = al
    st = AllocationStudy(rows=[
        {"name": "uniform", "d_head": [8, 8], "attention_params": 100, "total_params": 900,
         "ppl": 5.0, "loss": 1.6, "steps": 10},
        {"name": "cascade", "d_head": [4, 6], "attention_params": 60, "total_params": 860,
         "ppl": 5.2, "loss": 1.65, "steps": 10}], recipe={"steps": 10}, n_windows=4, seq_len=16)
    out[st.kind] = st
    cas = CascadeResult(run_name="r", attention="softmax", d_head=[8, 8],
                        steps=torch.tensor([1, 2]), rank_R=torch.rand(2, 2, 2, generator=g),
                        routing_fraction_R=torch.rand(2, 2, 2, generator=g),
                        val_loss=torch.tensor([2.0, 1.5], dtype=torch.float64))
    out[cas.kind] = cas
    del contribution_weights
    return out


def _plain(x) -> bool:
    if isinstance(x, torch.Tensor):
        return False
    if isinstance(x, dict):
        return all(_plain(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return True


def test_protocol_over_every_registered_kind(tmp_path):
    import matplotlib.figure

    _import_result_modules()
    inst = _instances(tmp_path)
    library = {k for k, cls in _REGISTRY.items() if cls.__module__.startswith("tl_spectral.")}
    missing = sorted(library - set(inst))
    assert not missing, f"add an instance of {missing} to _instances"
    for kind, r in inst.items():
        d = r.to_dict()
        assert isinstance(d, dict) and _plain(d), kind
        frame = r.to_frame()
        assert isinstance(frame, pd.DataFrame) and len(frame) >= 1, kind
        s = r.summary()
        assert isinstance(s, str) and kind in s and len(s.splitlines()) <= 15, kind
        text = repr(r)
        assert kind in text and len(text) <= 400 and "tensor(" not in text, (kind, text)
        html = r._repr_html_()
        assert "<table" in html and "<img" in html and "<script" not in html, kind
        fig = r.plot()
        assert isinstance(fig, matplotlib.figure.Figure), kind
        with pytest.warns(UserWarning, match="show"):  # Agg, no notebook: says how to save
            assert r.show() is None, kind
        path = r.save(tmp_path / kind)
        back = Result.load(path)
        assert type(back) is type(r), kind
        assert back.to_frame().shape == frame.shape, kind
        import matplotlib.pyplot as plt

        plt.close("all")
        for k, v in d.items():
            w = back.to_dict()[k]
            if isinstance(v, np.ndarray):
                np.testing.assert_allclose(np.asarray(w, dtype=v.dtype), v, err_msg=kind)


def test_print_is_short_and_numbers_come_out():
    from tl_spectral.probes import AttentionStatsProbe, run_probes

    model = make_native(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=64, d_vocab=20)
    r = run_probes(model, torch.randint(0, 20, (4, 60)), [AttentionStatsProbe()],
                   progress=False)["attention_stats"]
    assert len(repr(r)) < 400 and len(str(r)) < 400  # the raw mean pattern is 2×2×60×60
    assert r.to_frame().columns.tolist()[:3] == ["layer", "head", "entropy"]
    assert isinstance(r.to_dict()["entropy"], np.ndarray)
    assert "circuitsvis" in type(r.view()).__module__ or hasattr(r.view(), "local_src")


def test_register_result_is_idempotent_for_a_redefined_class():
    def define():
        @register_result
        @dataclasses.dataclass
        class NotebookResult(Result):
            kind = "notebook_result_test"
            x: torch.Tensor

        return NotebookResult

    first, second = define(), define()  # a notebook cell run twice
    assert _REGISTRY["notebook_result_test"] is second and first is not second
    with pytest.raises(ValueError, match="already registered"):
        @register_result
        @dataclasses.dataclass
        class Other(Result):
            kind = "notebook_result_test"
            y: int = 0


def test_every_kind_loads_in_a_fresh_process(tmp_path):
    """A saved file names the module of its kind; Result.load imports it (nothing imported
    beforehand), for every registered kind of the library."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    inst = _instances(tmp_path)
    paths = {kind: str(r.save(tmp_path / "fresh" / kind)) for kind, r in inst.items()}
    code = ("import json, sys\nfrom tl_spectral.results import Result\n"
            "paths = json.loads(sys.argv[1])\n"
            "print(json.dumps({k: type(Result.load(p)).kind for k, p in paths.items()}))")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", code, json.dumps(paths)], capture_output=True,
                       text=True, timeout=300, cwd=root)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {k: k for k in paths}


def test_an_old_file_without_its_module_loads_in_a_fresh_process():
    """Files written before the module was recorded (the committed faithfulness result) load
    through the frozen kind -> module table, in a process that imported nothing else."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    f = root / "docs/results/contributions/char_shakespeare_faithfulness.safetensors"
    code = ("import sys\nfrom tl_spectral.results import Result\n"
            "print(Result.load(sys.argv[1]).kind)")
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True,
                       timeout=300, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "faithfulness"


def test_load_imports_only_library_modules_that_define_the_kind(tmp_path):
    import json

    from safetensors.torch import save_file

    def write(name, kind, module):
        header = {"format": "tl_spectral.result/1", "kind": kind, "module": module,
                  "fields": {}}
        p = tmp_path / f"{name}.safetensors"
        save_file({"x": torch.zeros(1)}, str(p), metadata={"tl_spectral": json.dumps(header)})
        return p

    refused = "never imported from a file"
    with pytest.raises(ValueError, match=refused):
        Result.load(write("os", "no_such_kind_1", "os"))
    with pytest.raises(ValueError, match=refused):
        Result.load(write("studies", "no_such_kind_2", "tl_spectral_studies.routing"))
    with pytest.raises(ValueError, match=refused):  # a library module without result kinds
        Result.load(write("boot", "no_such_kind_3", "tl_spectral.analysis.bootstrap"))
    with pytest.raises(ValueError, match=refused):
        Result.load(write("missing", "no_such_kind_4", "tl_spectral.no_such_module"))
    with pytest.raises(ValueError, match="does not define it"):
        Result.load(write("wrong", "no_such_kind_6", "tl_spectral.analysis.pod"))
    with pytest.raises(ValueError, match="not the name"):
        Result.load(write("num", "no_such_kind_5", 3))


def test_every_figure_of_the_library_goes_through_the_plotting_leaf():
    """One convention: each plot / plot_* / view method of a library result kind is one line,
    ``self._draw(name, ...)``, and the plotting leaf has a function for it."""
    import inspect

    from tl_spectral.results import plotter

    _import_result_modules()
    seen = 0
    for kind, cls in _REGISTRY.items():
        if not cls.__module__.startswith("tl_spectral."):
            continue
        for name, fn in vars(cls).items():
            if not (name == "plot" or name == "view" or name.startswith("plot_")):
                continue
            src = inspect.getsource(fn)
            assert f'self._draw("{name}"' in src and "import matplotlib" not in src, (kind, name)
            assert callable(plotter(kind, name)), (kind, name)
            seen += 1
    assert seen >= 40
    with pytest.raises(NotImplementedError, match="no figure"):
        plotter("pod", "plot_nothing")


def test_the_main_table_is_to_rows():
    """The protocol's table hook is to_rows() (docs/api.md, "Conventions"): a library kind
    with a table defines it, and its old names (rows / summary_rows / table) are only the
    deprecated aliases (AllocationStudy keeps its models in a field named rows); a kind of
    another package with only an older name still works, with a DeprecationWarning."""
    _import_result_modules()
    for kind, cls in _REGISTRY.items():
        if not cls.__module__.startswith("tl_spectral."):
            continue
        for old in ("rows", "summary_rows", "table"):
            if callable(vars(cls).get(old)):
                assert "Deprecated" in (vars(cls)[old].__doc__ or ""), (kind, old)
                assert "to_rows" in vars(cls), kind

    @dataclasses.dataclass
    class OldStyle(Result):
        kind = "old_style_table_test"
        x: int = 1

        def rows(self):
            return [{"x": self.x}, {"x": 2}]

    with pytest.warns(DeprecationWarning, match="to_rows()"):
        assert len(OldStyle().to_frame()) == 2
