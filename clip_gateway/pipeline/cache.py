"""The content-addressed embedding cache: an item's bytes (or text) to its unnormalised
embedding and what answering it reported besides (a text's tokens, an image's size), for one
model and one preprocessing, in memory or in a SQLite file: a hit answers exactly what the miss
did.

A key is the SHA-256 of the model's identity (``identity``: its name, dimensions, the
preprocessing the backend reports, its quantization, its export-time canary embedding, and the
preprocessing variant, open_clip's or Immich's), the item's kind and its bytes: a vector is never
returned for another model, another preprocessing or the other kind. Values are float32 rows, so
a hit is exactly what the model answered the first time. Bounded in bytes; the oldest entries
go first (memory: least recently used; SQLite: first written). The SQLite file is in WAL mode,
so every worker of the gateway reads it while one writes; a write that finds it locked is
skipped (the entry is simply not cached), never waited on for long.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sqlite3
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

log = logging.getLogger("gateway")


@dataclass(frozen=True)
class Entry:
    """One item's answer: its unnormalised float32 row, and what the response reports of it
    besides: a text's tokens the model read (``usage``), an image's size as decoded (Immich's
    ``/predict`` answers it)."""

    vector: np.ndarray
    tokens: int = 0
    width: int = 0
    height: int = 0


class EmbeddingCache(Protocol):
    def get(self, key: bytes) -> Entry | None: ...
    def put(self, entries: Iterable[tuple[bytes, Entry]]) -> None: ...
    def close(self) -> None: ...


def identity(*facts: object) -> bytes:
    """A digest of what makes two embeddings of the same bytes the same (``repr`` of each)."""
    digest = hashlib.sha256()
    for fact in facts:
        if isinstance(fact, np.ndarray):
            digest.update(np.ascontiguousarray(fact, dtype=np.float32).tobytes())
        else:
            digest.update(repr(fact).encode())
        digest.update(b"\0")
    return digest.digest()


def key(model: bytes, kind: str, content: bytes) -> bytes:
    return hashlib.sha256(model + kind.encode() + b"\0" + content).digest()


class MemoryCache:
    """Least recently used first, at most ``max_bytes`` of vectors (keys and bookkeeping aside)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()

    def get(self, key: bytes) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, entries: Iterable[tuple[bytes, Entry]]) -> None:
        for key, entry in entries:
            if key in self._entries or entry.vector.nbytes > self.max_bytes:
                continue
            kept = np.array(entry.vector, dtype=np.float32)  # a copy: never a view into a batch
            kept.flags.writeable = False
            self._entries[key] = Entry(kept, entry.tokens, entry.width, entry.height)
            self.bytes += kept.nbytes
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= old.vector.nbytes

    def close(self) -> None:
        self._entries.clear()
        self.bytes = 0


class SqliteCache:
    """The cache in a SQLite file (WAL: the workers share it, and it outlives restarts)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        # one connection per worker, used from its event loop only; lookups are point reads
        # of a primary key (tens of microseconds), not worth a thread hop
        self._db = sqlite3.connect(path, timeout=0.2, isolation_level=None,
                                   check_same_thread=False)  # fmt: skip
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # the table before entries kept tokens and sizes: its rows cannot answer as a miss did
        self._db.execute("DROP TABLE IF EXISTS embeddings")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS entries (key BLOB PRIMARY KEY, vector BLOB NOT NULL, "
            "tokens INTEGER NOT NULL, width INTEGER NOT NULL, height INTEGER NOT NULL)"
        )
        self._bytes = self._stored_bytes()

    def _stored_bytes(self) -> int:
        row = self._db.execute("SELECT total(length(vector)) FROM entries").fetchone()
        return int(row[0])

    def get(self, key: bytes) -> Entry | None:
        row = self._db.execute(
            "SELECT vector, tokens, width, height FROM entries WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        return Entry(np.frombuffer(row[0], dtype=np.float32), *row[1:])

    def put(self, entries: Iterable[tuple[bytes, Entry]]) -> None:
        rows = [
            (k, np.ascontiguousarray(e.vector, dtype=np.float32).tobytes(), e.tokens, e.width,
             e.height)
            for k, e in entries
        ]  # fmt: skip
        if not rows:
            return
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR IGNORE INTO entries (key, vector, tokens, width, height) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
                self._bytes += sum(len(row[1]) for row in rows)
                if self._bytes > self.max_bytes:
                    self._evict()
        except sqlite3.OperationalError as exc:  # locked by another worker: not cached
            log.debug("embedding cache write skipped: %s", exc)

    def _evict(self) -> None:
        """Oldest written first, down to 90 % of the bound (other workers write too: the
        stored total is read again rather than trusted)."""
        count, stored = self._db.execute(
            "SELECT count(*), total(length(vector)) FROM entries"
        ).fetchone()
        excess = stored - self.max_bytes * 0.9
        if count and excess > 0:
            self._db.execute(
                "DELETE FROM entries WHERE rowid IN "
                "(SELECT rowid FROM entries ORDER BY rowid LIMIT ?)",
                (math.ceil(excess / (stored / count)),),
            )
        self._bytes = self._stored_bytes()

    def close(self) -> None:
        self._db.close()


def open_cache(max_bytes: int, path: Path | None) -> EmbeddingCache | None:
    """The configured cache: none (0 bytes), in memory, or in a SQLite file."""
    if max_bytes <= 0:
        return None
    if path is not None:
        return SqliteCache(path, max_bytes)
    return MemoryCache(max_bytes)
