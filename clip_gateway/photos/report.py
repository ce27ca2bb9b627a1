"""HTML pages for a person: near-duplicate groups to review, search results to look at.

Each page is one self-contained file: thumbnails are inline ``data:`` URIs and a
Content-Security-Policy forbids loading anything else, so opening it fetches nothing from
anywhere, and the page can be mailed or archived as it is.
"""

from __future__ import annotations

import base64
import html
import io
import shlex
from pathlib import Path

import numpy as np
from PIL import Image

from clip_gateway.client import formats
from clip_gateway.client.compact import upright
from clip_gateway.imaging import orientation
from clip_gateway.photos.dupes import normalise
from clip_gateway.photos.facts import BEST_RULE, Facts, best, human_size
from clip_gateway.photos.search import Hit

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
STYLE = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#222}"
    ".row{display:flex;flex-wrap:wrap;gap:14px;margin-bottom:8px}"
    "figure{margin:0;width:244px;padding:6px;border:2px solid #ddd;border-radius:6px}"
    "figure.best{border-color:#2a8a3e;background:#eef8f0}"
    "figure img{display:block;max-width:240px;max-height:240px;margin:auto}"
    "figcaption{font-size:12px;word-break:break-all;margin-top:4px}"
    ".keep{background:#2a8a3e;color:#fff;padding:1px 6px;border-radius:3px;font-weight:600}"
    ".score{font-weight:600}code{font-size:12px}textarea{width:100%;font:12px monospace}"
)
#: Copies a textarea's content to the clipboard (buttons name it in data-copy).
SCRIPT = (
    "document.querySelectorAll('button[data-copy]').forEach(b=>b.onclick=()=>{"
    "const t=document.getElementById(b.dataset.copy);t.select();"
    "navigator.clipboard?navigator.clipboard.writeText(t.value):document.execCommand('copy')})"
)


def thumbnail(path: str | Path, size: int = 240) -> str:
    """A ``data:`` URI of a small upright JPEG of the photo, or "" when it cannot be read."""
    try:
        data = Path(path).read_bytes()
        kind = formats.identify(data[: formats.HEAD_BYTES])
        if kind is None:
            return ""
        formats.plugins_for(kind)
        with Image.open(io.BytesIO(data)) as image:
            image.draft("RGB", (size, size))  # JPEG: decoded at a reduced DCT scale
            if kind in formats.GATEWAY_FORMATS:
                turn = orientation.of(data)  # the gateway's bounded reader
            else:
                turn = int(image.getexif().get(orientation.TAG, 1))
            small = upright(image.convert("RGB"), turn)
        small.thumbnail((size, size))
        buffer = io.BytesIO()
        small.save(buffer, "JPEG", quality=80)
    except (OSError, ValueError, SyntaxError):  # Pillow's kinds for unreadable files
        return ""
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>{body}"
        f"<script>{SCRIPT}</script></html>"
    )


def _figure(path: str, caption: str, *, keep: bool = False) -> str:
    src = thumbnail(path)
    image = f'<img src="{src}" alt="">' if src else "<p>(unreadable)</p>"
    badge = '<span class="keep">keep</span> ' if keep else ""
    return (
        f'<figure class="{"best" if keep else ""}">{image}<figcaption>{badge}{caption}'
        f"<br><code>{html.escape(path)}</code></figcaption></figure>"
    )


def _describe(fact: Facts) -> str:
    if not fact.pixels:
        return "unreadable"
    when = f"{fact.date:%Y-%m-%d %H:%M} ({fact.date_source})" if fact.date else ""
    return f"{fact.width}×{fact.height} · {human_size(fact.size)} · {when}"


def write_dupes(
    groups: list[list[int]],
    described: list[list[Facts]],
    paths: list[str],
    vectors: np.ndarray,
    threshold: float,
    out: Path,
) -> list[str]:
    """The review page (``described``: each group's facts); returns the others: every photo
    but the one to keep, per group."""
    unit = normalise(vectors)
    sections, others = [], []
    for number, (members, known) in enumerate(zip(groups, described, strict=True), 1):
        keep = members[best(known)]
        cells = []
        for index, fact in zip(members, known, strict=True):
            score = float(unit[index] @ unit[keep])
            note = "" if index == keep else f" · cos {score:.4f}"
            cells.append(_figure(paths[index], _describe(fact) + note, keep=index == keep))
            others += [] if index == keep else [paths[index]]
        sections.append(
            f"<h2>Group {number} ({len(members)} photos)</h2><div class=row>{''.join(cells)}</div>"
        )
    quoted = "\n".join(shlex.quote(p) for p in others)
    plain = "\n".join(others)
    lists = (
        f"<h2>The others ({len(others)} photos)</h2>"
        "<p>Every photo but the one to keep, one per line, quoted for a shell "
        '<button data-copy="shell">copy</button></p>'
        f'<textarea id="shell" rows="8" readonly>{html.escape(quoted)}</textarea>'
        '<p>The same as plain paths, for a file manager <button data-copy="plain">copy</button></p>'
        f'<textarea id="plain" rows="8" readonly>{html.escape(plain)}</textarea>'
    )
    intro = (
        f"<h1>{len(groups)} groups of near-duplicates</h1><p>{len(paths)} photos, grouped at "
        f"cosine ≥ {threshold:g}. The one marked <span class=keep>keep</span> in each group is "
        f"{BEST_RULE}; the others are listed at the end.</p>"
    )
    out.write_text(_page("Near-duplicates", intro + "".join(sections) + lists), encoding="utf-8")
    return others


def write_search(query: str, hits: list[Hit], total: int, out: Path) -> None:
    """The results page: thumbnails with rank, score and path."""
    cells = [
        _figure(hit.path, f'#{hit.rank} · <span class="score">{hit.score:.4f}</span>')
        for hit in hits
    ]
    intro = (
        f"<h1>Search: {html.escape(query)}</h1><p>The {len(hits)} of {total} photos most "
        "similar to the query (cosine similarity of the embeddings).</p>"
    )
    body = intro + f"<div class=row>{''.join(cells)}</div>"
    out.write_text(_page(f"Search: {query}", body), encoding="utf-8")
