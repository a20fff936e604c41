"""The stage-by-stage timing table at the end of ``tl-spectral analyze``'s log (issue 42).

``analyze`` times each phase of a run — the model load, the one probe pass, every other
model pass (perplexity check, linearization curve, weight geometry, …), every section's
derive step and render (figures, views, tables, the scale POD itself), the page write and the
saved state — and prints them, with each stage's share of the probe pass, after the report is
written (on stderr, unless ``--no-progress``), so that a slow stage is visible. The same phases, less the load, are in the
report's ``report.json`` (``timings_s``; ``benchmarks/report_stages.py`` reads them there).
"""

from __future__ import annotations

BASE = "probe pass"
#: the prefix of the model passes' rows (``pass sanity_perplexity``, …): the rest of the
#: report stages is the rendering (``derive …``, ``section …``, ``write``, ``save state``)
PASS = "pass "


def stage_sums(timings: dict[str, float]) -> dict[str, float]:
    """The report stages' sums: ``stages`` (every phase but the probe pass), ``passes`` (the
    model passes, rows ``pass <key>``) and ``render`` (the rest: derive steps, sections,
    page write, saved state)."""
    stages = {k: v for k, v in timings.items() if k != BASE}
    passes = sum(v for k, v in stages.items() if k.startswith(PASS))
    return {"stages": sum(stages.values()), "passes": passes,
            "render": sum(stages.values()) - passes}


def stage_table(timings: dict[str, float], *, before: dict[str, float] | None = None) -> str:
    """The lines of the table: stage, seconds, share of the probe pass (``—`` without one).

    timings: seconds per phase in run order (``"probe pass"``, ``"pass <key>"``,
    ``"derive <key>"``, ``"section <key>"``, ``"write"``, ``"save state"``); before: stages
    shown first and left out of the report stages' sum (the model load). The last rows: the
    model passes, the rendering, the report stages (every phase but the probe pass: the two
    together — ``benchmarks/report_stages.py``'s ratio; :func:`stage_sums`) and the total."""
    before = dict(before or {})
    base = timings.get(BASE)
    sums = stage_sums(timings)
    rows = list(before.items()) + list(timings.items())
    tail = [("model passes (pass …)", sums["passes"]),
            ("rendering (derive, sections, write, state)", sums["render"]),
            ("report stages (all but the probe pass)", sums["stages"]),
            ("total", sum(before.values()) + sum(timings.values()))]
    rows += tail
    width = max(len("stage"), *(len(k) for k, _ in rows))

    def share(v: float) -> str:
        return f"{v / base:8.2f}" if base else f"{'—':>8}"

    out = [f"{'stage':<{width}}  {'seconds':>8}  {'/ probe pass':>12}"]
    for i, (k, v) in enumerate(rows):
        if i == len(rows) - len(tail):
            out.append("-" * (width + 24))
        out.append(f"{k:<{width}}  {v:8.2f}  {share(v):>12}")
    return "\n".join(out)
