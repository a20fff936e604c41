"""Benchmark of the scale-selective POD (issue 5).

(c) first, because (a) and (b) reuse its fields:
(c) a random 6-layer, 8-head, d_model 128, n_ctx 256 TransformerBridge runs over N windows
    of T = 256 characters of Tiny Shakespeare; a local hook on
    ``blocks.{l}.attn.hook_pattern`` keeps the head-mean lag-coordinate fields (float32).
    The forward passes (with that collector) are timed, then the whole scale-selective
    analysis (``scale_pod``: scalogram, dominant scales, band windows, whole-field and band
    POD, coherence of 16 queries, head allocation) over those fields.
    ``analysis_vs_forward`` = analysis time / forward-with-collector time; the plain
    forward time (no hooks; timed on ``--plain-docs`` windows and scaled to N) is reported
    beside it.
(a) the torch CWT (:class:`LagCWT`, default ``method="auto"``; the FFT and matmul paths
    reported beside) vs ``pywt.cwt(method="fft")`` on the same lag profiles (float32, 48
    scales; 5 interleaved rounds, best time of each, the machine being shared).
(b) POD by snapshots (float64 Gram, all modes) vs ``numpy.linalg.svd`` (thin, with U and
    V) of the same snapshot matrix: N documents x (T x 64 lags) = 16,384 dimensions from
    the layer-0 fluctuations (best of 2 runs; the SVD repeated only while under 10 s).

Usage: ``python benchmarks/scale_pod.py [--n-docs 1000] [--quick]``. The last line printed
is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np
import pywt
import torch

from tl_spectral.analysis.pod import pod
from tl_spectral.analysis.scale_pod import ScalePODOptions, lag_fields, scale_pod
from tl_spectral.analysis.wavelets import LagCWT, default_scales
from tl_spectral.data.corpora import tiny_shakespeare
from tl_spectral.data.tokenizers import CharTokenizer
from tl_spectral.data.windows import document_windows


def build_model(T: int):
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    cfg = TransformerBridgeConfig(
        d_model=128,
        d_head=16,
        n_layers=6,
        n_ctx=T,
        n_heads=8,
        d_vocab=78,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
    )
    return TransformerBridge.boot_native(cfg)


class LagFieldCollector:
    """Hook functions that store the head-mean lag-coordinate field of every layer."""

    def __init__(self, n_layers: int, N: int, T: int, max_lag: int | None):
        self.n_lags = T if max_lag is None else max_lag + 1
        self.fields = [torch.empty(N, T, self.n_lags) for _ in range(n_layers)]
        self.lags = torch.arange(self.n_lags)
        self.offset = 0
        self.max_lag = max_lag

    def hook(self, layer: int):
        def fn(pattern: torch.Tensor, hook) -> torch.Tensor:  # [batch, head, query, key]
            A = pattern.detach().float().mean(1)  # head mean: [batch, T, T]
            F, _ = lag_fields(A, causal=True, max_lag=self.max_lag)
            self.fields[layer][self.offset : self.offset + F.shape[0]] = F
            return pattern

        return fn


def collect(model, tokens: torch.Tensor, batch: int, max_lag: int | None):
    N, T = tokens.shape
    n_layers = model.cfg.n_layers
    col = LagFieldCollector(n_layers, N, T, max_lag)
    hooks = [(f"blocks.{layer}.attn.hook_pattern", col.hook(layer)) for layer in range(n_layers)]
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(0, N, batch):
            col.offset = s
            model.run_with_hooks(tokens[s : s + batch], fwd_hooks=hooks)
    return col, time.perf_counter() - t0


def plain_forward(model, tokens: torch.Tensor, batch: int) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(0, tokens.shape[0], batch):
            model(tokens[s : s + batch])
    return time.perf_counter() - t0


def _best(fn, repeats: int):
    """Best-of-``repeats`` wall time (the machine is shared) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_cwt(profiles: torch.Tensor, T: int, repeats: int = 5) -> dict:
    """Rounds interleave pywt and the torch paths, so each sees the same machine load;
    the best time of each over the rounds is kept."""
    scales = default_scales(T)
    x = profiles.contiguous()
    xn = x.numpy()
    ops = {m: LagCWT(x.shape[-1], scales, method=m) for m in ("auto", "fft", "matmul")}
    for op in ops.values():
        op(x[:8])  # build the filter bank / operator (cached per op)
    best = {k: float("inf") for k in ["pywt", *ops]}
    errs = {}
    for _ in range(repeats):
        dt, (ref, _) = _best(
            lambda: pywt.cwt(xn, scales.numpy(), "cmor1.5-1.0", method="fft", axis=-1), 1
        )
        best["pywt"] = min(best["pywt"], dt)
        ref = np.moveaxis(ref, 0, 1)  # [B, S, n]
        for m, op in ops.items():
            dt, W = _best(lambda op=op: op(x), 1)
            best[m] = min(best[m], dt)
            if m not in errs:
                Wn = W.numpy()
                errs[m] = max(
                    float(np.abs(Wn[:, k] - ref[:, k]).max() / np.abs(ref[:, k]).max())
                    for k in range(ref.shape[1])
                )
            del W
        del ref
    return {
        "n_profiles": int(x.shape[0]),
        "n_lags": int(x.shape[-1]),
        "n_scales": int(scales.numel()),
        "default_method": ops["auto"].method,
        "t_pywt_s": best["pywt"],
        "t_torch_s": best["auto"],
        "t_torch_fft_s": best["fft"],
        "t_torch_matmul_s": best["matmul"],
        "cwt_speedup": best["pywt"] / best["auto"],
        "cwt_speedup_fft": best["pywt"] / best["fft"],
        "cwt_speedup_matmul": best["pywt"] / best["matmul"],
        "cwt_max_rel_err": max(errs.values()),
    }


def bench_pod(X: torch.Tensor, repeats: int = 2) -> dict:
    X = X.to(torch.float64)
    X = X - X.mean(0)
    N = X.shape[0]
    # all modes and coefficients, like the SVD
    t_pod, r = _best(lambda: pod(X, method="snapshots"), repeats)
    Xn = X.numpy()
    t_svd, (_, S, _) = _best(lambda: np.linalg.svd(Xn, full_matrices=False), 1)
    if t_svd < 10.0 and repeats > 1:  # repeat the baseline only while it is cheap
        t2, _ = _best(lambda: np.linalg.svd(Xn, full_matrices=False), repeats - 1)
        t_svd = min(t_svd, t2)
    lam_ref = S**2 / N
    n = r.n_available
    lam = r.eigenvalues.numpy()
    rel = float(np.max(np.abs(lam - lam_ref[:n]) / lam_ref[:n]))
    return {
        "pod_N": N,
        "pod_dim": int(X.shape[1]),
        "pod_modes": n,
        "t_pod_s": t_pod,
        "t_numpy_svd_s": t_svd,
        "pod_speedup": t_svd / t_pod,
        "pod_eig_rel_err": rel,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-docs", type=int, default=1000)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--max-lag", type=int, default=None, help="truncate lags (default: all)")
    ap.add_argument("--cwt-profiles", type=int, default=2000)
    ap.add_argument(
        "--plain-docs", type=int, default=200, help="windows for the plain-forward estimate"
    )
    ap.add_argument("--quick", action="store_true", help="N=100 smoke run")
    args = ap.parse_args()
    N = 100 if args.quick else args.n_docs
    T = args.T
    torch.manual_seed(0)

    text = tiny_shakespeare()
    tok = CharTokenizer.from_text(text)
    tokens = document_windows(text, tok, N, T, seed=0).tokens
    model = build_model(T)
    model.eval()
    with torch.no_grad():  # warm-up
        model(tokens[:2])

    # (c) forward passes with the collector, then the analysis
    col, t_fwd = collect(model, tokens, args.batch, args.max_lag)
    n_plain = min(N, args.plain_docs)
    t_plain = plain_forward(model, tokens[:n_plain], args.batch) * N / n_plain
    print(f"forward+collect {t_fwd:.1f}s, plain forward {t_plain:.1f}s", flush=True)
    gc.collect()
    t0 = time.perf_counter()
    res = scale_pod(col.fields, col.lags, n_heads=8, options=ScalePODOptions(center=True))
    t_analysis = time.perf_counter() - t0
    print(f"analysis {t_analysis:.1f}s", flush=True)
    for row in res.to_rows():
        print(row, flush=True)

    # (a) CWT on lag profiles of the same fields (layer 0 fluctuations)
    F0 = col.fields[0]
    u0 = F0 - F0.mean(0)
    profiles = u0.reshape(-1, u0.shape[-1])
    g = torch.Generator().manual_seed(0)
    pick = torch.randperm(profiles.shape[0], generator=g)[: args.cwt_profiles]
    cwt_stats = bench_cwt(profiles[pick], T)
    print(cwt_stats, flush=True)

    # (b) POD vs numpy SVD: N x (T * 64 lags) snapshot matrix of layer-0 fluctuations
    n_keep = min(64, u0.shape[-1])
    X = u0[:, :, :n_keep].reshape(N, -1)
    del u0, profiles
    pod_stats = bench_pod(X)
    print(pod_stats, flush=True)

    out = {
        "cwt_speedup": round(cwt_stats["cwt_speedup"], 2),
        "cwt_max_rel_err": float(f"{cwt_stats['cwt_max_rel_err']:.3g}"),
        "pod_speedup": round(pod_stats["pod_speedup"], 2),
        "pod_eig_rel_err": float(f"{pod_stats['pod_eig_rel_err']:.3g}"),
        "analysis_vs_forward": round(t_analysis / t_fwd, 3),
        "analysis_vs_plain_forward": round(t_analysis / t_plain, 3),
        "cwt_method": cwt_stats["default_method"],
        "cwt_speedup_fft": round(cwt_stats["cwt_speedup_fft"], 2),
        "cwt_speedup_matmul": round(cwt_stats["cwt_speedup_matmul"], 2),
        "t_forward_collect_s": round(t_fwd, 2),
        "t_forward_plain_s": round(t_plain, 2),
        "t_analysis_s": round(t_analysis, 2),
        "t_pywt_s": round(cwt_stats["t_pywt_s"], 2),
        "t_cwt_s": round(cwt_stats["t_torch_s"], 3),
        "t_cwt_fft_s": round(cwt_stats["t_torch_fft_s"], 3),
        "t_pod_s": round(pod_stats["t_pod_s"], 2),
        "t_numpy_svd_s": round(pod_stats["t_numpy_svd_s"], 2),
        "N": N,
        "T": T,
        "n_lags": int(col.n_lags),
        "pod_dim": pod_stats["pod_dim"],
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
