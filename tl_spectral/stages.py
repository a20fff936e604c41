"""The stage-by-stage timing table at the end of ``tl-spectral analyze``'s log (issue 42).

``analyze`` times each phase of a run — the model load, the one probe pass, every report
section's render (figures, views, tables, the scale POD itself, the weight geometry) and the
page write — and prints them, with each stage's share of the probe pass, after the report is
written, so that a slow stage is visible. The same phases, less the load, are in the
report's ``report.json`` (``timings_s``; ``benchmarks/report_stages.py`` reads them there).
"""

from __future__ import annotations

BASE = "probe pass"


def stage_table(timings: dict[str, float], *, before: dict[str, float] | None = None) -> str:
    """The lines of the table: stage, seconds, share of the probe pass (``—`` without one).

    timings: seconds per phase in run order (``"probe pass"``, ``"section <key>"``,
    ``"write"``); before: stages shown first and left out of the report stages' sum (the
    model load). The last rows: the report stages (every phase but the probe pass, i.e. the
    sections and the write — ``benchmarks/report_stages.py``'s ratio) and the total."""
    before = dict(before or {})
    base = timings.get(BASE)
    rows = list(before.items()) + list(timings.items())
    report = sum(v for k, v in timings.items() if k != BASE)
    rows += [("report stages (all but the probe pass)", report),
             ("total", sum(before.values()) + sum(timings.values()))]
    width = max(len("stage"), *(len(k) for k, _ in rows))

    def share(v: float) -> str:
        return f"{v / base:8.2f}" if base else f"{'—':>8}"

    out = [f"{'stage':<{width}}  {'seconds':>8}  {'/ probe pass':>12}"]
    for i, (k, v) in enumerate(rows):
        if i == len(rows) - 2:
            out.append("-" * (width + 24))
        out.append(f"{k:<{width}}  {v:8.2f}  {share(v):>12}")
    return "\n".join(out)
