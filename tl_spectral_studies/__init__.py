"""The paper reproductions of tl_spectral: one module per study, each with an entry function
that writes results (JSON + safetensors) and figures into an output folder, a ``markdown()``
that renders the doc tables from those results, and a ``main(argv)`` reached through
``tl-spectral study NAME``.

This package imports the library (``tl_spectral``); the library never imports it — the
command line finds the studies through the ``tl_spectral.studies`` entry points.
"""

from __future__ import annotations

#: study name (as typed after ``tl-spectral study``) -> module
STUDIES = {
    "routing": "tl_spectral_studies.routing",
    "surgery": "tl_spectral_studies.surgery",
    "scale-pod": "tl_spectral_studies.scale_pod",
    "contributions": "tl_spectral_studies.contributions",
    "head-allocation": "tl_spectral_studies.head_allocation",
    "real-decoder": "tl_spectral_studies.real_decoder",
    "pod-depth": "tl_spectral_studies.pod_depth",
    "gemma-window": "tl_spectral_studies.gemma_window",
    "evidence": "tl_spectral_studies.evidence",
}

#: Single measurements behind parts of the docs, run as ``python -m tl_spectral_studies.NAME``
#: (each writes one JSON file under docs/results/ that the doc tables read).
MEASUREMENTS = ("rank_truncation", "sink_bos", "faithfulness_scope")
