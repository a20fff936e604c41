"""The field-POD study of docs/scale_pod.md ("Scale POD of contribution fields"): scale-selective
POD of attention, contribution and value-weighted fields of the same documents, with 95%
intervals over documents (bootstrap for the band shares and the peak scale, delete-a-group
jackknife for T_spec and H*).

    F=attention,contribution,value_weighted
    tl-spectral study scale-pod --fields $F --model char-shakespeare --n-docs 150 --length 256 \
        --n-resamples 200 --out docs/results/field_pod --fig-dir docs/figures
    tl-spectral study scale-pod --fields $F --model minilm --n-docs 150 --length 256 \
        --n-resamples 200 --corpus ../shared/data/wiki_excerpt.txt \
        --out docs/results/field_pod --fig-dir docs/figures
    tl-spectral study scale-pod --fields $F --quick          # 16 windows of 128, a minute

(``main`` here is what ``scale-pod --fields`` calls; the study needs no entry point of its own.)

One forward pass captures every field (``AttentionFieldProbe(field=...)``, one probe per
field); each gets the scale POD of the scale-pod study (same windows: validation tenth of
the corpus, seed 0). Per layer and field: the peak scale ``a_peak`` (the largest ``E(a)``),
the fixed band shares, ``T_spec`` and ``H*(0.1)`` of the whole-field POD, each with a
percentile bootstrap interval over documents — except ``T_spec`` and ``H*``, which grow with
the number of documents and get the delete-a-group jackknife of the scale-pod study (20
random groups of documents, each replicate all-distinct; ``θ̂ ± t·se``) — and the paired
differences field − attention (the same documents for every field, so the differences are
paired).

Bootstrap (exact per resample, no pass over the fields): with ``w`` the resample's document
multiplicities, ``E'(a) = [Σ_s w_s e_s(a) − N ⟨P_a, mᵀm⟩] / (N T)``, where
``e_s(a) = ⟨P_a, F_sᵀ F_s⟩`` per document, ``P_a = Re(M_aᴴ M_a)`` from the Morlet operator and
``m = Σ_s w_s F_s / N`` the resample's mean fluctuation (so ``E'`` is the scale energy of the
resample's fluctuations about its own mean); the POD eigenvalues come from
``centred_gram_resample`` of the whole-field Gram. The dominant scales and band windows are
those of the full ensemble (only whole-field POD statistics get intervals).

Writes ``OUT/field_pod_<model>_N<n>.json`` and ``FIG/field_pod_<model>_N<n>_*.png``;
:func:`markdown` renders the doc tables from the JSON.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tl_spectral.usage import ArgumentParser
from tl_spectral.usage import seed as seed_arg
from tl_spectral_studies._common import (
    StudyUsageError,
    add_run_arguments,
    prepare_out,
    save_figures,
    validation_windows,
)

NAME = "scale-pod"  # reached as `tl-spectral study scale-pod --fields ...`
DEFAULT_FIELDS = ("attention", "contribution", "value_weighted")
STATS = ("a_peak", "E_fine", "E_medium", "E_coarse", "T_spec", "H_star")
"""Per layer and field: peak scale of E(a) (tokens), band shares, whole-field T_spec and H*."""


# ----------------------------------------------------------------------------- bootstrap
_OPERATORS: dict = {}  # (n_lags, T, dtype) -> (scales, P): one Morlet operator per shape


class LayerBootstrap:
    """What the per-resample statistics of one layer's fluctuation fields need.

    F: ``[N, T, n_lags]`` fluctuations (as passed to ``scale_pod_layer``); lags: ``[n_lags]``;
    epsilon: tolerance of ``H*``. Precomputes the per-document scale energies ``e [N, S]``,
    the operator ``P [S, n_lags²]`` and the whole-field Gram ``G = X Xᵀ [N, N]`` (float64).
    """

    def __init__(self, F: Tensor, lags: Tensor, *, epsilon: float = 0.10):
        from tl_spectral.analysis.wavelets import DEFAULT_WAVELET, LagCWT, default_scales

        N, T, n = (int(d) for d in F.shape)
        self.N, self.T, self.n, self.epsilon = N, T, n, float(epsilon)
        self.F = F.reshape(N, T * n)
        self.dtype = F.dtype
        key = (n, T, F.dtype)
        if key not in _OPERATORS:  # shared by every layer and field of one shape
            op = LagCWT(n, default_scales(T), DEFAULT_WAVELET,
                        dtype=torch.float64 if F.dtype == torch.float64 else torch.float32)
            M = op.matrix(torch.complex128 if op.is_complex else torch.float64)  # [S, n, n]
            if op.is_complex:
                P = M.real.transpose(1, 2) @ M.real + M.imag.transpose(1, 2) @ M.imag
            else:
                P = M.transpose(1, 2) @ M
            _OPERATORS.clear()
            _OPERATORS[key] = (op.scales.clone(), P.reshape(P.shape[0], n * n))
            del M, P
        self.scales, self.P = _OPERATORS[key]  # [S], [S, n²] float64
        e = torch.empty(N, self.P.shape[0], dtype=torch.float64)
        for s0 in range(0, N, 16):
            Fs = F[s0:s0 + 16]
            C = torch.bmm(Fs.transpose(1, 2), Fs).reshape(Fs.shape[0], n * n).double()
            e[s0:s0 + 16] = C @ self.P.T
        self.e = e
        self.G = (self.F @ self.F.T).double()
        self.eps = float(torch.finfo(F.dtype).eps)

    def scale_energy(self, idx: Tensor) -> Tensor:
        """``E'(a) [S]`` of the documents ``idx`` (a resample with repeats, or a subset such as
        a jackknife replicate; ``n = len(idx)`` documents)."""
        n = int(idx.numel())
        w = torch.bincount(idx, minlength=self.N).to(torch.float64)
        first = w @ self.e
        m = ((w / n).to(self.dtype) @ self.F).reshape(self.T, self.n).double()
        second = n * (self.P @ (m.T @ m).reshape(-1))
        return (first - second).clamp_min(0.0) / (n * self.T)

    def pod_stats(self, idx: Tensor) -> tuple[float, float]:
        """``(T_spec, H*)`` of the whole-field POD of the resample (same zero tolerance as
        ``pod_from_gram``)."""
        from tl_spectral.analysis.bootstrap import centred_gram_resample
        from tl_spectral.analysis.pod import effective_rank, spectral_concentration

        n = int(idx.numel())
        K = centred_gram_resample(self.G, idx) / n
        lam = torch.linalg.eigvalsh(0.5 * (K + K.T)).flip(0)
        total = float(torch.diagonal(K).sum())
        tol = max(float(lam[0]) * n * torch.finfo(torch.float64).eps, self.eps * total)
        lam = lam[lam > tol]
        H, _ = effective_rank(lam, self.epsilon, total_energy=total)
        fit = spectral_concentration(lam, total_energy=total)
        return float(fit["T_spec"]), float(H)

    def stats(self, idx: Tensor) -> Tensor:
        """``[len(STATS)]`` statistics of the resample ``idx``."""
        from tl_spectral.analysis.wavelets import band_energies

        E = self.scale_energy(idx)
        peak = float(self.scales[int(E.argmax())])
        bands = band_energies(E, self.scales)
        T_spec, H = self.pod_stats(idx)
        return torch.tensor([peak, bands["fine"], bands["medium"], bands["coarse"], T_spec, H],
                            dtype=torch.float64)


JACKKNIFE_GROUPS = 20
JACKKNIFE_KEYS = ("T_spec", "H_star")
"""Statistics whose interval is the delete-a-group jackknife's, as in the scale-pod study: they
grow with the number of documents, so bootstrap resamples (about 63% distinct documents) are
biased for them and their percentile intervals need not contain the estimate."""


def combine_intervals(est: Tensor, low: Tensor, high: Tensor, jk: dict[str, Any]
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """``(estimate, low, high)`` ``[..., len(STATS)]``: the bootstrap's for the band shares
    and the peak scale, the jackknife's (``jk`` from
    :func:`~tl_spectral.analysis.bootstrap.group_jackknife`) for :data:`JACKKNIFE_KEYS`."""
    low, high = low.clone(), high.clone()
    for k in JACKKNIFE_KEYS:
        i = STATS.index(k)
        low[..., i], high[..., i] = jk["low"][..., i], jk["high"][..., i]
    return est, low, high


def _interval_dict(est: Tensor, lo: Tensor, hi: Tensor) -> dict[str, dict[str, float]]:
    return {k: {"estimate": float(est[i]), "low": float(lo[i]), "high": float(hi[i])}
            for i, k in enumerate(STATS)}


# ----------------------------------------------------------------------------- run
def run_study(out_dir: str | Path, *, model: str = "char-shakespeare",
              corpus: str = "shakespeare", n_docs: int = 150, length: int = 256,
              fields: Sequence[str] = DEFAULT_FIELDS, batch_size: int = 16, seed: int = 0,
              n_resamples: int = 1000, bootstrap_seed: int = 0,
              fig_dir: str | Path | None = None) -> dict[str, Any]:
    """Capture every field in one pass, scale-POD each, bootstrap; write JSON and figures.
    Returns the summary (also in ``out_dir/field_pod_<model>_N<n_docs>.json``).

    Longer than 80 lines on purpose: the study's steps in order over one loaded model and its
    windows."""
    import matplotlib

    matplotlib.use("Agg")
    from tl_spectral.analysis.bootstrap import bootstrap, group_jackknife
    from tl_spectral.data import load_corpus
    from tl_spectral.model_view import ModelView
    from tl_spectral.models.loading import load_named_model as load_model
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    fields = list(fields)
    if fields[0] != "attention":
        raise StudyUsageError("the first field must be 'attention' (the reference of the "
                              f"paired differences); got {fields}")
    net, tok = load_model(model)
    view = ModelView(net)
    text = load_corpus(corpus)
    windows, source = validation_windows(text, tok, n_docs, length, seed)
    probes = [AttentionFieldProbe(field=f, name=f) for f in fields]
    t0 = time.perf_counter()
    res = run_probes(view, windows, probes, batch_size=batch_size, progress=False)
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    pods, boots = {}, {}
    for f in fields:
        pods[f] = res[f].scale_pod(n_heads=view.n_heads, coherence_queries=None)
        boots[f] = [LayerBootstrap(res[f].fluctuations(layer), res[f].lags)
                    for layer in res[f].layers]
    layers = list(res[fields[0]].layers)
    del res
    t_an = time.perf_counter() - t0
    nF = len(fields)

    def statistic(idx: Tensor) -> Tensor:
        s = torch.stack([torch.stack([b.stats(idx) for b in boots[f]]) for f in fields])
        return torch.cat([s, s[1:] - s[:1]])  # [nF + nF − 1, L, len(STATS)]

    t0 = time.perf_counter()
    iv = bootstrap(statistic, n_docs, n_resamples=n_resamples, seed=bootstrap_seed)
    jk = group_jackknife(statistic, n_docs, n_groups=JACKKNIFE_GROUPS, seed=bootstrap_seed)
    est, low, high = combine_intervals(iv.estimate, iv.low, iv.high, jk)
    t_boot = time.perf_counter() - t0
    per_field, diffs = {}, {}
    for k, f in enumerate(fields):
        rows = []
        for li, (lay, tab) in enumerate(zip(layers, pods[f].to_rows())):
            rows.append({"layer": lay, "dominant_scales": tab["dominant_scales"],
                         "tspec_r2": tab["tspec_r2"], "H_star_str": tab["H_star"],
                         **_interval_dict(est[k, li], low[k, li], high[k, li])})
        per_field[f] = rows
        if k:
            j = nF + k - 1
            diffs[f] = [{"layer": lay, **_interval_dict(est[j, li], low[j, li], high[j, li])}
                        for li, lay in enumerate(layers)]
    curves = {f: {"scales": pods[f].layers[0].scales.tolist(),
                  "scale_energy": [lay.scale_energy.tolist() for lay in pods[f].layers]}
              for f in fields}
    summary = {
        "model": model, "view": repr(view), "corpus": corpus, "windows_from": source,
        "n_docs": n_docs, "length": length, "seed": seed, "fields": fields,
        "bootstrap": {"n_resamples": n_resamples, "seed": bootstrap_seed, "level": 0.95,
                      "over": "documents (percentile intervals; paired across fields)",
                      "keys": [k for k in STATS if k not in JACKKNIFE_KEYS]},
        "jackknife": {**jk["meta"], "keys": list(JACKKNIFE_KEYS),
                      "over": "documents (delete-a-group; paired across fields)"},
        "forward_s": round(t_fwd, 2), "analysis_s": round(t_an, 2),
        "bootstrap_s": round(t_boot, 2),
        "per_field": per_field, "differences": diffs, "curves": curves,
        "pod": {f: pods[f].to_dict(include_curves=False) for f in fields},
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"field_pod_{model}_N{n_docs}"
    (out / f"{tag}.json").write_text(json.dumps(summary, indent=1, default=float))
    write_figures(summary, Path(fig_dir) if fig_dir else out / "figures")
    return summary


# ----------------------------------------------------------------------------- figures
def write_figures(summary: dict[str, Any], fig_dir: str | Path) -> dict:
    """The study's figures from its summary (also from a committed JSON):
    ``fig_dir/field_pod_<model>_N<n>_{energies,summary}.png``."""
    import matplotlib

    matplotlib.use("Agg")
    s = summary
    b = s["bootstrap"]
    return save_figures(
        {"energies": plot_energies(s), "summary": plot_summary(s)}, Path(fig_dir),
        f"field_pod_{s['model']}_N{s['n_docs']}", dpi=90,
        caption=f"{s['model']}: {s['n_docs']} windows × {s['length']} tokens ({s['windows_from']} "
                f"of {s['corpus']}), seed {s['seed']}; 95% intervals over documents: "
                f"bootstrap ({b['n_resamples']} resamples, seed {b['seed']})"
                + (f", T_spec and H* delete-a-group jackknife ({s['jackknife']['n_groups']} "
                   "groups)" if "jackknife" in s else "") + "; "
                "tl-spectral study scale-pod --fields")


_COLOURS = {"attention": "0.2", "contribution": "tab:red", "contribution_intra": "tab:orange",
            "value_weighted": "tab:blue", "value_weighted_raw": "tab:cyan"}


def plot_energies(summary: dict[str, Any]):
    """Normalised scale energy E(a)/ΣE per layer, every field overlaid."""
    import matplotlib.pyplot as plt

    fields = summary["fields"]
    nL = len(summary["per_field"][fields[0]])
    cols = min(3, nL)
    rows = math.ceil(nL / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False,
                             sharex=True)
    for f in fields:
        sc = summary["curves"][f]["scales"]
        for li, E in enumerate(summary["curves"][f]["scale_energy"]):
            ax = axes[li // cols][li % cols]
            tot = sum(E) or 1.0
            ax.plot(sc, [x / tot for x in E], color=_COLOURS.get(f), label=f, lw=1.3)
            ax.set_title(f"layer {summary['per_field'][f][li]['layer']}", fontsize=9)
            ax.set_xscale("log")
    for ax in axes.flat:
        ax.axvline(7, color="0.7", lw=0.6, ls=":")
        ax.axvline(20, color="0.7", lw=0.6, ls=":")
        ax.set_xlabel("scale a (tokens)", fontsize=8)
    axes[0][0].set_ylabel("E(a) / Σ E")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{summary['model']}: scale energy of each field's fluctuations", fontsize=10)
    fig.tight_layout()
    return fig


def plot_summary(summary: dict[str, Any]):
    """Peak scale, fine and coarse shares, T_spec and H* per layer with 95% intervals."""
    import matplotlib.pyplot as plt

    fields = summary["fields"]
    keys = ("a_peak", "E_fine", "E_coarse", "T_spec", "H_star")
    labels = ("peak scale a (tokens)", "E fine (a ≤ 7)", "E coarse (a ≥ 20)", "T_spec = 1/β",
              "H*(0.1)")
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3))
    off = {f: (k - (len(fields) - 1) / 2) * 0.12 for k, f in enumerate(fields)}
    for ax, key, lab in zip(axes, keys, labels):
        for f in fields:
            rows = summary["per_field"][f]
            x = [r["layer"] + off[f] for r in rows]
            y = [r[key]["estimate"] for r in rows]
            # the interval as its own segment: a percentile interval need not contain the
            # estimate (H*, T_spec of resamples with repeated documents are biased)
            ax.vlines(x, [r[key]["low"] for r in rows], [r[key]["high"] for r in rows],
                      color=_COLOURS.get(f), lw=1.2, alpha=0.6)
            ax.plot(x, y, "o", ms=3.5, color=_COLOURS.get(f), label=f)
        ax.set_xlabel("layer")
        ax.set_title(lab, fontsize=9)
        if key == "a_peak":
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- tables
def _iv(d: dict[str, float], fmt: str) -> str:
    return f"{fmt.format(d['estimate'])} [{fmt.format(d['low'])}, {fmt.format(d['high'])}]"


_FMT = {"a_peak": "{:.1f}", "E_fine": "{:.2f}", "E_medium": "{:.2f}", "E_coarse": "{:.2f}",
        "T_spec": "{:.2f}", "H_star": "{:.0f}"}
_DIFF_FMT = {"a_peak": "{:+.1f}", "E_fine": "{:+.3f}", "E_medium": "{:+.3f}",
             "E_coarse": "{:+.3f}", "T_spec": "{:+.3f}", "H_star": "{:+.0f}"}


def differs(d: dict[str, float]) -> bool:
    """The 95% interval of a paired difference excludes 0, on the side of the full-ensemble
    difference (H*, T_spec: jackknife intervals, which contain their estimate; the sign
    condition guards results written before the jackknife)."""
    return (d["low"] > 0 and d["estimate"] > 0) or (d["high"] < 0 and d["estimate"] < 0)


def table_markdown(summary: dict[str, Any]) -> str:
    """The side-by-side table (every field, every layer) and the paired-difference table."""
    fields = summary["fields"]
    nL = len(summary["per_field"][fields[0]])
    out = ["| layer | field | dominant scales a* | peak a | E fine (a ≤ 7) | E medium | "
           "E coarse (a ≥ 20) | T_spec = 1/β | H*(0.1) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for li in range(nL):
        for f in fields:
            r = summary["per_field"][f][li]
            a = ", ".join(f"{x:.1f}" for x in r["dominant_scales"])
            out.append(f"| {r['layer']} | {f} | {a} | "
                       + " | ".join(_iv(r[k], _FMT[k]) for k in STATS) + " |")
    out += ["", "| layer | field − attention | Δ peak a | Δ E fine | Δ E medium | Δ E coarse | "
                "Δ T_spec | Δ H* |", "|---|---|---|---|---|---|---|---|"]
    for li in range(nL):
        for f in fields[1:]:
            r = summary["differences"][f][li]
            cells = []
            for k in STATS:
                c = _iv(r[k], _DIFF_FMT[k])
                cells.append(f"**{c}**" if differs(r[k]) else c)
            out.append(f"| {r['layer']} | {f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def verdict(summary: dict[str, Any]) -> str:
    """One sentence per field: where it differs from attention (95% intervals of the paired
    difference excluding 0), or that it is not distinguishable at this size."""
    names = {"a_peak": "peak scale", "E_fine": "fine share", "E_medium": "medium share",
             "E_coarse": "coarse share", "T_spec": "T_spec", "H_star": "H*"}
    parts = []
    # a summary written before the jackknife holds biased bootstrap intervals of T_spec, H*
    keys = [k for k in STATS if "jackknife" in summary or k not in JACKKNIFE_KEYS]
    for f in summary["fields"][1:]:
        hits = []
        for k in keys:
            lay = [r for r in summary["differences"][f] if differs(r[k])]
            if lay:
                hits.append(f"{names[k]} (layers "
                            + ", ".join(f"{r['layer']}: {_iv(r[k], _DIFF_FMT[k])}" for r in lay)
                            + ")")
        parts.append(f"{f} vs attention: " + ("differs in " + "; ".join(hits) if hits else
                                              "not distinguishable at this size") + ".")
    if "jackknife" not in summary:
        parts.append("T_spec and H*: no call (bootstrap intervals, biased for statistics that "
                     "grow with N; rerun for the jackknife).")
    parts.append(f"Each call is one layer's 95% interval, uncorrected for the "
                 f"{len(summary['differences'][summary['fields'][1]])} layers and "
                 f"{len(keys)} statistics: a description of where the difference is resolved.")
    return " ".join(parts)


def markdown(results_dir: str | Path) -> str:
    """The tables and verdict of every ``field_pod_*.json`` under ``results_dir``, each under
    a heading naming the model, N and T."""
    parts = []
    for p in sorted(Path(results_dir).glob("field_pod_*.json")):
        s = json.loads(p.read_text())
        b = s["bootstrap"]
        jk = s.get("jackknife")
        parts.append(f"#### {s['model']}, N = {s['n_docs']}, T = {s['length']} (windows from the "
                     f"{s['windows_from']}; {b['n_resamples']} bootstrap resamples, seed "
                     f"{b['seed']}"
                     + (f"; T_spec and H*: delete-a-group jackknife, {jk['n_groups']} groups"
                        if jk else "; T_spec and H*: bootstrap, biased (rerun for the jackknife)")
                     + ")\n\n" + table_markdown(s) + "\n\nVerdict: " + verdict(s))
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str], prog: str = "tl-spectral study scale-pod --fields") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_run_arguments(ap, default_out="tl_spectral_study_field_pod")
    ap.add_argument("--model", default="char-shakespeare")
    ap.add_argument("--corpus", default="shakespeare",
                    help="'shakespeare' (bundled) or the path of a UTF-8 text file")
    ap.add_argument("--n-docs", type=int, default=150)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--fields", default=",".join(DEFAULT_FIELDS),
                    help="comma-separated fields, attention first (default "
                         f"{','.join(DEFAULT_FIELDS)})")
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--bootstrap-seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=seed_arg, default=0)
    args = ap.parse_args(list(argv))
    from tl_spectral.probes.pair_fields import FIELD_KINDS

    fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    bad = [f for f in fields if f not in FIELD_KINDS]
    if bad or not fields or fields[0] != "attention" or len(set(fields)) != len(fields):
        raise StudyUsageError(f"--fields {args.fields!r}: pass distinct fields of "
                              f"{', '.join(FIELD_KINDS)}, attention first")
    if args.n_docs < 2 or args.n_resamples < 1:
        raise StudyUsageError("--n-docs must be >= 2 and --n-resamples >= 1")
    if args.quick:
        args.n_docs, args.length = min(args.n_docs, 16), min(args.length, 128)
        args.n_resamples = min(args.n_resamples, 20)
    out = prepare_out(args.out, NAME, overwrite=args.overwrite)
    s = run_study(out, model=args.model, corpus=args.corpus, n_docs=args.n_docs,
                  length=args.length, fields=fields, batch_size=args.batch_size,
                  seed=args.seed, n_resamples=args.n_resamples,
                  bootstrap_seed=args.bootstrap_seed, fig_dir=args.fig_dir)
    print(f"{s['view']}; {s['n_docs']} windows of {s['length']} ({s['windows_from']}); "
          f"forward {s['forward_s']:.1f} s, analysis {s['analysis_s']:.1f} s, bootstrap "
          f"{s['bootstrap_s']:.1f} s")
    print(table_markdown(s))
    print(verdict(s))
    print(Path(out).resolve())
    return 0
