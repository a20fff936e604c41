"""The markdown of docs/scale_pod.md, "Across depth, tokenizers and the sink column", from the
JSON files of :mod:`tl_spectral_studies.pod_depth` (placeholder until the runs land)."""

from __future__ import annotations

from pathlib import Path


def markdown(out: str | Path) -> str:
    """Every table of the section from ``out/pod_depth_*.json``."""
    return "\n".join(str(p) for p in sorted(Path(out).glob("pod_depth_*.json")))
