"""Helpers every geometry module shares: per-layer weight lists, finiteness checks, layer
names, padded stacks and the per-head tables (rows, CSV) of the geometry results."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

import torch

__all__ = ["as_layers", "check_finite", "pad_stack", "per_head_table", "resolve_layer_names",
           "table_rows", "write_csv"]


def as_layers(w: Any, name: str, ndim_layer: int, what: str) -> list[torch.Tensor]:
    """Turn ``[layer, *per_layer]`` tensors or lists of per-layer tensors into a list."""
    if isinstance(w, torch.Tensor) or hasattr(w, "__array__"):
        t = torch.as_tensor(w)
        if t.ndim != ndim_layer + 1:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; pass a [layer, {what}] tensor "
                f"({ndim_layer + 1}-D) or a list with one [{what}] tensor per layer"
                + (f" (for a single layer use {name}[None])" if t.ndim == ndim_layer else "")
            )
        return list(t.unbind(0))
    if isinstance(w, (list, tuple)):
        if len(w) == 0:
            raise ValueError(f"{name} is an empty list; pass one [{what}] tensor per layer")
        out = []
        for i, wl in enumerate(w):
            t = torch.as_tensor(wl)
            if t.ndim != ndim_layer:
                raise ValueError(
                    f"{name}[{i}] has shape {tuple(t.shape)}; each list entry must be a "
                    f"[{what}] tensor ({ndim_layer}-D)"
                )
            out.append(t)
        return out
    raise TypeError(
        f"{name} is a {type(w).__name__}; pass a torch.Tensor [layer, {what}] or a list of "
        f"per-layer [{what}] tensors"
    )


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise a ValueError naming ``name`` if ``t`` holds NaN or Inf."""
    # fast path: a finite sum proves every entry finite; otherwise check entry-wise
    if t.numel() and torch.isfinite(t.sum()):
        return
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or Inf; pass finite weights")


def resolve_layer_names(layer_names: Sequence[str] | None, n_layers: int) -> list[str]:
    """``layer_names`` checked against ``n_layers`` (default ``L0, L1, …``)."""
    if layer_names is None:
        return [f"L{i}" for i in range(n_layers)]
    names = [str(n) for n in layer_names]
    if len(names) != n_layers:
        raise ValueError(
            f"layer_names has {len(names)} entries but the weights have {n_layers} layers; "
            "pass one name per layer or None"
        )
    return names


def pad_stack(parts: list[torch.Tensor], width: int, value: Any = 0) -> torch.Tensor:
    """Stack ``[head, k_l]`` tensors into ``[layer, head, width]`` padding the last dim."""
    out = []
    for p in parts:
        pad = width - p.shape[-1]
        if pad:
            p = torch.cat([p, p.new_full((*p.shape[:-1], pad), value)], dim=-1)
        out.append(p)
    return torch.stack(out)


def per_head_table(res: Any, columns: dict[str, torch.Tensor]) -> dict[str, list]:
    """Column table, one row per (layer, head), of ``[layer, head]`` tensors ``columns``
    (with ``layer``, ``layer_name``, ``head``, ``d_head`` of the result ``res``)."""
    n_layers, n_heads = next(iter(columns.values())).shape[:2]
    table: dict[str, list] = {"layer": [], "layer_name": [], "head": [], "d_head": []}
    for name in columns:
        table[name] = []
    for layer in range(n_layers):
        for head in range(n_heads):
            table["layer"].append(layer)
            table["layer_name"].append(res.layer_names[layer])
            table["head"].append(head)
            table["d_head"].append(int(res.d_head[layer]))
            for name, t in columns.items():
                v = t[layer, head]
                table[name].append(bool(v) if v.dtype == torch.bool else float(v))
    return table


def table_rows(table: dict[str, list]) -> list[dict[str, Any]]:
    """A column table as a list of row dicts."""
    keys = list(table)
    n = len(table[keys[0]])
    return [{k: table[k][i] for k in keys} for i in range(n)]


def write_csv(table: dict[str, list], path: str | Path) -> Path:
    """Write a column table as CSV (parent folders made); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table))
        writer.writeheader()
        writer.writerows(table_rows(table))
    return path
