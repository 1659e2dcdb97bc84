"""Persistent teacher-response cache: SQLite (WAL), one row per (model, prompt, params, sample, seed).

A response is committed as soon as it arrives, so killing a run loses only the requests in flight;
re-running reuses every finished response. Failed requests are recorded too (status ``failed`` with
the error) but are not served as hits: the next run retries them.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
create table if not exists responses (
  key text primary key,
  model text not null,
  tag text,
  sample_index integer,
  status text not null,          -- ok | failed
  text text,
  error text,
  completion_tokens integer,
  latency_s real,
  attempts integer,
  created_at real not null,
  system_fingerprint text,
  seed_honoured integer
)
"""
# columns added after the first schema: (name, type), added to an older cache file on open
ADDED_COLUMNS = (("system_fingerprint", "text"), ("seed_honoured", "integer"))


def request_key(model: str, req) -> str:
    """sha256 of (model, messages, sampling params, sample index, seed) — the cache identity.

    An unseeded request (``seed`` None) keeps the key it had before seeds existed, so older
    caches still serve it; a seeded one never shares a key with another seed or with no seed.
    """
    parts = [model, list(req.messages), list(req.params), req.sample_index]
    if getattr(req, "seed", None) is not None:
        parts.append({"seed": req.seed})
    blob = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Thread-safe SQLite cache at ``path`` (created with its parent folders)."""

    def __init__(self, path: str | Path, timeout_s: float = 30.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=timeout_s, check_same_thread=False, isolation_level=None)
        self._db.execute("pragma journal_mode=wal")
        self._db.execute(SCHEMA)
        have = {row[1] for row in self._db.execute("pragma table_info(responses)")}
        for name, kind in ADDED_COLUMNS:
            if name not in have:
                self._db.execute(f"alter table responses add column {name} {kind}")

    def get(self, key: str) -> dict | None:
        """The cached *successful* response for ``key`` (text, completion_tokens, latency_s,
        system_fingerprint, seed_honoured), else None."""
        with self._lock:
            row = self._db.execute(
                "select text, completion_tokens, latency_s, system_fingerprint, seed_honoured from responses "
                "where key = ? and status = 'ok'", (key,)
            ).fetchone()
        return None if row is None else {"text": row[0], "completion_tokens": row[1], "latency_s": row[2],
                                         "system_fingerprint": row[3], "seed_honoured": bool(row[4])}

    def put(self, key: str, model: str, result) -> None:
        """Store a result; a success never gets overwritten by a later failure."""
        with self._lock:
            self._db.execute(
                "insert into responses (key, model, tag, sample_index, status, text, error, completion_tokens, latency_s, "
                "attempts, created_at, system_fingerprint, seed_honoured) values (?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "on conflict(key) do update set "
                "status=excluded.status, text=excluded.text, error=excluded.error, completion_tokens=excluded.completion_tokens, "
                "latency_s=excluded.latency_s, attempts=excluded.attempts, created_at=excluded.created_at, "
                "system_fingerprint=excluded.system_fingerprint, seed_honoured=excluded.seed_honoured "
                "where responses.status != 'ok'",
                (key, model, result.request.tag, result.request.sample_index, result.status, result.text, result.error,
                 result.completion_tokens, result.latency_s, result.attempts, time.time(),
                 getattr(result, "system_fingerprint", None), int(bool(getattr(result, "seed_honoured", False)))),
            )

    def counts(self) -> dict:
        with self._lock:
            rows = self._db.execute("select status, count(*) from responses group by status").fetchall()
        return dict(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()
