"""Renders pages of the built site with headless chromium, writes full-page screenshots and checks
that nothing is cut at the right edge: no code block, table or other block of the page's content
is wider than its box or reaches past the content column.

    python docs/shots.py [--site DIR] [--out DIR] [--width PX]   # make docs-shots

Builds the site (`mkdocs build --strict`) unless --site names a built one. Writes OUT/<page>.png
and OUT/report.json; exits 1 listing every overflow. Needs chromium (apt-get install chromium).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
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

# Run in the page once it has loaded: every block of the content that is wider than its box or
# ends past the content column, and the page's height. The result replaces the page's body text
# so that --dump-dom carries it.
CHECK = r"""
<script>
window.addEventListener("load", () => {
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
  const report = {cut: cut, height: document.documentElement.scrollHeight};
  const out = document.createElement("pre");
  out.id = "shots-report";
  out.textContent = JSON.stringify(report);
  document.body.appendChild(out);
});
</script>
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("docs/shots.py needs chromium: apt-get install chromium")


def _browser(args: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


def check_page(site: Path, page: str, width: int) -> dict:
    """The page's overflow report at `width` CSS pixels (from a copy with CHECK injected)."""
    src = site / page
    probe = src.with_name("shots-probe.html")
    probe.write_text(src.read_text().replace("</body>", CHECK + "</body>"))
    try:
        size = f"--window-size={width},900"
        proc = _browser([size, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()])
    finally:
        probe.unlink()
    found = re.search(r'<pre id="shots-report">(.*?)</pre>', proc.stdout, re.S)
    if not found:
        raise RuntimeError(f"{page}: no report from chromium: {proc.stderr[-2000:]}")
    import html

    return json.loads(html.unescape(found.group(1)))


def screenshot(site: Path, page: str, width: int, height: int, png: Path) -> None:
    _browser([f"--window-size={width},{height}", f"--screenshot={png}", (site / page).as_uri()])
    if not png.exists():
        raise RuntimeError(f"{page}: chromium wrote no screenshot")


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
        for name, page in PAGES.items():
            res = check_page(site, page, args.width)
            report[name] = res
            for c in res["cut"]:
                where = f"{c['scroll']} > {c['client']} px, ends at {c['right']:.0f} of {c['column']:.0f}"
                problems.append(f"{name}: a {c['tag']} is cut ({where}): {c['text']!r}")
            screenshot(site, page, args.width, min(res["height"], 16000), out / f"{name}.png")
            print(f"{name}: {res['height']} px tall, {len(res['cut'])} cut; {out / (name + '.png')}")
    (out / "report.json").write_text(json.dumps(report, indent=1))
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
