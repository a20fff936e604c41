"""HeadScoresProbe: the per-head scores TransformerLens users look for first — previous-token,
duplicate-token, induction and first-token — and the attention mass on chosen token sets
(for encoders: [CLS], [SEP], punctuation), in the same pass as the other probes.

Definitions (TransformerLens ``transformer_lens.head_detector.detect_head`` with its default
``error_measure="mul"``, ``exclude_bos=False``, ``exclude_current_token=False``): a head's
score for a 0/1 detection pattern ``D`` on one sequence is ``Σ_ij α_ij D_ij / Σ_ij α_ij`` —
with rows of α summing to 1, the mean over queries of the attention mass on the positions
``D`` marks. The detection patterns, for tokens ``t`` (causal, so ``j ≤ i``):

* previous-token: ``D_ij = 1`` iff ``j = i − 1``;
* duplicate-token: ``D_ij = 1`` iff ``j < i`` and ``t_j = t_i``;
* induction: ``D_ij = 1`` iff ``1 ≤ j ≤ i`` and ``t_(j−1) = t_i`` (the token after an earlier
  occurrence of the current token: TransformerLens' duplicate pattern shifted one key to the
  right). On repeated random sequences (a random block followed by the same block, Olsson et
  al. 2022) the queries of the second block all have an earlier copy, so an induction head
  scores about one half (the share of such queries; random repeats inside the blocks add a
  little) and a head that ignores content far less.
* first-token: ``D_ij = 1`` iff ``j = 0`` (the same number as AttentionStatsProbe's
  ``first_token_mass``).

Over a corpus the score is pooled over every real query (``Σ_docs Σ_i mass_i / Σ_docs n_i``);
on windows of equal length this equals TransformerLens' mean over the sequences of a list.
Bidirectional models use the same patterns without the causal cut (``j ≠ i`` for duplicates,
``j − 1 ≠ i`` for induction). ``token_sets`` (``{name: token ids}``) adds, per set, the mean
attention mass on keys whose token is in the set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Optional, Sequence

import torch
from torch import Tensor

from tl_spectral._deprecation import deprecated_method, module_getattr
from tl_spectral.probes.base import LayerCapture, Probe
from tl_spectral.results import Result, register_result

#: the scores, in report order
SCORES = ("previous_token", "induction", "duplicate_token", "first_token")


@register_result
@dataclass
class HeadScoresResult(Result):
    """The head-detector scores and token-set masses per layer and head.

    Fields (see the module doc): ``previous_token``, ``induction``, ``duplicate_token``,
    ``first_token`` ``[layer, head]``; ``set_mass`` ``{name: [layer, head]}`` mean attention
    mass on the keys of each token set (``set_names`` in order); ``n_queries`` ``[layer]``;
    ``layers``."""

    kind: ClassVar[str] = "head_scores"
    main_plot: ClassVar[Optional[str]] = "plot"
    array_shapes = {
        "previous_token": "float[layer, head]", "induction": "float[layer, head]",
        "duplicate_token": "float[layer, head]", "first_token": "float[layer, head]",
        "n_queries": "int[layer]", "set_mass": "float[layer, head]",
    }
    array_dims = {"layer": "layers"}

    previous_token: Tensor
    induction: Tensor
    duplicate_token: Tensor
    first_token: Tensor
    n_queries: Tensor
    layers: list = field(default_factory=list)
    set_names: list = field(default_factory=list)
    set_mass: dict = field(default_factory=dict)
    causal: bool = True
    model_name: str = ""

    def score(self, name: str) -> Tensor:
        """The ``[layer, head]`` scores of ``name``: one of ``SCORES`` or a token set's name;
        KeyError otherwise."""
        if name in SCORES:
            return getattr(self, name)
        if name in self.set_mass:
            return self.set_mass[name]
        raise KeyError(f"unknown score {name!r}; one of {list(SCORES) + list(self.set_names)}")

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict]:
        """One row per (layer, head): every score."""
        rows = []
        for li, layer in enumerate(self.layers):
            for h in range(self.previous_token.shape[1]):
                r = {"layer": int(layer), "head": h}
                for s in SCORES:
                    r[s] = float(getattr(self, s)[li, h])
                for s in self.set_names:
                    r[f"mass_on_{s}"] = float(self.set_mass[s][li, h])
                rows.append(r)
        return rows

    def top(self, name: str, k: int = 3) -> list[tuple[int, int, float]]:
        """The ``k`` best heads for a score: (layer, head, score)."""
        t = self.score(name).float()
        idx = t.flatten().argsort(descending=True)[:k].tolist()
        H = t.shape[1]
        return [(int(self.layers[i // H]), i % H, float(t.flatten()[i])) for i in idx]

    def headline(self) -> dict:
        return {s: [list(x) for x in self.top(s, 1)] for s in SCORES}

    def plot(self):
        """Heads-by-layer maps of each score, every colour scale on the full range [0, 1]."""
        names = [s for s in SCORES if s != "first_token"] + list(self.set_names)
        return self._draw("plot", names)


class HeadScoresProbe(Probe):
    """Per-head previous-token, induction, duplicate-token and first-token scores (and the
    attention mass on ``token_sets``), TransformerLens' detection patterns (module doc).

    layers: which layers (default all); token_sets: ``{name: token ids}``.
    """

    name = "head_scores"

    def __init__(self, layers: Optional[Sequence[int]] = None,
                 token_sets: Optional[Mapping[str, Sequence[int]]] = None,
                 name: Optional[str] = None):
        super().__init__()
        self.layers = None if layers is None else sorted(set(int(x) for x in layers))
        self.token_sets = {str(k): sorted(set(int(i) for i in v))
                           for k, v in (token_sets or {}).items()}
        for k, v in self.token_sets.items():
            if not v:
                raise ValueError(f"token set {k!r} is empty; pass at least one token id")
        if name is not None:
            self.name = name

    def requires(self, view) -> dict[int, set[str]]:
        layers = self._read_layers(view)
        return {layer: {"pattern"} for layer in layers}

    def update(self, cap: LayerCapture) -> None:
        assert cap.pattern is not None
        layer = cap.layer
        p = cap.pattern.float()  # [b, h, q, k]
        b, H, T, _ = p.shape
        pair = cap.pair_mask  # [b, q, k]
        if not bool(cap.mask.all()):
            p = p * pair[:, None].to(p.dtype)
        qm = cap.mask.to(p.dtype)  # [b, q]
        t = cap.tokens.to(p.device)
        causal = bool(self.view is None or self.view.causal)
        idx = torch.arange(T, device=p.device)
        below = idx[None, :] < idx[:, None]  # j < i
        # previous token: α_{i, i−1}
        prev = p.diagonal(offset=-1, dim1=-2, dim2=-1)  # [b, h, T − 1]
        self.accumulate(f"{layer}.previous_token", (prev * qm[:, None, 1:]).sum((0, 2)).double())
        # duplicate token: j < i (causal) or j ≠ i, t_j = t_i
        same = t[:, :, None] == t[:, None, :]  # [b, q, k]
        dmask = (same & (below if causal else ~torch.eye(T, dtype=torch.bool,
                                                           device=p.device))) & pair
        dup = torch.einsum("bhqk,bqk->bhq", p, dmask.to(p.dtype))
        self.accumulate(f"{layer}.duplicate_token", (dup * qm[:, None]).sum((0, 2)).double())
        # induction: key j ≥ 1 with t_{j−1} = t_i, j ≤ i (causal) or j − 1 ≠ i
        if T > 1:
            shifted = t[:, :, None] == t[:, None, :-1]  # [b, q, k − 1]: key j = k' + 1
            jm1 = idx[None, :-1]  # j − 1
            ok = (jm1 < idx[:, None]) if causal else (jm1 != idx[:, None])
            imask = (shifted & ok) & pair[:, :, 1:]
            ind = torch.einsum("bhqk,bqk->bhq", p[..., 1:], imask.to(p.dtype))
            self.accumulate(f"{layer}.induction", (ind * qm[:, None]).sum((0, 2)).double())
        else:
            self.accumulate(f"{layer}.induction", torch.zeros(H, dtype=torch.float64,
                                                               device=p.device))
        self.accumulate(f"{layer}.first_token", (p[..., 0] * qm[:, None]).sum((0, 2)).double())
        for name, ids in self.token_sets.items():
            km = torch.isin(t, torch.tensor(ids, device=t.device)) & cap.mask  # [b, k]
            mass = torch.einsum("bhqk,bk->bhq", p, km.to(p.dtype))
            self.accumulate(f"{layer}.set.{name}", (mass * qm[:, None]).sum((0, 2)).double())
        self.accumulate(f"{layer}.n_queries", cap.mask.sum().double().reshape(1))

    def result(self) -> HeadScoresResult:
        self._require_state()
        s = {k: v.cpu() for k, v in self.state.items()}
        layers = list(self.layers or [])
        n = torch.stack([s[f"{layer}.n_queries"] for layer in layers])  # [L, 1]

        def get(key: str) -> Tensor:
            return (torch.stack([s[f"{layer}.{key}"] for layer in layers])
                    / n.clamp_min(1.0)).float()

        view = self.view
        return HeadScoresResult(
            previous_token=get("previous_token"), induction=get("induction"),
            duplicate_token=get("duplicate_token"), first_token=get("first_token"),
            n_queries=n[:, 0].long(), layers=layers, set_names=list(self.token_sets),
            set_mass={k: get(f"set.{k}") for k in self.token_sets},
            causal=view.causal if view is not None else True,
            model_name=view.name if view is not None else "")


def repeated_random_tokens(vocab: Sequence[int], n_seq: int, half: int,
                           prefix: Optional[Sequence[int]] = None, seed: int = 0) -> Tensor:
    """``[n_seq, len(prefix) + 2 · half]`` token ids: an optional prefix (e.g. the model's
    start token), then ``half`` tokens drawn uniformly from ``vocab`` (with a seeded
    generator), then the same ``half`` tokens again — the sequences on which induction heads
    are measured (TransformerLens' ``generate_repeated_tokens`` convention)."""
    vocab_t = torch.as_tensor(list(vocab), dtype=torch.long)
    if vocab_t.numel() < 2 or half < 1 or n_seq < 1:
        raise ValueError("need at least 2 vocabulary ids, half >= 1 and n_seq >= 1")
    g = torch.Generator().manual_seed(int(seed))
    body = vocab_t[torch.randint(0, vocab_t.numel(), (n_seq, half), generator=g)]
    parts = [torch.as_tensor(list(prefix), dtype=torch.long).expand(n_seq, -1)] if prefix else []
    return torch.cat(parts + [body, body], dim=1)


#: the old name of the probe class, deprecated (docs/api.md, "Deprecated spellings")
__getattr__ = module_getattr(__name__, {"HeadScores": ("HeadScoresProbe", __name__)})
