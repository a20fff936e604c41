"""Benchmark: offset-resolved rotary QK geometry (factored) vs dense W_Q R(Δ) W_Kᵀ per offset.

A Pythia-70m-shaped layer: 8 random heads, d_model 512, d_head 64, rotary_dim 16
(rotate_half), context 2048, float64.

1. ``spectra_speedup``: seconds per (head, offset) of
   :func:`tl_spectral.geometry.rotary.rotary_qk_geometry` (energies and the singular values of
   the skew / symmetric parts at ``--offsets`` offsets) over the dense baseline on a subset
   of the same (head, offset) pairs: form ``M(Δ) = W_Q R(Δ) W_Kᵀ`` (512×512), its parts, their
   squared norms and ``svdvals``. ``spectra_rel_err``: max error of the top ``2·d_head``
   singular values relative to each spectrum's maximum.
2. ``curve_speedup``: the routing-fraction curve at every causal offset (2048 per head) from
   the trigonometric form (:meth:`RotaryQKGeometry.energies`) against dense energies
   (form M(Δ), two Frobenius norms) per (head, offset), extrapolated from ``--dense-pairs``
   pairs. ``curve_rel_err``: max |ρ_factored − ρ_dense| on those pairs.

3. ``model_s``: :func:`tl_spectral.geometry.model.model_rotary_geometry` with default
   arguments on a Pythia-160m-shaped random native GPT (12 layers × 12 heads, d_model 768,
   d_head 64, rotary_dim 16, context 2,048; issue 32 target ≤ 30 s), wall clock and
   ``model_cpu_s`` (process CPU time, which other jobs on a shared machine disturb far less),
   in its own process after the warm-up above. The defaults average the effective ranks over
   an equal-mass quantile sample of the causal offsets (``model_rank_offsets`` of them);
   ``rank_sample_abs_err``: the largest |sampled − exact| mean effective rank (skew and
   symmetric parts) over ``--exact-heads`` heads of layer 0, whose exact mean over every
   offset (``rank_offsets=None``) is also timed (``exact_s_per_head``; ×144 heads is the
   exact cost of the whole model).

Prints human-readable lines, then exactly one JSON line (the last line).
Usage: ``python benchmarks/rotary_geometry.py [--threads 1] [--offsets 16] [--dense-pairs 8]
[--exact-heads 2] [--no-model]``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tl_spectral.geometry.rotary import RotarySpec, rotary_matrix, rotary_qk_geometry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--offsets", type=int, default=16)
    ap.add_argument("--dense-pairs", type=int, default=8)
    ap.add_argument("--exact-heads", type=int, default=2)
    ap.add_argument("--no-model", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    H, dm, d, rd, n_ctx = 8, 512, 64, 16, 2048
    g = torch.Generator().manual_seed(0)
    wq = torch.randn(1, H, dm, d, generator=g, dtype=torch.float64)
    wk = torch.randn(1, H, dm, d, generator=g, dtype=torch.float64)
    spec = RotarySpec.from_base(rd, 10000.0, "half")
    offs = [-(2 ** k) + 1 for k in range(args.offsets)]  # 0, -1, -3, -7, ...
    offs = [max(o, -(n_ctx - 1)) for o in offs]

    rotary_qk_geometry(wq, wk, spec, offsets=offs[:2], n_ctx=64, average_ranks=False)  # warm
    t0 = time.perf_counter()
    geo = rotary_qk_geometry(wq, wk, spec, offsets=offs, n_ctx=n_ctx, average_ranks=False)
    t_fact = (time.perf_counter() - t0) / (H * len(offs))
    t0 = time.perf_counter()
    curve = geo.energies(range(0, -n_ctx, -1))["routing_fraction"]
    t_curve = (time.perf_counter() - t0) / (H * n_ctx)

    pairs = [(h % H, n % len(offs)) for h, n in zip(range(args.dense_pairs),
                                                     range(3, 3 + args.dense_pairs))]
    err_sv = err_curve = 0.0
    t_dense = t_dense_e = 0.0
    k = 2 * d
    for h, n in pairs:
        R = rotary_matrix(spec, d, offs[n])
        t0 = time.perf_counter()
        m = wq[0, h] @ R @ wk[0, h].T
        sk, sy = 0.5 * (m - m.T), 0.5 * (m + m.T)
        nr, nf = sk.square().sum(), sy.square().sum()
        t_dense_e += time.perf_counter() - t0
        sv_r, sv_f = torch.linalg.svdvals(sk), torch.linalg.svdvals(sy)
        t_dense += time.perf_counter() - t0
        err_sv = max(err_sv, float((sv_r[:k] - geo.sv_R[0, h, n]).abs().max() / sv_r[0]),
                     float((sv_f[:k] - geo.sv_F[0, h, n]).abs().max() / sv_f[0]))
        err_curve = max(err_curve, abs(float(nr / (nr + nf)) - float(curve[0, h, -offs[n]])))
    t_dense /= len(pairs)
    t_dense_e /= len(pairs)
    out = {
        "benchmark": "rotary_geometry", "heads": H, "d_model": dm, "d_head": d,
        "rotary_dim": rd, "n_ctx": n_ctx, "threads": args.threads,
        "spectra_s_per_head_offset": t_fact, "dense_s_per_head_offset": t_dense,
        "spectra_speedup": t_dense / t_fact, "spectra_rel_err": err_sv,
        "curve_s_per_head_offset": t_curve, "dense_energy_s_per_head_offset": t_dense_e,
        "curve_speedup": t_dense_e / t_curve, "curve_rel_err": err_curve,
    }
    print(f"spectra: {t_fact * 1e3:.2f} ms vs dense {t_dense * 1e3:.1f} ms per (head, offset) "
          f"-> x{out['spectra_speedup']:.0f}; rel err {err_sv:.1e}")
    print(f"curve over {n_ctx} offsets: {t_curve * 1e6:.1f} us vs dense energies "
          f"{t_dense_e * 1e3:.2f} ms per (head, offset) -> x{out['curve_speedup']:.0f}; "
          f"abs err {err_curve:.1e}")
    if not args.no_model:
        out.update(model_case(args.exact_heads))
        print(f"model_rotary_geometry (12 x 12 heads, d_head 64, context 2048), defaults: "
              f"{out['model_s']:.1f} s wall, {out['model_cpu_s']:.1f} s CPU (target <= 30 s); "
              f"ranks averaged over {out['model_rank_offsets']} sampled offsets, "
              f"|sampled - exact| <= {out['rank_sample_abs_err']:.3f} on "
              f"{args.exact_heads} heads (exact: {out['exact_s_per_head']:.1f} s per head)")
    print(json.dumps(out))


def model_case(exact_heads: int) -> dict:
    """model_rotary_geometry with defaults on a Pythia-160m-shaped model (see the docstring)."""
    from tl_spectral.geometry.model import model_rotary_geometry
    from tl_spectral.models import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, n_layers=12, n_heads=12, d_model=768, d_head=64, n_ctx=2048,
                    positional="rotary", rotary_dim=16)
    model = GPT(cfg).eval()
    # the random init is near-isotropic: give the heads a spread of scales per coordinate,
    # as trained heads have, so the ranks vary with the offset
    with torch.no_grad():
        for blk in model.blocks:
            for p in blk.attn.parameters():
                if p.dim() == 2:
                    p.mul_(torch.rand(p.shape[-1]) ** 3 + 0.05)
    t0, c0 = time.perf_counter(), time.process_time()
    geo = model_rotary_geometry(model, n_ctx=cfg.n_ctx, progress=False)  # the whole 2,048
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # the exact mean over every offset on a few heads of layer 0, against the sample
    from tl_spectral.geometry.model import native_attention_weights
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry
    from tl_spectral.models.attention import rotary_inv_freq

    w = native_attention_weights(model)[0]
    spec = RotarySpec(rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base), "adjacent")
    heads = slice(0, exact_heads)
    t0 = time.perf_counter()
    ex = rotary_qk_geometry(w["W_Q"][None, heads], w["W_K"][None, heads], spec, offsets=[0],
                            n_ctx=cfg.n_ctx, rank_offsets=None, progress=False)
    t_exact = (time.perf_counter() - t0) / exact_heads
    err = max(float((ex.mean_eff_rank_R[0] - geo.mean_eff_rank_R[0, heads]).abs().max()),
              float((ex.mean_eff_rank_F[0] - geo.mean_eff_rank_F[0, heads]).abs().max()))
    return {"model": "pythia-160m-shaped random native GPT (12L x 12H, d_head 64, rotary_dim 16)",
            "model_n_ctx": cfg.n_ctx, "model_s": wall, "model_cpu_s": cpu,
            "model_rank_offsets": int(geo.rank_offsets.numel()),
            "model_rank_exact": bool(geo.mean_eff_rank_exact),
            "mean_eff_rank_R_mean": float(geo.mean_eff_rank_R.mean()),
            "rank_sample_abs_err": err, "exact_heads": exact_heads,
            "exact_s_per_head": t_exact}


if __name__ == "__main__":
    main()
