"""`cebm studio` in a real browser: Playwright drives Debian's Chromium against the app served on 127.0.0.1.

The browser is found at ``CEBM_CHROMIUM``, else ``chromium-headless-shell`` or ``chromium`` on the PATH
(``apt-get install chromium-headless-shell``; .ci/run installs it). Without one the tests skip, unless
``CEBM_REQUIRE_BROWSER=1`` (set by .ci/run), where a missing browser fails them. Every wait is on the
page's state (a value, an element), never a fixed sleep. ``CEBM_STUDIO_SCREENSHOT=path.png`` keeps the
first test's screenshot (the docs' picture comes from it).
"""

from __future__ import annotations

import io
import os
import re
import shutil

import pytest

gradio = pytest.importorskip("gradio")
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
expect.set_options(timeout=60_000)  # a generation on a busy 2-core CPU

from composable_ebm import studio  # noqa: E402
from composable_ebm.images import image_grid  # noqa: E402

pytestmark = pytest.mark.browser

FIRST = "faces-smiling[smiling=yes] + faces-glasses[glasses=yes] + faces-hat[hat=yes]"
"""The page's first expression: the README's sentence, in the form ``auto`` the page starts in (as `cebm compose`)."""
RED_CIRCLE_LARGE = "shapes-color[color=red] + shapes-shape[shape=circle] + shapes-size[size=large]"


def _chromium() -> str | None:
    return os.environ.get("CEBM_CHROMIUM") or shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.fixture(scope="module")
def url():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    app = studio.launch("127.0.0.1", device="cpu", prevent_thread_lock=True, quiet=True)  # as `cebm studio` serves it
    yield app.local_url
    app.close()
    torch.set_num_threads(threads)  # the tests after this module run as they would alone


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    if path is None:
        if os.environ.get("CEBM_REQUIRE_BROWSER") == "1":
            pytest.fail("CEBM_REQUIRE_BROWSER=1 but no Chromium: apt-get install chromium-headless-shell")
        pytest.skip("no Chromium (apt-get install chromium-headless-shell, or set CEBM_CHROMIUM)")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, url):
    page = browser.new_page(viewport={"width": 1300, "height": 1500})
    page.set_default_timeout(60_000)  # a generation on a busy 2-core CPU
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(url)
    expect(page.locator("#expression textarea")).to_have_value(FIRST)
    page.requests = requests
    yield page
    page.close()


def _choose(page, selector: str, option: str) -> None:
    page.locator(f"{selector} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def _expression(page):
    return page.locator("#expression textarea")


def test_the_page_opens_on_the_readmes_sentence_and_generates_it_with_readings(page):
    page.click("#generate")
    expect(page.locator("#message")).to_contain_text("16 samples in")
    expect(page.locator("#readings figure")).to_have_count(16)
    expect(page.locator("#readings .cebm-summary")).to_have_text(
        re.compile(r"\d+ of 16 samples read as asked \(classifier: faces-classifier\)"))
    shot = os.environ.get("CEBM_STUDIO_SCREENSHOT")
    if shot:
        page.screenshot(path=shot, full_page=True)


def _show(page, text: str) -> None:
    """Type ``text`` into the expression field and let the controls move to it."""
    expr = _expression(page)
    expr.fill(text)
    expr.press("Enter")
    expect(page.locator("#expression-note")).to_contain_text("The controls show this expression")


def test_red_circle_large_built_from_the_controls_generates_a_grid_with_readings(page, url):
    expr = _expression(page)
    for left in ["faces-glasses[glasses=yes] + faces-hat[hat=yes]", "faces-hat[hat=yes]", ""]:
        page.click("#term-0-remove")
        expect(expr).to_have_value(left)
    for i, (model, value) in enumerate([("shapes-color", "color=red"), ("shapes-shape", "shape=circle"),
                                        ("shapes-size", "size=large")]):
        page.click("#add-term")
        expect(page.locator(f"#term-{i}")).to_be_visible()
        _choose(page, f"#term-{i}-model", model)
        _choose(page, f"#term-{i}-values", value)
    expect(expr).to_have_value(RED_CIRCLE_LARGE)
    page.click("#generate")
    expect(page.locator("#message")).to_contain_text("16 samples in")
    expect(page.locator("#readings figure")).to_have_count(16)
    expect(page.locator("#readings .cebm-summary")).to_have_text(re.compile(r"\d+ of 16 samples read as asked"))
    assert page.locator("#readings .cebm-right").count() > 0  # the asked attributes carry marks
    src = page.locator("#grid img").get_attribute("src")
    png = page.request.get(src).body()
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    import torch

    assert image.size == image_grid(torch.zeros(16, 3, 16, 16)).size  # 4 x 4 samples of 64 px
    import numpy as np

    pixels = np.asarray(image, dtype=np.float32) / 255
    assert pixels.std() > 0.1 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # not blank
    expect(page.locator("#download")).to_be_visible()
    assert page.locator("#chain img").count() == 1
    outside = {u for u in page.requests if not re.match(r"^(https?://127\.0\.0\.1[:/]|data:|blob:)", u)}
    assert not outside, f"requests left the machine: {sorted(outside)[:5]}"


def test_a_typed_expression_moves_the_controls(page):
    expr = _expression(page)
    expr.fill("shapes-color[color=blue] - 0.5*shapes-shape[shape=square] | shapes-size[size=small] / 2")
    expr.press("Enter")
    expect(page.locator("#term-2")).to_be_visible()
    expect(page.locator("#term-0-model input")).to_have_value("shapes-color")
    expect(page.locator("#term-1-op input")).to_have_value("and not")
    expect(page.locator("#term-1-weight input")).to_have_value("0.5")
    expect(page.locator("#term-1-values")).to_contain_text("shape=square")
    expect(page.locator("#term-2-op input")).to_have_value("or")
    expect(page.locator("#term-2-temperature input")).to_have_value("2")
    expect(page.locator("#expression-note")).to_contain_text("The controls show this expression")
    expr.fill("(shapes-color[color=blue] + shapes-size[size=small]) * 2")
    expr.press("Enter")
    expect(page.locator("#expression-note")).to_contain_text("cannot show this expression")
    expect(page.locator("#term-2")).to_be_visible()  # the controls keep what they showed


def test_a_bad_expression_is_one_line_clears_the_last_results_and_the_next_generate_works(page):
    _show(page, RED_CIRCLE_LARGE)
    page.locator("#n input").fill("4")
    page.locator("#steps input, #steps textarea").first.fill("5")
    message = page.locator("#message")
    page.click("#generate")
    expect(message).to_contain_text("4 samples in")
    expect(page.locator("#readings figure")).to_have_count(4)
    expr = _expression(page)
    expr.fill("shapes-color[color=purple] + shapes-shape[shape=circle]")
    page.click("#generate")
    expect(message).to_contain_text("error:")
    text = message.inner_text()
    assert "purple" in text and "red" in text and "Traceback" not in text and len(text.strip().splitlines()) == 1
    expect(page.locator("#readings figure")).to_have_count(0)  # no earlier samples shown under the error
    expect(page.locator("#grid img")).to_have_count(0)
    expect(page.locator("#download")).to_be_hidden()
    expr.fill("shapes-color[color=green]")
    page.click("#generate")
    expect(message).to_contain_text("4 samples in")
    expect(page.locator("#readings figure")).to_have_count(4)


def test_deleting_a_term_updates_the_expression(page):
    page.click("#term-1-remove")
    expect(_expression(page)).to_have_value("faces-smiling[smiling=yes] + faces-hat[hat=yes]")
    expect(page.locator("#term-2")).to_be_hidden()
    expect(page.locator("#term-1-model input")).to_have_value("faces-hat")


def test_stop_ends_a_long_generation_and_the_page_stays_usable(page):
    """A request within the bounds can still take a while: Stop cancels it, and the next Generate runs."""
    _show(page, RED_CIRCLE_LARGE)
    page.locator("#steps input, #steps textarea").first.fill("900")
    page.click("#generate")
    page.wait_for_timeout(1500)
    page.click("#stop")
    expect(page.locator("#message")).to_contain_text("stopped", timeout=20_000)
    page.locator("#steps input, #steps textarea").first.fill("5")
    page.click("#generate")
    expect(page.locator("#message")).to_contain_text("16 samples in")


def test_the_page_names_its_bounds(page):
    expect(page.locator("#bounds")).to_contain_text("at most 64 samples of at most 1000 steps")


def test_a_typed_value_the_model_lacks_is_one_line_and_stays_out_of_the_controls(page):
    expr = _expression(page)
    expr.fill("shapes-color[color=purple] + shapes-shape[shape=circle]")
    expr.press("Enter")
    expect(page.locator("#expression-note")).to_contain_text("has no value 'purple'")
    expect(page.locator("#term-0-values")).not_to_contain_text("purple")


def test_the_studio_draws_the_pixels_cebm_compose_draws(page, tmp_path):
    """Typed as-is, a sum of face models is sampled as `cebm compose` samples it (the form ``auto``: guided): the
    same grid, pixel for pixel, for one seed."""
    import numpy as np
    import torch
    from PIL import Image
    from typer.testing import CliRunner

    from composable_ebm.cli import app

    text = "faces-smiling[smiling=yes] + faces-hat[hat=yes]"
    expr = _expression(page)
    expr.fill(text)
    expr.press("Enter")
    expect(page.locator("#expression-note")).to_contain_text(f'as cebm compose "{text}" does')
    page.locator("#n input").fill("4")
    page.locator("#seed input").fill("7")
    page.click("#generate")
    expect(page.locator("#message")).to_contain_text("4 samples in")
    studio_png = page.request.get(page.locator("#grid img").get_attribute("src")).body()
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(app, ["--threads", str(torch.get_num_threads()), "compose", text, "-n", "4", "--seed",
                                      "7", "-o", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    ours = np.asarray(Image.open(io.BytesIO(studio_png)).convert("RGB"))
    theirs = np.asarray(Image.open(out).convert("RGB"))
    assert ours.shape == theirs.shape and np.array_equal(ours, theirs)


ATTACK = """<!doctype html><title>elsewhere</title>
<iframe id="sandboxed" sandbox="allow-scripts" srcdoc="<script>
  const form = new FormData(); form.append('files', new Blob([new Uint8Array(1 << 20)]), 'x.bin');
  fetch('STUDIO/gradio_api/upload', {method: 'POST', mode: 'no-cors', body: form})
    .then(() => parent.postMessage('sent', '*'), () => parent.postMessage('failed', '*'));
</script>"></iframe>
<script>
  window.results = {};
  const sandboxed = new Promise(resolve => addEventListener('message', e => { window.results.sandboxed = e.data; resolve(); }));
  const read = (name, promise) => promise.then(r => r.text().then(t => { window.results[name] = 'read ' + r.status + ' ' + t.slice(0, 80); }),
                                              e => { window.results[name] = 'refused'; });
  const form = new FormData(); form.append('files', new Blob([new Uint8Array(1 << 20)]), 'y.bin');
  Promise.all([
    sandboxed,
    read('info', fetch('STUDIO/gradio_api/info')),
    read('config', fetch('STUDIO/config')),
    read('generate', fetch('STUDIO/gradio_api/call/on_generate', {method: 'POST', headers: {'Content-Type': 'application/json'},
         body: JSON.stringify({data: ['/etc', 'auto', 0, 1, '1', '']})})),
    fetch('STUDIO/gradio_api/upload', {method: 'POST', mode: 'no-cors', body: form}).catch(() => null),
  ]).then(() => { window.done = true; });
</script>"""


def _count_files(*folders) -> int:
    return sum(1 for folder in folders if folder.is_dir() for p in folder.rglob("*") if p.is_file())


def test_a_page_of_another_origin_can_neither_store_nor_read_anything(browser, url):
    """A page on another port of localhost, and a sandboxed frame in it (``Origin: null``), try the upload route,
    the studio's API and a generation: every answer is refused and nothing reaches the studio's disk."""
    import http.server
    import tempfile
    import threading
    from pathlib import Path

    body = ATTACK.replace("STUDIO", url.rstrip("/")).encode()

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    temp = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
    studio_dirs = list(Path(tempfile.gettempdir()).glob("cebm-studio-*"))
    before = _count_files(temp, *studio_dirs)
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        page.wait_for_function("window.done === true", timeout=60_000)
        results = page.evaluate("window.results")
    finally:
        page.close()
        server.shutdown()
    assert results == {"sandboxed": "sent", "info": "refused", "config": "refused", "generate": "refused"}, results
    assert _count_files(temp, *studio_dirs) == before
