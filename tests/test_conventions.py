"""One convention per thing (docs/api.md, "Conventions" and "Deprecated spellings").

For each convention: the new spelling works, every public name follows it, and each old
spelling still works for a release: it warns exactly one DeprecationWarning, pointing at the
caller's line, and gives the same result as the new spelling.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
import warnings
from pathlib import Path

import pytest
import torch

import tl_spectral as tls
from tl_spectral.probes import Probe

ROOT = Path(__file__).resolve().parents[1]


def _one_deprecation(fn, *args, **kwargs):
    """fn's value, checking that the call warned exactly one DeprecationWarning, attributed
    to this file (the caller's line), that names the replacement and the removal release."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn(*args, **kwargs)
    dep = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(dep) == 1, [str(w.message) for w in dep]
    assert dep[0].filename == __file__, dep[0].filename
    assert "use " in str(dep[0].message) and "removed in tl_spectral" in str(dep[0].message)
    return value


def _no_deprecation(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return fn(*args, **kwargs)


def _public_functions():
    for name in tls.__all__:
        obj = getattr(tls, name)
        if inspect.isfunction(obj) or inspect.isclass(obj) and issubclass(obj, Probe):
            yield name, obj


@pytest.fixture(scope="module")
def tiny():
    from conftest import make_native

    return make_native(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=20)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 20, (3, 8), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def gpt():
    from tl_spectral.models import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16,
                         d_mlp=32)).eval()


# ------------------------------------------------------------------ the token argument
def test_the_token_argument_is_called_tokens_everywhere():
    for name, fn in _public_functions():
        params = list(inspect.signature(fn).parameters)
        # (rotary geometry's windows= is a layer's sliding attention window, not tokens)
        assert "data" not in params and params[1:2] != ["windows"], \
            f"{name} still takes data= / windows= for its tokens"
    for fn in (tls.run_probes, tls.run_probes_with_logits, tls.faithfulness, tls.zero_sink_value,
               tls.ablation_table, tls.linearization_curve, tls.rank_truncation_curve,
               tls.layer_maps, tls.tl_linearization_curve):
        assert list(inspect.signature(fn).parameters)[1] == "tokens", fn.__name__


def _same(a, b):
    assert type(a) is type(b)
    for k, v in a.to_dict().items():
        w = b.to_dict()[k]
        if hasattr(v, "shape"):
            assert (v == w).all() or (v != v).all(), k  # NaN means "undefined": kept as is
        else:
            assert v == w, k


def test_old_token_keywords_warn_once_and_give_the_same_result(tiny, tokens, gpt):
    p = [tls.AttentionStatsProbe()]
    new = tls.run_probes(tiny, tokens=tokens, probes=p)["attention_stats"]
    _same(_one_deprecation(tls.run_probes, tiny, data=tokens, probes=p)["attention_stats"], new)
    kw = dict(fractions=[0.0, 0.5], measures=["attention", "random"])
    _same(_one_deprecation(tls.faithfulness, tiny, data=tokens, **kw),
          tls.faithfulness(tiny, tokens=tokens, **kw))
    _same(_one_deprecation(tls.zero_sink_value, tiny, data=tokens),
          tls.zero_sink_value(tiny, tokens))
    win = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    for fn, kw in ((tls.ablation_table, {}), (tls.linearization_curve, {"ks": [0, 1]}),
                   (tls.rank_truncation_curve, {"ranks": [1]})):
        _same(_one_deprecation(fn, gpt, windows=win, **kw), fn(gpt, tokens=win, **kw))


def test_old_and_new_token_keyword_together_is_a_type_error(tiny, tokens):
    with pytest.raises(TypeError, match="both data= and tokens="):
        tls.run_probes(tiny, data=tokens, tokens=tokens, probes=[tls.AttentionStatsProbe()])


# ------------------------------------------------------------------ logits and results
@pytest.mark.tl39
def test_run_probes_with_logits_returns_logits_then_results_like_run_with_cache(tiny, tokens):
    p = [tls.AttentionStatsProbe()]
    results = _no_deprecation(tls.run_probes, tiny, tokens, p)
    assert isinstance(results, dict)
    logits, again = _no_deprecation(tls.run_probes_with_logits, tiny, tokens, p)
    ref_logits, _cache = tiny.run_with_cache(tokens)  # TransformerLens' order: logits first
    torch.testing.assert_close(logits, ref_logits.cpu(), atol=1e-5, rtol=1e-5)
    _same(again["attention_stats"], results["attention_stats"])
    # the deprecated spelling: the old order and type, the same numbers
    run = _one_deprecation(tls.run_probes, tiny, tokens, p, return_logits=True)
    from tl_spectral.probes.runner import ProbeRun

    assert isinstance(run, ProbeRun) and run.results.keys() == results.keys()
    assert _one_deprecation(getattr, tls, "ProbeRun") is ProbeRun
    assert "ProbeRun" not in tls.__all__
    torch.testing.assert_close(run.logits, logits)
    _same(run.results["attention_stats"], results["attention_stats"])


# ------------------------------------------------------------------ progress
def test_every_progress_argument_defaults_to_none():
    seen = []
    for name, fn in _public_functions():
        params = inspect.signature(fn).parameters
        if "progress" in params:
            seen.append(name)
            assert params["progress"].default is None, name
    assert {"run_probes", "faithfulness", "linearization_curve",
            "model_rotary_geometry"} <= set(seen)


@pytest.mark.parametrize("enabled, tty, shown, delay", [
    (None, False, False, 0.0), (None, True, True, 2.0), (True, False, True, 0.0),
    (False, True, False, 0.0)])
def test_progress_none_shows_a_delayed_bar_only_where_someone_sees_it(monkeypatch, enabled, tty,
                                                                       shown, delay):
    from tl_spectral import progress

    monkeypatch.setattr(progress, "interactive", lambda: tty)
    bar = progress.progress_bar(range(3), enabled=enabled, file=open("/dev/null", "w"))
    assert bar.disable is not shown
    if shown:
        assert bar.delay == delay
    bar.close()


def test_interactive_is_false_under_a_captured_stderr():
    from tl_spectral.progress import interactive

    assert interactive() is False  # pytest captures stderr: no TTY, no kernel


# ------------------------------------------------------------------ mode strings
MODE_ARGS = [
    (tls.ContributionProbe, "mode"), (tls.contribution_weights, "mode"),
    (tls.layer_maps, "mode"), (tls.faithfulness, "mode"), (tls.faithfulness, "level"),
    (tls.faithfulness, "scope"), (tls.AttentionFieldProbe, "field"),
]


@pytest.mark.parametrize("fn, arg", MODE_ARGS, ids=[f"{f.__name__}-{a}" for f, a in MODE_ARGS])
def test_mode_strings_are_literal_types(fn, arg):
    target = fn.__init__ if inspect.isclass(fn) else fn
    hint = typing.get_type_hints(inspect.unwrap(target))[arg]
    assert typing.get_origin(hint) is typing.Literal, hint
    assert inspect.signature(fn).parameters[arg].default in typing.get_args(hint)


def test_a_bad_mode_string_is_one_line_listing_the_allowed_values(tiny, tokens):
    calls = {
        "mode": lambda: tls.ContributionProbe(mode="both"),
        "field": lambda: tls.AttentionFieldProbe(field="attn"),
        "level": lambda: tls.faithfulness(tiny, tokens, level="pair"),
        "scope": lambda: tls.faithfulness(tiny, tokens, scope="doc"),
    }
    allowed = {"mode": ["'inter'", "'intra'"], "level": ["'token'", "'head'"],
               "scope": ["'query'", "'layer'"],
               "field": ["'attention'", "'contribution'", "'value_weighted_raw'"]}
    for arg, call in calls.items():
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{arg}=")
        assert all(a in msg for a in allowed[arg]), msg
    with pytest.raises(ValueError, match=r"^mode='x' is not one of 'inter', 'intra'"):
        tls.layer_maps(tiny, tokens, mode="x")


# ------------------------------------------------------------------ the main table
@pytest.fixture(scope="module")
def results(tiny, tokens):
    probes = [tls.AttentionStatsProbe(), tls.HeadScoresProbe(), tls.ContributionProbe(),
              tls.SinkProbe(), tls.AttentionFieldProbe()]
    out = tls.run_probes(tiny, tokens, probes)
    out["faithfulness"] = tls.faithfulness(tiny, tokens, fractions=[0.0, 0.5],
                                           measures=["attention", "random"])
    out["scale_pod"] = out["attention_fields"].scale_pod(n_heads=2)
    return out


OLD_TABLES = [("attention_stats", "rows"), ("head_scores", "rows"),
              ("contributions", "rows"), ("contributions", "summary_rows"), ("sinks", "rows"),
              ("sinks", "summary_rows"), ("faithfulness", "rows"), ("scale_pod", "rows"),
              ("scale_pod", "table")]


@pytest.mark.parametrize("key, old", OLD_TABLES, ids=[f"{k}.{o}" for k, o in OLD_TABLES])
def test_old_table_names_warn_once_and_equal_to_rows(results, key, old):
    res = results[key]
    rows = _no_deprecation(res.to_rows)
    assert rows and all(isinstance(r, dict) for r in rows)
    assert _one_deprecation(getattr(res, old)) == rows
    assert list(_no_deprecation(res.to_frame).columns) == list(rows[0])


def test_faithfulness_table_of_one_setting_is_to_rows_of_that_setting(results):
    res = results["faithfulness"]
    one = res.to_rows(1)
    assert len(one) == len(res.measures) and "setting" not in one[0]
    assert [{"setting": res.settings[1], **r} for r in one] == [
        r for r in res.to_rows() if r["setting"] == res.settings[1]]
    assert _one_deprecation(res.table, 1) == one


def test_every_exported_result_kind_names_its_table_to_rows():
    from tl_spectral.results import Result

    kinds = [getattr(tls, n) for n in tls.__all__ if inspect.isclass(getattr(tls, n))
             and issubclass(getattr(tls, n), Result) and getattr(tls, n) is not Result]
    assert len(kinds) >= 20
    for cls in kinds:
        assert callable(getattr(cls, "to_rows", None)), cls.__name__
        for old in ("summary_rows", "table"):
            assert old not in cls.__dict__ or "Deprecated" in (cls.__dict__[old].__doc__ or ""), \
                f"{cls.__name__}.{old} is not the deprecated alias"


def test_a_foreign_kind_with_the_old_hook_still_tabulates_with_a_warning():
    import dataclasses

    from tl_spectral.results import Result

    @dataclasses.dataclass
    class Mine(Result):
        kind: typing.ClassVar[str] = "mine_conventions_test"
        x: int = 1

        def rows(self):
            return [{"x": self.x}]

    frame = _one_deprecation(Mine().to_frame)
    assert frame.to_dict("records") == [{"x": 1}]


# ------------------------------------------------------------------ probes and their names
def test_probe_name_is_an_instance_attribute_with_a_class_default():
    assert typing.get_type_hints(Probe)["name"] is str  # not ClassVar: instances set it
    p = tls.SinkProbe(name="mine")
    assert p.name == "mine" and tls.SinkProbe.name == "sinks" and tls.SinkProbe().name == "sinks"
    for f in sorted((ROOT / "tl_spectral" / "probes").glob("*.py")):
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"self\.(name|reductions) = .*# type: ignore", text), f.name


def test_probes_end_in_probe_and_results_are_exported():
    from tl_spectral.results import _REGISTRY, Result

    probes = [n for n in tls.__all__ if inspect.isclass(getattr(tls, n))
              and issubclass(getattr(tls, n), Probe) and getattr(tls, n) is not Probe]
    assert len(probes) == 5 and all(n.endswith("Probe") for n in probes), probes
    results = {n for n in tls.__all__ if inspect.isclass(getattr(tls, n))
               and issubclass(getattr(tls, n), Result)}
    internal = {"AllocationStudy", "ScalePODLayer", "ScalePODHeadsLayer"}  # parts / studies'
    for _kind, cls in _REGISTRY.items():
        if cls.__module__.startswith("tl_spectral.") and cls.__name__ not in internal:
            assert cls.__name__ in results, f"{cls.__name__} is not exported from tl_spectral"
    # what each built-in probe returns is exported under its class name
    assert {"AttentionStatsResult", "HeadScoresResult", "ContributionStats", "SinkStats",
            "AttentionFields", "StreamedAttentionFields"} <= results


@pytest.mark.parametrize("old, new", [("AttentionStats", "AttentionStatsProbe"),
                                      ("HeadScores", "HeadScoresProbe")])
def test_old_probe_names_warn_once_and_are_the_same_class(old, new):
    import tl_spectral.probes as probes_pkg

    assert _one_deprecation(getattr, tls, old) is getattr(tls, new)
    assert _one_deprecation(getattr, probes_pkg, old) is getattr(tls, new)
    assert old not in tls.__all__ and old not in probes_pkg.__all__


# ------------------------------------------------------------------ one loader
def test_load_model_takes_a_zoo_name_random_or_a_folder(tmp_path, gpt):
    from tl_spectral.data import CharTokenizer
    from tl_spectral.model_view import ModelView
    from tl_spectral.models import load_checkpoint, save_model, to_transformer_lens

    model, tok = tls.load_model("random")
    assert ModelView(model).n_layers == 6 and tok.vocab_size > 20
    cs, ctok = tls.load_model("char-shakespeare")
    assert ModelView(cs).n_layers == 6 and isinstance(ctok, CharTokenizer)
    # a folder of the project's own checkpoint: converted, with its tokenizer
    chars = CharTokenizer.from_text("abcdefghijklmnopqrs ")
    save_model(gpt, tmp_path / "ck", extra={"tokenizer": json.loads(chars.to_json())})
    for spelling in (str(tmp_path / "ck"), tmp_path / "ck"):
        tl_model, tok = tls.load_model(spelling)
        assert tok.vocab_size == chars.vocab_size
        x = torch.randint(0, 20, (2, 7), generator=torch.Generator().manual_seed(2))
        ref = to_transformer_lens(load_checkpoint(tmp_path / "ck"))
        torch.testing.assert_close(tl_model(x), ref(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown model 'no-such-model'") as e:
        tls.load_model("no-such-model")
    assert "\n" not in str(e.value)


def test_the_old_loaders_warn_once_and_give_the_same_models(tmp_path, gpt):
    import tl_spectral.cli as cli
    import tl_spectral.models as models
    from tl_spectral.model_view import ModelView
    from tl_spectral.models import load_checkpoint, save_model

    old, _ = _one_deprecation(cli.load_model, "random")
    new, _ = tls.load_model("random")
    x = torch.randint(0, 20, (1, 5))
    torch.testing.assert_close(old(x), new(x))
    assert ModelView(old).n_layers == ModelView(new).n_layers
    save_model(gpt, tmp_path / "ck")
    via_old = _one_deprecation(lambda: models.load_model(tmp_path / "ck"))
    torch.testing.assert_close(via_old(x), load_checkpoint(tmp_path / "ck")(x))
    assert "load_model" not in models.__all__ and "load_checkpoint" in models.__all__


# ------------------------------------------------------------------ moved modules
_OLD_MODULE_PATHS = r"""
import sys, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import tl_spectral.models as models
    import tl_spectral.models.surgery as s   # the old module path: warns
    s_again = models.surgery   # now bound on the package: no second warning
    a = models.ablations   # an attribute of the package, before any import: warns
    from tl_spectral.models import ablations as a_again   # bound: no second warning
import tl_spectral.interventions.ablations as a2
import tl_spectral.interventions.surgery as s2
print(s is s2, s_again is s2, a is a2, a_again is a2)
for w in caught:
    print(w.category.__name__, w.filename, str(w.message).split(";")[0])
"""


def test_the_old_paths_of_the_interventions_warn_and_are_the_same_modules():
    """``tl_spectral.models.surgery`` / ``.ablations`` moved to ``tl_spectral.interventions``:
    the old paths give the new module objects themselves, with one DeprecationWarning (at
    the user's line) when a process first reaches one, by import or as an attribute."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _OLD_MODULE_PATHS], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "True True True True"
    assert lines[1:] == [
        "DeprecationWarning <string> tl_spectral.models.surgery is deprecated",
        "DeprecationWarning <string> tl_spectral.models.ablations is deprecated"]


# ------------------------------------------------------------------ our own code is clean
OLD_SPELLINGS = [
    (r"\.summary_rows\(|\b(?:res|stats|pod|zs|ind|r)\.(?:rows|table)\(", "a table's old name"),
    (r"return_logits=True", "run_probes(..., return_logits=True)"),
    (r"\b(?:AttentionStats|HeadScores)\(", "a probe's old class name"),
    (r"from tl_spectral\.models(?:\.gpt)? import [^\n]*\bload_model\b|cli\.load_model\(",
     "an old loader"),
    (r"(?:run_probes|faithfulness|zero_sink_value)\([^)]*\bdata=", "data="),
    (r"(?:ablation_table|linearization_curve|rank_truncation_curve)\([^)]*\bwindows=",
     "windows="),
    (r"tl_spectral\.models\.(?:surgery|ablations)\b|from tl_spectral\.models import "
     r"[^\n]*\b(?:surgery|ablations)\b", "an old path of the interventions"),
]


#: where an old spelling is named on purpose: the code that keeps it working
NAMES_THEM = {("runner.py", "run_probes(..., return_logits=True)"),
              *((path, "an old path of the interventions") for path in (
                  "tl_spectral/models/__init__.py", "tl_spectral/models/surgery.py",
                  "tl_spectral/models/ablations.py", "tl_spectral/interventions/__init__.py",
                  "tl_spectral/results.py"))}


def test_no_caller_of_ours_uses_an_old_spelling():
    files = [*sorted((ROOT / "tl_spectral").rglob("*.py")),
             *sorted((ROOT / "tl_spectral_studies").rglob("*.py")),
             *sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "demos").glob("*.py")),
             ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    skip = {"_deprecation.py", "test_conventions.py"}
    for f in files:
        if f.name in skip:
            continue
        text = f.read_text(encoding="utf-8")
        if f.name == "api.md":  # its "Deprecated spellings" table names them on purpose
            text = text.split("## Deprecated spellings")[0]
        for pattern, what in OLD_SPELLINGS:
            if {(f.name, what), (f.relative_to(ROOT).as_posix(), what)} & NAMES_THEM:
                continue
            m = re.search(pattern, text)
            assert m is None, f"{f.relative_to(ROOT)} uses {what}: {m.group(0)!r}"
    for nb in sorted((ROOT / "demos").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text("utf-8"))["cells"]
                         if c["cell_type"] == "code")
        for pattern, what in OLD_SPELLINGS:
            assert re.search(pattern, code) is None, f"{nb.name} uses {what}"


def test_the_suite_turns_our_deprecations_raised_by_our_own_code_into_errors():
    """pyproject's filterwarnings: a deprecated spelling used inside tl_spectral (or the
    studies) fails the suite; a test that uses one on purpose only sees the warning."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"error:.*removed in tl_spectral:DeprecationWarning:tl_spectral"' in text
