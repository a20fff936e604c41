"""Benchmark of the per-head scale-selective POD (issue 18, part 2).

The char-shakespeare model of the zoo (6 layers, 8 heads, d_model 128) runs over N windows
of T = 256 characters of the bundled Tiny Shakespeare (validation tenth, seed 0) with a
per-head :class:`~tl_spectral.probes.fields.AttentionFieldProbe`; the per-head fluctuation
fields ``[N, 8, T, T]`` of every layer and their head mean ``[N, T, T]`` are then analysed,
the implementations interleaved (``repeats`` rounds, best time of each, the machine being
shared):

- ``per_head``: :func:`scale_pod_heads` over all layers (scalogram, dominant scales, bands,
  whole-field and band POD eigenvalues, ``T_spec``, ``H*`` of every head, diversity);
- ``head_mean``: today's :func:`scale_pod` on the head-mean fields with its defaults (also
  16-query coherence and 8 modes per POD) — the baseline of ``per_head_over_mean``;
- ``head_mean_lean``: the same without coherence and with 1 mode (closest to the per-head
  work); ``per_head_over_mean_lean`` = per_head / that;
- ``loop``: the Python-loop alternative: :func:`scale_pod_layer` on each head's field in
  turn (no coherence, 1 mode); ``loop_over_per_head`` = loop / per_head;
- ``per_head_matmul``: :func:`scale_pod_heads` with the Toeplitz-GEMM scalogram instead of the
  FFT form (reported beside).

Target: ``per_head_over_mean <= H = 8``. The per-head and loop results are checked equal
(dominant scales, ``H*``; eigenvalues to float32 Gram round-off). With ``--out DIR`` the
per-head result is written as ``DIR/per_head_<model>_N<n>.json`` (the table of
docs/scale_pod.md, "Scale POD per head").

Usage: ``python benchmarks/scale_pod_per_head.py [--n-docs 64] [--repeats 3] [--out DIR]``.
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch
from _bench import interleaved_times

from tl_spectral.analysis.scale_pod import scale_pod, scale_pod_heads, scale_pod_layer


def per_head_fields(model_name: str, n_docs: int, T: int, batch: int):
    from tl_spectral.data import document_windows, train_val_split
    from tl_spectral.data.corpora import tiny_shakespeare
    from tl_spectral.model_view import ModelView
    from tl_spectral.models.zoo import load
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    net, tok = load(model_name)
    view = ModelView(net)
    _, val = train_val_split(tiny_shakespeare())
    windows = document_windows(val, tok, n_docs, T, seed=0)
    t0 = time.perf_counter()
    res = run_probes(view, windows, [AttentionFieldProbe(per_head=True)], batch_size=batch,
                     progress=False)["attention_fields"]
    t_fwd = time.perf_counter() - t0
    fl = [res.fluctuations(layer) for layer in res.layers]  # [N, H, T, n_lags] each
    del res
    return view, fl, t_fwd


def table_markdown(summary: dict) -> str:
    """Per-layer markdown table of a written result: every head's peak scale (tokens of
    lag), then the diversity summary."""
    H = summary["layers"][0]["n_heads"]
    head_cols = " | ".join(f"h{h}" for h in range(H))
    rows = [
        f"| layer | {head_cols} | heads fine / medium / coarse | band entropy (bits) | "
        "scale classes | std log2 a (octaves) | H* min–max |",
        "|---" * (H + 6) + "|",
    ]
    for layer, div in zip(summary["layers"], summary["diversity"]):
        peaks = " | ".join(
            (f"{r['peak_scale']:.1f}" if r["active"] else "–") for r in layer["heads"]
        )
        c = div["band_counts"]
        rows.append(
            f"| {layer['layer']} | {peaks} | {c['fine']} / {c['medium']} / {c['coarse']} | "
            f"{div['band_entropy_bits']:.2f} | {div['n_scale_classes']} | "
            f"{div['log2_peak_scale_std']:.2f} | {div['H_star_min']}–{div['H_star_max']} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="char-shakespeare")
    ap.add_argument("--n-docs", type=int, default=64)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the per-head result JSON here")
    ap.add_argument("--quick", action="store_true", help="N=16, T=128, 1 round smoke run")
    args = ap.parse_args()
    N, T, repeats = args.n_docs, args.T, args.repeats
    if args.quick:
        N, T, repeats = 16, 128, 1
    torch.manual_seed(0)
    view, fl, t_fwd = per_head_fields(args.model, N, T, args.batch)
    H = int(fl[0].shape[1])
    lags = torch.arange(fl[0].shape[-1])
    mean_fl = [f.mean(1) for f in fl]
    print(f"{view!r}: {N} windows of {T}, {H} heads, forward {t_fwd:.1f}s", flush=True)
    ids = list(range(len(fl)))
    out: dict = {}

    def per_head():
        out["per_head"] = scale_pod_heads(fl, lags, layer_ids=ids)
        return out["per_head"]

    def per_head_matmul():
        return scale_pod_heads(fl, lags, layer_ids=ids, scalogram_method="matmul")

    def head_mean():
        return scale_pod(mean_fl, lags, n_heads=H, layer_ids=ids)

    def head_mean_lean():
        return scale_pod(mean_fl, lags, n_heads=H, layer_ids=ids, coherence_queries=None,
                         n_modes=1)

    def loop():
        out["loop"] = [[scale_pod_layer(f[:, h], lags, layer=li, coherence_queries=None,
                                        n_modes=1) for h in range(H)] for li, f in enumerate(fl)]
        return out["loop"]

    fns = {"per_head": per_head, "head_mean": head_mean, "head_mean_lean": head_mean_lean,
           "loop": loop, "per_head_matmul": per_head_matmul}
    gc.collect()
    times = interleaved_times(fns, repeats)
    best = {k: min(v) for k, v in times.items()}
    print({k: [round(x, 2) for x in v] for k, v in times.items()}, flush=True)

    res = out["per_head"]
    max_rel = 0.0
    for layer, refs in zip(res.layers, out["loop"]):
        for h, ref in enumerate(refs):
            assert layer.dominant_scales[h] == ref.dominant_scales, (layer.layer, h)
            assert int(layer.H_star[h]) == ref.H_star, (layer.layer, h)
            lam = layer.eigenvalues(h)
            n = min(lam.numel(), ref.full_eigenvalues.numel())
            rel = float(((lam[:n] - ref.full_eigenvalues[:n]).abs() / ref.full_eigenvalues[0]).max())
            max_rel = max(max_rel, rel)
    for row in res.diversity_table():
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)

    if args.out:
        p = Path(args.out) / f"per_head_{args.model}_N{N}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        summary = {
            "model": args.model, "view": repr(view), "corpus": "shakespeare",
            "windows_from": "validation split", "n_docs": N, "length": T, "seed": 0,
            "command": f"python benchmarks/scale_pod_per_head.py --n-docs {N} --out {args.out}",
            "analysis_s": round(best["per_head"], 2),
            **res.to_dict(include_curves=True),
        }
        p.write_text(json.dumps(summary, indent=1, default=float))
        print(p, flush=True)
        print(table_markdown(summary), flush=True)

    print(json.dumps({
        "per_head_over_mean": round(best["per_head"] / best["head_mean"], 3),
        "target_max": H,
        "per_head_over_mean_lean": round(best["per_head"] / best["head_mean_lean"], 3),
        "loop_over_per_head": round(best["loop"] / best["per_head"], 3),
        "matmul_scalogram_over_fft": round(best["per_head_matmul"] / best["per_head"], 3),
        "t_per_head_s": round(best["per_head"], 2),
        "t_head_mean_s": round(best["head_mean"], 2),
        "t_head_mean_lean_s": round(best["head_mean_lean"], 2),
        "t_loop_s": round(best["loop"], 2),
        "t_per_head_matmul_s": round(best["per_head_matmul"], 2),
        "t_forward_s": round(t_fwd, 2),
        "loop_eig_max_rel_diff": float(f"{max_rel:.3g}"),
        "model": args.model, "N": N, "T": T, "H": H, "n_layers": len(fl),
        "n_lags": int(lags.numel()), "repeats": repeats,
        "torch_threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
