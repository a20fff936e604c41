"""The demo notebooks run in a real Jupyter kernel and show what they promise.

Each notebook of demos/ is executed top to bottom by nbclient in a fresh kernel on this
interpreter (``demos.run_notebooks.execute``: offline, one thread). A cell error fails the test
with the cell. Then, on the fresh outputs: what the notebook promises is there (an HTML table,
an image, its circuitsvis views), nothing is displayed twice, no warning reaches the notebook,
the circuitsvis JavaScript is carried once, the file stays under 5 MB, and the committed
outputs equal the fresh ones after normalization (else the test names the differing cells:
regenerate with ``python -m demos.run_notebooks --write``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from demos.run_notebooks import DEMOS, differences, execute

#: notebook -> (HTML tables at least, images at least, circuitsvis views exactly)
PROMISES = {
    "quickstart": (3, 2, 2),
    "scale_pod": (4, 6, 0),
    "contributions_sinks": (4, 3, 1),
    "routing_filtering": (3, 4, 0),
    "surgery": (2, 1, 0),
    "smollm2": (3, 2, 5),
}
MAX_BYTES = 5_000_000


def test_every_notebook_is_listed():
    assert sorted(p.stem for p in DEMOS.glob("*.ipynb")) == sorted(PROMISES)


def _html(out) -> str:
    v = out.get("data", {}).get("text/html", "")
    return v if isinstance(v, str) else "".join(v)


def _has_image(out) -> bool:
    return "image/png" in out.get("data", {}) or "data:image/png;base64," in _html(out)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROMISES))
def test_notebook_runs_and_shows_what_it_promises(name):
    path = DEMOS / f"{name}.ipynb"
    fresh = execute(path)  # raises CellExecutionError naming the cell on any error
    code = [c for c in fresh.cells if c.cell_type == "code"]
    outs = [o for c in code for o in c.outputs]
    assert not [o for o in outs if o.output_type == "error"]

    # opens with what it shows and how long it takes, ends with what to try next
    first, last = fresh.cells[0], fresh.cells[-1]
    assert first.cell_type == "markdown" and "**What this shows.**" in first.source
    assert re.search(r"\*\*Time\.\*\*.*\d+ s", first.source, re.S)
    assert last.cell_type == "markdown" and "## What to try next" in last.source

    # no warning (TqdmWarning, deprecations …) reaches the notebook
    stderr = "".join(o.text for o in outs if o.output_type == "stream" and o.name == "stderr")
    assert "Warning" not in stderr and "IProgress" not in stderr, stderr[:2000]

    tables, images, views = PROMISES[name]
    assert sum("<table" in _html(o) for o in outs) >= tables
    assert sum(_has_image(o) for o in outs) >= images
    html = [_html(o) for o in outs]
    ids = [i for h in html for i in re.findall(r'<div id="(tls-cv-[^"]+)" class="tls-cv-view"', h)]
    assert len(ids) == views and len(set(ids)) == len(ids)
    # the circuitsvis JavaScript is carried once: by the first view only
    bundles = sum(h.count("var CircuitsVis=") for h in html)
    assert bundles == (1 if views else 0)

    # nothing displayed twice within a cell (figures, tables; views have their own ids above)
    for i, c in enumerate(code):
        shown = [json.dumps(o.get("data", {}), sort_keys=True) for o in c.outputs
                 if o.output_type in ("display_data", "execute_result")]
        assert len(shown) == len(set(shown)), f"code cell {i + 1} displays an output twice"
        imgs = [o.data["image/png"] for o in c.outputs if "image/png" in o.get("data", {})]
        assert len(imgs) == len(set(imgs)), f"code cell {i + 1} shows a figure twice"

    size = len(nbformat.writes(fresh).encode())
    assert size < MAX_BYTES, f"{name}.ipynb is {size / 1e6:.1f} MB"

    committed = nbformat.read(path, as_version=4)
    diff = differences(committed, fresh)
    assert not diff, (f"{name}.ipynb: committed outputs are stale (regenerate with `python -m "
                      "demos.run_notebooks --write`):\n" + "\n".join(diff))


def test_differences_name_the_cell():
    """The staleness check ignores timings, addresses and view ids, and names a changed cell."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("print(1)"), nbformat.v4.new_code_cell("x = model.run()")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="at 0x7f3a2b1c9d00\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="3.2 it/s\n")]
    nb.cells[1].outputs = [nbformat.v4.new_output(
        "display_data", data={"text/html": '<div id="tls-cv-0a1b2c3d-1" class="tls-cv-view">'
                              '</div><p>0.123456</p>', "image/png": "AAAA"})]
    other = nbformat.reads(nbformat.writes(nb), as_version=4)
    other.cells[0].outputs[0].text = "at 0x7f00000000ff\n"
    other.cells[0].outputs[1].text = "9.9 it/s\n"
    other.cells[1].outputs[0].data["text/html"] = (
        '<div id="tls-cv-99999999-7" class="tls-cv-view"></div><p>0.1234571</p>')
    other.cells[1].outputs[0].data["image/png"] = "BBBB"
    assert differences(nb, other) == []
    other.cells[1].outputs[0].data["text/html"] = (
        '<div id="tls-cv-99999999-7" class="tls-cv-view"></div><p>0.1300</p>')
    diff = differences(nb, other)
    assert len(diff) == 1 and diff[0].startswith("code cell 2 ('x = model.run()')")
    other.cells[1].outputs[0].data["text/html"] = "<p>0.123456</p>"
    assert len(differences(nb, other)) == 1
    # a print chunked differently by the kernel is the same output
    split = nbformat.reads(nbformat.writes(nb), as_version=4)
    split.cells[0].outputs[:1] = [nbformat.v4.new_output("stream", name="stdout", text="at "),
                                  nbformat.v4.new_output("stream", name="stdout",
                                                         text="0x7f3a2b1c9d00\n")]
    assert differences(nb, split) == []
    del other.cells[0].outputs[0]
    assert [d[:11] for d in differences(nb, other)] == ["code cell 1", "code cell 2"]


ROOT = Path(__file__).resolve().parents[1]
#: doc -> the notebook that shows its analysis (linked in the doc's first lines)
DOC_NOTEBOOK = {"api.md": "quickstart", "architecture.md": "quickstart", "probes.md": "quickstart",
                "scale_pod.md": "scale_pod", "contributions.md": "contributions_sinks",
                "routing_filtering.md": "routing_filtering", "surgery.md": "surgery",
                "models.md": "smollm2", "real_decoder.md": "smollm2", "claims.md": "smollm2", "report.md": "quickstart"}


def test_readme_links_every_notebook_with_a_picture():
    readme = (ROOT / "README.md").read_text()
    assert "python -m demos.run_notebooks --write" in readme
    for name in PROMISES:
        row = next((ln for ln in readme.splitlines() if f"(demos/{name}.ipynb)" in ln), None)
        assert row, f"README does not link demos/{name}.ipynb"
        pic = f"docs/figures/notebook_{name}.png"
        assert "![](" + pic + ")" in row and (ROOT / pic).is_file(), pic


def test_docs_link_their_notebook_at_the_top():
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md")) == sorted(DOC_NOTEBOOK)
    for doc, name in DOC_NOTEBOOK.items():
        top = "\n".join((ROOT / "docs" / doc).read_text().splitlines()[:4])
        assert f"(../demos/{name}.ipynb)" in top, f"docs/{doc} does not link {name}.ipynb"


def test_shared_bundle_views_render_in_a_browser(tmp_path):
    """The committed SmolLM2 notebook's outputs, in order on one page (as a notebook front end
    shows them): every view renders, though only the first carries the circuitsvis
    JavaScript, with no console error and no request outside the page."""
    import shutil

    webdriver = pytest.importorskip("selenium.webdriver")
    chrome = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
    driver_path = shutil.which("chromedriver")
    if not chrome or not driver_path:
        pytest.skip("Chromium / chromedriver not found (scripts/setup_env.sh installs them)")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    nb = nbformat.read(DEMOS / "smollm2.ipynb", as_version=4)
    body = "".join(_html(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    page = tmp_path / "outputs.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{body}"
                    "</body></html>", encoding="utf-8")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for f in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run",
              "--disable-dev-shm-usage"):
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        drv.set_page_load_timeout(120)
        drv.get(page.as_uri())
        count = "return document.querySelectorAll('.tls-cv-view').length"
        rendered = ("return Array.from(document.querySelectorAll('.tls-cv-view'))"
                    ".filter(d => d.querySelector('canvas, select, input')).length")
        assert drv.execute_script(count) == PROMISES["smollm2"][2]
        WebDriverWait(drv, 60).until(lambda d: d.execute_script(rendered) == d.execute_script(count))
        errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors[:3]
    finally:
        drv.quit()
