"""AttentionStatsProbe: entropy, distance, first-token mass and mean pattern per layer and head."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional, Sequence

import torch
from torch import Tensor

from tl_spectral._deprecation import deprecated_method, module_getattr
from tl_spectral.probes import shared
from tl_spectral.probes.base import LayerCapture, Probe
from tl_spectral.results import Result, register_result


@register_result
@dataclass
class AttentionStatsResult(Result):
    """Per layer and head means over every real query of the corpus.

    entropy: [layer, head] mean of ``-Σ_j α_ij log α_ij`` (nats; 0·log 0 = 0).
    distance: [layer, head] mean of ``Σ_j α_ij |i − j|`` (tokens).
    first_token_mass: [layer, head] mean of ``α_i0``.
    mean_pattern: [layer, head, query, key] mean pattern over the documents where both
      positions are real, for the first ``pattern_positions`` queries and keys of the probe
      (all positions when it was ``None``). n_queries: [layer] real queries seen. layers: the
      layer indices.
    """

    kind: ClassVar[str] = "attention_stats"
    array_shapes = {
        "entropy": "float[layer, head]", "distance": "float[layer, head]",
        "first_token_mass": "float[layer, head]", "mean_pattern": "float[layer, head, pos, pos]",
        "n_queries": "int[layer]",
    }
    array_dims = {"layer": "layers"}

    entropy: Tensor
    distance: Tensor
    first_token_mass: Tensor
    mean_pattern: Tensor
    n_queries: Tensor
    layers: list = field(default_factory=list)
    model_name: str = ""
    causal: bool = True

    def headline(self) -> dict:
        return {"layers": len(self.layers), "heads": int(self.entropy.shape[1]),
                "entropy_per_layer": [round(float(x), 4) for x in self.entropy.mean(1)],
                "first_token_mass_max": float(self.first_token_mass.max())}

    def view(self, layer: int | None = None, max_pos: int = 64):
        """circuitsvis view of the mean pattern of ``layer`` (default: the last), one panel
        per head; positions are labelled by index."""
        return self._draw("view", layer=layer, max_pos=max_pos)

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict]:
        """One row per (layer, head): entropy, distance, first-token mass."""
        rows = []
        for li, layer in enumerate(self.layers):
            for h in range(self.entropy.shape[1]):
                rows.append(
                    {
                        "layer": int(layer),
                        "head": h,
                        "entropy": float(self.entropy[li, h]),
                        "distance": float(self.distance[li, h]),
                        "first_token_mass": float(self.first_token_mass[li, h]),
                    }
                )
        return rows

    def plot(self):
        """Heat maps (layer × head) of entropy, mean distance and first-token mass."""
        return self._draw("plot")

    def plot_patterns(self, max_pos: int = 64):
        """Grid (layer × head) of mean attention patterns, first ``max_pos`` positions."""
        return self._draw("plot_patterns", max_pos=max_pos)


def _row_plogp(p: Tensor, causal: bool, n_blocks: int = 16,
               sums: Optional[shared.BlockSums] = None) -> Tensor:
    """``Σ_j p_ij log p_ij`` per row of ``p`` [..., query, key] (0 log 0 = 0).

    Causal patterns are zero above the diagonal, so queries are taken in ``n_blocks`` blocks
    whose keys stop at the block's last query: about half the work of the full product.
    ``sums``: the pattern's sums by key and lag, gathered from each block while it is in
    cache (:class:`tl_spectral.probes.shared.BlockSums`).
    """
    if not causal:
        return _plogp_sum(p)
    T = p.shape[-1]
    nb = max(1, min(n_blocks, T))
    edges = [round(T * i / nb) for i in range(nb + 1)]
    parts = []
    for a, b in zip(edges[:-1], edges[1:]):
        parts.append(_plogp_sum(p[..., a:b, :b]))
        if sums is not None:
            sums.add(a, b)
    if sums is not None:
        sums.finish()
    return torch.cat(parts, dim=-1)


def _plogp_sum(p: Tensor) -> Tensor:
    """``Σ_key p log p`` with ``0 log 0 = 0``: ``p · log max(p, tiny)`` (``xlogy(p, p)`` for
    every ``p >= tiny``; a subnormal ``p`` adds under ``1e-36``), about twice as fast as
    ``xlogy``."""
    tiny = torch.finfo(p.dtype).tiny
    return p.clamp_min(tiny).log_().mul_(p).sum(-1)


class AttentionStatsProbe(Probe):
    """Entropy, distance, first-token mass and mean pattern of every head.

    layers: which layers to read (default all). pattern_positions: the mean pattern is kept
    for the first ``pattern_positions`` queries and keys (default 256; ``None``: every
    position). Entropy, distance and first-token mass always use every position. The full
    mean pattern is ``layers × heads × T²`` floats of state: 604 MB for GPT-2 small at
    T = 1,024, more than the model itself, where the first 256 positions take 38 MB.
    The state stays on the model's device; the result is on the CPU.
    """

    name = "attention_stats"

    def __init__(self, layers: Optional[Sequence[int]] = None, name: Optional[str] = None,
                 *, pattern_positions: Optional[int] = 256):
        super().__init__()
        if pattern_positions is not None and (isinstance(pattern_positions, bool)
                                              or int(pattern_positions) < 1):
            raise ValueError(f"pattern_positions must be a positive int or None (every "
                             f"position), got {pattern_positions!r}")
        self.pattern_positions = None if pattern_positions is None else int(pattern_positions)
        self.layers = None if layers is None else sorted(set(int(x) for x in layers))
        if name is not None:
            self.name = name

    def requires(self, view) -> dict[int, set[str]]:
        layers = self._read_layers(view)
        return {layer: {"pattern"} for layer in layers}

    def update(self, cap: LayerCapture) -> None:
        assert cap.pattern is not None
        layer = cap.layer
        causal = bool(self.view is not None and self.view.causal)
        T = cap.pattern.shape[-1]
        P = T if self.pattern_positions is None else min(T, self.pattern_positions)
        if shared.padless(cap):
            # full windows: the batch's pattern sum and its sums by lag and by key are shared
            # with the other probes of this layer (ContributionProbe reads the same ones)
            p = shared.query_pattern(cap)  # the capture itself
            # the entropy's blocks also gather the sums by key and lag (while in cache)
            ent = _row_plogp(p, causal=causal, sums=shared.BlockSums(cap, causal))  # [b, h, q]
            # Σ_b of the mean pattern's corner (the whole Σ_b only when shared already)
            psum = shared.pattern_sum(cap) if p.shape[0] == 1 or "pattern_sum" in cap.shared \
                else p[:, :, :P, :P].sum(0)
            pos_l, neg_l = shared.pattern_lag_sums(cap, causal)  # [h, T] by |i − j|
            lag = torch.arange(T, device=p.device, dtype=torch.float64)
            distance = (pos_l.double() @ lag) + (neg_l.double() @ lag)
            first = shared.pattern_source_sums(cap)[:, 0].double()
            self.accumulate(f"{layer}.entropy_sum", -ent.sum(dim=(0, 2)).double())
            pair_count = torch.full((P, P), float(p.shape[0]), device=p.device)
        else:
            p = cap.pattern.float() * cap.pair_mask[:, None].to(torch.float32)  # padded: 0
            qmask = cap.mask[:, None, :].to(p.dtype)  # [b, 1, q]
            psum = p.sum(dim=0)  # [h, q, k]
            ent = _row_plogp(p, causal=causal)  # [b, h, q]
            pos = torch.arange(T, device=p.device, dtype=torch.float32)
            lag_m = (pos[:, None] - pos[None, :]).abs()
            self.accumulate(f"{layer}.entropy_sum", -(ent * qmask).sum(dim=(0, 2)).double())
            distance = (psum * lag_m).sum(dim=(1, 2)).double()
            first = psum[..., 0].sum(-1).double()
            pair_count = cap.pair_mask[:, :P, :P].sum(dim=0).float()
        self.accumulate(f"{layer}.distance_sum", distance)
        self.accumulate(f"{layer}.first_sum", first)
        self.accumulate(f"{layer}.pattern_sum", psum[:, :P, :P].contiguous())
        self.accumulate(f"{layer}.n_queries", cap.mask.sum().double().reshape(1))
        self.accumulate(f"{layer}.pair_count", pair_count)

    def result(self) -> AttentionStatsResult:
        self._require_state()
        s = {k: v.cpu() for k, v in self.state.items()}  # state lives on the model's device
        layers = list(self.layers or [])
        T = max(s[f"{layer}.pattern_sum"].shape[-1] for layer in layers)

        def stack(name: str) -> Tensor:
            return torch.stack([s[f"{layer}.{name}"] for layer in layers])

        n_q = stack("n_queries")[:, 0]  # [L]
        n = n_q.clamp_min(1.0)[:, None]
        # mean pattern, one layer at a time into the output (no [L, H, T, T] float64
        # temporaries). float32 division of the float32 sums by the (exact) float32 counts
        # is correctly rounded, so it equals the float64 quotient rounded to float32.
        first = s[f"{layers[0]}.pattern_sum"]
        mean_pattern = torch.zeros(len(layers), first.shape[0], T, T, dtype=torch.float32)
        for li, layer in enumerate(layers):
            ps = s[f"{layer}.pattern_sum"]
            pair = s[f"{layer}.pair_count"].to(ps.dtype)
            q, k = ps.shape[-2:]
            out = mean_pattern[li, :, :q, :k]
            if ps.dtype == torch.float32:
                torch.div(ps, pair.clamp_min(1.0), out=out)
            else:  # float64 sums (float64 models): divide in float64, then round
                out.copy_(ps / pair.clamp_min(1.0))
            out.masked_fill_(pair == 0, 0.0)
        view = self.view
        return AttentionStatsResult(
            entropy=(stack("entropy_sum") / n).float(),
            distance=(stack("distance_sum") / n).float(),
            first_token_mass=(stack("first_sum") / n).float(),
            mean_pattern=mean_pattern,
            n_queries=n_q.long(),
            layers=layers,
            model_name=view.name if view is not None else "",
            causal=view.causal if view is not None else True,
        )


#: the old name of the probe class, deprecated (docs/api.md, "Deprecated spellings")
__getattr__ = module_getattr(__name__, {"AttentionStats": ("AttentionStatsProbe", __name__)})
