"""`llmpar ui` in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by Selenium; nothing is downloaded) loads the page, changes
fields, runs a search, and the numbers on the page are compared with `evaluate` and
`llmpar.search` of the server's session. The screenshots in docs/ are checked by the
geometry of the page's main elements (docs/ui-geometry.json), not by pixels. The session
loads no installed plugin (a plugin's search dimensions would change the layouts listed,
and so the geometry), as `Session(load_entry_points=False)`.

Skipped, saying why, where Selenium or the browser is absent. `LLMPAR_UI_SCREENSHOTS=1`
rewrites the screenshots and the geometry (docs/ui.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import llmpar
from llmpar.session import Session
from llmpar.ui import api, form
from llmpar.ui.server import UiServer, make_server

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GEOMETRY = DOCS / "ui-geometry.json"
TRAINING = ROOT / "specs" / "examples" / "llama-3-70b-tp8-pp4-cp2.toml"
SERVING = ROOT / "specs" / "examples" / "inference-llama-2-70b-h100.toml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WINDOW = (1400, 1800)
"""The browser window's size in CSS pixels: the screenshots' and the geometry's."""
MAIN_ELEMENTS = {
    "plan": ("header", "#spec-panel", "#fields", "#toml", "#plan-title", "#cards",
             "#memory-box", "#stages-box", "#peak-box", "#step-box", "#collectives-box"),
    "search": ("header", "#spec-panel", "#search-results", "#pareto-box"),
    "serving": ("header", "#spec-panel", "#memory-box", "#serving-box", "#collectives-box"),
}
"""The elements whose boxes each view's geometry records."""
POSITION_TOLERANCE_PX = 80
SIZE_TOLERANCE = 0.25
"""How far a box may move (CSS pixels) and grow or shrink (share of its size, or the
position tolerance, whichever is larger) before the layout counts as changed: fonts
differ between machines, a broken layout moves far more."""
WAIT_SECONDS = 60
POLL_SECONDS = 0.05

selenium = pytest.importorskip(
    "selenium", reason="browser tests need Selenium (pip install selenium) and Debian's "
                       "chromium and chromium-driver (apt-get install chromium chromium-driver)")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="browser tests need Chromium and its driver: apt-get install chromium "
           "chromium-driver (not found on PATH)")


@pytest.fixture(scope="module")
def planner() -> Session:
    """The server's session: llmpar's own plugins only."""
    return Session(load_entry_points=False)


@pytest.fixture(scope="module")
def server(planner: Session) -> Iterator[UiServer]:
    running = make_server(planner, {"toml": TRAINING.read_text(), "label": TRAINING.name})
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="llmpar-ui-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--hide-scrollbars",
                 "--force-device-scale-factor=1", f"--user-data-dir={profile}",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: Any, script: str) -> Any:
    """Wait until the page's `script` (a JavaScript expression) is truthy."""
    return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=POLL_SECONDS).until(
        lambda d: d.execute_script(f"return {script};"))


def open_page(driver: Any, server: UiServer, fragment: str = "") -> None:
    driver.get("about:blank")
    driver.get(server.url + fragment)
    wait_for(driver, "document.body.dataset.state")


def evaluated_after(driver: Any, action: Any) -> str:
    """Run `action`, then wait for the page's next answer; its state."""
    driver.execute_script("document.body.dataset.state = ''")
    action()
    state: str = wait_for(driver, "document.body.dataset.state")
    return state


def value(driver: Any, selector: str) -> float:
    return float(driver.find_element(By.CSS_SELECTOR, selector).get_attribute("data-value"))


def set_field(driver: Any, key: str, text: str) -> None:
    """Type `text` over the field's value, then leave it (one change event, as a user's)."""
    element = driver.find_element(By.ID, "field-" + key.replace(".", "-"))
    element.send_keys(Keys.CONTROL, "a")
    element.send_keys(text)
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", element)


def check_training_numbers(driver: Any, plan: llmpar.Plan) -> None:
    assert value(driver, "[data-key=total_bytes]") == plan.total_bytes
    assert value(driver, "[data-key=capacity_bytes]") == plan.capacity_bytes
    segments = driver.find_elements(By.CSS_SELECTOR, "#memory-stack .segment")
    assert sum(float(s.get_attribute("data-value")) for s in segments) == plan.total_bytes
    by_component = {s.get_attribute("data-component"): float(s.get_attribute("data-value"))
                    for s in segments}
    assert by_component["weights"] == plan.weights_bytes
    assert by_component["activations"] == plan.activations_bytes
    assert value(driver, ".card[data-key=step_seconds]") == pytest.approx(plan.step_seconds)
    assert value(driver, ".card[data-key=train_seconds]") == pytest.approx(plan.train_seconds)
    assert value(driver, ".card[data-key=gpu_hours]") == pytest.approx(plan.gpu_hours)
    assert value(driver, ".card[data-key='memory_peak.allocated_bytes']") == (
        plan.training.memory_peak.allocated_bytes)
    stages = driver.find_elements(By.CSS_SELECTOR, "#stage-bars .bar")
    assert [float(s.get_attribute("data-total")) for s in stages] == [
        s.total_bytes for s in plan.stages]
    rows = driver.find_elements(By.CSS_SELECTOR, "#collectives tbody tr")
    assert len(rows) == len(plan.collectives)
    assert driver.find_element(By.ID, "trust").text == plan.training.step_time_trust


def test_the_page_shows_the_plan_of_the_given_spec(browser, server, planner):
    open_page(browser, server)
    assert browser.execute_script("return document.body.dataset.state") == "planned"
    check_training_numbers(browser, planner.evaluate(TRAINING))
    points = browser.find_elements(By.CSS_SELECTOR, "#timeline-svg circle")
    plan = planner.evaluate(TRAINING)
    assert max(float(p.get_attribute("data-value")) for p in points) == (
        plan.training.memory_peak.allocated_bytes)
    # The peak is ringed at llmpar's stage and moment.
    ringed = browser.find_element(By.CSS_SELECTOR, "#timeline-svg .peak-point")
    assert float(ringed.get_attribute("data-value")) == (
        plan.training.memory_peak.allocated_bytes)
    # The address now carries the spec: opened again, the page shows the same plan.
    assert "#spec=" in browser.current_url
    assert browser.find_element(By.ID, "download-json").is_enabled()
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_changing_a_field_replans(browser, server, planner):
    open_page(browser, server)
    assert evaluated_after(browser, lambda: set_field(
        browser, "parallel.pipeline.degree", "8")) == "planned"
    plan = planner.evaluate(TRAINING, {"parallel.pipeline.degree": 8})
    check_training_numbers(browser, plan)
    assert "degree = 8" in browser.find_element(By.ID, "toml").get_attribute("value")
    # The new address holds the changed spec.
    shared = browser.current_url
    open_page(browser, server, "#" + shared.split("#", 1)[1])
    check_training_numbers(browser, plan)


def test_problems_show_beside_their_field(browser, server):
    open_page(browser, server)
    assert evaluated_after(browser, lambda: set_field(
        browser, "parallel.tensor.degree", "3")) == "problems"
    beside = browser.find_element(By.CSS_SELECTOR,
                                  ".field-problem[data-path='$.parallel.tensor.degree']")
    assert "must divide model.num_attention_heads" in beside.text
    listed = [li.get_attribute("data-path") for li in
              browser.find_elements(By.CSS_SELECTOR, "#problems li")]
    assert "$.parallel.tensor.degree" in listed


def open_table(driver: Any, key: str) -> None:
    """Open a table of the form as a user does: a click on its heading."""
    table = driver.find_element(By.CSS_SELECTOR, f"details.table[data-key='{key}']")
    if table.get_attribute("open") is None:
        table.find_element(By.TAG_NAME, "summary").click()


def test_the_form_holds_every_key_and_edits_nested_tables(browser, server, planner):
    from selenium.webdriver.support.select import Select

    open_page(browser, server)
    nodes = api.spec_form(planner)
    keys = [node.key for node in form.walk(nodes)]  # a preset's menu and its table
    drawn = browser.execute_script(
        "return [...document.querySelectorAll('#fields [data-key]')]"
        ".filter((n) => !n.classList.contains('field-problem')).map((n) => n.dataset.key)")
    assert sorted(drawn) == sorted(keys)
    # A key the spec does not give shows the loaded spec's value: the preset's.
    layers = browser.find_element(By.ID, "field-model-num_layers")
    assert layers.get_attribute("placeholder") == str(
        planner.load_spec(TRAINING).model.num_layers)
    # A nested key, an enum from its menu and a size with its unit inside a closed table.
    assert evaluated_after(browser, lambda: set_field(
        browser, "parallel.tensor.degree", "4")) == "planned"
    assert evaluated_after(browser, lambda: Select(browser.find_element(
        By.ID, "field-training-recompute")).select_by_value("full")) == "planned"
    open_table(browser, "hardware.gpu")
    assert evaluated_after(browser, lambda: set_field(
        browser, "hardware.gpu.memory_bytes", "80 GB")) == "planned"
    plan = planner.evaluate(TRAINING, {"parallel.tensor.degree": 4,
                                       "training.recompute": "full",
                                       "hardware.gpu.memory_bytes": "80 GB"})
    check_training_numbers(browser, plan)
    text = browser.find_element(By.ID, "toml").get_attribute("value")
    assert 'memory_bytes = "80 GB"' in text and 'recompute = "full"' in text


def test_a_bad_value_shows_its_key_path_beside_the_field(browser, server):
    open_page(browser, server)
    open_table(browser, "model")
    assert evaluated_after(browser, lambda: set_field(
        browser, "model.num_layers", "many")) == "problems"
    beside = browser.find_element(By.CSS_SELECTOR,
                                  ".field-problem[data-key='model.num_layers']")
    assert beside.is_displayed() and "expected an integer" in beside.text
    listed = [li.get_attribute("data-path") for li in
              browser.find_elements(By.CSS_SELECTOR, "#problems li")]
    assert listed == ["$.model.num_layers"]
    # Cleared, the key is the preset's again and the spec plans.
    assert evaluated_after(browser, lambda: set_field(
        browser, "model.num_layers", Keys.DELETE)) == "planned"
    assert beside.text == ""


def test_a_serving_spec_from_the_address(browser, server, planner):
    from base64 import urlsafe_b64encode

    code = urlsafe_b64encode(SERVING.read_bytes()).decode().rstrip("=")
    open_page(browser, server, f"#spec={code}")
    plan = planner.evaluate(SERVING)
    assert value(browser, ".card[data-key=kv_cache_bytes]") == plan.kv_cache_bytes
    assert value(browser, ".card[data-key=ttft_seconds]") == pytest.approx(plan.prefill_seconds)
    assert value(browser, ".card[data-key=tpot_seconds]") == pytest.approx(plan.tpot_seconds)
    assert value(browser, ".card[data-key=tokens_per_second_per_gpu]") == pytest.approx(
        plan.tokens_per_second_per_gpu)
    assert browser.find_element(By.ID, "step-box").get_attribute("hidden") is not None
    record_view(browser, "serving")


def run_search(driver: Any) -> None:
    driver.find_element(By.ID, "tab-search").click()
    driver.execute_script("document.body.dataset.search = ''")
    driver.find_element(By.ID, "run-search").click()
    WebDriverWait(driver, WAIT_SECONDS, poll_frequency=POLL_SECONDS).until(
        lambda d: d.execute_script("return document.body.dataset.search") in ("done",
                                                                              "problems"))


def test_a_search_lists_llmpars_layouts_and_opens_one(browser, server, planner):
    open_page(browser, server)
    record_view(browser, "plan")
    run_search(browser)
    expected = llmpar.search(api.edited(TRAINING.read_text(), None)[0], top=10,
                             session=planner)
    rows = browser.find_elements(By.CSS_SELECTOR, "#search-results tbody tr")
    assert [float(r.get_attribute("data-objective")) for r in rows] == pytest.approx(
        [r.objective for r in expected.results])
    points = browser.find_elements(By.CSS_SELECTOR, "#pareto-svg .pareto-point")
    assert len(points) == len(expected.pareto)
    assert browser.find_element(By.ID, "download-search").is_enabled()
    record_view(browser, "search")
    # A row opens as a plan: the plan of that row's spec.
    assert evaluated_after(browser, rows[1].click) == "planned"
    assert browser.find_element(By.ID, "plan-view").is_displayed()
    second = planner.evaluate(expected.results[1].spec)
    assert value(browser, ".card[data-key=step_seconds]") == pytest.approx(
        second.step_seconds)


# --- screenshots and their geometry --------------------------------------------------


def geometry(driver: Any, view: str) -> dict[str, dict[str, float]]:
    boxes: dict[str, dict[str, float]] = {}
    for selector in MAIN_ELEMENTS[view]:
        box = driver.execute_script(
            "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
            "return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height};",
            selector)
        boxes[selector] = {k: round(float(v), 1) for k, v in box.items()}
    return boxes


def small_png(path: Path) -> None:
    """A screenshot in 64 colours (a quarter of the bytes; the page has few colours),
    where Pillow is installed (the plot extra brings it)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def record_view(driver: Any, view: str) -> None:
    """Compare the view's geometry with the recorded one (or, with
    LLMPAR_UI_SCREENSHOTS=1, save its screenshot and record its geometry)."""
    driver.execute_script("window.scrollTo(0, 0)")
    found = geometry(driver, view)
    if os.environ.get("LLMPAR_UI_SCREENSHOTS") == "1":
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(WINDOW[0], max(WINDOW[1], int(height) + 140))
        driver.save_screenshot(str(DOCS / f"ui-{view}.png"))
        driver.set_window_size(*WINDOW)
        small_png(DOCS / f"ui-{view}.png")
        recorded = json.loads(GEOMETRY.read_text()) if GEOMETRY.exists() else {}
        recorded[view] = found
        GEOMETRY.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    expected = json.loads(GEOMETRY.read_text())[view]
    for selector, box in expected.items():
        now = found[selector]
        for key in ("x", "y"):
            assert abs(now[key] - box[key]) <= POSITION_TOLERANCE_PX, (view, selector, key,
                                                                       now, box)
        for key in ("width", "height"):
            allowed = max(POSITION_TOLERANCE_PX, SIZE_TOLERANCE * box[key])
            assert abs(now[key] - box[key]) <= allowed, (view, selector, key, now, box)


def test_the_screenshots_in_the_docs_are_the_recorded_views():
    recorded = json.loads(GEOMETRY.read_text())
    assert set(recorded) == set(MAIN_ELEMENTS)
    for view, selectors in MAIN_ELEMENTS.items():
        assert set(recorded[view]) == set(selectors)
        assert (DOCS / f"ui-{view}.png").stat().st_size > 10_000
        # Every main element is drawn (not hidden, not empty) and inside the window.
        for selector, box in recorded[view].items():
            assert box["width"] > 0 and box["height"] > 0, (view, selector)
            assert box["x"] >= 0 and box["x"] + box["width"] <= WINDOW[0] + 1, (view, selector)
        assert f"ui-{view}.png" in (DOCS / "ui.md").read_text()


def test_without_a_spec_the_page_starts_from_a_shipped_example(browser, planner):
    bare = make_server(planner)
    threading.Thread(target=bare.serve_forever, daemon=True).start()
    try:
        open_page(browser, bare)
        check_training_numbers(browser, planner.evaluate(TRAINING))
        # Another example from the menu replaces the spec and its plan.
        menu = browser.find_element(By.ID, "example")
        assert evaluated_after(browser, lambda: browser.execute_script(
            "arguments[0].value = 'inference-llama-2-70b-h100';"
            "arguments[0].dispatchEvent(new Event('change'))", menu)) == "planned"
        assert value(browser, ".card[data-key=kv_cache_bytes]") == (
            planner.evaluate(SERVING).kv_cache_bytes)
    finally:
        bare.shutdown()
        bare.server_close()
