"""A headless Chromium driven over the Chrome DevTools Protocol (websocket-client), for the HTML report test.

Why CDP and not Selenium: one small pure-Python dependency (``websocket-client``), no driver binary whose
version must match the browser, and direct access to console messages, exceptions and screenshots.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """``$CHROME_BIN`` or the first Chromium/Chrome on PATH."""
    candidates = [os.environ.get("CHROME_BIN")] + [shutil.which(name) for name in BROWSERS]
    return next((c for c in candidates if c and Path(c).exists()), None)


def require_browser() -> str:
    """The browser for a test: skip without one, fail instead when ``MEDHEVAL_REQUIRE_BROWSER`` is set (CI);
    skip when websocket-client (the test extra that drives it over CDP) is missing."""
    import pytest

    executable = find_browser()
    if executable is None:
        if os.environ.get("MEDHEVAL_REQUIRE_BROWSER"):
            pytest.fail("MEDHEVAL_REQUIRE_BROWSER is set and no Chromium was found (apt-get install chromium)")
        pytest.skip("no Chromium/Chrome on PATH or $CHROME_BIN (Debian: apt-get install chromium)")
    pytest.importorskip("websocket", reason="websocket-client (the test extra) drives the browser over CDP")
    return executable


class Browser:
    """One headless browser with one page; ``events`` collects every CDP event received."""

    def __init__(self, executable: str, timeout: float = 30.0):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="medheval-chromium-")
        self.process = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1280,900",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError(f"{executable} did not start (no DevToolsActivePort after {timeout}s)")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as response:
            pages = [t for t in json.load(response) if t.get("type") == "page"]
        self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=timeout)
        self.events: list[dict[str, Any]] = []
        self._id = 0
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.socket.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and wait for the load event."""
        start = len(self.events)
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events[start:]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in {timeout}s")
            self.events.append(json.loads(self.socket.recv()))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[dict[str, Any]]:
        """Console errors, uncaught exceptions and browser log errors (e.g. a blocked request)."""
        return [e for e in self.events if e.get("method") == "Runtime.exceptionThrown"
                or e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert")
                or e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error"]

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
