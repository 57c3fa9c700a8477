"""Harvest Jobs in the cluster: start (or find) one Job per missing anchor within the tuning's
GPU-hour budget, follow their states, and import the anchor a succeeded Job wrote as a ServingAnchor.

What a Job is (its manifest, limits and the anchor in its termination message) is harvest_job.py,
which the harvester pod imports too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from inferasim.core.spec import TuningSpec
from inferasim.model.anchors import Anchor
from inferasim_operator import harvest_lock, metrics
from inferasim_operator import kube as kube_mod
from inferasim_operator.harvest_job import (
    JOB_TTL_AFTER_FINISHED_S,
    HarvestTarget,
    MessageError,
    anchor_object,
    build_job,
    decode_anchor,
    job_limits,
    terminated_message,
)
from inferasim_operator.kube import ApiException, Kube
from inferasim_operator.models import Harvest, LayoutStatus, MissingAnchor
from inferasim_operator.settings import Settings
from inferasim_operator.status import StatusBook, post_event
from inferasim_operator.times import RFC3339, age_s, now_iso

log = logging.getLogger("inferasim_operator")


def job_state(job: dict[str, Any]) -> str:
    st = job.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("status") == "True" and c.get("type") == "Complete":
            return "Succeeded"
        if c.get("status") == "True" and c.get("type") == "Failed":
            return "Failed"
    if (st.get("succeeded") or 0) > 0:
        return "Succeeded"
    if (st.get("active") or 0) > 0:
        return "Running"
    return "Pending"


def unscheduled_reason(kube: Kube, job: dict[str, Any]) -> str:
    """Why no pod of an active Job is on a node ('' when one is): the scheduler's message (no
    node with the GPU's labels, not enough GPUs ...), which otherwise shows only at the deadline."""
    meta = job["metadata"]
    try:
        pods = kube.list_pods(meta["namespace"], f"job-name={meta['name']}")
    except ApiException:
        return ""
    waiting = []
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            return ""
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                waiting.append(f"{c.get('reason') or 'Unschedulable'}: {c.get('message') or ''}".strip(": "))
    return "; ".join(waiting)[:400]


def job_failure(job: dict[str, Any]) -> str:
    """A failed Job's reason and message ('failed' when its conditions give none)."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip(": ")
    return "failed"


async def import_harvest(kube: Kube, job: dict[str, Any], harvested_by: str) -> tuple[Anchor, bool]:
    """The anchor a succeeded harvest Job wrote in its pod's termination message, as a ServingAnchor.
    Returns (anchor, whether the ServingAnchor was created now)."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    pods = await asyncio.to_thread(kube.list_pods, ns, f"job-name={name}")
    problems = []
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True):
        if (pod.get("status") or {}).get("phase") != "Succeeded":
            continue
        message = terminated_message(pod)
        try:
            anchor = decode_anchor(message or "")
        except MessageError as exc:
            problems.append(f"pod {pod['metadata']['name']}: {exc}")
            continue
        body = anchor_object(anchor, harvested_by=harvested_by, job=f"{ns}/{name}")
        created = await asyncio.to_thread(kube.create_anchor, body)
        if not created:
            return anchor, False
        try:
            await asyncio.to_thread(kube.patch_anchor_status, body["metadata"]["name"],
                                    {"harvestedBy": harvested_by, "job": f"{ns}/{name}", "importedAt": now_iso()})
        except ApiException as exc:  # status is informative only
            log.warning("cannot write the status of ServingAnchor %s: %s", body["metadata"]["name"], exc)
        _count_gpu_seconds(job, "succeeded")
        return anchor, True
    raise MessageError("; ".join(problems) or f"no succeeded pod of Job {ns}/{name} holds an anchor")


def _count_gpu_seconds(job: dict[str, Any], result: str) -> None:
    st = job.get("status") or {}
    start, end = st.get("startTime"), st.get("completionTime")
    gpus = int((job["metadata"].get("annotations") or {}).get("inferasim.io/gpus", "1") or 1)
    if not start:
        return
    s = age_s(start if isinstance(start, str) else start.strftime(RFC3339))
    e = age_s(end if isinstance(end, str) else end.strftime(RFC3339)) if end else 0.0
    if s is not None and e is not None and s >= e:
        engine = (job["metadata"].get("labels") or {}).get("inferasim.io/engine", "")
        metrics.HARVEST_GPU_SECONDS.labels(engine=engine, result=result).inc((s - e) * gpus)


async def plan_harvests(body: dict[str, Any], spec: TuningSpec, missing: list[dict[str, Any]], book: StatusBook,
                        kube: Kube, settings: Settings) -> tuple[list[Harvest], list[MissingAnchor], int]:
    """Start (or find) one Job per missing anchor within the GPU-hour budget.

    Returns (harvests in flight, missing anchors with reasons, anchors imported just now)."""
    anchors = book.get("anchors") or {}
    used = float(anchors.get("gpuHoursBudgeted") or 0.0)
    known = {h["job"]: h for h in anchors.get("harvesting") or []}
    harvesting: list[Harvest] = []
    missing_out: list[MissingAnchor] = []
    imported = 0
    owner = f"{book.namespace}/{book.name}"
    for m in sorted(missing, key=lambda m: (m["harvest_gpu_hours"], m["engine"], m["precision"])):
        target = HarvestTarget.from_missing(m)
        lay = LayoutStatus.model_validate(target.layout.as_dict())
        entry = MissingAnchor(engine=target.engine, model=target.model, gpu=target.gpu, precision=target.precision,
                              layout=lay, gpu_hours=round(target.gpu_hours, 4))
        # One Job per anchor in the whole cluster, whoever started it, across operator restarts: the
        # anchor's Lease in the operator's namespace names it (harvest_lock.py).
        lock_ns = settings.prices.namespace
        found, _ = await asyncio.to_thread(harvest_lock.find_job, kube, lock_ns, target.key, book.namespace,
                                               target.job_name)
        jobs = [found] if found is not None else []
        if jobs:
            job = sorted(jobs, key=lambda j: j["metadata"]["name"])[0]
            state = job_state(job)
            where = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
            job_ns, job_name = job["metadata"]["namespace"], job["metadata"]["name"]
            refs = list(job["metadata"].get("ownerReferences") or [])
            owned = any(ref.get("uid") == book.uid for ref in refs)
            running = state not in ("Succeeded", "Failed")
            if not spec.harvest.allowed and owned and running:
                # Harvesting was switched off while a Job this tuning owns ran: it would hold its GPUs
                # to its deadline for an anchor the spec no longer wants. Deleted when no other tuning
                # owns it too; else this tuning lets go of it and the others keep it.
                others = [r for r in refs if r.get("uid") != book.uid]
                if others:
                    await asyncio.to_thread(kube.set_job_owners, job_ns, job_name, others)
                    entry.reason = f"harvest.allowed is false: harvest Job {where} is left to the other tunings"
                else:
                    await asyncio.to_thread(kube.delete_job, job_ns, job_name)
                    await asyncio.to_thread(harvest_lock.release, kube, lock_ns, target.key, job_ns, job_name)
                    post_event(body, "Normal", "HarvestStopped", f"Job {where} deleted: harvest.allowed is false")
                    entry.reason = (f"harvest.allowed is false: its harvest Job {where} was deleted; predictions "
                                    "are unanchored")
                missing_out.append(entry)
                continue
            if spec.harvest.allowed and running and not owned and job_ns == book.namespace and \
                    (body.get("metadata") or {}).get("uid"):
                # Waiting for a Job another tuning of this namespace started: own it too, so that
                # deleting that tuning does not garbage-collect a measurement this one waits for.
                await asyncio.to_thread(kube.set_job_owners, job_ns, job_name, [*refs, kube_mod.sharing_owner(body)])
            if state == "Succeeded":
                try:
                    _, created = await import_harvest(kube, job, owner)
                    imported += int(created)
                    entry.reason = (f"harvested by Job {where}" if created else
                                    f"harvested by Job {where}, but its anchor does not match what the search needs")
                except MessageError as exc:
                    entry.reason = f"harvest Job {where} succeeded but {exc}"
            elif state == "Failed":
                entry.reason = (f"harvest Job {where} failed ({job_failure(job)}); delete it to try again (it "
                                f"removes itself {JOB_TTL_AFTER_FINISHED_S // 3600} h after it finished)")
            else:
                entry.reason = f"being harvested by Job {where}"
                prev = known.get(job["metadata"]["name"], {})
                harvesting.append(Harvest(job=job["metadata"]["name"], job_namespace=job["metadata"]["namespace"],
                                          engine=target.engine, precision=target.precision, layout=lay,
                                          gpu_hours=float(prev.get("gpuHours", target.gpu_hours)), state=state,
                                          started=prev.get("started") or now_iso()))
            missing_out.append(entry)
            continue
        if not spec.harvest.allowed:
            entry.reason = "harvest.allowed is false: predictions for it are unanchored"
            missing_out.append(entry)
            continue
        remaining = spec.harvest.max_gpu_hours - used
        limits = job_limits(target, spec.harvest, remaining)
        if limits is None:
            entry.reason = (f"a harvest needs {target.gpu_hours:.2f} GPU-hours; {max(remaining, 0):.2f} of "
                            f"harvest.maxGPUHours ({spec.harvest.max_gpu_hours:g}) left")
            missing_out.append(entry)
            continue
        try:
            job = build_job(target, spec.harvest, limits, namespace=book.namespace, tuning=book.name,
                            harvester_image=settings.harvest.image, extra_harvest_args=settings.harvest.extra_args,
                            engine_images=settings.harvest.engine_images)
        except ValueError as exc:
            entry.reason = f"cannot harvest: {exc}"
            missing_out.append(entry)
            continue
        kube_mod.own(job, body)
        if not await asyncio.to_thread(harvest_lock.claim, kube, lock_ns, target.key, book.namespace,
                                       job["metadata"]["name"], owner):
            # Another tuning (maybe of another namespace) won the anchor a moment ago and is creating
            # its Job: wait for that one, named by the anchor's Lease.
            lease = await asyncio.to_thread(kube.get_lease, lock_ns, harvest_lock.lease_name(target.key))
            jns, jname = harvest_lock.job_ref(lease)
            if not jns:
                entry.reason = "another tuning is starting the harvest of this anchor"
                missing_out.append(entry)
                continue
            entry.reason = f"being harvested by Job {jns}/{jname} (started by {harvest_lock.holder(lease)})"
            missing_out.append(entry)
            harvesting.append(Harvest(job=jname, job_namespace=jns, engine=target.engine, precision=target.precision,
                                      layout=lay, gpu_hours=0.0, state="Pending", started=now_iso()))
            continue
        created = await asyncio.to_thread(kube.create_job, job)
        if created:
            used += limits.budget_gpu_hours
            metrics.HARVEST_JOBS.labels(engine=target.engine).inc()
            post_event(body, "Normal", "HarvestStarted",
                       f"Job {job['metadata']['name']} measures {target.kernel_set.describe()} at "
                       f"{target.layout.label()} ({target.layout.gpus} GPUs, at most {limits.budget_gpu_hours:.2f} "
                       f"GPU-hours, deadline {limits.active_deadline_s} s)")
        entry.reason = f"being harvested by Job {book.namespace}/{job['metadata']['name']}"
        missing_out.append(entry)
        harvesting.append(Harvest(job=job["metadata"]["name"], engine=target.engine, precision=target.precision,
                                  layout=lay, gpu_hours=round(limits.budget_gpu_hours, 4), state="Pending",
                                  started=now_iso()))
    book.set(anchors={**anchors, "gpuHoursBudgeted": round(used, 4)})
    return harvesting, missing_out, imported


async def refresh_harvests(body: dict[str, Any], book: StatusBook, kube: Kube) -> tuple[int, int, int]:
    """Update the harvest Jobs' states; import finished ones. Returns (in flight, imported, failed)."""
    anchors = dict(book.get("anchors") or {})
    out, imported, failed, active = [], 0, 0, 0
    owner = f"{book.namespace}/{book.name}"
    for h in anchors.get("harvesting") or []:
        job = await asyncio.to_thread(kube.get_job, h.get("jobNamespace") or book.namespace, h["job"])
        if job is None and (age_s(h.get("started")) or 0.0) < harvest_lock.STALE_S and \
                (h.get("jobNamespace") or book.namespace) != book.namespace:
            # Another tuning won the anchor's Lease and is creating this Job now.
            active += 1
            out.append(h)
            continue
        if job is None:
            failed += 1
            post_event(body, "Warning", "HarvestFailed", f"Job {h['job']} disappeared")
            continue
        state = job_state(job)
        if state == "Succeeded":
            try:
                anchor, _ = await import_harvest(kube, job, owner)
                imported += 1
                post_event(body, "Normal", "AnchorHarvested", f"Job {h['job']} wrote ServingAnchor "
                                                              f"{anchor_object(anchor)['metadata']['name']}")
            except MessageError as exc:
                failed += 1
                post_event(body, "Warning", "HarvestFailed", f"Job {h['job']} succeeded but {exc}")
            continue
        if state == "Failed":
            failed += 1
            _count_gpu_seconds(job, "failed")
            post_event(body, "Warning", "HarvestFailed", f"Job {h['job']}: {job_failure(job)}")
            continue
        active += 1
        why = ""
        if state == "Running":
            # A pod the scheduler cannot place counts as active: say Pending, and why.
            why = await asyncio.to_thread(unscheduled_reason, kube, job)
            state = "Pending" if why else state
        if h.get("state") != state or (h.get("reason") or "") != why:
            post_event(body, "Normal" if not why else "Warning",
                       "HarvestRunning" if state == "Running" else "HarvestPending",
                       f"Job {h['job']} is {state.lower()}" + (f": {why}" if why else ""))
        out.append({**h, "state": state, "reason": why})
    if out != anchors.get("harvesting"):
        anchors["harvesting"] = out
        book.set(anchors=anchors)
    return active, imported, failed
