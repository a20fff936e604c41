"""Every declared claim and model, evaluated: the one entry point to the records.

Importing this module declares the claims (:mod:`.seed000`, :mod:`.seed002`, :mod:`.seed003`)
and the model columns (:mod:`.models`) into :mod:`.registry`; nothing imports back, so the
registry stays free of import circles.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tl_spectral_studies.claims import models as _models  # noqa: F401  (declares MODELS)
from tl_spectral_studies.claims import seed000, seed002, seed003  # noqa: F401  (declare CLAIMS)
from tl_spectral_studies.claims.registry import (
    CLAIMS,
    MODELS,
    ROOT,
    Claim,
    Model,
    Record,
    Results,
    evaluate,
)


def all_claims() -> dict[str, Claim]:
    """Every declared claim, by paper part (A, B, C), then as declared."""
    order = list(CLAIMS)
    return dict(sorted(CLAIMS.items(), key=lambda kv: (kv[0][0], order.index(kv[0]))))


def records(root: Path = ROOT, models: Mapping[str, Model] | None = None) -> list[Record]:
    """Every (claim, model) record from the committed results under ``root``."""
    out = []
    for m in (MODELS if models is None else models).values():
        res = Results(root, m)
        out += [evaluate(c, res) for c in all_claims().values()]
    return out
