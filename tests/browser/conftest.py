"""Fixtures of the browser tests: one headless Chromium per session, and dashboards.

A missing Chromium or chromedriver FAILS these tests (never a skip): CI installs both
(``.ci/run``), and a developer gets the one ``apt-get`` line that brings them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver

from tests.browser.support import MISSING_BROWSER, StartUI, missing_browser, start_browser
from tests.harness.ui_server import UIServer


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium (1280 x 900) for the whole session."""
    missing = missing_browser()
    if missing:
        pytest.fail(MISSING_BROWSER.format(missing=", ".join(missing)), pytrace=False)
    driver = start_browser()
    yield driver
    driver.quit()


@pytest.fixture
def page(browser: WebDriver) -> Iterator[WebDriver]:
    """The session's browser, its console log drained (``console_errors`` sees this test's
    only), left on a blank page with no cookies after the test."""
    browser.get_log("browser")
    yield browser
    browser.get("about:blank")
    browser.execute_cdp_cmd("Network.clearBrowserCookies", {})


@pytest.fixture
def start_ui(page: WebDriver, tmp_path: Path) -> Iterator[StartUI]:
    """``start_ui(store_url, token=None)``: a running ``ai-lease ui`` on that store, stopped
    after the test (the browser leaves its pages first, so no live stream stays open)."""
    servers: list[UIServer] = []

    def start(store_url: str, *, token: str | None = None) -> UIServer:
        server = UIServer(store_url, tmp_path, token=token)
        servers.append(server)
        return server.start()

    yield start
    page.get("about:blank")
    for server in servers:
        server.stop()
