"""The generated tables of the reproduction docs, from the committed results.

Each doc marks its generated blocks ``<!-- generated: KEY -->`` … ``<!-- /generated -->``;
the study's ``tables(docs/results/<study>)`` returns every block by key.

    python -m tl_spectral_studies.doc_tables            # rewrite the blocks of every doc
    python -m tl_spectral_studies.doc_tables --check    # exit 1 when a block differs

The check also covers the verdict records (``verdicts.json`` of every real-decoder column,
``docs/results/claims/records.json``: what the claims registry gives from the committed
results) and the prose: every ``<!-- check: CLAIM MODEL -->`` … ``<!-- /check -->`` span of
a doc may quote only the numbers, layer lists and label of its record
(:func:`tl_spectral_studies.claims.render.check_prose`).

``tests/test_study_tables.py`` runs the check.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tl_spectral_studies._common import fill_generated, generated_blocks

ROOT = Path(__file__).resolve().parents[1]


def _docs() -> dict[str, tuple[str, Callable[[Path], dict[str, str]], str]]:
    """doc path -> (results folder, tables function, block-key prefix)."""
    from tl_spectral_studies import (
        contributions_tables,
        real_decoder_tables,
        routing_tables,
        scale_pod,
        surgery_tables,
    )

    return {
        "docs/claims.md": ("docs/results/claims", claims_tables, "claims/"),
        "docs/contributions.md": ("docs/results/contributions", contributions_tables.tables,
                                  "contributions/"),
        "docs/scale_pod.md": ("docs/results/scale_pod", scale_pod.tables, "scale_pod/"),
        "docs/surgery.md": ("docs/results/surgery", surgery_tables.tables, "surgery/"),
        "docs/routing_filtering.md": ("docs/results/routing", routing_tables.tables,
                                      "routing/"),
        "docs/real_decoder.md": ("docs/results/real_decoder", real_decoder_tables.tables,
                                 "real_decoder/"),
    }


def claims_tables(results_dir: Path) -> dict[str, str]:
    """The blocks of docs/claims.md: the claims matrix (every claim × every model)."""
    from tl_spectral_studies.claims import catalog, render

    return {"claims/matrix": render.matrix_markdown(catalog.records(results_dir.parents[2]))}


def prose_differences(root: Path = ROOT) -> list[str]:
    """Checked prose spans and records files that disagree with the records."""
    from tl_spectral_studies.claims import catalog, render

    recs = catalog.records(root)
    out = render.result_differences(root, recs)
    for doc in _docs():
        out += render.check_prose((root / doc).read_text(encoding="utf-8"), recs, doc)
    return out


def expected(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """doc path -> {block key: generated text} from the committed results."""
    return {doc: fn(root / res) for doc, (res, fn, _) in _docs().items()}


def differences(root: Path = ROOT) -> list[str]:
    """One line per block that differs, is missing from its doc, or is not generated."""
    out = []
    for doc, want in expected(root).items():
        prefix = _docs()[doc][2]
        have = {k: v for k, v in generated_blocks((root / doc).read_text(encoding="utf-8"))
                .items() if k.startswith(prefix)}
        for k in sorted(set(want) | set(have)):
            if k not in have:
                out.append(f"{doc}: block {k} is generated but not in the doc")
            elif k not in want:
                out.append(f"{doc}: block {k} is in the doc but the results do not produce it")
            elif have[k] != want[k]:
                out.append(f"{doc}: block {k} differs from its committed results")
    return out + prose_differences(root) + _summary_differences(root)


def _summaries(root: Path) -> dict[Path, str]:
    """Whole generated files (not blocks), path -> text from the results beside them: the
    surgery study's summary, which carries the claims' model columns too."""
    from tl_spectral_studies.surgery import markdown

    folder = root / "docs" / "results" / "surgery"
    return {folder / "summary.md": markdown(folder)} if folder.is_dir() else {}


def _summary_differences(root: Path) -> list[str]:
    return [f"{p.relative_to(root)} differs from its committed results"
            for p, text in _summaries(root).items()
            if not p.is_file() or p.read_text(encoding="utf-8") != text]


def write(root: Path = ROOT, docs: Sequence[str] | None = None) -> list[str]:
    """Rewrite every generated block of the docs (default all) in place, and the records
    files; the docs changed."""
    from tl_spectral_studies.claims import catalog, render

    render.write_results(root, catalog.records(root))
    changed = []
    for doc, (res, fn, prefix) in _docs().items():
        if docs is not None and doc not in docs:
            continue
        p = root / doc
        text = p.read_text(encoding="utf-8")
        new = fill_generated(text, fn(root / res), prefix=prefix)
        if new != text:
            p.write_text(new, encoding="utf-8")
            changed.append(doc)
    if docs is None:
        for p, text in _summaries(root).items():
            if not p.is_file() or p.read_text(encoding="utf-8") != text:
                p.write_text(text, encoding="utf-8")
                changed.append(str(p.relative_to(root)))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report differences")
    ap.add_argument("docs", nargs="*", help="docs to rewrite (default all)")
    a = ap.parse_args(argv)
    if a.check:
        diff = differences()
        print("\n".join(diff) or "every generated block matches its committed results")
        return 1 if diff else 0
    print("\n".join(write(docs=a.docs or None)) or "nothing changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
