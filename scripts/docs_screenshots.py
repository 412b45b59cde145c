"""Screenshots of the built documentation site (scripts/docs.sh), taken in Debian's chromium.

    .venv/bin/python scripts/docs_screenshots.py OUT_DIR                 # the default pages, from docs/_build/html
    .venv/bin/python scripts/docs_screenshots.py OUT_DIR --site DIR guide/whats-here.html reference/cli.html

Each page is opened from the folder (file://, no server, as a user opens it) and waits until every widget of its
notebooks is drawn; a page with widgets is shot with its first widget output at the top, the others from their top.
The picture is OUT_DIR/<page path with / as ->.png. Says how many widgets each page drew, the requests that failed
and the browser's console errors; exits 1 when a page has a widget that was not drawn.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"  # the browser tests' (tests/browser/harness.py): Playwright's own download can't be used
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]
DEFAULT_PAGES = ["guide/will-it-fit.html", "reference/api.html"]
VIEW_MIME = "application/vnd.jupyter.widget-view+json"

# Widget outputs saved in the page (myst-nb writes one <script> per output), and how many of them html-manager drew
# (it puts a .widget-subarea before each script and draws the view in it; a view that failed shows an error box).
_COUNT_JS = f"""() => {{
  const outputs = document.querySelectorAll('script[type="{VIEW_MIME}"]').length;
  const areas = [...document.querySelectorAll('.widget-subarea')];
  const drawn = areas.filter(a => a.children.length && !a.querySelector('.jupyter-widgets-error-widget')).length;
  return [outputs, drawn];
}}"""

# The code cell above the first widget output at the top of the window (at once: furo's pages scroll smoothly).
_SCROLL_JS = """el => {
  (el.closest('.cell') || el).scrollIntoView({block: 'start', behavior: 'instant'});
  window.scrollBy({top: -40, behavior: 'instant'});
}"""


def shoot(page: Page, url: str, path: Path, wait_s: float) -> tuple[int, int]:
    """Open url, wait for its widgets, save the picture at path; (widget outputs, drawn)."""
    page.goto(url, wait_until="load")
    outputs, drawn = page.evaluate(_COUNT_JS)
    if outputs:
        # Not all drawn in time: the picture shows what was, and the count says so.
        with contextlib.suppress(Exception):
            page.wait_for_function(f"() => ({_COUNT_JS})()[1] >= {outputs}", timeout=wait_s * 1000)
        outputs, drawn = page.evaluate(_COUNT_JS)
        page.wait_for_timeout(500)  # fonts and plotly's first layout
        first = page.locator(".widget-subarea").first
        if first.count():
            page.evaluate(_SCROLL_JS, first.element_handle())
    page.screenshot(path=str(path))
    return outputs, drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("out", type=Path, help="folder for the pictures")
    parser.add_argument("pages", nargs="*", default=DEFAULT_PAGES, help=f"pages of the site (default: {DEFAULT_PAGES})")
    parser.add_argument(
        "--site", type=Path, default=ROOT / "docs/_build/html", help="the built site (default: %(default)s)"
    )
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--wait", type=float, default=30, help="seconds to wait for a page's widgets (default: 30)")
    args = parser.parse_intermixed_args(argv)
    site = args.site.resolve()
    if not (site / "index.html").is_file():
        parser.error(f"no built site in {site}: run scripts/docs.sh first")
    args.out.mkdir(parents=True, exist_ok=True)
    undrawn = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for name in args.pages:
                context = browser.new_context(viewport={"width": args.width, "height": args.height})
                page = context.new_page()
                errors: list[str] = []
                page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.on("requestfailed", lambda r, errors=errors: errors.append(f"request failed: {r.url}"))
                path = args.out / (name.removesuffix(".html").replace("/", "-") + ".png")
                outputs, drawn = shoot(page, (site / name).as_uri(), path, args.wait)
                context.close()
                undrawn += outputs - drawn
                print(f"{path}: {drawn} of {outputs} widget outputs drawn")
                for error in errors:
                    print(f"  {error.splitlines()[0][:200]}")
        finally:
            browser.close()
    return 1 if undrawn else 0


if __name__ == "__main__":
    sys.exit(main())
