"""An HTML page showing each near-duplicate group's photos side by side, for review."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np
from PIL import Image

from gateway.client.compact import upright
from gateway.client.dupes import normalise
from gateway.imaging import orientation


def thumbnail(path: Path, size: int = 180) -> str:
    try:
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            small = upright(image.convert("RGB"), orientation.of(data))
            small.thumbnail((size, size))
            buffer = io.BytesIO()
            small.save(buffer, "JPEG", quality=80)
    except (OSError, ValueError):
        return ""
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def write(groups: list[list[int]], paths: list[str], vectors: np.ndarray, out: Path) -> None:
    unit = normalise(vectors)
    sections = []
    for number, members in enumerate(groups, 1):
        anchor = unit[members[0]]
        cells = []
        for index in members:
            similarity = float(unit[index] @ anchor)
            src = thumbnail(Path(paths[index]))
            image = f'<img src="{src}" alt="">' if src else "<div>(unreadable)</div>"
            cells.append(
                f"<figure>{image}<figcaption>{html.escape(paths[index])}<br>"
                f"cos {similarity:.4f}</figcaption></figure>"
            )
        sections.append(
            f"<h2>Group {number} ({len(members)} photos)</h2><div>{''.join(cells)}</div>"
        )
    out.write_text(
        "<!doctype html><meta charset=utf-8><title>Near-duplicates</title><style>"
        "body{font-family:sans-serif}div{display:flex;flex-wrap:wrap;gap:12px}"
        "figure{margin:0;width:190px;font-size:11px;word-break:break-all}</style>"
        f"<h1>{len(groups)} groups of near-duplicates</h1>{''.join(sections)}"
    )
