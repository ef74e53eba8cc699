"""Screenshots of the documentation site in a headless browser, and a check that nothing is cut.

Builds the site (``mkdocs build --strict``) into a temporary folder, serves it on localhost, opens
each page in headless Chromium (Playwright driving the system's ``chromium``) at a window of
``--width`` pixels, and for every table and code block measures whether its content is wider than
the column that shows it (``scrollWidth > clientWidth`` of the element or of the theme's scroll
wrapper, and of a code block's inner ``code``, which the theme scrolls): such an element is cut,
or needs a scroll bar. Writes a full-page PNG per page and a
JSON of the measurements; exits 1 when an element is cut.

    python tools/docs_screenshots.py --out results/docs          # Home, Getting started, a results page
    python tools/docs_screenshots.py --out /tmp/shots --all      # and measure every other page

Needs the ``docs`` extra, ``pip install playwright`` and a Chromium (``apt install chromium``,
or ``--browser PATH``); nothing is downloaded.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"home": "", "getting_started": "getting_started/", "voting_dpfl": "voting_dpfl/"}

#: per table / code block: its own and its scroll wrapper's content width against the width shown
MEASURE = """() => [...document.querySelectorAll('table, pre')].map(e => {
  const boxes = [e, e.closest('.md-typeset__scrollwrap, .wy-table-responsive'),
                 e.querySelector(':scope > code')].filter(b => b);
  const cut = boxes.some(b => b.scrollWidth > b.clientWidth + 1);
  return {tag: e.tagName.toLowerCase(), content_px: Math.max(...boxes.map(b => b.scrollWidth)),
          shown_px: Math.min(...boxes.map(b => b.clientWidth)), cut: cut,
          text: e.innerText.slice(0, 60)};
})"""


def build(config: Path, site: Path) -> None:
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f",
                    str(config), "-d", str(site)], check=True,
                   env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the PNGs and screenshots.json")
    ap.add_argument("--width", type=int, default=1600, help="window width in px (default 1600)")
    ap.add_argument("--browser", default="/usr/bin/chromium", help="the Chromium executable")
    ap.add_argument("--all", action="store_true", help="also measure every other page of the "
                    "site (screenshots of the three named pages only)")
    ap.add_argument("--config", default=str(ROOT / "mkdocs.yml"),
                    help="the mkdocs.yml to build (default: the repository's)")
    args = ap.parse_args(argv)
    if args.width < 320:
        ap.error(f"--width must be at least 320 px, got {args.width}")
    if not Path(args.browser).is_file():
        ap.error(f"--browser: no Chromium at {args.browser} (apt install chromium)")
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"width_px": args.width, "pages": {}}
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        build(Path(args.config), site)
        server, url = serve(site)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.browser, args=[
                    "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
                page = browser.new_page(viewport={"width": args.width, "height": 1000})
                pages = dict(PAGES)
                if args.all:
                    pages.update({str(f.parent.relative_to(site)): f"{f.parent.relative_to(site)}/"
                                  for f in sorted(site.rglob("index.html"))
                                  if f.parent != site and "search" not in f.parts})
                for name, path in pages.items():
                    page.goto(url + path, wait_until="load")
                    elements = page.evaluate(MEASURE)
                    png = None
                    if name in PAGES:
                        png = out / f"{name}_{args.width}px.png"
                        page.screenshot(path=str(png), full_page=True)
                    report["pages"][name] = {"url_path": path, "png": png and png.name,
                                             "tables": sum(e["tag"] == "table" for e in elements),
                                             "code_blocks": sum(e["tag"] == "pre"
                                                                for e in elements),
                                             "cut": [e for e in elements if e["cut"]]}
                browser.close()
        finally:
            server.shutdown()
    (out / "screenshots.json").write_text(json.dumps(report, indent=1) + "\n")
    cut = 0
    for name, r in report["pages"].items():
        cut += len(r["cut"])
        shot = f" -> {out / r['png']}" if r["png"] else ""
        print(f"{name}: {r['tables']} tables, {r['code_blocks']} code blocks, {len(r['cut'])} cut "
              f"at {args.width} px{shot}")
        for e in r["cut"]:
            print(f"  cut {e['tag']}: {e['content_px']} px in {e['shown_px']} px: {e['text']!r}")
    return 1 if cut else 0


if __name__ == "__main__":
    sys.exit(main())
