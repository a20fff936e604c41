"""Linear (ELU+1, chunked O(T)) vs softmax attention, forward pass, same dimensions.

Dimensions: batch 1, 4 heads, d_head 64 (d_model 256), float32, CPU, one thread, no grad.

- **core** (the headline): the attention operation on the same ``q, k, v``
  ``[1, head, T, d_head]`` — ``causal_linear_attention(q, k, v)`` (the linear layer's
  forward path) vs ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` (the softmax
  layer's training path). ``speedup_T = t_softmax / t_linear``.
- **explicit**: softmax through the explicit ``[T, T]`` pattern (scores, mask, softmax,
  product — what a pattern-exposing forward costs), reported beside it.
- **module**: the whole attention modules (``make_attention("linear" | "softmax", ...)``,
  same weights, train mode so softmax takes its SDPA path), which add the identical q/k/v/o
  projections (O(T·d_model²)) to both.
- time: best of ``--repeats`` (default 10) runs, the kinds interleaved so all see the same load;
  each timed call follows an untimed call of the same kind, so no kind pays for the cache
  and allocator state the previous kind left (the explicit softmax touches ~0.5 GB).
- memory: each (kind, T) in a fresh subprocess; the peak resident-set growth of one forward
  (the kernel's peak counter VmHWM is reset through ``/proc/self/clear_refs`` just before,
  minus VmRSS then), in MiB. ``mem_ratio_4096 = mem_softmax(4096) / mem_linear(4096)``;
  ``linear_mem_growth = mem_linear(4096) / mem_linear(2048)`` (2 = linear in T,
  4 = quadratic); the same for the explicit softmax.

Last line: one JSON object {"speedup_2048", "speedup_4096", "mem_ratio_4096", ...}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
import torch.nn.functional as F
from _bench import interleaved_times, peak_rss_growth_mib

D_MODEL, N_HEADS, D_HEAD = 256, 4, 64
KINDS = ("linear", "softmax", "softmax_explicit", "module_linear", "module_softmax")


def _explicit(q, k, v):
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / D_HEAD**0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def make(kind: str, T: int):
    """A zero-argument callable running one forward of ``kind`` at length T."""
    from tl_spectral.models import make_attention
    from tl_spectral.models.attention import causal_linear_attention

    g = torch.Generator().manual_seed(0)
    if kind.startswith("module_"):
        torch.manual_seed(0)
        # train mode (no dropout exists): softmax runs its SDPA path, as in training; in eval
        # mode it takes the explicit TransformerLens-arithmetic path (see attention.py)
        att = make_attention(kind[len("module_"):], D_MODEL, N_HEADS, D_HEAD, T).train()
        with torch.no_grad():
            for p in att.parameters():
                p.normal_(0, 0.05, generator=g)
        x = torch.randn(1, T, D_MODEL, generator=g)
        return lambda: att(x)
    q, k, v = (torch.randn(1, N_HEADS, T, D_HEAD, generator=g) for _ in range(3))
    if kind == "linear":
        return lambda: causal_linear_attention(q, k, v)
    if kind == "softmax":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if kind == "softmax_explicit":
        return lambda: _explicit(q, k, v)
    raise ValueError(kind)


def measure_memory(kind: str, T: int) -> float:
    """(child) MiB of peak RSS growth during one forward of ``kind`` at length T."""
    torch.set_num_threads(1)
    with torch.no_grad():
        make(kind, 64)()  # warm-up: kernels, allocator
        return peak_rss_growth_mib(make(kind, T))


def child_memory(kind: str, T: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(T)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--child", nargs=2)
    a = ap.parse_args()
    if a.child:
        print(measure_memory(a.child[0], int(a.child[1])))
        return
    torch.set_num_threads(1)
    res: dict[str, float] = {}
    for T in (2048, 4096):
        fns = {k: make(k, T) for k in KINDS}
        with torch.no_grad():
            torch.testing.assert_close(fns["softmax"](), fns["softmax_explicit"](),
                                       atol=1e-5, rtol=1e-4)
            times = interleaved_times(fns, a.repeats, warm_each=True)
            best = {k: min(v) for k, v in times.items()}
        for k, v in best.items():
            res[f"t_{k}_{T}_ms"] = round(1000 * v, 2)
        res[f"speedup_{T}"] = round(best["softmax"] / best["linear"], 2)
        res[f"speedup_explicit_{T}"] = round(best["softmax_explicit"] / best["linear"], 2)
        res[f"speedup_module_{T}"] = round(best["module_softmax"] / best["module_linear"], 2)
        for k in ("linear", "softmax", "softmax_explicit"):
            res[f"mem_{k}_{T}_mib"] = round(child_memory(k, T), 1)
        print(f"T={T}: " + ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in best.items()),
              flush=True)
    lin4 = max(res["mem_linear_4096_mib"], 0.1)
    res["mem_ratio_4096"] = round(res["mem_softmax_4096_mib"] / lin4, 2)
    res["mem_ratio_explicit_4096"] = round(res["mem_softmax_explicit_4096_mib"] / lin4, 2)
    res["linear_mem_growth"] = round(lin4 / max(res["mem_linear_2048_mib"], 0.1), 2)
    res["explicit_mem_growth"] = round(
        res["mem_softmax_explicit_4096_mib"] / max(res["mem_softmax_explicit_2048_mib"], 0.1), 2)
    head = {k: res.pop(k) for k in ("speedup_2048", "speedup_4096", "mem_ratio_4096")}
    print(json.dumps({**head, **res}))


if __name__ == "__main__":
    main()
