"""The built site in a real browser: every page loads whole, offline, without errors.

Debian's chromium, driven by Playwright (never `playwright install`: no browser is downloaded),
opens every page of the site served from 127.0.0.1 and fails on: an image that did not load, an
internal link or resource that answers 404, any request to another host, math left as TeX, and
errors on the console. `make test` installs chromium; without it this test is skipped, saying why.
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
import urllib.error
import urllib.request
from urllib.parse import urldefrag, urlsplit

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# Runs in the page after load: what a reader would see broken.
CHECK_PAGE = r"""() => {
  const out = {images: [], math: [], bareMath: 0, links: []};
  for (const img of document.images)
    if (img.complete && img.naturalWidth === 0) out.images.push(img.currentSrc || img.src);
    else if (!img.complete) out.images.push('(still loading) ' + img.src);
  const skip = new Set(['SCRIPT', 'STYLE', 'CODE', 'PRE', 'TEXTAREA', 'math']);
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    let p = n.parentElement, skipped = false;
    for (; p; p = p.parentElement) if (skip.has(p.tagName) || skip.has(p.localName)) { skipped = true; break; }
    if (skipped) continue;
    const t = n.textContent;
    if (t.includes('\\(') || t.includes('\\[') || t.includes('$$')) out.math.push(t.trim().slice(0, 120));
  }
  for (const el of document.querySelectorAll('.arithmatex'))
    if (!el.querySelector('math')) out.bareMath++;
  for (const a of document.querySelectorAll('a[href]')) out.links.push(a.href);
  return out;
}"""


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the browser drops connections it no longer needs; not the site's fault


@pytest.fixture(scope="module")
def server(built_site):
    if built_site.returncode != 0:
        pytest.fail(f"the site did not build:\n{built_site.problems()}", pytrace=False)
    handler = functools.partial(QuietHandler, directory=str(built_site.dir))
    httpd = Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", built_site.dir
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (`make test` does, as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def page_urls(base: str, site_dir) -> list[str]:
    """Every HTML page of the site (a superset of the nav and the sitemap)."""
    urls = []
    for path in sorted(site_dir.rglob("*.html")):
        rel = path.relative_to(site_dir).as_posix()
        urls.append(base + (rel[:-len("index.html")] if rel.endswith("index.html") else rel))
    return urls


def test_every_page_in_chromium(server, browser, tmp_path):
    base, site_dir = server
    host = urlsplit(base).netloc
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    problems: list[str] = []
    current = {"url": ""}

    def route(r):
        url = r.request.url
        if urlsplit(url).netloc != host:
            problems.append(f"{current['url']}: request to another host: {url}")
            r.abort()
        else:
            r.continue_()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and problems.append(
        f"{current['url']}: console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"{current['url']}: script error: {e}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(
        f"{current['url']}: {r.status} for {r.url}"))

    links: set[str] = set()
    urls = page_urls(base, site_dir)
    assert len(urls) > 3, urls
    for url in urls:
        current["url"] = url
        response = page.goto(url, wait_until="load")
        if url.endswith("404.html"):
            pass
        elif response is None or response.status != 200:
            problems.append(f"{url}: status {response and response.status}")
        page.wait_for_load_state("networkidle")
        found = page.evaluate(CHECK_PAGE)
        problems += [f"{url}: image did not load: {src}" for src in found["images"]]
        problems += [f"{url}: unrendered math: {t!r}" for t in found["math"]]
        if found["bareMath"]:
            problems.append(f"{url}: {found['bareMath']} arithmatex element(s) without <math>")
        links |= {urldefrag(u)[0] for u in found["links"] if urlsplit(u).netloc == host}
    context.close()

    for link in sorted(links):
        try:
            with urllib.request.urlopen(link, timeout=10) as r:
                r.read(1)
        except urllib.error.HTTPError as e:
            problems.append(f"link {link}: HTTP {e.code}")

    print(f"{len(urls)} pages and {len(links)} internal links checked")
    assert not problems, "\n".join(problems[:40])
