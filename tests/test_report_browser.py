"""The report in a real browser: Debian's Chromium driven by selenium (no browser download).

Opens a small default report (char-shakespeare) and a small MiniLM report and checks: no
console errors, no request other than file:/data:, every image loaded, every circuitsvis
view rendered, nothing wider than a 1,280 px viewport, the layer selector switches the
figure, every table-of-contents link resolves. Screenshots of the top of each report are
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


def _open(drv, index):
    drv.get_log("browser"), drv.get_log("performance")  # drop earlier entries
    drv.set_window_size(WIDTH, HEIGHT)
    drv.get(index.resolve().as_uri())
    drv.execute_script("window.scrollTo(0, 0)")
    drv.implicitly_wait(0)
    import time

    for _ in range(50):  # circuitsvis renders asynchronously (React)
        ok = drv.execute_script(
            "return Array.from(document.querySelectorAll('.cvview'))"
            ".every(d => d.children.length > 0)")
        if ok:
            break
        time.sleep(0.2)


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
    _open(drv, index)
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
    # every circuitsvis view rendered content: a canvas or the head selector
    views = drv.execute_script(
        "return Array.from(document.querySelectorAll('.cvview')).map(d => "
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

    sets = drv.find_elements(By.CSS_SELECTOR, "figure.figset")
    assert sets
    fs = sets[0]
    visible = "return Array.from(arguments[0].querySelectorAll('[data-opt]'))" \
              ".filter(d => d.offsetParent !== null).map(d => d.querySelector('img').src)"
    drv.execute_script("arguments[0].scrollIntoView()", fs)
    before = drv.execute_script(visible, fs)
    sel = Select(fs.find_element(By.TAG_NAME, "select"))
    assert len(sel.options) >= 2
    sel.select_by_index(len(sel.options) - 1)
    after = drv.execute_script(visible, fs)
    assert len(before) == 1 and len(after) == 1 and before != after
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
    print("screenshot:", minilm_report.parent / "top-minilm.png")
