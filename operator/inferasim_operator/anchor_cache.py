"""Anchors for the search: the cluster's ServingAnchors written as files next to the shipped folders.

The search runs in a child process that reads anchor folders; the cache folder holds one file per
ServingAnchor the search may use, rewritten only when an object changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from inferasim.live import search_view
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import Anchor
from inferasim_operator.kube import Kube
from inferasim_operator.settings import Settings

log = logging.getLogger("inferasim_operator")

_anchor_sync_lock = asyncio.Lock()


_shipped: dict[tuple[str, ...], list[Anchor]] = {}


def shipped_anchors(dirs: list[str]) -> list[Anchor]:
    """The anchors of the shipped folders (read once: they do not change while the operator runs)."""
    key = tuple(dirs)
    if key not in _shipped:
        _shipped[key] = AnchorStore(*dirs).all()
    return _shipped[key]


def _sync_anchor_files(kube: Kube, cache: Path, shipped: list[str] | None = None) -> int:
    cache.mkdir(parents=True, exist_ok=True)
    found: list[tuple[str, Anchor]] = []
    for obj in kube.list_anchors():
        try:
            anchor = Anchor.model_validate(obj.get("spec") or {})
        except ValueError as exc:
            log.warning("ServingAnchor %s is not a valid anchor, skipped: %s", obj["metadata"]["name"], exc)
            continue
        found.append((obj["metadata"]["name"], anchor))
    # A passive anchor stays a ServingAnchor beside a harvested one, but the search (which picks by
    # point count) must not see it there: live traffic never silently overrides a harvest.
    keep = {id(a) for a in search_view([a for _, a in found], shipped_anchors(shipped or []))}
    wanted: dict[str, str] = {}
    for name, anchor in found:
        if id(anchor) in keep:
            # Named after the object, not anchor.filename(): a canary anchor and the harvested anchor
            # of the same kernel set and layout share a filename, and the store keeps both.
            wanted[f"{name}.json"] = anchor.model_dump_json(indent=2) + "\n"
    for name, text in wanted.items():
        path = cache / name
        if not path.exists() or path.read_text() != text:
            tmp = cache / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
    for path in cache.glob("*.json"):
        if path.name not in wanted:
            path.unlink(missing_ok=True)
    return len(wanted)


_last_sync: tuple[float, int] = (-1.0, 0)  # (when the last sync started, anchors it wrote)


async def sync_anchors(kube: Kube, settings: Settings) -> int:
    """Write the cluster's ServingAnchors into the cache folder. Passes that arrive together share
    one sync: a sync that started after a caller arrived covers it (100 tunings applied at once
    listed the ServingAnchors 100 times, one after the other)."""
    global _last_sync
    arrived = time.monotonic()
    async with _anchor_sync_lock:
        started, count = _last_sync
        if started >= arrived:
            return count
        started = time.monotonic()
        count = await asyncio.to_thread(_sync_anchor_files, kube, Path(settings.anchors.cache), settings.anchors.dirs)
        _last_sync = (started, count)
        return count


def anchor_dirs(settings: Settings) -> list[str]:
    return [*settings.anchors.dirs, settings.anchors.cache]
