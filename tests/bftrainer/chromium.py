"""A real headless Chromium, driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes Chromium read JSON commands, each ending in a NUL
byte, from its file descriptor 3 and write replies and events to descriptor 4: the
standard library is enough, with no WebDriver or browser download. Tests look at a page
as a person would: did it load without console errors, did every image decode, what
does it look like.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")
TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    """Chromium replied with an error, exited, or did not answer in time."""


class Chromium:
    """One headless browser with one page (a tab), for ``with`` blocks."""

    def __init__(self, executable: str, width: int = 1100, height: int = 900) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="bftrainer-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [
            executable,
            "--headless",
            "--remote-debugging-pipe",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={self._profile.name}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with one
        # The child's fds 3 and 4 are the pipe's ends (dup2'd before exec).
        self.process = subprocess.Popen(
            args,
            pass_fds=(3, 4),
            preexec_fn=lambda: (os.dup2(to_browser_r, 3), os.dup2(from_browser_w, 4)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=self.session)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout_s=10.0)
        except BrowserError:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()

    # ---- the protocol -----------------------------------------------------------------

    def call(
        self,
        method: str,
        *,
        session: str | None = None,
        timeout_s: float = TIMEOUT_S,
        **params: Any,
    ) -> dict[str, Any]:
        """Send a command; its result (events that arrive meanwhile go to ``events``)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
        """The first event ``method`` (already received, or arriving within the time)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for e in self.events:
                if e.get("method") == method:
                    return e
            self.events.append(self._read(deadline, method))

    def _read(self, deadline: float, what: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no answer to {what} in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (status {self.process.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(message))

    # ---- what a test asks -------------------------------------------------------------

    def open(self, path: Path) -> None:
        """Load a local file and wait for its load event."""
        self.call("Page.navigate", session=self.session, url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value (promises awaited)."""
        result = self.call(
            "Runtime.evaluate",
            session=self.session,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen so far."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(params["exceptionDetails"].get("text")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                out.append(" ".join(str(a.get("value")) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                out.append(str(params["entry"].get("text")))
        return out

    def screenshot(self, width: int = 1100) -> bytes:
        """A PNG of the whole page, as wide as ``width`` CSS pixels."""
        size = self.call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
        height = int(size["height"]) + 1
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session=self.session,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = self.call("Page.captureScreenshot", session=self.session, format="png")
        return base64.b64decode(shot["data"])
