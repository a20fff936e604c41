"""AttentionFieldProbe: attention fields of an ensemble of documents, in lag coordinates.

Per layer it streams the head-mean field ``A_s(i, j)`` (or every head's, on request) of each
document ``s`` into lag coordinates (SPEC A.3; causal ``tau = i - j``, bidirectional
``tau = j - i``), truncated to ``max_lag``, in float32. It keeps

- a running sum and count per (query, lag) for the ensemble mean (the Reynolds split), and
- the per-document lag fields (a "cat" state), so fluctuations ``u_s = A_s - Ā`` are
  formed once at the end.

N = 1,000 documents at T = 256 with all 256 lags is 262 MB per layer (float32). Padded
positions never enter the mean, and their fluctuation is set to zero (no energy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

import torch
from torch import Tensor

from tl_spectral.analysis.scale_pod import lag_fields
from tl_spectral.probes.base import LayerCapture, Probe
from tl_spectral.probes.pair_fields import needs_values, pair_field
from tl_spectral.results import Result, register_result


@register_result
@dataclass
class AttentionFields(Result):
    """Lag-coordinate attention fields of every captured layer.

    fields: ``{str(layer): [N, T, n_lags]}`` raw lag fields F_s(i, tau) (per-head:
      ``[N, head, T, n_lags]``); mean: ``{str(layer): [T, n_lags]}`` ensemble mean over real
      positions; doc_mask: ``[N, T]`` 1 at real tokens; lags: ``[n_lags]``;
      field: which per-pair field (:data:`~tl_spectral.probes.pair_fields.FIELD_KINDS`).
    """

    kind: ClassVar[str] = "attention_fields"
    main_plot: ClassVar[str | None] = "plot_mean"

    fields: dict
    mean: dict
    doc_mask: Tensor
    lags: Tensor
    layers: list = field(default_factory=list)
    causal: bool = True
    per_head: bool = False
    model_name: str = ""
    field: str = "attention"

    @property
    def n_docs(self) -> int:
        return int(self.doc_mask.shape[0])

    def fluctuations(self, layer: int) -> Tensor:
        """``F_s - F̄`` of ``layer``: ``[N, T, n_lags]``; zero at padded queries and at lags that
        reach before the first token (causal) or past the end."""
        F = self.fields[str(layer)]
        mean = self.mean[str(layer)]
        u = F - mean
        m = self.doc_mask.to(F.dtype)
        if self.per_head:
            m = m[:, None]
        u = u * m[..., None]
        # keys outside the document: lag_fields wrote 0 there for every document
        T = F.shape[-2]
        i = torch.arange(T)[:, None]
        j = i - self.lags[None, :] if self.causal else i + self.lags[None, :]
        inside = ((j >= 0) & (j < T)).to(F.dtype)
        return u * inside

    def scale_pod(self, n_heads: int | Sequence[int], **kwargs: Any):
        """Scale-selective POD of every layer (see :func:`tl_spectral.analysis.scale_pod.scale_pod`);
        per-head fields get :func:`~tl_spectral.analysis.scale_pod.scale_pod_heads` (every head;
        ``n_heads`` unused)."""
        from tl_spectral.analysis.scale_pod import scale_pod, scale_pod_heads

        if self.n_docs < 2:
            raise ValueError(f"POD needs at least 2 documents, the ensemble has {self.n_docs}")
        fl = [self.fluctuations(layer) for layer in self.layers]
        if self.per_head:
            return scale_pod_heads(fl, self.lags, layer_ids=self.layers, **kwargs)
        return scale_pod(fl, self.lags, n_heads=n_heads, layer_ids=self.layers, **kwargs)

    def plot_mean(self):
        """Mean lag profile per layer: ``Σ_i F̄(i, tau)`` against ``tau``."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for layer in self.layers:
            m = self.mean[str(layer)]
            prof = m.mean(dim=0) if not self.per_head else m.mean(dim=(0, 1))
            ax.plot(self.lags.numpy(), prof.numpy(), label=f"layer {layer}")
        ax.set_xlabel("lag τ (tokens)")
        ax.set_ylabel("mean attention" if self.field == "attention" else f"mean {self.field}")
        ax.set_yscale("log" if self.field in ("attention", "value_weighted",
                                              "value_weighted_raw") else "symlog")
        ax.legend(fontsize=8)
        return fig


class AttentionFieldProbe(Probe):
    """Capture lag-coordinate attention fields of each document.

    layers: layers to capture (default all). field: the per-pair map captured (default
    ``"attention"``; ``"contribution"`` (inter-head), ``"contribution_intra"``,
    ``"value_weighted"``, ``"value_weighted_raw"``: see :mod:`tl_spectral.probes.pair_fields`
    for definitions and normalisation), in the same forward pass as every other probe; the
    default probe name is ``"attention_fields"`` for attention and ``"<field>_fields"``
    otherwise. per_head: keep each head's field instead of the head-combined one (the head
    mean; for ``"contribution"`` the head sum ``C_ij``, whose rows sum to 1).
    max_lag: largest |lag| kept (default T − 1: all lags). offload: keep the
    per-document fields (the large state) in CPU memory instead of on the model's device
    (default False: every state stays on the model's device; the result is on the CPU).
    """

    name: ClassVar[str] = "attention_fields"
    reductions: ClassVar[dict[str, str]] = {}

    def __init__(self, layers: Optional[Sequence[int]] = None, *, per_head: bool = False,
                 max_lag: Optional[int] = None, name: Optional[str] = None,
                 offload: bool = False, field: str = "attention"):
        super().__init__()
        self.field = field
        self._values = needs_values(field)  # validates the kind
        self._W: dict[int, Tensor] = {}
        if name is None and field != "attention":
            name = f"{field}_fields"
        self.offload = bool(offload)
        self.layers = None if layers is None else sorted(set(int(x) for x in layers))
        self.per_head = per_head
        self.max_lag = max_lag
        if name is not None:
            self.name = name  # type: ignore[misc]
        self.reductions = {"doc_mask": "cat", "doc_index": "cat"}  # type: ignore[misc]

    def requires(self, view) -> dict[int, set[str]]:
        if self.layers is None:
            self.layers = list(range(view.n_layers))
        for layer in self.layers:
            self.reductions[f"{layer}.fields"] = "cat"  # type: ignore[index]
        self._W = {}  # W_O is read from this run's model
        kinds = {"pattern", "v"} if self._values else {"pattern"}
        return {layer: set(kinds) for layer in self.layers}

    def _w_o(self, layer: int, device: torch.device) -> Optional[Tensor]:
        """The layer's ``W_O [head, d_head, d_model]`` on ``device`` (None for attention)."""
        if not self._values:
            return None
        W = self._W.get(layer)
        if W is None or W.device != device:
            assert self.view is not None
            W = self._W[layer] = self.view.weights(layer).W_O.to(device)
        return W

    def begin(self, n_docs: int, length: int) -> None:
        if self.max_lag is not None and self.max_lag > length - 1:
            raise ValueError(
                f"max_lag={self.max_lag} exceeds the document length {length} - 1; "
                f"pass max_lag <= {length - 1}"
            )
        self.length = length

    def update(self, cap: LayerCapture) -> None:
        assert cap.pattern is not None and self.layers is not None and self.view is not None
        T = self.length
        # the field A [b, (h,) q, k]; padded pairs are 0 (never count)
        A = pair_field(cap, self.field, W_O=self._w_o(cap.layer, cap.pattern.device),
                       per_head=self.per_head).float()
        T_b = A.shape[-1]
        mask = cap.mask
        if T_b < T:  # a batch whose trailing padding was trimmed: pad back to the corpus length
            pad = T - T_b
            A = torch.nn.functional.pad(A, (0, pad, 0, pad))
            mask = torch.nn.functional.pad(mask, (0, pad), value=False)
        F, lags = lag_fields(A, causal=self.view.causal, max_lag=self.max_lag)
        # counts per (query, lag): a real query and a real key inside the document
        i = torch.arange(T, device=F.device)[:, None]
        lg = lags[None, :].to(F.device)
        j = i - lg if self.view.causal else i + lg
        inside = (j >= 0) & (j < T)
        key_real = mask[:, j.clamp(0, T - 1)] & inside[None]  # [b, T, n_lags]
        count = (mask[:, :, None] & key_real).to(F.dtype)
        layer = cap.layer
        self.accumulate(f"{layer}.sum", F.sum(dim=0))
        self.accumulate(f"{layer}.count", count.sum(dim=0))
        self.accumulate(f"{layer}.fields", F.to("cpu") if self.offload else F.contiguous())
        if layer == self.layers[0]:
            self.accumulate("doc_mask", mask.to(torch.uint8))
            self.accumulate("doc_index", cap.doc_index)

    def result(self) -> AttentionFields:
        self._require_state()
        assert self.layers is not None
        s = {k: v.cpu() for k, v in self.state.items()}  # state lives on the model's device
        T = int(s["doc_mask"].shape[1])
        n_lags = int(s[f"{self.layers[0]}.count"].shape[-1])
        causal = self.view.causal if self.view is not None else True
        L = (n_lags - 1) if causal else (n_lags - 1) // 2
        lags = torch.arange(0, L + 1) if causal else torch.arange(-L, L + 1)
        fields, means = {}, {}
        for layer in self.layers:
            cnt = s[f"{layer}.count"]
            if self.per_head:
                cnt = cnt[None]
            means[str(layer)] = torch.where(cnt > 0, s[f"{layer}.sum"] / cnt.clamp_min(1.0), 0.0)
            fields[str(layer)] = s[f"{layer}.fields"]
        return AttentionFields(
            fields=fields, mean=means, doc_mask=s["doc_mask"].to(torch.uint8)[:, :T], lags=lags,
            layers=list(self.layers), causal=causal, per_head=self.per_head,
            model_name=self.view.name if self.view is not None else "", field=self.field,
        )
