"""The report in a real browser: Debian's Chromium driven by selenium (no browser download).

Opens a small default report (char-shakespeare) and a small MiniLM report and checks: no
console errors, no request other than file:/data:, every image loaded, nothing wider than a
1,280 px viewport, every table-of-contents link resolves; the views are LAZY (at load no
circuitsvis view is compiled, not even the bundle: the page is usable at once), and once
opened every view renders (the contribution view's heat map at full size), the document and
layer selectors (layers 0 → L−1) switch views; every visible text, inside the views too
(head labels, tokens, before and after a head is picked), has a WCAG contrast of at least
4.5:1 (3:1 large) against its effective background, and the headings of the rendered page
(views included) never skip a level downward nor sit inside a lower-level heading's part,
and no word of a table header, caption, heading or summary breaks across lines
(the smallest contrast is printed). The time to the first interactive selector is
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


#: WCAG 2 contrast of every visible text element (its own text nodes) against its effective
#: background: the background colours of the element and its ancestors composited (alpha
#: over alpha) onto the white canvas, the text colour (times the elements' opacity) over
#: that. Text drawn into a <canvas> has no DOM colour and cannot be measured this way; the
#: report draws none (circuitsvis' head thumbnails are canvases without text; head labels,
#: tokens and selectors are elements) and ``_contrast`` asserts no text sits on a
#: background image. Large text (≥ 24 px, or ≥ 18.66 px bold) needs 3:1, the rest 4.5:1.
CONTRAST_JS = r"""
// WCAG 2 contrast of every visible text element against its effective background.
const parse = (c) => {
  const m = c.match(/rgba?\(([^)]+)\)/);
  if (!m) return null;
  const p = m[1].split(/[ ,\/]+/).filter(s => s.length).map(Number);
  return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
};
const over = (fg, bg) => {  // composite fg (with alpha) over an opaque bg
  const a = fg[3];
  return [0, 1, 2].map(i => fg[i] * a + bg[i] * (1 - a)).concat([1]);
};
const lum = (c) => {
  const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
};
const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
const background = (el) => {
  const chain = [];
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) chain.push(e);
  let bg = [255, 255, 255, 1];  // the canvas
  let image = null;
  for (let i = chain.length - 1; i >= 0; i--) {
    const cs = getComputedStyle(chain[i]);
    const c = parse(cs.backgroundColor);
    if (c && c[3] > 0) bg = over(c, bg);
    if (cs.backgroundImage && cs.backgroundImage !== 'none') image = chain[i];
  }
  return [bg, image];
};
const out = [];
const all = document.body.querySelectorAll('*');
for (const el of all) {
  if (['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'CANVAS', 'svg', 'SVG'].includes(el.tagName)) continue;
  const own = Array.from(el.childNodes).filter(n => n.nodeType === 3 && n.textContent.trim().length);
  if (!own.length) continue;
  const rects = el.getClientRects();
  if (!rects.length) continue;
  const r = el.getBoundingClientRect();
  if (r.width < 1 || r.height < 1) continue;
  const cs = getComputedStyle(el);
  if (cs.visibility !== 'visible') continue;
  let op = 1;
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) op *= parseFloat(getComputedStyle(e).opacity);
  if (op === 0) continue;
  const [bg, image] = background(el);
  let fg = parse(cs.color);
  if (!fg) { out.push({tag: el.tagName, text: own[0].textContent.trim().slice(0, 40), ratio: 0, why: 'colour ' + cs.color}); continue; }
  fg = [fg[0], fg[1], fg[2], fg[3] * op];
  const size = parseFloat(cs.fontSize), bold = parseInt(cs.fontWeight) >= 700;
  const large = size >= 24 || (size >= 18.66 && bold);
  out.push({tag: el.tagName, cls: String(el.className).slice(0, 40),
            text: own.map(n => n.textContent.trim()).join(' ').slice(0, 40),
            ratio: ratio(over(fg, bg), bg), need: large ? 3 : 4.5,
            inView: !!el.closest('.cvview'), image: image ? image.tagName : null,
            fg: cs.color, bg: 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')'});
}
return out;
"""

#: heading order over the rendered document, views included
HEADINGS_JS = r"""
// Heading order over the whole rendered document (views included): levels never skip
// downward (h2 → h4), and no heading inside a container (section, details, figure, view)
// has a level at or above that of the section the container sits in (an h2 in an h3's part).
const hs = Array.from(document.querySelectorAll('h1, h2, h3, h4, h5, h6'));
const lvl = (h) => parseInt(h.tagName[1]);
const problems = [];
let prev = 0;
for (const h of hs) {
  if (lvl(h) > prev + 1) problems.push(`skip h${prev} → ${h.tagName} "${h.textContent.trim().slice(0, 40)}"`);
  prev = lvl(h);
}
for (const c of document.querySelectorAll('section, article, aside, details, figure, .cvview')) {
  let outer = null;  // the last heading before the container, outside it
  for (const h of hs) {
    if (c.contains(h)) continue;
    if (h.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING) outer = h; else break;
  }
  if (!outer) continue;
  for (const h of c.querySelectorAll('h1, h2, h3, h4, h5, h6')) {
    if (lvl(h) <= lvl(outer)) problems.push(`${h.tagName} "${h.textContent.trim().slice(0, 40)}" inside a ${c.tagName.toLowerCase()} of the ${outer.tagName} "${outer.textContent.trim().slice(0, 40)}"`);
  }
}
return [hs.length, problems];
"""


#: words broken across two lines in headers, captions, headings, summaries
MIDWORD_JS = r"""
// Words broken across lines ("lay/er") in table headers, captions, headings and summaries:
// a word whose Range has client rects on two lines.
const out = [];
const sel = 'th, caption, figcaption, h1, h2, h3, h4, h5, summary, .selector label';
for (const el of document.querySelectorAll(sel)) {
  if (!el.getClientRects().length) continue;
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const re = /\S+/g;
    let m;
    while ((m = re.exec(n.textContent)) !== null) {
      if (m[0].length < 4) continue;
      const r = document.createRange();
      r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
      const tops = new Set(Array.from(r.getClientRects()).filter(x => x.width > 0).map(x => Math.round(x.top)));
      if (tops.size > 1 && !/[\/\-–—_.,]/.test(m[0])) out.push(el.tagName + ': ' + m[0]);
    }
  }
}
return out;
"""

def _contrast(drv) -> float:
    """Open every <details> (the lazy views already rendered), measure every visible text's
    contrast, assert it; returns the smallest ratio."""
    import time

    drv.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    time.sleep(0.3)  # the views' ink fix runs on the next animation frame
    res = drv.execute_script(CONTRAST_JS)
    assert len(res) > 100 and sum(r["inView"] for r in res) > 10, len(res)
    bad = [r for r in res if r["ratio"] < r["need"] or r["image"]]
    assert not bad, bad[:10]
    return min(r["ratio"] for r in res)


def _headings(drv) -> int:
    n, problems = drv.execute_script(HEADINGS_JS)
    assert n >= 8 and not problems, problems
    return n


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
    import time

    time.sleep(0.5)  # tlKeyboard runs just after a view renders
    # contrast of every text (views included, before and after a head is picked, which
    # recolours the tokens) and the heading order (views included)
    low = _contrast(drv)
    heads = drv.find_elements(By.CSS_SELECTOR, ".cvview [tabindex='0'][role=button]")
    if heads:
        drv.execute_script("arguments[0].scrollIntoView(); arguments[0].click()", heads[-1])
        low = min(low, _contrast(drv))
    print(f"{index.parent.name}: smallest text contrast {low:.2f}:1, "
          f"{_headings(drv)} headings in order")
    broken = drv.execute_script(MIDWORD_JS)
    assert not broken, broken
    # accessibility: head thumbnails keyboard-focusable, every select labelled, tables
    # with a caption and column scopes, a way back to the contents
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
    # the checks catch what they should: white on light green (1.7:1, the head
    # label) and an h2 inside the h3 "Interactive view"'s details
    drv = browser
    drv.execute_script(
        "const p = document.createElement('p'); p.id = 'probe'; p.textContent = 'H2';"
        "p.style.cssText = 'color:#fff;background:rgb(157,217,38)';"
        "document.querySelector('details.lazyview').appendChild(p);"
        "const h = document.createElement('h2'); h.id = 'probe2'; h.textContent = 'x';"
        "document.querySelector('details.lazyview').appendChild(h);")
    res = [r for r in drv.execute_script(CONTRAST_JS) if r["text"] == "H2" and not r["inView"]]
    assert res and 1.6 < res[0]["ratio"] < 1.8, res
    problems = drv.execute_script(HEADINGS_JS)[1]
    assert any(p.startswith('H2 "x" inside a details') for p in problems), problems
    drv.execute_script(
        "const t = document.querySelector('table th');"
        "t.insertAdjacentHTML('beforeend', '<span style=\"display:inline-block;width:2.5em;"
        "overflow-wrap:anywhere\">layerwise</span>');")
    assert "SPAN: layerwise" in drv.execute_script(MIDWORD_JS.replace("th, caption", "th span, caption"))


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
                   "sanity,attention_stats,surgery")


def _findings(drv, index) -> str:
    _open(drv, index)
    return drv.execute_script("return document.getElementById('findings').innerText")


def test_untrained_model_is_called_untrained(browser, random_hf_report, default_report):
    text = _findings(browser, random_hf_report / "index.html")
    first = text.split("\n")[1] if "\n" in text else text
    assert "looks untrained" in first, text  # the first finding
    assert "perplexity" in text and "unigram model" in text and "random weights" in text
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
