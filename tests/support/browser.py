"""A real headless Chromium, driven by Selenium, for the web console's tests
(tests/ha/test_console.py).

Debian's Chromium and ChromeDriver (`make test-deps` installs them) are named explicitly,
so Selenium never downloads a browser or a driver. Each Browser has its own fresh profile.

    browser = Browser(tmp_path)
    browser.open_console(admin_address, ("user", "password"))
    browser.wait_text("#served-by", "primary")
    browser.click('#destinations tr[data-destination="/queue/a"] [data-action="purge"]')
    browser.accept_confirm()
    browser.close()

Logging in: the page is opened at http://USER:PASSWORD@HOST:PORT/, which puts the
credentials in the browser's HTTP auth cache for that server, as a person typing them in
the browser's login prompt does; the page's own fetch() calls then send them from that
cache. So the tests log in the way a browser really does, not with a header forced on
every request.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from tests.support.admin import ADMIN
from tests.support.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# known to work as root on a closed network: no sandbox, no GPU, nothing fetched
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--disable-extensions", "--mute-audio",
         "--no-default-browser-check", "--password-store=basic")
WINDOW = (1280, 1000)
WAIT_S = 20.0  # a console refreshes every 2 s; a slow shared machine may take several

T = TypeVar("T")


def missing() -> str | None:
    """Why the browser cannot run here (None when it can)."""
    lacking = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if lacking:
        return (f"{' and '.join(lacking)} missing: `make test-deps` installs Debian's "
                f"chromium and chromium-driver")
    return None


class Browser:
    def __init__(self, workdir: Path, size: tuple[int, int] = WINDOW) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=workdir))
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self.profile}")
        options.add_argument(f"--window-size={size[0]},{size[1]}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.log_path = workdir / "chromedriver.log"
        service = Service(executable_path=CHROMEDRIVER, log_output=str(self.log_path))
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(30)

    # ------------------------------------------------------------ pages

    def open_console(self, admin: str, credentials: tuple[str, str] = ADMIN) -> None:
        """Open the console of the server whose management port is `admin`, logged in
        as `credentials`, and wait until the page has shown its first answer."""
        user, password = (urllib.parse.quote(part, safe="") for part in credentials)
        self.driver.get(f"http://{user}:{password}@{admin}/")
        self.wait(lambda: self.attribute("#poll-status", "data-ok") in ("true", "false"),
                  "the console's first refresh")

    def mark(self) -> None:
        """Leave a mark in the page's window: `marked()` is False once the page reloads."""
        self.driver.execute_script("window.__consoleTestMark = true;")

    def marked(self) -> bool:
        return bool(self.driver.execute_script("return window.__consoleTestMark === true;"))

    # ------------------------------------------------------------ reading

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        """The visible text of the first element matching `css` ("" if there is none)."""
        try:
            return self.find(css).text
        except (NoSuchElementException, StaleElementReferenceException):
            return ""

    def attribute(self, css: str, name: str) -> str | None:
        try:
            return self.find(css).get_attribute(name)
        except (NoSuchElementException, StaleElementReferenceException):
            return None

    def wait(self, predicate: Callable[[], T], what: str, timeout: float = WAIT_S) -> T:
        """Poll `predicate` (in the test, against the live page) until it is truthy."""
        def look() -> T | None:
            try:
                return predicate()
            except (NoSuchElementException, StaleElementReferenceException):
                return None  # the page changed under the look: look again

        try:
            return wait_until(look, f"the console to show {what}", timeout, interval=0.1)
        except TimeoutError:
            raise AssertionError(f"the console did not show {what} within {timeout} s; "
                                 f"it shows:\n{self.page_text()}\n{self.console_log()}") from None

    def wait_text(self, css: str, text: str, timeout: float = WAIT_S) -> str:
        """Wait until the element matching `css` shows `text`; returns all its text."""
        return self.wait(lambda: (shown := self.text(css)) and text in shown and shown,
                         f"{text!r} in {css}", timeout)

    def wait_exact(self, css: str, text: str, timeout: float = WAIT_S) -> None:
        """Wait until the element matching `css` shows exactly `text` (a number, a state)."""
        self.wait(lambda: self.text(css) == text, f"exactly {text!r} in {css}", timeout)

    def page_text(self) -> str:
        try:
            return self.find("body").text
        except Exception as e:  # a diagnostic only
            return f"(no page text: {e})"

    def console_log(self) -> str:
        """What the page's scripts logged (errors included), for assertion messages."""
        try:
            entries: list[dict[str, Any]] = self.driver.get_log("browser")
        except Exception as e:  # a diagnostic only
            return f"(no browser log: {e})"
        return "\n".join(f"browser {e.get('level')}: {e.get('message')}" for e in entries)

    # ------------------------------------------------------------ acting

    def click(self, css: str) -> None:
        element = self.wait(lambda: self.find(css), f"an element {css}")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
        element.click()

    def type_into(self, css: str, text: str) -> None:
        element = self.find(css)
        element.clear()
        element.send_keys(text)

    def accept_confirm(self, timeout: float = 10.0) -> str:
        """Accept the confirm() dialog the page opened; returns its question."""
        def dialog() -> Any:
            try:
                return self.driver.switch_to.alert
            except NoAlertPresentException:
                return None

        alert = self.wait(dialog, "a confirmation dialog", timeout)
        question = str(alert.text)
        alert.accept()
        return question

    def screenshot(self, path: Path, down_to: str | None = None) -> Path:
        """A PNG of the window; with `down_to` (a CSS selector), the window is made tall
        enough for the page down to that element first, and put back afterwards."""
        path.parent.mkdir(parents=True, exist_ok=True)
        size = self.driver.get_window_size()
        if down_to is not None:
            self.driver.execute_script("window.scrollTo(0, 0);")
            bottom = self.driver.execute_script(
                "return Math.ceil(arguments[0].getBoundingClientRect().bottom);",
                self.find(down_to))
            chrome = self.driver.execute_script(
                "return window.outerHeight - window.innerHeight;")
            self.driver.set_window_size(size["width"], int(bottom) + int(chrome) + 16)
        try:
            if not self.driver.save_screenshot(str(path)):
                raise AssertionError(f"the browser did not write a screenshot to {path}")
        finally:
            if down_to is not None:
                self.driver.set_window_size(size["width"], size["height"])
        return path

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


__all__ = ["Browser", "TimeoutException", "missing"]
