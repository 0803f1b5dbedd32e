"""Renders pages of the built site with headless chromium, writes full-page screenshots and checks
that nothing is cut at the right edge: no code block, table or other block of the page's content
is wider than its box or reaches past the content column.

    python docs/shots.py [--site DIR] [--out DIR] [--width PX]   # make docs-shots

Builds the site (`mkdocs build --strict`) unless --site names a built one. Writes OUT/<page>.png
and OUT/report.json; exits 1 listing every overflow. Needs chromium (apt-get install chromium).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = {
    "index": "index.html",
    "figures": "figures/index.html",
    "reference": "reference/pyddstore/index.html",
    "reference-torch": "reference/torch/index.html",
    "install": "install/index.html",
    "security": "security/index.html",
    "developer": "developer/index.html",
}

# Evaluated in the page once it has loaded: every block of the content that is wider than its box
# or ends past the content column, and the page's height.
CHECK = r"""
(() => {
  const column = document.querySelector(".md-content").getBoundingClientRect();
  const cut = [];
  const blocks = ".md-content__inner pre, .md-content__inner pre > code, .md-content__inner table, " +
    ".md-content__inner img, " +
    ".md-content__inner .md-typeset__scrollwrap, .md-content__inner .highlight, .md-content__inner p";
  for (const el of document.querySelectorAll(blocks)) {
    const box = el.getBoundingClientRect();
    const wide = el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== "visible";
    if (wide || box.right > column.right + 1) {
      cut.push({tag: el.tagName.toLowerCase(), text: el.textContent.trim().slice(0, 80),
                scroll: el.scrollWidth, client: el.clientWidth, right: box.right, column: column.right});
    }
  }
  return {cut: cut, height: document.documentElement.scrollHeight};
})()
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("docs/shots.py needs chromium: apt-get install chromium")


class Browser:
    """One headless chromium for every page (a launch costs more CPU than rendering a page), driven
    through the DevTools protocol on its pipe: JSON messages, each ended by a NUL byte, written to
    its descriptor 3 and read from its descriptor 4."""

    def __init__(self, timeout: float = 180):
        self.timeout = timeout
        to_browser, self._out = os.pipe()
        self._in, from_browser = os.pipe()
        self._log = tempfile.TemporaryFile()
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
        ]
        cmd = ["sh", "-c", f'exec "$@" 3<&{to_browser} 4>&{from_browser}', "sh", chromium(), *flags]
        self._proc = subprocess.Popen(
            cmd,
            pass_fds=(to_browser, from_browser),
            stdout=self._log,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id, self._session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if not select.select([self._in], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise RuntimeError(f"chromium did not answer within {self.timeout} s{self._stderr()}")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited{self._stderr()}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _stderr(self) -> str:
        self._log.seek(0)
        return ": " + self._log.read().decode(errors="replace")[-2000:]

    def call(self, method: str, until_event: str | None = None, **params) -> dict:
        """Sends one command and returns its result; with `until_event`, first waits for that event
        of the page too (e.g. Page.loadEventFired after Page.navigate)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self._session:
            message["sessionId"] = self._session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        result, seen = None, until_event is None
        while result is None or not seen:
            m = self._message(deadline)
            if m.get("id") == self._next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                result = m["result"]
            seen = seen or m.get("method") == until_event
        return result

    def show(self, url: str, width: int, height: int) -> None:
        """Loads `url` in a window of `width` x `height` CSS pixels."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.call("Page.navigate", until_event="Page.loadEventFired", url=url)

    def close(self) -> None:
        try:
            self._session = None
            self.call("Browser.close")
        except RuntimeError:
            pass  # it may exit before its answer
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._in)
        os.close(self._out)
        self._log.close()


def check_page(browser: Browser, site: Path, page: str, width: int) -> dict:
    """The page's overflow report at `width` CSS pixels."""
    browser.show((site / page).as_uri(), width, 900)
    found = browser.call("Runtime.evaluate", expression=CHECK, returnByValue=True)
    if "exceptionDetails" in found:
        raise RuntimeError(f"{page}: the check failed in the page: {found['exceptionDetails']}")
    return found["result"]["value"]


def screenshot(browser: Browser, site: Path, page: str, width: int, height: int, png: Path) -> None:
    browser.show((site / page).as_uri(), width, height)
    png.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", help="a built site (default: build one with mkdocs build --strict)")
    ap.add_argument("--out", default="site/shots", help="where the PNGs and report.json go")
    ap.add_argument("--width", type=int, default=1280, help="window width in CSS pixels")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(args.site) if args.site else Path(tmp) / "site"
        if not args.site:
            cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)]
            subprocess.run(cmd, cwd=ROOT, check=True, timeout=600)
        report, problems = {}, []
        browser = Browser()
        try:
            for name, page in PAGES.items():
                res = check_page(browser, site, page, args.width)
                report[name] = res
                for c in res["cut"]:
                    where = f"{c['scroll']} > {c['client']} px, ends at {c['right']:.0f} of {c['column']:.0f}"
                    problems.append(f"{name}: a {c['tag']} is cut ({where}): {c['text']!r}")
                screenshot(browser, site, page, args.width, min(res["height"], 16000), out / f"{name}.png")
                print(f"{name}: {res['height']} px tall, {len(res['cut'])} cut; {out / (name + '.png')}")
        finally:
            browser.close()
    (out / "report.json").write_text(json.dumps(report, indent=1))
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
