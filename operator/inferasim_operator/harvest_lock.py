"""One harvest Job per anchor across the whole cluster: a lock object per anchor.

Two tunings in two namespaces that miss the same anchor at the same moment each found no Job and
each created one (the Job's name is deterministic, but per namespace). Now the tuning that starts
a harvest first creates a Lease (coordination.k8s.io/v1) named after the anchor, in the operator's
own namespace; creation is atomic, so exactly one tuning wins and creates the Job, and the Lease
names that Job (annotation `inferasim.io/job`: namespace/name). The others find the Job through
the Lease and wait for it (or, while it is being created, for the name the Lease gives).

A Lease whose Job is gone (finished and removed after a day, or deleted to try again) and that
is older than STALE_S is taken over by the next tuning that needs the anchor: a replace with the
Lease's resourceVersion, which only one can win. The operator needs no cluster-wide Job access
for any of it (only its own namespace's Leases and the watched namespaces' Jobs).

Blocking (kubernetes client): callers run these with asyncio.to_thread.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from inferasim_operator.kube import ApiException, Kube, managed
from inferasim_operator.models import LABEL_ANCHOR, LABEL_MANAGED, MANAGER

log = logging.getLogger("inferasim_operator")

JOB_ANNOTATION = "inferasim.io/job"
HOLDER_ANNOTATION = "inferasim.io/tuning"
# A Lease naming no existing Job is left alone this long (its holder may be creating the Job).
STALE_S = 120
MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


def lease_name(key: str) -> str:
    return f"inferasim-harvest-{key}"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime(MICRO)


def _age_s(text: Any) -> float | None:
    if isinstance(text, dt.datetime):
        when = text if text.tzinfo else text.replace(tzinfo=dt.UTC)
    else:
        try:
            when = dt.datetime.strptime(str(text), MICRO).replace(tzinfo=dt.UTC)
        except ValueError:
            return None
    return (dt.datetime.now(dt.UTC) - when).total_seconds()


def job_ref(lease: dict[str, Any] | None) -> tuple[str, str]:
    """(namespace, name) of the Job a Lease names; ('', '') when none."""
    ref = (((lease or {}).get("metadata") or {}).get("annotations") or {}).get(JOB_ANNOTATION, "")
    ns, _, name = ref.partition("/")
    return (ns, name) if ns and name else ("", "")


def holder(lease: dict[str, Any] | None) -> str:
    return (((lease or {}).get("metadata") or {}).get("annotations") or {}).get(HOLDER_ANNOTATION, "")


def _job(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None | bool:
    """The Job, None when it does not exist, True when it may exist but cannot be read (a namespace
    the operator no longer watches: never taken over then)."""
    try:
        return kube.get_job(namespace, name)
    except ApiException as exc:
        if exc.status == 403:
            return True
        raise


def find_job(kube: Kube, lock_namespace: str, key: str, namespace: str, name: str
             ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the anchor's harvest Job wherever the Lease says it is, else the Job of that deterministic
    name in ``namespace`` (one started before the locks), the Lease)."""
    lease = kube.get_lease(lock_namespace, lease_name(key))
    jns, jname = job_ref(lease)
    if jns:
        job = _job(kube, jns, jname)
        if isinstance(job, dict):
            return job, lease
    job = kube.get_job(namespace, name)
    return job, lease


def claim(kube: Kube, lock_namespace: str, key: str, namespace: str, name: str, tuning: str) -> bool:
    """Whether this tuning may create the harvest Job ``namespace/name`` for anchor ``key``: it holds
    the anchor's Lease now (created, or taken over from a stale one)."""
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(key), "namespace": lock_namespace,
                         "labels": {LABEL_MANAGED: MANAGER, LABEL_ANCHOR: key},
                         "annotations": {JOB_ANNOTATION: f"{namespace}/{name}", HOLDER_ANNOTATION: tuning}},
            "spec": {"holderIdentity": tuning[:253], "acquireTime": _now(), "renewTime": _now(),
                     "leaseDurationSeconds": STALE_S}}
    if kube.create_lease(body):
        return True
    current = kube.get_lease(lock_namespace, lease_name(key))
    if current is None:  # released meanwhile
        return kube.create_lease(body)
    if not managed(current):
        log.warning("Lease %s/%s is not the operator's: the anchor is not harvested", lock_namespace,
                    lease_name(key))
        return False
    jns, jname = job_ref(current)
    if jns and _job(kube, jns, jname) is not None:
        return False  # its Job exists: that one is the anchor's harvest
    age = _age_s((current.get("spec") or {}).get("renewTime"))
    if age is not None and age < STALE_S:
        return False  # its holder is creating the Job now
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return kube.replace_lease(body)


def release(kube: Kube, lock_namespace: str, key: str, namespace: str, name: str) -> None:
    """Delete the anchor's Lease when it names this Job (the operator deleted the Job)."""
    lease = kube.get_lease(lock_namespace, lease_name(key))
    if lease is not None and managed(lease) and job_ref(lease) == (namespace, name):
        kube.delete_lease(lock_namespace, lease_name(key))
