"""The built site in headless Chromium (Debian's `chromium` + `chromium-driver`, driven by
selenium): answers open on click, the search and filters narrow the index, the language
switch changes every string and follows the reader to the next page. Screenshots go to
test-artifacts/ (gitignored).

If the browser cannot start the test FAILS (install with `make browser-deps`); set
POLICYLAB_SKIP_BROWSER=1 to skip it deliberately (`make test` does so, with one line
saying how to enable it, for a user who is not root and has no Chromium). Under CI
(CI=true) it never skips. POLICYLAB_CHROMIUM / POLICYLAB_CHROMEDRIVER override the binaries
(default /usr/bin/chromium, /usr/bin/chromedriver)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1200,900"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# the sites it opens are session fixtures that test_site.py builds too: one worker under xdist
pytestmark = pytest.mark.xdist_group("learn_site")


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("POLICYLAB_SKIP_BROWSER") == "1":
        if os.environ.get("CI") == "true":
            pytest.fail("POLICYLAB_SKIP_BROWSER=1 under CI: the headless-browser test must run in CI")
        pytest.skip("POLICYLAB_SKIP_BROWSER=1: headless-browser tests skipped on request")
    hint = "install the browser and driver with `make browser-deps` (or set POLICYLAB_SKIP_BROWSER=1 to skip)"
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        pytest.fail(f"selenium is not installed ({exc}); {hint}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("POLICYLAB_CHROMIUM", "/usr/bin/chromium")
    for flag in FLAGS + [f"--user-data-dir={tempfile.mkdtemp(prefix='policylab-chromium-')}"]:
        opts.add_argument(flag)
    driver_path = os.environ.get("POLICYLAB_CHROMEDRIVER", "/usr/bin/chromedriver")
    try:
        driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))
    except Exception as exc:  # noqa: BLE001 - any start failure must be loud
        pytest.fail(f"headless Chromium did not start ({type(exc).__name__}: {exc}); {hint}")
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def built(fixture_site):
    """The fixture bank's site, the one test_site.py checks (built once per session)."""
    return fixture_site[1]


def _shot(driver, name):
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"learn-{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 5000, path  # a real rendering, not an empty frame


def _visible_ids(driver):
    from selenium.webdriver.common.by import By

    return [li.get_attribute("data-id") for li in driver.find_elements(By.CSS_SELECTOR, "#results li")]


def test_answer_opens_on_click(browser, built):
    from selenium.webdriver.common.by import By

    browser.get((built / "method-grpo.html").as_uri())
    details = browser.find_element(By.ID, "grpo-mechanism")
    answer = details.find_element(By.CSS_SELECTOR, ".answer p.en")
    assert details.get_attribute("open") is None and not answer.is_displayed()
    details.find_element(By.TAG_NAME, "summary").click()
    assert details.get_attribute("open") is not None and answer.is_displayed()
    assert answer.text.startswith("It computes advantages such as [1.7320, -0.5773, -0.5773, -0.5773]")
    cell = details.find_element(By.CSS_SELECTOR, 'td.v[data-key="best"]')
    assert cell.text == "1.7320"
    _shot(browser, "method-answer-open")
    # a link with a hash opens that question by itself
    browser.get((built / "method-grpo.html").as_uri() + "#grpo-implementation")
    assert browser.find_element(By.ID, "grpo-implementation").get_attribute("open") is not None
    assert browser.find_element(By.ID, "grpo-basics").get_attribute("open") is None


def test_search_and_filters_narrow_the_index(browser, built):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get((built / "index.html").as_uri())
    every = _visible_ids(browser)
    assert len(every) == 9 and browser.find_element(By.ID, "count").text == "9 questions"
    box = browser.find_element(By.ID, "q")
    box.send_keys("x-grpo")
    assert _visible_ids(browser) == ["x-grpo-rloo"]
    box.clear()
    box.send_keys("1.0000, -0.5000")  # a live number: only the cross-method example shows it
    assert _visible_ids(browser) == ["x-grpo-rloo"]
    box.clear()
    browser.execute_script("arguments[0].dispatchEvent(new Event('input'))", box)
    Select(browser.find_element(By.ID, "f-category")).select_by_value("implementation")
    assert _visible_ids(browser) == ["grpo-implementation", "rloo-implementation"]
    Select(browser.find_element(By.ID, "f-method")).select_by_value("rloo")
    assert _visible_ids(browser) == ["rloo-implementation"]
    Select(browser.find_element(By.ID, "f-category")).select_by_value("")
    assert _visible_ids(browser) == ["grpo-comparison"] \
        + [f"rloo-{c}" for c in ("basics", "mechanism", "comparison", "implementation")] \
        + ["x-grpo-rloo"]  # grpo's comparison question compares with rloo: it is listed too
    Select(browser.find_element(By.ID, "f-method")).select_by_value("")
    Select(browser.find_element(By.ID, "f-family")).select_by_value("advantage")  # rloo's family
    assert _visible_ids(browser) == [f"rloo-{c}" for c in ("basics", "mechanism", "comparison", "implementation")] \
        + ["x-grpo-rloo"]
    _shot(browser, "index-filtered")


def test_language_switch(browser, built):
    from selenium.webdriver.common.by import By

    browser.get((built / "index.html").as_uri())
    browser.find_element(By.CSS_SELECTOR, 'button[data-set-lang="zh"]').click()
    assert browser.find_element(By.TAG_NAME, "html").get_attribute("data-lang") == "zh"
    assert browser.find_element(By.ID, "count").text == "共 9 个问题"
    assert browser.find_element(By.ID, "q").get_attribute("placeholder").startswith("搜索")
    assert browser.find_element(By.CSS_SELECTOR, "header nav a .zh").text == "问题"
    assert not browser.find_element(By.CSS_SELECTOR, "header nav a .en").is_displayed()
    first = browser.find_element(By.CSS_SELECTOR, "#results li a")
    assert first.text == "grpo 做什么（basics）？"
    assert browser.title == "policylab 方法浏览器"
    _shot(browser, "index-zh")
    first.click()  # the language follows the reader to the method page
    assert "method-grpo.html" in browser.current_url
    assert browser.find_element(By.TAG_NAME, "html").get_attribute("data-lang") == "zh"
    d = browser.find_element(By.ID, "grpo-basics")
    assert d.get_attribute("open") is not None
    assert d.find_element(By.CSS_SELECTOR, ".answer p.zh").text.startswith("它计算优势，例如 [1.7320")
    assert not d.find_element(By.CSS_SELECTOR, ".answer p.en").is_displayed()
    _shot(browser, "method-zh")
    browser.find_element(By.CSS_SELECTOR, 'button[data-set-lang="en"]').click()
    assert d.find_element(By.CSS_SELECTOR, ".answer p.en").is_displayed()


_FIGURES = """
var out = {};
document.querySelectorAll('figure.plot img').forEach(function (img) {
  var a = img.closest('a'), r = img.getBoundingClientRect();
  out[a.getAttribute('lang')] = {complete: img.complete, w: img.naturalWidth, h: img.naturalHeight,
                                 shown: r.width > 0 && r.height > 0, alt: img.alt};
});
var cap = {};
document.querySelectorAll('figure.plot figcaption > p.en, figure.plot figcaption > p.zh').forEach(function (p) {
  cap[p.getAttribute('lang')] = p.getBoundingClientRect().height > 0 ? p.textContent : null;
});
return {img: out, cap: cap};
"""


def _loaded(driver, lang):
    from selenium.webdriver.support.ui import WebDriverWait

    def ready(d):
        s = d.execute_script(_FIGURES)
        i = s["img"].get(lang)
        return s if i and i["complete"] and i["w"] > 0 else False

    return WebDriverWait(driver, 10).until(ready, f"the {lang} figure did not load")


def _check_figure(driver, lang):
    s = _loaded(driver, lang)
    other = "zh" if lang == "en" else "en"
    shown, hidden = s["img"][lang], s["img"][other]
    assert shown["shown"] and shown["w"] > 0 and shown["h"] > 0 and shown["alt"].strip()
    assert not hidden["shown"]  # only the current language's figure is visible
    assert s["cap"][lang] and s["cap"][other] is None
    return s


def test_every_method_and_overlay_page_shows_a_loaded_figure_in_both_languages(browser, real_site):
    """Each page of the package's site: the figure of the current language is visible and
    loaded (natural size > 0) with its alt text and caption; after the switch, the other
    language's figure is."""
    from selenium.webdriver.common.by import By

    pages = sorted(real_site.glob("method-*.html")) + sorted(real_site.glob("overlay-*.html"))
    assert len(pages) >= 30 + 5
    for page in pages:
        browser.get(page.as_uri() + "?lang=en")
        _check_figure(browser, "en")
        browser.find_element(By.CSS_SELECTOR, 'button[data-set-lang="zh"]').click()
        s = _check_figure(browser, "zh")
        assert any("\u4e00" <= ch <= "\u9fff" for ch in s["img"]["zh"]["alt"]), page.name
    # opened directly in Chinese; on a wide window the formulas take the whole column and the
    # figure follows them at its natural size
    browser.get((real_site / "method-kpop.html").as_uri() + "?lang=zh")
    _check_figure(browser, "zh")
    formula = browser.find_element(By.CSS_SELECTOR, ".formula-col").rect
    fig = browser.find_element(By.CSS_SELECTOR, ".figure-col").rect
    assert fig["y"] >= formula["y"] + formula["height"] and abs(fig["width"] - formula["width"]) < 2
    browser.execute_script("document.getElementById('figure').scrollIntoView()")
    _shot(browser, "method-figure-zh")
    browser.get((real_site / "index.html").as_uri() + "?lang=en")
    # the index links every overlay page, and only those
    linked = {a.get_attribute("data-href") for a in browser.find_elements(By.CSS_SELECTOR, "#overlays + ul a")}
    assert linked == {p.name for p in pages if p.name.startswith("overlay-")}
    browser.find_element(By.CSS_SELECTOR, '#overlays + ul a[data-href="overlay-engine-corrections.html"]').click()
    assert "overlay-engine-corrections.html" in browser.current_url
    _check_figure(browser, "en")
    _shot(browser, "overlay-en")


# ------------------------------------------------------------------- layout, every page

WIDTHS = (1280, 400)
# the figure's body text is 8 pt (10.7 px at its natural size); on a phone it must not
# shrink below 90 % of that
MIN_FIGURE_SCALE = 0.9
_LAYOUT = """
var W = window.innerWidth, out = {page_overflow: document.documentElement.scrollWidth - W,
  wide_formulas: [], unboxed: [], formulas: 0, figure: null, zoom: null};
function scrolls(el) {
  for (; el && el !== document.body; el = el.parentElement) {
    var o = getComputedStyle(el).overflowX;
    if (o === 'auto' || o === 'scroll') return el;
  }
  return null;
}
document.querySelectorAll('.formula-col pre').forEach(function (pre) {
  out.formulas++;
  if (pre.offsetParent === null) return;
  var box = scrolls(pre);
  if (pre.scrollWidth > pre.clientWidth + 1) {
    out.wide_formulas.push({text: pre.textContent.slice(0, 60), over: pre.scrollWidth - pre.clientWidth,
                            own_box: box === pre});
  }
});
// anything drawn past the window's right edge that is not inside a box of its own that scrolls
document.querySelectorAll('main *').forEach(function (el) {
  var r = el.getBoundingClientRect();
  if (r.width > 0 && r.right > W + 1 && !scrolls(el.parentElement) && getComputedStyle(el).position !== 'fixed') {
    out.unboxed.push(el.tagName + '.' + el.className + ': ' + (el.textContent || '').slice(0, 50));
  }
});
var img = Array.prototype.filter.call(document.querySelectorAll('figure.plot img'),
                                      function (i) { return i.offsetParent !== null; })[0];
if (img) {
  out.figure = {src: img.currentSrc, shown: img.getBoundingClientRect().width, natural: img.naturalWidth,
                complete: img.complete};
}
var zoom = Array.prototype.filter.call(document.querySelectorAll('figure.plot a.zoom'),
                                       function (a) { return a.offsetParent !== null; })[0];
out.zoom = zoom ? zoom.getAttribute('href') : null;
return out;
"""


def _window(driver, width):
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    assert driver.execute_script("return window.innerWidth") == width


def _figure_ready(driver):
    from selenium.webdriver.support.ui import WebDriverWait

    def ready(d):
        s = d.execute_script(_LAYOUT)
        return s if s["figure"] is None or (s["figure"]["complete"] and s["figure"]["natural"] > 0) else False

    return WebDriverWait(driver, 10).until(ready, "the figure did not load")


def layout_problems(driver, page: Path, width: int) -> tuple[list[str], dict]:
    """Every layout problem of `page` at `width` px, in English and then in Chinese (the
    switch, no reload): a page wider than the window, a formula wider than its column (at
    1280 px) or not scrolling inside its own box (at 400 px), anything past the right edge
    outside a scroll box, and on a small window a figure that is not the one-column drawing
    at >= 90 % of its natural size with a visible full-size link."""
    from selenium.webdriver.common.by import By

    problems, stats = [], {}
    driver.get(page.as_uri() + "?lang=en")
    for lang in ("en", "zh"):
        if lang == "zh":
            driver.find_element(By.CSS_SELECTOR, 'button[data-set-lang="zh"]').click()
        s = _figure_ready(driver)
        where = f"{page.name} [{lang}, {width} px]"
        stats[lang] = s
        if s["page_overflow"] > 0:
            problems.append(f"{where}: the page scrolls sideways by {s['page_overflow']} px")
        for f in s["wide_formulas"]:
            if width >= 1280 or not f["own_box"]:
                problems.append(f"{where}: formula {f['text']!r} is {f['over']} px wider than its box"
                                + ("" if f["own_box"] else " and does not scroll inside it"))
        problems += [f"{where}: past the right edge outside a scroll box: {u}" for u in s["unboxed"][:3]]
        fig = s["figure"]
        if fig and width <= 400:
            if not fig["src"].endswith(f".{lang}.narrow.svg"):
                problems.append(f"{where}: the small-screen figure is {fig['src']!r}, not the one-column drawing")
            if fig["shown"] < MIN_FIGURE_SCALE * fig["natural"]:
                problems.append(f"{where}: the figure is shown at {fig['shown'] / fig['natural']:.2f} of its size")
            if not s["zoom"] or not s["zoom"].endswith(f".{lang}.svg"):
                problems.append(f"{where}: no visible full-size link under the figure ({s['zoom']!r})")
    return problems, stats


def site_pages(out: Path) -> list[Path]:
    return sorted(out.glob("*.html")) + sorted(out.glob("source/**/*.html"))


SCREENSHOTS = (("index.html", "en"), ("method-ppo.html", "en"), ("method-grpo.html", "zh"), ("compare.html", "en"),
               ("topics.html", "zh"))
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def _small_png(driver, path: Path):
    """A viewport screenshot, quantized to 64 colours (small enough to commit)."""
    import io

    from PIL import Image

    png = driver.get_screenshot_as_png()
    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, optimize=True)
    assert path.stat().st_size > 5000, path


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_at_1280_and_400_px_in_both_languages(browser, real_site, width):
    """The real site, every page (index, comparison, topics, every method and overlay page,
    every source page), English and Chinese: see `layout_problems`. Screenshots of five
    pages go to test-artifacts/ (and to docs/screenshots/ with POLICYLAB_DOCS_SCREENSHOTS=1)."""
    pages = site_pages(real_site)
    assert len(pages) > 100
    _window(browser, width)
    try:
        problems, formulas = [], 0
        for page in pages:
            found, stats = layout_problems(browser, page, width)
            problems += found
            formulas += stats["en"]["formulas"]
        assert formulas > 150
        assert not problems, f"{len(problems)} layout problem(s):\n" + "\n".join(problems[:40])
        target = DOCS_SHOTS if os.environ.get("POLICYLAB_DOCS_SCREENSHOTS") == "1" else ARTIFACTS
        for name, lang in SCREENSHOTS:
            browser.get((real_site / name).as_uri() + f"?lang={lang}")
            _figure_ready(browser)
            if name.startswith("method-"):  # the formulas and the figure, the part that has to fit
                browser.execute_script("document.querySelector('.formula-col').scrollIntoView()")
            _small_png(browser, target / f"{name[:-5]}-{lang}-{width}.png")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


_OPEN_ANSWERS = """
document.querySelectorAll('details.q').forEach(function (d) { d.open = true; });
var W = window.innerWidth, out = {page_overflow: document.documentElement.scrollWidth - W, boundaries: 0, bad: []};
document.querySelectorAll('.boundary').forEach(function (b) {
  var r = b.getBoundingClientRect(), id = b.closest('details').id;
  var shown = Array.prototype.filter.call(b.querySelectorAll('dd > span'), function (s) {
    return s.offsetParent !== null; });
  out.boundaries += 1;
  if (r.right > W + 0.5) out.bad.push(id + ': ' + Math.round(r.right - W) + ' px past the window');
  if (r.height < 20 || shown.length !== 3) out.bad.push(id + ': ' + shown.length + ' of 3 parts shown');
});
return out;
"""


@pytest.mark.parametrize("width", WIDTHS)
def test_every_answer_opened_shows_its_boundary_inside_the_window(browser, real_site, width):
    """Every method, metric and topics page with all its answers open, in both languages:
    each answer's boundary block shows its three parts in the current language, inside the
    window, and the page does not scroll sideways."""
    from selenium.webdriver.common.by import By

    pages = [p for pattern in ("method-*.html", "metric-*.html", "literature-*.html", "topics.html")
             for p in sorted(real_site.glob(pattern))]
    _window(browser, width)
    try:
        problems, boundaries = [], 0
        for page in pages:
            browser.get(page.as_uri() + "?lang=en")
            for lang in ("en", "zh"):
                if lang == "zh":
                    browser.find_element(By.CSS_SELECTOR, 'button[data-set-lang="zh"]').click()
                s = browser.execute_script(_OPEN_ANSWERS)
                boundaries += s["boundaries"] if lang == "en" else 0
                where = f"{page.name} [{lang}, {width} px]"
                if s["page_overflow"] > 0:
                    problems.append(f"{where}: with the answers open the page scrolls sideways by "
                                    f"{s['page_overflow']} px")
                problems += [f"{where}: {b}" for b in s["bad"]]
        assert boundaries >= 240, boundaries
        assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:40])
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
