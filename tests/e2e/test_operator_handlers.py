"""The handler functions driven directly (no kopf runner, no operator process) against the real API
server: reconcile and the timer's tick, step by step."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from inferasim_e2e_support import kubelet_finish, wait_until
from inferasim_operator.harvest import job_state
from inferasim_operator.harvest_job import encode_anchor
from inferasim_operator.kube import Kube
from inferasim_operator.passes import timer, tune
from inferasim_operator.settings import Settings

from inferasim.model.anchor_store import AnchorStore

pytestmark = pytest.mark.e2e
GROUP, VERSION, PLURAL = "inferasim.io", "v1alpha1", "servingtunings"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ns(cluster: Any, gpu_node: str) -> Iterator[str]:
    from kubernetes import client

    name = f"direct-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(cluster.api).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(cluster.api).delete_namespace(name)
    custom = client.CustomObjectsApi(cluster.api)
    for a in custom.list_cluster_custom_object(GROUP, VERSION, "servinganchors")["items"]:
        if (a["metadata"].get("annotations") or {}).get("inferasim.io/harvested-by", "").startswith(name + "/"):
            custom.delete_cluster_custom_object(GROUP, VERSION, "servinganchors", a["metadata"]["name"])


def create(cluster: Any, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ServingTuning", "metadata": {"name": name, "namespace": ns},
        "spec": spec})


def spec(**over: Any) -> dict[str, Any]:
    # fp8: a kernel set no other test harvests (the cluster's ServingAnchors are shared)
    s = {"target": {"name": "svc"}, "model": "meta-llama/Meta-Llama-3-8B", "precision": ["fp8"],
         "hardware": {"gpu": "MI300X", "maxGPUs": 4}, "engines": ["vllm"],
         "workload": {"static": {"kind": "closed", "concurrency": 16, "inputTokens": 256, "outputTokens": 64}},
         "harvest": {"allowed": True, "maxGPUHours": 1}}
    s.update(over)
    return s


def test_reconcile_and_tick_directly(cluster: Any, ns: str) -> None:
    from kubernetes import client

    kube = Kube(cluster.api)
    tmp = Path(tempfile.mkdtemp(prefix="inferasim-direct-"))
    settings = Settings(anchor_dirs=[str(tmp / "none")], anchor_cache=str(tmp / "cache"), stage2_top=2,
                                  harvester_image="op:test", search_timeout_s=240, operator_namespace=ns)
    body = create(cluster, ns, "t1", spec())
    assert asyncio.run(tune.reconcile(body, kube, settings, trigger="test", reason="direct")) == "Harvesting"
    again = asyncio.run(tune.reconcile(body, kube, settings, trigger="test", reason="direct"))
    assert again == "skipped"  # the same generation is not searched twice (resume after a restart)
    st = kube.get_tuning(ns, "t1")["status"]
    assert st["phase"] == "Harvesting" and st["observedGeneration"] == 1
    assert st["anchors"]["gpuHoursBudgeted"] <= 1.0
    job = st["anchors"]["harvesting"][0]["job"]
    assert asyncio.run(timer.tick(kube.get_tuning(ns, "t1"), kube, settings)) == "harvesting"

    # the pod finishes with an anchor in its termination message (one measured elsewhere)
    anchor = next(a for a in AnchorStore(REPO / "anchors").all() if a.kernel_set.engine == "vllm")
    anchor = anchor.model_copy(update={"kernel_set": anchor.kernel_set.model_copy(update={
        "model": "meta-llama/Meta-Llama-3-8B", "gpu": "MI300X", "precision": "fp8", "kv_dtype": "fp8"})})
    core = client.CoreV1Api(cluster.api)
    pod = wait_until(lambda: [p for p in core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items
                              if p.spec.node_name], 60, "harvest pod scheduled")[0]
    kubelet_finish(cluster.api, ns, pod.metadata.name, {"harvester": encode_anchor(anchor)})
    wait_until(lambda: job_state(kube.get_job(ns, job) or {}) == "Succeeded", 30, "Job complete")
    assert asyncio.run(timer.tick(kube.get_tuning(ns, "t1"), kube, settings)) == "Recommended"
    st = kube.get_tuning(ns, "t1")["status"]
    assert st["recommendation"]["anchor"] and st["anchors"]["harvesting"] == []
    assert [(c["type"], c["status"]) for c in st["conditions"]] == [
        ("WorkloadObserved", "True"), ("AnchorsReady", "True"), ("Priced", "False"), ("Recommended", "True")]
    assert st["conditions"][2]["reason"] == "NoPrice"  # no spec price, no prices ConfigMap: unpriced, not failed
    assert asyncio.run(timer.tick(kube.get_tuning(ns, "t1"), kube, settings)) == "steady"

    # a spec change is a new generation: searched again, no second Job
    client.CustomObjectsApi(cluster.api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "t1", {"spec": {"hardware": {"gpu": "MI300X", "maxGPUs": 2}}})
    body = kube.get_tuning(ns, "t1")
    assert asyncio.run(tune.reconcile(body, kube, settings, trigger="test", reason="spec")) == "Recommended"
    assert kube.get_tuning(ns, "t1")["status"]["observedGeneration"] == 2
    assert len(client.BatchV1Api(cluster.api).list_namespaced_job(ns).items) == 1


def test_invalid_spec_is_permanent_and_reported(cluster: Any, ns: str) -> None:
    kube = Kube(cluster.api)
    settings = Settings(anchor_cache=tempfile.mkdtemp(), stage2_top=1)
    body = create(cluster, ns, "bad", spec(retune={"every": "often"}))
    with pytest.raises(kopf.PermanentError, match="retune.every"):
        asyncio.run(tune.reconcile(body, kube, settings, trigger="test", reason="direct"))
    st = kube.get_tuning(ns, "bad")["status"]
    assert st["phase"] == "Invalid" and st["conditions"][0]["reason"] == "InvalidSpec"
    assert asyncio.run(tune.reconcile(body, kube, settings, trigger="test", reason="again")) == "skipped"
    assert asyncio.run(timer.tick(kube.get_tuning(ns, "bad"), kube, settings)) == "idle"
