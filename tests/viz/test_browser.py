"""The HTML viewer in a real headless browser (Debian's Chromium, driven by Playwright).

Skipped, with the reason, where Chromium or Playwright is not installed (``.ci/run``
installs both).
"""

import io
import pathlib
import shutil

import pytest
import torch

import gact_fx

from ..helpers import compiled_grads, model_case

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
if CHROMIUM is None:
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def page_and_report(tmp_path_factory):
    torch._dynamo.reset()
    model, inputs = model_case("block")
    backend = gact_fx.backend(bits=2)
    compiled_grads(model, inputs, backend)
    path = tmp_path_factory.mktemp("viz") / "block.html"
    gact_fx.visualize(backend, path=path)
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        errors = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(pathlib.Path(path).as_uri())
        page.wait_for_selector("body[data-ready=true]")
        yield page, backend.report(), errors
        browser.close()


def test_the_page_loads_without_errors(page_and_report):
    page, _, errors = page_and_report
    assert errors == []


def shown_column(page, name):
    rows = page.locator("#saved-table tbody tr")
    column = [h.strip() for h in page.locator("#saved-table th").all_text_contents()].index(name)
    return [rows.nth(i).locator("td").nth(column).text_content() for i in range(rows.count())]


def test_saved_tensors_are_listed_by_bytes_held_with_their_bits_and_parameters_folded(page_and_report):
    page, report, _ = page_and_report
    by_bytes = sorted(report.rows, key=lambda r: -r.bytes_before)
    held = [r for r in by_bytes if r.kind not in ("parameter", "view of parameter")]
    assert len(held) < len(report.rows)  # the block saves its weights: there is something to fold
    assert shown_column(page, "FX node") == [r.name for r in held]
    assert shown_column(page, "bits") == ["-" if r.bits is None else str(r.bits) for r in held]
    assert "exponential" in shown_column(page, "backward use")
    page.click("#parameters-toggle")
    assert shown_column(page, "FX node") == [r.name for r in by_bytes]
    page.click("#parameters-toggle")
    assert shown_column(page, "FX node") == [r.name for r in held]


def test_clicking_a_node_shows_its_details(page_and_report):
    page, _, _ = page_and_report
    page.click("#zoom-fit")  # the whole graph in view: the first view shows its start
    node = page.locator(".node.quantize").first
    name = node.get_attribute("data-node").split(":", 1)[1]
    node.click()
    details = page.text_content("#node-details")
    assert name in details and "gact::quantize" in details and "uint8" in details


def test_search_highlights_matches(page_and_report):
    page, _, _ = page_and_report
    page.fill("#search", "dequantize")
    assert page.locator(".node.match").count() == page.locator(".node.dequantize").count() > 0


def test_the_screenshot_is_not_blank(page_and_report):
    from PIL import Image, ImageStat

    page, _, _ = page_and_report
    image = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("L")
    assert image.size[1] > 800 and ImageStat.Stat(image).stddev[0] > 10
