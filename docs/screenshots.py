"""Screenshots of the documentation site as a visitor's browser shows it, and a check of its first screen and search.

Builds the site (``mkdocs build --strict`` into a temporary folder; ``--site DIR`` reuses a built one), serves it over
http on 127.0.0.1 (search needs http: its worker does not start from file://), opens it in headless Chromium at
1280 x 800 through the DevTools protocol, and writes PNGs of the home page, the quick start, the ``accel`` API
reference and the benchmarks (each page's first screen, and the whole page), and of a search. Then it checks what
the first screen of the home page holds: the pitch, a picture and the four-line change starting above the fold,
and that search answers (it does not stay at "Initializing search"). Exit 0 when every check passes; each result is
printed.

    apt-get install -y chromium      # Debian's Chromium, once
    uv run --group docs python docs/screenshots.py --out /tmp/accel-docs-screenshots

Run by hand (and before changing the home page): CI checks the built home page's order without a browser
(tests/docs/test_home_page.py). The screenshots are for looking at, not committed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1280, 800  # a laptop's browser window: "above the fold" is the first 800 px
PAGES = {
    "home": "",
    "quickstart": "quickstart/",
    "api-accel": "reference/api/accel/",
    "benchmarks": "benchmarks/",
}
SEARCH_QUERY = "gather_for_metrics"

# Where the home page's parts start, in CSS pixels from the top of the page (JavaScript run in the page).
HOME_LAYOUT_JS = """
(() => {
  const top = (element) => element ? Math.round(element.getBoundingClientRect().top + window.scrollY) : null;
  const article = document.querySelector("article");
  const picture = article.querySelector("img, svg:not(.md-icon svg)");
  const code = [...article.querySelectorAll("pre code")].find((c) => c.textContent.includes("accelerator.prepare("));
  return JSON.stringify({
    picture: top(picture),
    picture_height: picture ? Math.round(picture.getBoundingClientRect().height) : null,
    picture_loaded: picture && picture.tagName === "IMG" ? picture.complete && picture.naturalWidth > 0 : !!picture,
    four_line_change: top(code), page_height: document.documentElement.scrollHeight,
  });
})()
"""
SEARCH_STATE_JS = """
(() => {
  const meta = document.querySelector(".md-search-result__meta");
  const items = document.querySelectorAll(".md-search-result__item");
  return JSON.stringify({meta: meta ? meta.textContent.trim() : null, results: items.length});
})()
"""


def build_site(out: Path) -> None:
    subprocess.run(
        ["uv", "run", "--group", "docs", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        check=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@contextlib.contextmanager
def serve(site: Path) -> Iterator[str]:
    """The site served over http on 127.0.0.1 (a free port), quietly, for the duration of the block."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[int]:
    """Headless Chromium with its DevTools port (read from the profile's DevToolsActivePort file)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if binary is None:
        sys.exit("docs/screenshots.py needs Chromium: apt-get install -y chromium")
    process = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",  # root in a container has no user namespace for Chromium's sandbox
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--window-size={WIDTH},{HEIGHT}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"Chromium did not start (exit code {process.poll()})")
            time.sleep(0.1)
        yield int(port_file.read_text().split()[0])
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


class Page:
    """One browser tab driven through the DevTools protocol (commands awaited by id; events by name)."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.socket.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = json.loads((await self.socket.receive()).data)
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    async def wait_for_event(self, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == name for e in self.events):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {name} in {timeout} s")
            message = json.loads((await asyncio.wait_for(self.socket.receive(), remaining)).data)
            self.events.append(message)

    async def open(self, url: str) -> None:
        self.events.clear()
        await self.send("Page.navigate", url=url)
        await self.wait_for_event("Page.loadEventFired")
        await asyncio.sleep(1.0)  # fonts and the theme's scripts settle

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return json.loads(result["result"]["value"])

    async def screenshot(self, path: Path, full_page: bool = False) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = await self.evaluate("JSON.stringify(document.documentElement.scrollHeight)")
            params.update(
                captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1}
            )
        data = (await self.send("Page.captureScreenshot", **params))["data"]
        path.write_bytes(base64.b64decode(data))
        print(f"wrote {path}")


async def take(base_url: str, port: int, out: Path) -> list[str]:
    """Screenshots into ``out``; returns the failed checks (empty: all passed)."""
    import aiohttp  # in the workspace's lock (a dependency of its tracker libraries)

    failures: list[str] = []
    async with aiohttp.ClientSession() as session:
        async with session.put(f"http://127.0.0.1:{port}/json/new?about:blank") as response:
            target = await response.json()
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            page = Page(socket)
            await page.send("Page.enable")
            await page.send(
                "Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False
            )
            for name, path in PAGES.items():
                await page.open(base_url + path)
                await page.screenshot(out / f"{name}.png")
                await page.screenshot(out / f"{name}-full.png", full_page=True)
                if name == "home":
                    layout = await page.evaluate(HOME_LAYOUT_JS)
                    print(f"home page at {WIDTH} px: {layout}")
                    if layout["picture"] is None or not layout["picture_loaded"]:
                        failures.append(f"the home page shows no picture (or it did not load): {layout}")
                    elif layout["picture"] >= HEIGHT:
                        failures.append(f"the home page's picture starts below the fold ({layout['picture']} px)")
                    if layout["four_line_change"] is None or layout["four_line_change"] >= HEIGHT:
                        failures.append(f"the four-line change does not start above the fold: {layout}")
            # Search: the theme opens it with the query from ?q=; its worker builds the index, then answers.
            await page.open(f"{base_url}?q={SEARCH_QUERY}")
            state: dict[str, Any] = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                state = await page.evaluate(SEARCH_STATE_JS)
                if state["results"]:
                    break
                await asyncio.sleep(0.5)
            await page.screenshot(out / "search.png")
            print(f"search for {SEARCH_QUERY!r}: {state}")
            if not state.get("results"):
                failures.append(f"search did not answer in 30 s: {state}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "accel-docs-screenshots")
    parser.add_argument("--site", type=Path, help="a site already built (default: build one now)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="accel-docs-") as scratch:
        site = args.site
        if site is None:
            site = Path(scratch) / "site"
            build_site(site)
        with serve(site) as base_url, chromium(Path(scratch) / "profile") as port:
            failures = asyncio.run(take(base_url, port, args.out))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
