"""The operator end to end on a real control plane (see conftest.py for which one).

A ServingTuning observed through a real Prometheus that scrapes an emulated vLLM playing the
live deployment -> a harvest Job for the missing anchor, scheduled by the real scheduler onto a
registered GPU node -> the test plays the kubelet: it runs the pod's harvester command against a
second emulator playing the engine container and writes the pod status -> ServingAnchor ->
Recommended with a manifest the API server accepts -> canary Deployment -> Confirmed.
The operator runs as a process under the chart's ServiceAccount and ClusterRole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from inferasim_e2e_support import (
    GROUP,
    PLURAL,
    VERSION,
    Load,
    OperatorEnv,
    Prometheus,
    free_port,
    kubelet_finish,
    kubelet_run,
    operator_in_namespace,
    wait_until,
)

pytestmark = pytest.mark.e2e

MODEL, GPU = "meta-llama/Meta-Llama-3-8B", "MI300X"
SPEEDUP = 20.0
# A short harvest plan for the emulated engine; the fit-quality gate is loosened because a loaded
# 2-core CI machine adds timing noise (the gate is the harvester's own tests' business).
HARVEST_ARGS = f"--speedup {SPEEDUP:g} --plan 512x128@1,4,16;2048x64@4 --max-rms-log-error 1.5 --quiet"


Env = OperatorEnv


@pytest.fixture(scope="module")
def env(cluster: Any, operator_kubeconfig: Path, gpu_node: str) -> Iterator[Env]:
    from kubernetes import client

    # No shipped anchors: the model/GPU pair below must be harvested. GPU prices: the ConfigMap
    # inferasim-gpu-prices in the test namespace (the test creates it).
    settings = {"INFERASIM_HARVEST_ARGS": HARVEST_ARGS, "INFERASIM_HARVESTER_IMAGE": "inferasim-operator:e2e"}
    with operator_in_namespace(cluster.api, operator_kubeconfig, "e2e", settings) as e:
        try:
            yield e
        finally:
            custom = client.CustomObjectsApi(cluster.api)
            for a in custom.list_cluster_custom_object(GROUP, VERSION, "servinganchors")["items"]:
                notes = a["metadata"].get("annotations") or {}
                if any(notes.get(k, "").startswith(e.ns + "/") for k in ("inferasim.io/harvested-by",
                                                                          "inferasim.io/measured-by")):
                    custom.delete_cluster_custom_object(GROUP, VERSION, "servinganchors", a["metadata"]["name"])


def static_spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"name": "chat"}, "model": MODEL, "precision": ["bf16"],
        "hardware": {"gpu": "AMD_Instinct_MI300X", "gpusPerNode": 8, "maxGPUs": 8}, "engines": ["vllm"],
        "workload": {"static": {"kind": "poisson", "requestRate": 5, "inputTokens": 512, "outputTokens": 128}},
    }
    spec.update(over)
    return spec


# --------------------------------------------------------------------------------------------
# RBAC and bad specs
# --------------------------------------------------------------------------------------------


def test_operator_service_account_cannot_read_secrets(env: Env, operator_kubeconfig: Path) -> None:
    from inferasim_e2e_support import api_client
    from kubernetes import client

    sa = api_client(operator_kubeconfig)
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(sa).list_namespaced_secret(env.ns)
    assert err.value.status == 403
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(sa).list_secret_for_all_namespaces()
    assert err.value.status == 403
    # ... while what it needs is allowed, in the namespaces it watches only
    client.CustomObjectsApi(sa).list_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL)
    client.BatchV1Api(sa).list_namespaced_job(env.ns, limit=1)
    with pytest.raises(client.ApiException) as err:
        client.BatchV1Api(sa).list_job_for_all_namespaces(limit=1)
    assert err.value.status == 403


@pytest.mark.parametrize("case,spec,field", [
    ("unknown-engine", static_spec(engines=["trtllm"]), "spec.engines"),
    ("gpu-budget-0", static_spec(hardware={"gpu": "MI300X", "maxGPUs": 0}), "spec.hardware.maxGPUs"),
    ("slo-negative", static_spec(objective={"slo": {"ttftP90Ms": -1}}), "spec.objective.slo.ttftP90Ms"),
    ("target-missing", {k: v for k, v in static_spec().items() if k != "target"}, "spec.target"),
    ("two-workloads", static_spec(workload={"static": {"requestRate": 1}, "prometheus": {"url": "http://x"}}),
     "oneOf"),
])
def test_bad_specs_refused_by_the_crd_schema(env: Env, case: str, spec: dict[str, Any], field: str) -> None:
    from kubernetes import client

    with pytest.raises(client.ApiException) as err:
        env.apply_tuning(f"bad-{case}", spec)
    assert err.value.status == 422
    assert field in err.value.body


def test_bad_spec_reported_as_a_condition(env: Env) -> None:
    # Valid for the schema, refused by the library: an unknown GPU and an unknown model.
    env.apply_tuning("bad-gpu", static_spec(hardware={"gpu": "NotAGPU-9000", "maxGPUs": 8}))
    env.apply_tuning("bad-window", static_spec(confirmation={"mode": "canary", "window": "half an hour"}))
    for name, words in (("bad-gpu", "NotAGPU-9000"), ("bad-window", "confirmation.window")):
        st = wait_until(lambda n=name: env.status(n) if env.status(n).get("phase") == "Invalid" else None, 90,
                        f"{name} phase Invalid")
        cond = next(c for c in st["conditions"] if c["type"] == "Recommended")
        assert cond["status"] == "False" and cond["reason"] == "InvalidSpec"
        assert words in cond["message"]
        assert st["observedGeneration"] == env.tuning(name)["metadata"]["generation"]


def test_unreachable_prometheus_is_a_condition_with_the_query(env: Env) -> None:
    port = free_port()  # nothing listens there
    env.apply_tuning("no-prom", static_spec(workload={"prometheus": {
        "url": f"http://127.0.0.1:{port}", "selector": {"namespace": env.ns, "deployment": "chat"}, "window": "1m"}}))

    def failing() -> dict[str, Any] | None:
        c = env.condition("no-prom", "WorkloadObserved")
        return c if c and c["status"] == "False" and env.status("no-prom").get("retries", 0) >= 2 else None

    cond = wait_until(failing, 90, "WorkloadObserved=False with retries")
    assert cond["reason"] == "Unreachable"
    assert "count({__name__=~" in cond["message"] and f"127.0.0.1:{port}" in cond["message"]
    assert "recommendation" not in env.status("no-prom")  # never a made-up workload
    env.custom.delete_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, "no-prom")


def test_static_tuning_recommends_and_its_manifest_applies(env: Env) -> None:
    """A static workload, harvest not allowed: Recommended (unanchored), ConfigMap, manifest accepted,
    priced from the operator's GPU prices ConfigMap (the spec has no price)."""
    env.core.create_namespaced_config_map(env.ns, {"metadata": {"name": "inferasim-gpu-prices"},
                                                   "data": {"mi300x": "2.5", "H200": "3.1"}})
    t0 = time.monotonic()
    env.apply_tuning("static", static_spec())
    st = wait_until(lambda: env.status("static") if env.status("static").get("phase") == "Recommended" else None,
                    120, "static tuning Recommended")
    print(f"\nstatic tuning: Recommended {time.monotonic() - t0:.1f} s after apply")
    rec = st["recommendation"]
    assert rec["engine"] == "vllm" and rec["gpus"] >= 1 and rec["manifestConfigMap"] == "static-recommendation"
    assert env.condition("static", "AnchorsReady")["reason"] == "AnchorsMissing"
    assert "harvest.allowed is false" in env.condition("static", "AnchorsReady")["message"]
    assert len(st["shortlist"]) <= 5 and st["history"]
    priced = env.condition("static", "Priced")
    assert priced["status"] == "True" and priced["reason"] == "ConfigMapPrice" and "'mi300x'" in priced["message"]
    assert rec["predicted"]["costPerMillionTokens"] > 0
    assert all(c["predicted"]["costPerMillionTokens"] > 0 for c in st["shortlist"])
    assert not env.batch.list_namespaced_job(env.ns, label_selector="inferasim.io/tuning=static").items
    cm = wait_until(lambda: (c := env.core.read_namespaced_config_map("static-recommendation", env.ns)).data
                    ["manifest.yaml"] == rec["manifest"] and c, 30, "the ConfigMap holding the recommendation")
    assert cm.metadata.owner_references[0].name == "static"
    server_side_dry_run(env, rec["manifest"])
    events = env.core.list_namespaced_event(env.ns, field_selector="involvedObject.name=static").items
    reasons = {e.reason for e in events}
    assert {"Tuning", "SearchComplete", "Recommended"} <= reasons, reasons


def server_side_dry_run(env: Env, manifest: str) -> None:
    """Apply every document with server-side apply, dryRun=All: the API server validates it fully."""
    from kubernetes.dynamic import DynamicClient

    docs = [d for d in yaml.safe_load_all(manifest) if d]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "PodDisruptionBudget"}
    dynamic = DynamicClient(env.api)
    for d in docs:
        name, ns = d["metadata"]["name"], d["metadata"]["namespace"]
        if d["kind"] == "PodDisruptionBudget":
            # The local control plane (v1.20) serves the budget as policy/v1beta1 only (same spec
            # fields); the Python client's typed APIs no longer hold it: the dynamic client, dry run.
            served = {v.version for g in env.api_groups() if g.name == "policy" for v in g.versions}
            version = "policy/v1" if "v1" in served else "policy/v1beta1"
            pdbs = dynamic.resources.get(api_version=version, kind="PodDisruptionBudget")
            out = pdbs.create(body={**d, "apiVersion": version}, namespace=ns, dry_run="All")
            assert out.metadata.name == name
            continue
        # force: as `kubectl apply --server-side --force-conflicts` from a GitOps tool taking the target over
        kw = {"dry_run": "All", "field_manager": "inferasim-e2e", "force": True,
              "_content_type": "application/apply-patch+yaml"}
        if d["kind"] == "Deployment":
            out = env.apps.patch_namespaced_deployment(name, ns, d, **kw)
        else:
            out = env.core.patch_namespaced_service(name, ns, d, **kw)
        assert out.metadata.name == name


# --------------------------------------------------------------------------------------------
# the whole story
# --------------------------------------------------------------------------------------------


def play_harvest_pod(env: Env, pod: Any, tmp: Path) -> dict[str, str]:
    """Be the kubelet of a harvest pod: the engine container is an emulator; the harvester
    container's own command runs as a process; its termination message is what it wrote."""
    from inferasim.emulator import EmulatorConfig, start_emulator

    kubelet_run(env.api, env.ns, pod.metadata.name)
    tmp.mkdir(parents=True, exist_ok=True)
    harvester = next(c for c in pod.spec.containers if c.name == "harvester")
    engine = next(c for c in pod.spec.containers if c.name != "harvester")
    assert engine.resources.limits["amd.com/gpu"] == "1"
    args = list(harvester.args)
    old_endpoint = args[args.index("--endpoint") + 1]
    with start_emulator(EmulatorConfig(model=MODEL, gpu=GPU, engine="vllm", speedup=SPEEDUP, precision="bf16")) as h:
        # The pod's paths and address, mapped onto this machine.
        args = [a.replace(old_endpoint, h.url).replace("/harvest/", f"{tmp}/") for a in args]
        term = tmp / "termination-log"
        r = subprocess.run([sys.executable, *harvester.command[1:], *args], capture_output=True, text=True,
                           timeout=240, env={**os.environ, "INFERASIM_TERMINATION_LOG": str(term)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp / "done").exists()  # the engine container would stop now
    return {"harvester": term.read_text(), engine.name: ""}


@pytest.fixture(scope="module")
def live(env: Env, prometheus: Prometheus) -> Iterator[dict[str, Any]]:
    """An emulated vLLM playing the live deployment `chat`, under load, scraped by Prometheus."""
    from inferasim.emulator import EmulatorConfig, start_emulator

    h = start_emulator(EmulatorConfig(model=MODEL, gpu=GPU, engine="vllm", speedup=SPEEDUP, precision="bf16"))
    load = Load(h.url, h.served_model_name, rate=6.0, prompt_tokens=400, max_tokens=64).start()
    groups = [{"targets": [h.url.removeprefix("http://")], "labels": {"namespace": env.ns, "deployment": "chat"}}]
    prometheus.set_targets(groups)
    prometheus.wait_for_series(f'rate(vllm:request_success_total{{namespace="{env.ns}"}}[30s]) > 0', timeout=60)
    try:
        yield {"emulator": h, "load": load, "groups": groups}
    finally:
        load.stop()
        h.stop()


def test_end_to_end(env: Env, prometheus: Prometheus, live: dict[str, Any], gpu_node: str) -> None:
    # The live deployment being tuned (its pods never run: no kubelet; its labels matter).
    env.apps.create_namespaced_deployment(env.ns, {
        "metadata": {"name": "chat", "labels": {"app": "chat"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "chat"}},
                 "template": {"metadata": {"labels": {"app": "chat"}},
                              "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai-rocm:v0.27.1"}]}}}})
    spec = static_spec(
        workload={"prometheus": {"url": prometheus.url, "selector": {"namespace": env.ns, "deployment": "chat"},
                                 "window": "30s"}},
        harvest={"allowed": True, "maxGPUHours": 2, "deadlineMinutes": 30},
        confirmation={"mode": "canary", "candidates": 1, "window": "12s"},
        retune={"driftThreshold": 0.5})
    t0 = time.monotonic()
    env.apply_tuning("chat", spec)

    # 1. observed, searched, one harvest Job for the missing anchor, owned by the tuning
    st = wait_until(lambda: env.status("chat") if env.status("chat").get("phase") == "Harvesting" else None, 120,
                    "phase Harvesting")
    t_harvesting = time.monotonic() - t0
    assert env.condition("chat", "WorkloadObserved")["status"] == "True"
    obs = st["observedWorkload"]
    assert obs["engine"] == "vllm" and obs["requestRate"] > 0 and 300 <= obs["promptTokensMean"] <= 500
    assert obs["outputTokensMean"] == pytest.approx(64, rel=0.05)
    assert obs["ttft"]["p90Ms"] > 0 and obs["itl"]["p90Ms"] > 0
    assert env.condition("chat", "AnchorsReady")["reason"] == "Harvesting"
    assert env.condition("chat", "Recommended")["reason"] == "Provisional"
    jobs = env.batch.list_namespaced_job(env.ns, label_selector="inferasim.io/tuning=chat").items
    assert len(jobs) == 1
    job = jobs[0]
    assert job.metadata.owner_references[0].kind == "ServingTuning"
    assert job.metadata.owner_references[0].name == "chat"
    terms = job.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        .node_selector_terms
    assert terms[0].match_expressions[0].values == ["AMD_Instinct_MI300X_OAM"]
    assert terms[1].match_expressions[0].key == "amd.com/gpu.device-id"
    assert job.spec.backoff_limit >= 0 and job.spec.active_deadline_seconds <= 30 * 60
    assert [h["job"] for h in st["anchors"]["harvesting"]] == [job.metadata.name]

    # 2. the real scheduler places the harvest pod on the GPU node
    def scheduled() -> Any:
        pods = env.core.list_namespaced_pod(env.ns, label_selector=f"job-name={job.metadata.name}").items
        return pods[0] if pods and pods[0].spec.node_name else None

    pod = wait_until(scheduled, 60, "harvest pod bound to a node")
    assert pod.spec.node_name == gpu_node

    # 3. restart the operator mid-harvest: no second Job, the tuning carries on
    env.op.stop(sig=9)
    env.op.start()
    time.sleep(4)  # a few timer periods of the new process
    key = job.metadata.labels["inferasim.io/anchor"]
    jobs = env.batch.list_job_for_all_namespaces(label_selector=f"inferasim.io/anchor={key}")
    assert [j.metadata.name for j in jobs.items] == [job.metadata.name]
    assert env.status("chat")["phase"] == "Harvesting"

    # 4. the kubelet's part: run the pod, finish it with the harvester's termination message
    messages = play_harvest_pod(env, pod, env.tmp / "pod")
    kubelet_finish(env.api, env.ns, pod.metadata.name, messages)
    anchors = wait_until(lambda: [a for a in env.custom.list_cluster_custom_object(GROUP, VERSION, "servinganchors")
                                  ["items"] if a["metadata"]["annotations"].get("inferasim.io/harvested-by")
                                  == f"{env.ns}/chat"], 60, "ServingAnchor written")
    assert anchors[0]["spec"]["kernel_set"]["engine"] == "vllm"
    assert anchors[0]["spec"]["provenance"]["method"] == "harvest"

    # 5. re-tuned with the anchor: Recommended, manifest in a ConfigMap, accepted by the API server
    def recommended() -> dict[str, Any] | None:
        s = env.status("chat")
        return s if s.get("phase") in ("Recommended", "Confirming", "Confirmed") and \
            (s.get("recommendation") or {}).get("anchor") else None

    st = wait_until(recommended, 120, "Recommended with the harvested anchor")
    t_recommended = time.monotonic() - t0
    assert env.condition("chat", "AnchorsReady")["status"] == "True"
    assert env.condition("chat", "Recommended")["reason"] == "SearchComplete"
    rec = st["recommendation"]
    assert rec["predicted"]["throughputPerGpu"] > 0 and rec["image"].startswith("vllm/")
    assert st["anchors"]["used"] and not st["anchors"]["harvesting"]
    # The status holding the recommendation is written first, its ConfigMap right after (tune.py:
    # nothing is published before the status): the ConfigMap follows within moments.
    cm = wait_until(lambda: (c := env.core.read_namespaced_config_map("chat-recommendation", env.ns)).data
                    ["manifest.yaml"] == rec["manifest"] and c, 30, "the ConfigMap holding the recommendation")
    assert cm.data["manifest.yaml"] == rec["manifest"]
    server_side_dry_run(env, rec["manifest"])
    assert len(env.batch.list_namespaced_job(env.ns, label_selector="inferasim.io/tuning=chat").items) == 1

    # 6. confirmation: a canary Deployment, played by a second emulator scraped by Prometheus
    canary = wait_until(lambda: env.apps.list_namespaced_deployment(
        env.ns, label_selector="inferasim.io/kind=canary").items, 60, "canary Deployment")[0]
    assert canary.metadata.name == "chat-canary-0" and canary.spec.replicas == 1
    assert canary.metadata.owner_references[0].name == "chat"
    assert canary.spec.template.metadata.labels["app"] == "chat"  # the target's Service sends it traffic
    cpod = wait_until(lambda: [p for p in env.core.list_namespaced_pod(
        env.ns, label_selector="inferasim.io/canary=chat-canary-0").items if p.spec.node_name], 60,
        "canary pod scheduled")[0]
    kubelet_run(env.api, env.ns, cpod.metadata.name)
    from inferasim.emulator import EmulatorConfig, start_emulator

    with start_emulator(EmulatorConfig(model=MODEL, gpu=GPU, engine="vllm", speedup=SPEEDUP,
                                       precision="bf16")) as ch:
        cload = Load(ch.url, ch.served_model_name, rate=6.0, prompt_tokens=400, max_tokens=64).start()
        prometheus.set_targets(live["groups"] + [{"targets": [ch.url.removeprefix("http://")],
                                                  "labels": {"namespace": env.ns, "deployment": "chat-canary-0"}}])
        try:
            st = wait_until(lambda: env.status("chat") if env.status("chat").get("phase") == "Confirmed" else None,
                            120, "phase Confirmed")
        finally:
            cload.stop()
    t_confirmed = time.monotonic() - t0
    cond = env.condition("chat", "Confirmed")
    assert cond["reason"] in ("CanaryMeasured", "PredictionOff"), cond
    c0 = st["confirmation"]["canaries"][0]
    assert c0["state"] == "Measured" and c0["measuredItlP90Ms"] > 0 and "predictionError" in c0
    wait_until(lambda: not env.apps.list_namespaced_deployment(env.ns, label_selector="inferasim.io/kind=canary")
               .items, 30, "canary removed after measuring")
    print(f"\nend to end: Harvesting after {t_harvesting:.1f} s, Recommended after {t_recommended:.1f} s, "
          f"Confirmed after {t_confirmed:.1f} s; {cond['message']}")

    # 7. the canary's measurement is a ServingAnchor (provenance canary) the store predicts it with
    check_canary_anchor(env, c0, anchors[0])

    # the invalid tunings of the earlier tests (when they ran) did not stop the operator serving this one
    names = {t["metadata"]["name"] for t in env.custom.list_namespaced_custom_object(GROUP, VERSION, env.ns,
                                                                                      PLURAL)["items"]}
    if "bad-gpu" in names:
        assert env.status("bad-gpu")["phase"] == "Invalid"


def check_canary_anchor(env: Env, c0: dict[str, Any], harvested: dict[str, Any]) -> None:
    from inferasim.model.anchor_store import AnchorStore
    from inferasim.model.anchors import Anchor
    from inferasim.model.predictor import fitted_from_anchor

    assert c0["anchor"].startswith("canary-"), c0
    obj = env.custom.get_cluster_custom_object(GROUP, VERSION, "servinganchors", c0["anchor"])
    assert obj["metadata"]["annotations"]["inferasim.io/measured-by"] == f"{env.ns}/chat"
    assert obj["metadata"]["annotations"]["inferasim.io/parent-anchor"] == Anchor.model_validate(
        harvested["spec"]).id  # calibrated on the harvested anchor the prediction came from
    assert obj["metadata"]["labels"]["inferasim.io/kind"] == "canary"
    anchor = Anchor.model_validate(obj["spec"])
    assert anchor.provenance.method == "canary" and anchor.fit is not None and anchor.fit.converged
    (point,) = anchor.points  # the measured window: in flight, lengths, mean ITL and TTFT
    assert point.tpot_ms == pytest.approx(c0["measuredItlMeanMs"], rel=1e-3)
    assert point.ttft_ms == pytest.approx(c0["measuredTtftMeanMs"], rel=1e-3)
    assert point.concurrency == max(1, round(c0["measuredInFlight"]))
    assert 300 <= point.isl <= 500 and point.osl == pytest.approx(64, rel=0.1)
    # A fresh prediction through the operator's store (it syncs ServingAnchors into its cache) at
    # the canary's layout and operating point reproduces the measured ITL.
    store = AnchorStore(env.tmp / "anchor-cache")
    stored = [a for a in store.all() if a.provenance.method == "canary" and a.id == anchor.id]
    assert stored, [a.id for a in store.all()]
    assert len(store.all()) >= 2  # the harvested anchor of the same kernel set is kept beside it
    layout = stored[0].layout.to_layout()
    pred = fitted_from_anchor(stored[0]).predict_layout(layout, point.isl, point.osl, point.concurrency)
    itl_pred = pred["tpot"] * 1e3
    assert itl_pred == pytest.approx(c0["measuredItlMeanMs"], rel=0.02)
    print(f"canary {c0['name']}: ITL p90 measured {c0['measuredItlP90Ms']:.2f} ms vs predicted "
          f"{c0['predictedItlP90Ms']:.2f} ms ({c0['predictionError']:+.1%}); mean ITL measured "
          f"{c0['measuredItlMeanMs']:.2f} ms at {point.concurrency} in flight, the canary anchor predicts "
          f"{itl_pred:.2f} ms; step scale {c0['calibrationScale']:.3f} on the harvested anchor")


def test_operator_metrics(env: Env) -> None:
    text = httpx.get(f"http://127.0.0.1:{env.op.metrics_port}/metrics", timeout=5).text
    for name in ("inferasim_tunings{phase=", "inferasim_search_seconds_bucket", "inferasim_reconciles_total",
                 "inferasim_harvest_gpu_seconds_total", "inferasim_canary_prediction_error"):
        assert name in text, name
    assert 'inferasim_tunings{phase="Invalid"}' in text
