"""Benchmark: factored QK geometry vs dense d_model×d_model spectra; S–D vs softmax step time.

1. ``speedup_vs_dense`` / ``spectra_rel_err``: :func:`tl_spectral.geometry.qk.qk_geometry`
   on 16 random heads (d_model 1024, d_head 64, float64) against the dense baseline on
   the same heads: form ``M = W_Q W_Kᵀ``, ``R``, ``F`` (1024×1024) and run
   ``torch.linalg.svdvals(R)``, ``svdvals(F)``, ``eigvals(M)``. The error compares the top
   ``2·d_head`` singular values of R and F and the ``d_head`` largest-modulus eigenvalues
   of M (optimal matching of the complex multisets), relative to each spectrum's maximum.
2. ``sd_step_ratio``: forward + backward + AdamW step time of an ``attention="sd"`` GPT
   over the same GPT with ``"softmax"`` at the char-shakespeare size (6 layers, 8 heads,
   d_model 128, d_head 16, context 256, batch 32, vocab 78), same random tokens, steps
   interleaved, median of ``--steps`` steps after one warm-up step each.

Prints human-readable lines, then exactly one JSON line (the last line).
Usage: ``python benchmarks/qk_geometry.py [--threads 1] [--steps 5] [--dense-heads 16]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from tl_spectral.geometry.qk import qk_geometry


def _match_err(a: np.ndarray, b: np.ndarray) -> float:
    """Max |a_i − b_π(i)| over the optimal matching, relative to max |a|."""
    cost = np.abs(a[:, None] - b[None, :])
    r, c = linear_sum_assignment(cost)
    return float(cost[r, c].max() / max(np.abs(a).max(), 1e-300))


def bench_geometry(d_model: int, d_head: int, n_heads: int, dense_heads: int, repeats: int):
    g = torch.Generator().manual_seed(0)
    wq = torch.randn(1, n_heads, d_model, d_head, generator=g, dtype=torch.float64)
    wk = torch.randn(1, n_heads, d_model, d_head, generator=g, dtype=torch.float64)

    qk_geometry(wq, wk)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        geo = qk_geometry(wq, wk)
        times.append(time.perf_counter() - t0)
    t_fact = statistics.median(times)

    err = 0.0
    t0 = time.perf_counter()
    for h in range(dense_heads):
        m = wq[0, h] @ wk[0, h].T
        r, f = 0.5 * (m - m.T), 0.5 * (m + m.T)
        sv_r = torch.linalg.svdvals(r)
        sv_f = torch.linalg.svdvals(f)
        eig = torch.linalg.eigvals(m)
        k = 2 * d_head
        err = max(
            err,
            float((sv_r[:k] - geo.sv_R[0, h]).abs().max() / sv_r[0]),
            float((sv_f[:k] - geo.sv_F[0, h]).abs().max() / sv_f[0]),
            _match_err(
                eig[torch.argsort(eig.abs(), descending=True)[:d_head]].numpy(),
                geo.eigenvalues[0, h].numpy(),
            ),
        )
    t_dense = (time.perf_counter() - t0) * n_heads / dense_heads
    return t_fact, t_dense, err


def _load_models():
    try:
        from tl_spectral.models import GPT, GPTConfig  # the public path
    except ImportError:
        from tl_spectral.models.gpt import GPT, GPTConfig
    return GPT, GPTConfig


def bench_sd_step(steps: int, batch: int = 32, n_ctx: int = 256) -> tuple[float, float, float]:
    GPT, GPTConfig = _load_models()
    models, opts = {}, {}
    for kind in ("softmax", "sd"):
        torch.manual_seed(0)
        cfg = GPTConfig(
            vocab_size=78,
            n_layers=6,
            n_heads=8,
            d_model=128,
            d_head=16,
            n_ctx=n_ctx,
            d_mlp=512,
            attention=kind,
        )
        models[kind] = GPT(cfg)
        opts[kind] = torch.optim.AdamW(models[kind].parameters(), lr=1e-3)
    tokens = torch.randint(0, 78, (batch, n_ctx + 1), generator=torch.Generator().manual_seed(1))

    def step(kind: str) -> float:
        t0 = time.perf_counter()
        opts[kind].zero_grad(set_to_none=True)
        loss = models[kind].loss(tokens)
        loss.backward()
        opts[kind].step()
        return time.perf_counter() - t0

    for kind in models:  # warm-up
        step(kind)
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(steps):
        for kind in models:  # interleaved, so machine-load drift hits both alike
            times[kind].append(step(kind))
    t_soft, t_sd = statistics.median(times["softmax"]), statistics.median(times["sd"])
    return t_soft, t_sd, t_sd / t_soft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--d-head", type=int, default=64)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument(
        "--dense-heads",
        type=int,
        default=16,
        help="heads timed densely (time scaled to --heads); all by default",
    )
    ap.add_argument("--repeats", type=int, default=5, help="factored timing repeats")
    ap.add_argument("--steps", type=int, default=5, help="timed training steps per model")
    ap.add_argument("--skip-sd", action="store_true", help="skip the S–D step benchmark")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t_fact, t_dense, err = bench_geometry(
        args.d_model, args.d_head, args.heads, min(args.dense_heads, args.heads), args.repeats
    )
    speedup = t_dense / t_fact
    print(
        f"geometry d_model={args.d_model} d_head={args.d_head} heads={args.heads} "
        f"threads={args.threads}: factored {t_fact * 1e3:.1f} ms, dense "
        f"{t_dense:.2f} s -> speedup {speedup:.0f}x, spectra rel err {err:.2e}"
    )

    ratio = None
    if not args.skip_sd:
        try:
            t_soft, t_sd, ratio = bench_sd_step(args.steps)
            print(
                f"train step (fwd+bwd+AdamW, 6L 8H d128 ctx256 batch32): softmax "
                f"{t_soft * 1e3:.0f} ms, sd {t_sd * 1e3:.0f} ms -> ratio {ratio:.2f}"
            )
        except ImportError as exc:  # tl_spectral.models not available
            print(f"sd_step_ratio skipped: {exc}")

    print(
        json.dumps(
            {
                "speedup_vs_dense": round(speedup, 1),
                "spectra_rel_err": float(f"{err:.3e}"),
                "sd_step_ratio": None if ratio is None else round(ratio, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
