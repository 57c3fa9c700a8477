"""The ServingTuning's status and its story: conditions, the StatusBook that writes the status,
and the Kubernetes Events that `kubectl describe` shows.

Every step of a pass writes the status (merge patch on /status) and posts an Event. A book is the
status as last written plus the patches not sent yet; a pass that fails half-way discards them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
from typing import Any

import kopf

from inferasim_operator import kube as kube_mod
from inferasim_operator import metrics
from inferasim_operator.kube import ApiException, Kube
from inferasim_operator.models import Condition, dump
from inferasim_operator.times import now_iso

log = logging.getLogger("inferasim_operator")


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  generation: int | None) -> list[dict[str, Any]]:
    """The conditions with ``type_`` replaced; lastTransitionTime moves only when status changes."""
    old = next((c for c in conditions if c.get("type") == type_), None)
    when = old.get("lastTransitionTime") if old and old.get("status") == status else now_iso()
    new = dump(Condition(type=type_, status=status, reason=reason, message=message[:1024],
                         last_transition_time=when or now_iso(), observed_generation=generation))
    out = [c for c in conditions if c.get("type") != type_] + [new]
    order = {"WorkloadObserved": 0, "AnchorsReady": 1, "Priced": 2, "Recommended": 3, "Confirmed": 4,
             "PredictionDrift": 5, "Degraded": 6}
    return sorted(out, key=lambda c: order.get(c.get("type", ""), 9))


class StatusNotWritable(ValueError):
    """A status patch the API server would refuse (a number JSON cannot carry); never sent."""


def non_finite_paths(obj: Any, path: str = "status") -> list[str]:
    """Where ``obj`` holds a float that is inf or nan (JSON has no such number: the API server
    refuses the whole patch, HTTP 500 Invalid JSON Patch)."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in non_finite_paths(v, f"{path}.{k}")]
    if isinstance(obj, list | tuple):
        return [p for i, v in enumerate(obj) for p in non_finite_paths(v, f"{path}[{i}]")]
    return []


class StatusBook:
    """The status as last written (camelCase dict) and the patches that change it."""

    def __init__(self, body: dict[str, Any], kube: Kube) -> None:
        self.body = body
        self.kube = kube
        meta = body["metadata"]
        self.namespace, self.name = meta["namespace"], meta["name"]
        self.uid = meta.get("uid", f"{self.namespace}/{self.name}")
        self.generation = meta.get("generation")
        self.status: dict[str, Any] = json.loads(json.dumps(dict(body.get("status") or {})))
        self._pending: dict[str, Any] = {}
        self._written: dict[str, Any] = {}  # each pending key's value as the server holds it
        self.touched: set[str] = set()  # condition types this book (one pass) has written

    def get(self, key: str, default: Any = None) -> Any:
        return self.status.get(key, default)

    def set(self, **fields: Any) -> None:
        for k, v in fields.items():
            if k not in self._pending:
                self._written[k] = copy.deepcopy(self.status.get(k))
            self.status[k] = v
            self._pending[k] = v

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.touched.add(type_)
        self.set(conditions=set_condition(self.status.get("conditions") or [], type_, status, reason, message,
                                          self.generation))

    def discard(self) -> None:
        """Forget the changes not written yet (a pass that failed half-way): the book reads as the
        server holds the status again."""
        for k, old in self._written.items():
            self.status[k] = old
        self._pending, self._written = {}, {}

    def cond(self, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status.get("conditions") or [] if c.get("type") == type_), None)

    async def flush(self) -> None:
        if not self._pending:
            return
        # A merge patch merges nested objects: a sub-object written whole must also null what the
        # server holds and the new value lacks (a removed price's cost, an old prediction error's
        # figures next to a message that nothing was computed).
        patch = {k: kube_mod.merge_patch_to(self._written.get(k), v) for k, v in self._pending.items()}
        bad = non_finite_paths(patch)
        if bad:
            # Refused here, whole: the book goes back to what the server holds, and the caller's pass
            # ends (reconcile's guard reports it as Degraded) before anything is published.
            self.discard()
            raise StatusNotWritable(f"the status patch holds numbers JSON cannot carry (inf or nan) at "
                                    f"{', '.join(bad[:5])}; it was not sent")
        self._pending, self._written = {}, {}
        try:
            await asyncio.to_thread(self.kube.patch_tuning_status, self.namespace, self.name, patch)
        except ApiException as exc:
            if exc.status == 404:
                raise kopf.PermanentError("the ServingTuning was deleted") from None
            raise
        if "phase" in patch:
            metrics.set_phase(self.uid, patch["phase"])


def post_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the ServingTuning (through kopf's poster); logged when kopf is not running."""
    try:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])
    except LookupError:  # outside a running operator (handler functions driven directly)
        pass
    (log.warning if type_ == "Warning" else log.info)("%s/%s %s: %s", body["metadata"].get("namespace"),
                                                      body["metadata"].get("name"), reason, message)


async def fresh_book(body: dict[str, Any], kube: Kube) -> tuple[dict[str, Any], StatusBook]:
    """Inside the tuning's lock: the tuning as the API server has it now, and a StatusBook on it. A
    timer's body is captured before the lock; a reconcile that ran meanwhile may have moved the phase
    or the conditions, and a book on the old status would write them back (conditions are a list,
    replaced whole by the merge patch)."""
    meta = body["metadata"]
    fresh = await asyncio.to_thread(kube.get_tuning, meta["namespace"], meta["name"])
    body = {**body, "spec": fresh.get("spec") or body.get("spec") or {}, "status": fresh.get("status") or {}}
    return body, StatusBook(body, kube)
