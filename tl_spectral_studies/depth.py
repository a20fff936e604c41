"""Depth as a fraction of the stack: layer ``l`` of ``L`` at ``l / (L − 1)``, and the thirds
of the stack (early, middle, late) that compare models of different depths at equal fractions
(issue 39 item 4; used by :mod:`tl_spectral_studies.pod_depth` and its tables)."""

from __future__ import annotations

THIRDS = ("early", "middle", "late")


def depth_fraction(layer: int, n_layers: int) -> float:
    """``l / (L − 1)`` (0 for a one-layer model): 0 at the first layer, 1 at the last."""
    if not 0 <= int(layer) < int(n_layers):
        raise ValueError(f"layer {layer} is not one of the {n_layers} layers 0..{n_layers - 1}")
    return 0.0 if n_layers == 1 else int(layer) / (int(n_layers) - 1)


def third_of(layer: int, n_layers: int) -> str:
    """"early" when ``l/(L−1) < 1/3``, "middle" when ``< 2/3``, else "late" (compared in
    integers: ``3l < L − 1``, ``3l < 2(L − 1)``, so no rounding decides a boundary)."""
    depth_fraction(layer, n_layers)  # validates
    span = int(n_layers) - 1
    if span == 0 or 3 * int(layer) < span:  # one layer: depth 0, early
        return "early"
    return "middle" if 3 * int(layer) < 2 * span else "late"


def third_layers(n_layers: int) -> dict[str, list[int]]:
    """``{"early": [...], "middle": [...], "late": [...]}`` layer indices per third."""
    out: dict[str, list[int]] = {t: [] for t in THIRDS}
    for li in range(int(n_layers)):
        out[third_of(li, n_layers)].append(li)
    return out
