"""``tl-spectral render FOLDER [--out NEW] [--overwrite]``: a report folder written by
``tl-spectral analyze`` rendered again from its saved state (``results/report_state.json``),
without its model (:func:`tl_spectral.viz.sections.rerender`). ``--out`` follows analyze's
rules: a new or empty folder, an earlier report only with ``--overwrite``; without ``--out``
the folder itself is re-rendered in place, which also needs ``--overwrite``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from tl_spectral._leftovers import remove_dead_leftovers
from tl_spectral.outdirs import REPORT_MARKER, check_out_dir, out_leftover_patterns, out_path
from tl_spectral.usage import ArgumentParser, UsageError

RENDER = "tl-spectral render"


def render(argv: Optional[list[str]] = None) -> int:
    """``tl-spectral render``: parse, check the folder and ``--out``, re-render, print the
    new page's path."""
    from tl_spectral.viz.report_state import STATE_FILE

    ap = ArgumentParser(prog=RENDER, description="Render a report folder written by "
                        "tl-spectral analyze again from its saved results, without the model.")
    ap.add_argument("folder", help="a report folder (tl-spectral analyze --out)")
    ap.add_argument("--out", default=None,
                    help="a new folder for the page (default: FOLDER itself, with --overwrite)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier report in --out (or FOLDER) whole")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    if not (folder / REPORT_MARKER).is_file():
        raise UsageError(f"{RENDER}: {folder} is not a tl_spectral report (no {REPORT_MARKER}); "
                         "pass a folder written by tl-spectral analyze --out")
    if not (folder / "results" / STATE_FILE).is_file():
        raise UsageError(f"{RENDER}: {folder} has no saved report state (results/{STATE_FILE}: "
                         "written by an older tl-spectral); run tl-spectral analyze again")
    out = out_path(args.out) if args.out is not None else folder.resolve()
    if out == folder.resolve() and not args.overwrite:
        raise UsageError(f"{RENDER}: re-rendering {folder} in place replaces it whole; pass "
                         "--overwrite, or --out NEW for a new folder")
    check_out_dir(out, args.overwrite)
    remove_dead_leftovers(out.parent, out_leftover_patterns(out))
    from tl_spectral.viz.sections import rerender

    print(rerender(folder, out, progress=not args.no_progress).resolve())
    return 0
