"""A page opened in a real headless Chromium (Debian's ``chromium``): what a person would see.

A local page is copied with a probe script appended that, once everything has loaded, writes into
the DOM how many images there are, how many failed to decode (``naturalWidth == 0``), every
resource the browser fetched, and the visible text; ``--dump-dom`` hands that back. A page a
loopback server serves is opened as it is, with every other host unresolvable (offline, as the
container and users' hosts are), and its DOM handed back once its scripts have run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

PROBE = """<script>
window.addEventListener('load', () => {
  const images = [...document.images];
  const probe = {
    images: images.length,
    broken: images.filter(i => !(i.complete && i.naturalWidth > 0)).length,
    fetched: performance.getEntriesByType('resource').map(e => e.name),
    text: document.body.innerText,
  };
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
</script>"""
#: No sandbox (tests run as root), and nothing that talks to the network by itself.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
)  # fmt: skip


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    return found


#: Only loopback resolves: a page that needs a CDN breaks here as it would offline.
LOOPBACK_ONLY = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


def _run(page: Path | str, *args: str) -> str:
    url = page.as_uri() if isinstance(page, Path) else page
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def open_page(page: Path, work: Path) -> dict[str, Any]:
    """The probe's findings for ``page`` (opened from a copy in ``work``)."""
    copy = work / f"probed-{page.name}"
    copy.write_text(page.read_text(encoding="utf-8").replace("</html>", PROBE + "</html>"))
    dom = _run(copy, "--virtual-time-budget=10000", "--dump-dom")
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    raw = dom[start : dom.index("</pre>", start)]
    for escaped, plain in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&amp;", "&")):
        raw = raw.replace(escaped, plain)
    result: dict[str, Any] = json.loads(raw)
    return result


def served_dom(url: str) -> str:
    """The DOM of the page a loopback server serves at ``url``, once its scripts have run."""
    assert url.startswith("http://127.0.0.1:"), url
    return _run(url, LOOPBACK_ONLY, "--virtual-time-budget=10000", "--dump-dom")


def screenshot(page: Path, out: Path, width: int = 1280, height: int = 1400) -> None:
    _run(page, f"--window-size={width},{height}", f"--screenshot={out}")
    assert out.stat().st_size > 10_000
