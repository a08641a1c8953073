"""What the browser tests and the screenshot script share: Debian's Chromium under Selenium,
bounded waits, and real runs that put jobs in a store.

The browser is ``/usr/bin/chromium`` driven through ``/usr/bin/chromedriver`` (Debian's
``chromium`` and ``chromium-driver`` packages, which ``.ci/run`` installs when missing).
Both paths are given to Selenium explicitly, so Selenium Manager never runs and nothing is
downloaded at test time; ``SE_OFFLINE`` forbids it in case a later Selenium changes that.

Jobs come from real runs: ``tests/harness/node.py`` processes, each a Runner on the real
store (a quick answer, a slow stream, or a hung owner that a follower takes over).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.harness.node import Cluster, NodeProcess
from tests.harness.ui_server import UIServer

__all__ = [
    "CHROMEDRIVER",
    "CHROMIUM",
    "MISSING_BROWSER",
    "MNP",
    "RENEW",
    "TTL",
    "WAIT_S",
    "StartUI",
    "click",
    "console_errors",
    "finish",
    "missing_browser",
    "run_ok",
    "run_takeover",
    "start_browser",
    "start_slow",
    "wait_for",
]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MISSING_BROWSER = (
    "the browser tests need Debian's Chromium and its driver ({missing} missing): "
    "apt-get install chromium chromium-driver (.ci/run does this when they are missing)"
)
WAIT_S = 15.0  # generous: CI machines are loaded
TTL, RENEW, MNP = 2.0, 0.5, 1.0  # the timeline tests' compressed lease (tests/test_timeline.py)
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage")

T = TypeVar("T")
StartUI = Callable[..., UIServer]
"""The ``start_ui`` fixture: ``start_ui(store_url, token=None)`` -> a running server."""


def missing_browser() -> list[str]:
    """The browser binaries that are not there (or not executable)."""
    return [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]


def start_browser(width: int = 1280, height: int = 900) -> WebDriver:
    """A headless Chromium of ``width`` x ``height``; RuntimeError if the binaries are missing."""
    missing = missing_browser()
    if missing:
        raise RuntimeError(MISSING_BROWSER.format(missing=", ".join(missing)))
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager, if ever run, must not download
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for console_errors()
    for flag in (*FLAGS, f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    return driver


def wait_for(
    driver: WebDriver, condition: Callable[[WebDriver], T], what: str, timeout: float = WAIT_S
) -> T:
    """Poll ``condition(driver)`` until it is truthy and return it; fail naming ``what``
    with the page's URL and the start of its text. An element missing or replaced (a
    navigation or a live update in between) counts as not yet."""
    ignored = (NoSuchElementException, StaleElementReferenceException)
    try:
        waiting = WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored)
        return waiting.until(condition)
    except TimeoutException:
        text = _page_text(driver)
        raise AssertionError(
            f"timed out after {timeout:g}s waiting for {what} on {driver.current_url}\n{text}"
        ) from None


def click(driver: WebDriver, css: str, what: str) -> None:
    """Find the element ``css`` names and click it, again if a live update replaced it in
    between (a stale element, seen on a loaded machine): the click lands once."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    wait_for(driver, clicked, what)


def console_errors(driver: WebDriver) -> list[str]:
    """The browser console's errors since the last call (a script error, a CSP violation, a
    failed request), but the favicon no page links to."""
    entries = driver.get_log("browser")
    return [
        str(e["message"])
        for e in entries
        if e.get("level") == "SEVERE" and "favicon.ico" not in str(e.get("message"))
    ]


def _page_text(driver: WebDriver) -> str:
    try:
        body: Any = driver.execute_script("return document.body ? document.body.innerText : ''")
    except Exception as exc:  # the page may be mid-navigation: the message is what matters
        return f"(page text unavailable: {exc})"
    return str(body)[:2000]


def _cluster(store_url: str, key: str, directory: Path) -> Cluster:
    directory.mkdir(parents=True, exist_ok=True)
    return Cluster(store_url, key, directory, ttl=TTL, renew=RENEW, mnp=MNP)


async def run_ok(store_url: str, key: str, directory: Path, node: str = "A") -> None:
    """Run job ``key`` to DONE in one real node process (answer ``answer from NODE``)."""
    async with _cluster(store_url, key, directory) as cluster:
        owner = await cluster.start(node, "ok")
        code = await owner.exited()
        assert code == 0, f"node {node} exited with {code}\n{owner.dump()}"


async def start_slow(
    store_url: str, key: str, directory: Path, seconds: float, node: str = "A"
) -> tuple[Cluster, NodeProcess]:
    """Start job ``key`` streaming slowly (but progressing) for ``seconds``; return once it
    owns the job. The caller closes the cluster (which kills the node)."""
    cluster = _cluster(store_url, key, directory)
    owner = await cluster.start(node, "slow", extra=("--slow-for", str(seconds)))
    try:
        await owner.wait_for_event("acquired", f"{node} to own {key}")
    except BaseException:
        await cluster.aclose()
        raise
    return cluster, owner


async def run_takeover(store_url: str, key: str, directory: Path, *, go: bool = True) -> Cluster:
    """The seed's timeline for job ``key``: owner A hangs in the model call and stalls, B
    (already following) takes over with a higher token and commits, A's late write with
    its old fence is rejected. Returns the cluster once A owns the job; ``finish`` it. With
    ``go=False`` B is held back until the test calls ``cluster.go()`` (A's late write waits
    for B's takeover), so a page opened first sees the takeover happen."""
    cluster = _cluster(store_url, key, directory)
    try:
        await cluster.start("B", "ok", wait_for_go=True)
        owner = await cluster.start("A", "hang-async")
        await owner.wait_for_event("acquired", "A to own the job")
    except BaseException:
        await cluster.aclose()
        raise
    if go:
        cluster.go()
    return cluster


async def finish(cluster: Cluster) -> None:
    """Wait until every node of ``cluster`` exited 0 (fail with their histories if not)."""
    for node in cluster.nodes.values():
        code = await node.exited()
        assert code == 0, f"node {node.name} exited with {code}\n{cluster.dump()}"
