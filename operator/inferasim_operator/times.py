"""Times as the operator writes them in status and annotations: RFC 3339 in UTC, to the second
(`2026-12-02T17:05:00Z`)."""

from __future__ import annotations

import datetime as dt
import time

RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def iso(ts: float) -> str:
    """Unix seconds as the operator writes a time."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime(RFC3339)


def now_iso() -> str:
    return iso(time.time())


def epoch(text: str | None) -> float | None:
    """Unix seconds of a time the operator wrote (None when absent or unreadable)."""
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, RFC3339).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


def age_s(text: str | None) -> float | None:
    """Seconds since a time the operator wrote (None when absent or unreadable)."""
    then = epoch(text)
    return None if then is None else time.time() - then
