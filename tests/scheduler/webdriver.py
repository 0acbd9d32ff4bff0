"""A minimal W3C WebDriver client over httpx for Debian's headless Chromium (chromium + chromium-driver).

Enough for the dashboard's browser tests and screenshots: open a page, fill and click, read text,
run a script, take a screenshot. No Selenium needed: WebDriver is HTTP and JSON.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.net import free_port

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
CHROMIUM = "/usr/bin/chromium"


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return "no Chromium (apt-get install chromium chromium-driver)"
    if shutil.which("chromedriver") is None:
        return "no chromedriver (apt-get install chromium-driver)"
    return None


class Browser:
    def __init__(self, http: httpx.Client, session: str) -> None:
        self.http, self.session = http, session

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        resp = self.http.request(method, f"/session/{self.session}{path}", json=body)
        value = resp.json().get("value")
        if resp.status_code >= 400:
            raise AssertionError(f"webdriver {method} {path}: {value}")
        return value

    def get(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    @property
    def url(self) -> str:
        return str(self._call("GET", "/url"))

    def find(self, css: str) -> str:
        return str(self._call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT])

    def find_all(self, css: str) -> list[str]:
        return [str(e[ELEMENT]) for e in self._call("POST", "/elements", {"using": "css selector", "value": css})]

    def type(self, css: str, text: str) -> None:
        element = self.find(css)
        self._call("POST", f"/element/{element}/clear", {})
        self._call("POST", f"/element/{element}/value", {"text": text})

    def click(self, css: str) -> None:
        self._call("POST", f"/element/{self.find(css)}/click", {})

    def text(self, css: str = "body") -> str:
        return str(self._call("GET", f"/element/{self.find(css)}/text"))

    def script(self, source: str, *args: Any) -> Any:
        return self._call("POST", "/execute/sync", {"script": source, "args": list(args)})

    def set_window(self, width: int, height: int) -> None:
        self._call("POST", "/window/rect", {"width": width, "height": height})

    def screenshot(self, path: Path, *, full_page: bool = True) -> None:
        if full_page:  # grow the window to the page so one PNG shows all of it
            height = int(self.script("return document.documentElement.scrollHeight"))
            width = int(self.script("return window.outerWidth"))
            self.set_window(width, min(max(height + 140, 600), 2200))
        path.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))

    def wait_for(self, predicate: Callable[[], object], what: str, timeout: float = 30.0) -> None:
        """Poll the page until ``predicate`` holds (the page's own timer is the event)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def chromium(width: int = 1280, height: int = 900, args: tuple[str, ...] = ()) -> Iterator[Browser]:
    """A headless Chromium session through a chromedriver process of its own (``args``: more switches)."""
    port = free_port()
    driver = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.get("/status").json()["value"]["ready"]:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or driver.poll() is not None:
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.05)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--hide-scrollbars", *args]}}}}
        resp = http.post("/session", json=caps)
        if resp.status_code >= 400:
            raise RuntimeError(f"chromedriver refused a session: {resp.text[:500]}")
        session = resp.json()["value"]["sessionId"]
        browser = Browser(http, session)
        try:
            yield browser
        finally:
            http.delete(f"/session/{session}")
    finally:
        http.close()
        driver.terminate()
        driver.wait(timeout=10)
