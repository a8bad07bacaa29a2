"""The chat page of ``dualpath serve``, in a real browser: Debian's chromium, headless,
driven by Selenium through Debian's chromedriver, against a live server on loopback.

The model is a random-weight stories15M (``synth:stories15M``): it almost never writes
an end-of-sequence token, so a reply runs long enough to be seen streaming and to be
stopped. The screenshot goes to ``$DUALPATH_TEST_ARTIFACTS`` (default: the test's
temporary folder) as ``webui.png``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
webdriver = pytest.importorskip("selenium.webdriver")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
                                       "chromium-driver)")
STATIC = Path(__file__).resolve().parents[2] / "sdk" / "dualpath" / "server" / "static"


def _serve(*extra):
    from dualpath.bench.common import free_port, live_server

    port = free_port()
    cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", "synth:stories15M", "--port", str(port),
           "--ctx-size", "2048", "--chat-template", "chatml", "-t", "2", *extra]
    return live_server("dualpath serve", cmd, f"http://127.0.0.1:{port}", startup_s=240)


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,700"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver, what, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            from selenium.webdriver.common.by import By

            seen = " ".join(f"{i}={driver.find_element(By.ID, i).text!r}" for i in ("model", "status", "speed"))
            seen += f" reply={_reply(driver)[:200]!r}"
            raise AssertionError(f"timed out after {timeout_s:g} s waiting in the page; it shows {seen}")
        time.sleep(0.05)


def _reply(driver) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")
    return found[-1].text if found else ""


def test_the_page_streams_a_reply_stops_one_and_shows_the_speed(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with _serve() as server:
        browser.get(server.base + "/")
        _wait(browser, lambda: "stories15M" in browser.find_element(By.ID, "model").text or
              "synth" in browser.find_element(By.ID, "model").text)
        assert not browser.find_element(By.ID, "key-form").is_displayed()  # no API key on this server
        assert not browser.find_element(By.ID, "attach").is_displayed()  # the model takes no images
        browser.find_element(By.ID, "input").send_keys("Tell me a long story")
        browser.find_element(By.ID, "send").click()
        first = _wait(browser, lambda: _reply(browser))
        # still streaming: more text arrives
        longer = _wait(browser, lambda: len(_reply(browser)) > len(first) + 20 and _reply(browser))
        assert longer.startswith(first)
        assert _wait(browser, lambda: "tok/s" in browser.find_element(By.ID, "speed").text)
        browser.find_element(By.ID, "stop").click()
        _wait(browser, lambda: browser.find_element(By.ID, "status").text == "stopped")
        stopped = _reply(browser)
        time.sleep(1.0)
        assert _reply(browser) == stopped  # nothing more arrives
        assert browser.find_element(By.ID, "send").is_enabled()
        out = Path(os.environ.get("DUALPATH_TEST_ARTIFACTS", tmp_path))
        out.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(out / "webui.png"))
        assert (out / "webui.png").stat().st_size > 10_000
        print(f"\nscreenshot: {out / 'webui.png'}")
        # the server let go of the stopped request
        assert _wait(browser, lambda: "dualpath_running_requests 0" in httpx.get(server.base + "/metrics").text, 30)
        # New chat while a reply streams: the page and the conversation empty, and the cut
        # reply does not come back into the new one
        browser.find_element(By.ID, "input").send_keys("Another long story")
        browser.find_element(By.ID, "send").click()
        _wait(browser, lambda: len(_reply(browser)) > 20)
        browser.find_element(By.ID, "new").click()
        time.sleep(1.0)
        assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []
        assert browser.execute_script("return messages.length") == 0
        browser.find_element(By.ID, "input").send_keys("Hi")
        browser.find_element(By.ID, "send").click()
        _wait(browser, lambda: _reply(browser))
        browser.find_element(By.ID, "stop").click()
        _wait(browser, lambda: browser.find_element(By.ID, "status").text == "stopped")
        roles = browser.execute_script("return messages.map(m => m.role)")
        assert roles == ["user", "assistant"]


def test_with_an_api_key_the_page_asks_for_it(browser):
    from selenium.webdriver.common.by import By

    with _serve("--api-key", "sk-page-test") as server:
        browser.get(server.base + "/")
        _wait(browser, lambda: browser.find_element(By.ID, "key-form").is_displayed())
        browser.find_element(By.ID, "key").send_keys("sk-page-test")
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        _wait(browser, lambda: "context" in browser.find_element(By.ID, "model").text)
        browser.find_element(By.ID, "input").send_keys("Hello")
        browser.find_element(By.ID, "send").click()
        assert _wait(browser, lambda: _reply(browser))
        browser.find_element(By.ID, "stop").click()
        _wait(browser, lambda: browser.find_element(By.ID, "status").text == "stopped")


def test_the_page_makes_no_external_requests_and_has_no_inline_script():
    html = (STATIC / "index.html").read_text()
    for f in STATIC.iterdir():
        text = f.read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, f.name
    assert "<script src=" in html and html.count("<script") == 1  # our one file, no inline script
    js = (STATIC / "chat.js").read_text()
    assert "innerHTML" not in js and "eval(" not in js  # replies go in as text


def test_a_replys_thinking_shows_in_a_block_that_folds_once_the_answer_starts(browser, gguf_path, tmp_path):
    from selenium.webdriver.common.by import By

    from dualpath.bench.common import free_port, live_server
    from tests_shared import THINK_TEMPLATE, write_thinking_gguf

    path = write_thinking_gguf(gguf_path, tmp_path / "think.gguf", THINK_TEMPLATE)
    port = free_port()
    cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", str(path), "--port", str(port),
           "--ctx-size", "256", "-t", "2", "--reasoning-budget", "6"]
    with live_server("dualpath serve", cmd, f"http://127.0.0.1:{port}", startup_s=240) as server:
        browser.get(server.base + "/")
        _wait(browser, lambda: "context" in browser.find_element(By.ID, "model").text)
        browser.find_element(By.ID, "input").send_keys("Once upon a time")
        browser.find_element(By.ID, "send").click()
        _wait(browser, lambda: "tokens" in browser.find_element(By.ID, "status").text)
        reply = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
        block = reply.find_element(By.CSS_SELECTOR, "details.thinking")
        thought = block.find_element(By.CSS_SELECTOR, ".thought").get_attribute("textContent")
        answer = reply.find_element(By.CSS_SELECTOR, "span").text
        assert thought.strip() and answer.strip() and "think>" not in thought + answer
        assert block.get_attribute("open") is None  # folded once the answer came
        assert block.find_element(By.TAG_NAME, "summary").text == "Thoughts"
        block.find_element(By.TAG_NAME, "summary").click()
        assert block.get_attribute("open") is not None
        assert _wait(browser, lambda: block.find_element(By.CSS_SELECTOR, ".thought").text.strip())
        # the conversation sent back holds the answer alone
        sent = browser.execute_script("return messages.map(m => m.content)")
        assert sent[0] == "Once upon a time" and sent[1].strip() == answer.strip() and len(sent) == 2


def test_an_image_attached_in_the_page_goes_with_the_message(browser, tmp_path):
    """On a server with a projector (--mmproj) the page offers Image: the picked file shows as a
    thumbnail, goes with the next message as an ``image_url`` part, and is encoded."""
    pytest.importorskip("PIL", reason="the [vision] extra (Pillow) decodes images")
    import numpy as np
    from PIL import Image
    from selenium.webdriver.common.by import By

    from dualpath.bench.common import free_port, live_server
    from dualpath.models.synth_vision import synth_mmproj, synth_text

    text = synth_text(tmp_path / "text.gguf", "smolvlm-tiny", "F16")
    mmproj = synth_mmproj(tmp_path / "mmproj.gguf", "smolvlm-tiny", "F16")
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (60, 90, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    port = free_port()
    cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", str(text), "--mmproj", str(mmproj),
           "--port", str(port), "--ctx-size", "512", "--chat-template", "chatml", "-t", "2"]
    with live_server("dualpath serve", cmd, f"http://127.0.0.1:{port}", startup_s=240) as server:
        browser.get(server.base + "/")
        _wait(browser, lambda: browser.find_element(By.ID, "attach").is_displayed())
        browser.find_element(By.ID, "image-file").send_keys(str(tmp_path / "a.png"))
        _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#attached img.thumb"))
        browser.find_element(By.ID, "input").send_keys("What is in this picture?")
        browser.find_element(By.ID, "send").click()
        _wait(browser, lambda: "tokens" in browser.find_element(By.ID, "status").text)
        assert browser.find_elements(By.CSS_SELECTOR, ".msg.user img.thumb")
        assert browser.find_elements(By.CSS_SELECTOR, "#attached img.thumb") == []  # it went with the message
        content = browser.execute_script("return messages[0].content")
        assert [p["type"] for p in content] == ["image_url", "text"]
        assert content[0]["image_url"]["url"].startswith("data:image/png;base64,")
        assert browser.execute_script("return messages[1].role") == "assistant"
        metrics = httpx.get(server.base + "/metrics").text
        seconds = next(line for line in metrics.splitlines() if line.startswith("dualpath_image_encoder_seconds_total"))
        assert float(seconds.split()[1]) > 0
