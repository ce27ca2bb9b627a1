"""The review and results pages: self-contained, facts shown, the others listed for copying."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np

from clip_gateway.photos.facts import BEST_RULE, facts
from clip_gateway.photos.report import CSP, thumbnail, write_dupes, write_search
from clip_gateway.photos.search import Hit
from tests import samples


def photos(tmp_path: Path) -> list[str]:
    names = ["big.jpg", "it's small.jpg", "other.png"]
    data = [
        samples.encode(samples.small_photo(0, (800, 600)), "JPEG"),
        samples.encode(samples.small_photo(0, (400, 300)), "JPEG"),
        samples.png(1),
    ]
    for name, content in zip(names, data, strict=True):
        (tmp_path / name).write_bytes(content)
    return [str(tmp_path / name) for name in names]


def test_dupes_page_marks_the_one_to_keep_and_lists_the_others(tmp_path: Path) -> None:
    paths = photos(tmp_path)
    vectors = np.eye(3, dtype=np.float32)[[0, 0, 2]]
    out = tmp_path / "dupes.html"
    others = write_dupes([[1, 0]], [[facts(paths[1]), facts(paths[0])]], paths, vectors, 0.9, out)
    page = out.read_text()
    assert others == [paths[1]]  # the 400x300 copy; the 800x600 one is kept
    assert page.count('<figure class="best">') == 1
    assert page.index('class="best"') < page.index(html.escape(paths[0]))
    assert "800×600" in page and "400×300" in page and BEST_RULE in page
    shell = re.search(r'<textarea id="shell"[^>]*>(.*?)</textarea>', page, re.S)
    assert shell and html.unescape(shell.group(1)) == "'" + paths[1].replace("'", "'\"'\"'") + "'"
    plain = re.search(r'<textarea id="plain"[^>]*>(.*?)</textarea>', page, re.S)
    assert plain and html.unescape(plain.group(1)) == paths[1]
    assert CSP in page and "http://" not in page and "https://" not in page


def test_search_page_shows_rank_score_and_path(tmp_path: Path) -> None:
    paths = photos(tmp_path)
    out = tmp_path / "search.html"
    write_search("a <cat>", [Hit(1, 0.31234, paths[2]), Hit(2, 0.2, paths[0])], 3, out)
    page = out.read_text()
    assert "Search: a &lt;cat&gt;" in page and "#1 · " in page and "0.3123" in page
    assert page.count("data:image/jpeg;base64,") == 2


def test_thumbnails_of_unreadable_files_are_empty(tmp_path: Path) -> None:
    (tmp_path / "x.jpg").write_bytes(b"junk")
    assert thumbnail(tmp_path / "x.jpg") == "" == thumbnail(tmp_path / "missing.jpg")
    (tmp_path / "a.gif").write_bytes(samples.gif(0))
    assert thumbnail(tmp_path / "a.gif").startswith("data:image/jpeg;base64,")
