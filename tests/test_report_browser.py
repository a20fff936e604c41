"""The report in a real browser: Debian's Chromium driven by selenium (no browser download).

Opens a small default report (char-shakespeare) and a small MiniLM report and checks: no
console errors, no request other than file:/data:, every image loaded, nothing wider than a
1,280 px viewport, every table-of-contents link resolves; the views are LAZY (at load no
circuitsvis view is compiled, not even the bundle: the page is usable at once), and once
opened every view renders (the contribution view's heat map at full size), the document and
layer selectors (layers 0 → L−1) switch views. The time to the first interactive selector is
printed (not asserted: no test depends on timing). Screenshots of the top of each report are
saved in the test's temporary folder (CI artifacts). scripts/setup_env.sh installs
``chromium`` and ``chromium-driver`` with apt when missing; without them these tests skip.
"""

from __future__ import annotations

import json
import shutil

import pytest

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")
WIDTH, HEIGHT = 1280, 900


def _browser_paths():
    chrome = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
    driver = shutil.which("chromedriver")
    return chrome, driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    chrome, driver_path = _browser_paths()
    if not chrome or not driver_path:
        pytest.skip("Chromium / chromedriver not found: scripts/setup_env.sh installs Debian's "
                    "'chromium' and 'chromium-driver' with apt-get (apt was unavailable or it "
                    "was not run)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for f in CHROMIUM_FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    opts.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    drv.set_page_load_timeout(120)
    yield drv
    drv.quit()


def _report(tmp_path_factory, name, *extra):
    from tl_spectral.cli import main

    out = tmp_path_factory.mktemp("reports") / name
    assert main(["analyze", *extra, "--n-docs", "8", "--length", "64", "--out", str(out),
                 "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def default_report(tmp_path_factory):
    return _report(tmp_path_factory, "default")


@pytest.fixture(scope="module")
def minilm_report(tmp_path_factory):
    return _report(tmp_path_factory, "minilm", "--model", "minilm")


def _open(drv, index) -> float:
    """Load the page; returns the seconds until its first selector is interactive (the
    load event has fired, so its change handlers are bound)."""
    import time

    drv.get_log("browser"), drv.get_log("performance")  # drop earlier entries
    drv.set_window_size(WIDTH, HEIGHT)
    t0 = time.perf_counter()
    drv.get(index.resolve().as_uri())  # returns after the load event
    drv.execute_script("return document.querySelector('select') !== null")
    ready = time.perf_counter() - t0
    drv.execute_script("window.scrollTo(0, 0)")
    drv.implicitly_wait(0)
    return ready


def _open_views(drv):
    """Open every lazy view (click its summary) and wait for circuitsvis to render."""
    import time

    shown = ("return Array.from(arguments[0].querySelectorAll('.cvview'))"
             ".filter(d => d.style.display !== 'none')"
             ".every(d => d.querySelectorAll('canvas').length > 0)")
    for det in drv.find_elements("css selector", "details.lazyview"):
        drv.execute_script("arguments[0].scrollIntoView()", det)
        t0 = time.perf_counter()
        det.find_element("css selector", "summary").click()
        for _ in range(600):  # circuitsvis renders asynchronously (React)
            if drv.execute_script(shown, det):
                break
            time.sleep(0.05)
        print(f"  view rendered {time.perf_counter() - t0:.2f} s after opening")
    # TensorFlow.js (inside circuitsvis) was kept off WebGL: no WebGL context was created
    assert drv.execute_script("return HTMLCanvasElement.prototype.tlNoWebGL === true")


def _requests(drv) -> tuple[list[str], list[str]]:
    """(requests made for the report's page, http(s)/ws requests of any target)."""
    page, net = [], []
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            url = msg["params"]["request"]["url"]
            if msg["params"].get("documentURL", "").startswith("file:"):
                page.append(url)
            if url.startswith(("http:", "https:", "ws:", "wss:")):
                net.append(url)
    return page, net


def _check(drv, index, shot):
    ready = _open(drv, index)
    print(f"{index.parent.name}: first interactive selector after {ready:.2f} s")
    # lazy views: nothing compiled at load, not even the bundle
    n_views, rendered, cv = drv.execute_script(
        "return [document.querySelectorAll('.cvview').length, window.tlViews.rendered, "
        "typeof window.CircuitsVis]")
    assert n_views >= 2 and rendered == 0 and cv == "undefined", (n_views, rendered, cv)
    drv.save_screenshot(str(shot))
    errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    page, net = _requests(drv)
    bad = [u for u in page if not u.startswith(("file:", "data:"))]
    assert page and not bad and not net, (bad, net)
    # every image loaded (hidden selector options included)
    n_img, broken = drv.execute_script(
        "const im = Array.from(document.images);"
        "return [im.length, im.filter(i => !(i.complete && i.naturalWidth > 0)).length]")
    assert n_img > 0 and broken == 0
    # opened, every shown circuitsvis view renders content: a canvas or the head selector
    _open_views(drv)
    views = drv.execute_script(
        "return Array.from(document.querySelectorAll('.cvview'))"
        ".filter(d => d.style.display !== 'none').map(d => "
        "[d.id, d.querySelectorAll('canvas').length, d.querySelectorAll('button, select, "
        "[class*=selector], [id*=selector]').length, d.innerText.length])")
    assert len(views) >= 2, views
    for vid, canvases, selectors, _ in views:
        assert canvases or selectors, f"view {vid} rendered nothing"
    # nothing wider than the viewport
    wide = drv.execute_script(
        "const w = document.documentElement.clientWidth; const out = [];"
        "for (const el of document.body.querySelectorAll('*')) {"
        "  const r = el.getBoundingClientRect();"
        "  if (r.width > w + 1 || r.right > w + 1) out.push(el.tagName + '.' + el.className"
        "     + ' ' + Math.round(r.width) + 'x' + Math.round(r.right)); }"
        "return [w, document.documentElement.scrollWidth, out.slice(0, 10)]")
    assert wide[1] <= WIDTH and not wide[2], wide
    # every table-of-contents and findings link resolves
    missing = drv.execute_script(
        "return Array.from(document.querySelectorAll('nav.toc a, .findings a'))"
        ".map(a => a.getAttribute('href')).filter(h => !h.startsWith('#') || "
        "!document.getElementById(h.slice(1)))")
    n_links = drv.execute_script("return document.querySelectorAll('nav.toc a').length")
    assert n_links >= 8 and not missing, missing
    # the layer selector switches the shown figure
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    # the contribution view draws its heat map at full size (not a 30 × 30 canvas)
    big = drv.execute_script(
        "return Array.from(document.querySelectorAll('.cvview[id*=contributions]'))"
        ".filter(d => d.style.display !== 'none').map(d => Math.max(...Array.from("
        "d.querySelectorAll('canvas')).map(c => c.width)))")
    assert big and min(big) >= 500, big
    # accessibility: head thumbnails keyboard-focusable, every select labelled, tables
    # with a caption and column scopes, a way back to the contents
    import time

    time.sleep(0.5)  # tlKeyboard runs just after a view renders
    n_focus = drv.execute_script(
        "return document.querySelectorAll('.cvview [tabindex=\"0\"][role=button]').length")
    assert n_focus >= 2, n_focus
    unlabelled = drv.execute_script(
        "return Array.from(document.querySelectorAll('select')).filter(s => "
        "!s.closest('.cvview') && !s.closest('label') && !s.getAttribute('aria-label')).length")
    assert unlabelled == 0
    assert drv.execute_script("return document.querySelectorAll('table caption').length") >= 3
    assert drv.execute_script("return document.querySelectorAll('a[href=\"#contents\"]').length") >= 4
    # the document and layer selectors: layers in order 0 → L−1; picking another layer
    # renders that view (and only then)
    sets = drv.find_elements(By.CSS_SELECTOR, "figure.viewset")
    assert sets
    fs = sets[0]
    shown = "return Array.from(arguments[0].querySelectorAll('.cvview'))" \
            ".filter(d => d.style.display !== 'none').map(d => d.id)"
    drv.execute_script("arguments[0].scrollIntoView()", fs)
    before = drv.execute_script(shown, fs)
    n_before = drv.execute_script("return window.tlViews.rendered")
    layer = Select(fs.find_element(By.CSS_SELECTOR, "select[data-dim='1']"))
    values = [o.get_attribute("value") for o in layer.options]
    assert values == [str(i) for i in range(len(values))] and len(values) >= 2
    doc = Select(fs.find_element(By.CSS_SELECTOR, "select[data-dim='0']"))
    assert len(doc.options) >= 2
    pick = "1" if layer.first_selected_option.get_attribute("value") != "1" else "0"
    layer.select_by_value(pick)
    after = drv.execute_script(shown, fs)
    assert len(before) == 1 and len(after) == 1 and before != after
    assert drv.execute_script("return window.tlViews.rendered") == n_before + 1
    errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    return drv.execute_script("return document.title")


def test_default_report_in_chromium(browser, default_report):
    title = _check(browser, default_report / "index.html",
                   default_report.parent / "top-default.png")
    assert "char-shakespeare" in title
    print("screenshot:", default_report.parent / "top-default.png")


def test_minilm_report_in_chromium(browser, minilm_report):
    title = _check(browser, minilm_report / "index.html", minilm_report.parent / "top-minilm.png")
    assert title.endswith("minilm") and "/" not in title
    html = (minilm_report / "index.html").read_text()
    assert "[CLS]" in html and "Does not apply" in html
    # word pieces decoded the tokenizer's way: joined into words, spaces between words
    import re

    toks = json.loads(re.search(r'type="application/json" id="cvd-1">(.*?)</script>',
                                html).group(1))["props"]["tokens"]
    assert not any(t.startswith("##") for t in toks) and sum(t.startswith(" ") for t in toks) > 5
    # encoder head scores: attention on [SEP], [CLS] and punctuation
    assert "attention on SEP" in html or "mass_on_SEP" in html
    print("screenshot:", minilm_report.parent / "top-minilm.png")


@pytest.fixture(scope="module")
def random_hf_report(tmp_path_factory):
    """A random-weight GPT-2 (Hugging Face initialisation, std 0.02) that a user brings."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _tiny_hf import save_tiny

    folder = save_tiny("gpt2", tmp_path_factory.mktemp("hf") / "random-gpt2", init_std=0.02,
                       n_layers=2, n_ctx=64)
    return _report(tmp_path_factory, "random-gpt2", "--model", str(folder), "--sections",
                   "attention_stats,surgery")


def _findings(drv, index) -> str:
    _open(drv, index)
    return drv.execute_script("return document.getElementById('findings').innerText")


def test_untrained_model_is_called_untrained(browser, random_hf_report, default_report):
    text = _findings(browser, random_hf_report / "index.html")
    first = text.split("\n")[1] if "\n" in text else text
    assert "looks untrained" in first, text  # the first finding
    assert "perplexity" in text and "vocabulary size" in text
    assert "looks untrained" not in _findings(browser, default_report / "index.html")


@pytest.fixture(scope="module")
def smollm2_report(tmp_path_factory):
    """A small cut of the real decoder's report (issue 25): SmolLM2-135M, 30 layers, the
    rotary routing section, windows after its start token."""
    return _report(tmp_path_factory, "smollm2", "--model", "smollm2-135m")


def test_smollm2_report_in_chromium(browser, smollm2_report):
    """The 30-layer report of the real decoder opens with no console error, its selectors
    work (the shared checks), says what the model is (quantized) and shows the rotary
    routing section instead of 'could not be computed'."""
    title = _check(browser, smollm2_report / "index.html",
                   smollm2_report.parent / "top-smollm2.png")
    assert title.endswith("smollm2-135m")
    html = (smollm2_report / "index.html").read_text()
    assert "Q4_1" in html and "This model has rotary positions" in html
    assert "could not be computed" not in html
    layers = browser.execute_script(
        "const s = document.querySelector('figure.viewset select[data-dim=\"1\"]');"
        "return s ? s.options.length : 0")
    assert layers == 30
