"""The page of `mt serve` in a real browser: headless Chromium driven by Selenium through the system chromedriver
(`make browser-test` installs both from Debian; without them this test skips)."""

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="no chromium and chromedriver (make "
                                                                          "browser-test installs them)")

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from .test_app import free_port, serve_app  # noqa: E402

SENTENCE = "die katze sitzt auf dem roten baum"


@pytest.fixture
def server(checkpoint):  # noqa: F811
    app = serve_app(checkpoint)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_the_page_translates_as_the_api_does_and_draws_the_attention(server, browser):
    api = httpx.post(f"{server}/v1/translate", json={"text": [SENTENCE]}).json()["translations"][0]["text"]
    attention = httpx.post(f"{server}/v1/attention", json={"text": SENTENCE}).json()
    browser.get(server + "/")
    wait = WebDriverWait(browser, 20)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#model option"))
    browser.find_element(By.ID, "input").send_keys(SENTENCE)
    wait.until(lambda b: b.find_element(By.ID, "output").text.strip())
    assert browser.find_element(By.ID, "output").text == api
    rows = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#heatmap tbody tr"))
    assert [row.find_element(By.TAG_NAME, "th").text for row in rows] == attention["target"]  # a row per piece
    assert len(rows[0].find_elements(By.TAG_NAME, "td")) == len(attention["source"])
    if os.environ.get("MT_SCREENSHOT"):
        browser.save_screenshot(str(Path(os.environ["MT_SCREENSHOT"])))
