"""Issue 36 item 16: demos/routing_filtering.ipynb's "What to try next" suggested
``tls.ablation_table(gpt, windows)`` with ``windows`` defined nowhere. The suggestion's code
spans run, in order, in the namespace of the notebook's cells that define what they use."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

NB = Path(__file__).resolve().parents[1] / "demos" / "routing_filtering.ipynb"


def _cells():
    nb = json.loads(NB.read_text(encoding="utf-8"))
    return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


def _assigned(src: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _used(src: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}


def test_the_ablation_suggestion_runs_in_the_notebook_namespace():
    cells = _cells()
    nxt = next(src for kind, src in cells if kind == "markdown" and "What to try next" in src)
    bullet = next(b for b in nxt.split("\n* ") if "ablation_table" in b)
    spans = re.findall(r"`([^`]+)`", bullet)
    code = [s for s in spans if "=" in s or "(" in s]
    assert any(s.startswith("tls.ablation_table(") for s in code), code
    used = set()
    for s in code:
        used |= {n.id for n in ast.walk(ast.parse(s)) if isinstance(n, ast.Name)}
    defined_here = set().union(*(_assigned(s) for s in code))
    needed = used - defined_here - {"tls"}
    code_cells = [src for kind, src in cells if kind == "code"]
    chosen: set[int] = set()
    while True:  # the cells that define what the suggestion uses, and what those use
        more = {i for i, src in enumerate(code_cells) if _assigned(src) & needed} - chosen
        if not more:
            break
        chosen |= more
        for i in more:
            needed |= _used(code_cells[i]) - {"tls", "torch"}
    ns: dict = {}
    exec("import torch\nimport tl_spectral as tls", ns)  # noqa: S102 - the notebook's imports
    for i in sorted(chosen):
        exec(code_cells[i], ns)  # noqa: S102 - repository code
    needed = used - defined_here - {"tls"}
    assert needed <= set(ns), f"the suggestion uses {sorted(needed - set(ns))}, never defined"
    for s in code[:-1]:
        exec(s, ns)  # noqa: S102
    result = eval(code[-1], ns)  # noqa: S307
    assert result.n_windows == 16 and result.rows and result.baseline_ppl > 1
