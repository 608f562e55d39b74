"""A page as a person sees it: headless Chromium driven over the DevTools protocol (websockets), for the report's
tests. ``open_page`` loads a file, collects console errors and uncaught exceptions, evaluates JavaScript in it and
takes a screenshot."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from websockets.sync.client import connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Page:
    def __init__(self, ws):
        self._ws, self._ids = ws, itertools.count(1)
        self.errors: list[str] = []  # console errors, failed loads and uncaught exceptions, in order
        self._events: list[dict] = []

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self._ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self._event(msg)

    def wait_for(self, event: str, timeout: float = 30) -> dict:
        for i, e in enumerate(self._events):
            if e["method"] == event:
                return self._events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self._ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if msg.get("method") == event:
                return msg
            self._event(msg)

    def evaluate(self, expression: str, timeout: float = 30):
        """The value of a JavaScript expression (awaited when it is a promise)."""
        result = self.call("Runtime.evaluate", timeout, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def _event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append("console: " + " ".join(str(a.get("value")) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method:
            self._events.append(msg)


@contextmanager
def open_page(path: Path, width: int = 1280, height: int = 900) -> Iterator[Page]:
    """``path`` loaded in headless Chromium (listening from before the page starts, so nothing is missed)."""
    with tempfile.TemporaryDirectory(prefix="longboat-chromium-") as profile:
        proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--mute-audio",
             "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}",
             "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            port = _devtools_port(Path(profile), proc)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                target = next(t for t in json.load(r) if t["type"] == "page")
            with connect(target["webSocketDebuggerUrl"], max_size=None, proxy=None) as ws:
                page = Page(ws)
                for domain in ("Page", "Runtime", "Log"):
                    page.call(f"{domain}.enable")
                page.call("Page.navigate", url=path.resolve().as_uri())
                page.wait_for("Page.loadEventFired")
                yield page
        finally:
            proc.kill()
            proc.wait(10)


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout: float = 30) -> int:
    """The port Chromium chose, from the file it writes in its profile once it listens."""
    deadline = time.monotonic() + timeout
    file = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if file.is_file() and file.read_text().strip():
            return int(file.read_text().split()[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"chromium did not start listening within {timeout} s")
