"""Operator behaviour found by review: names and labels within Kubernetes' limits, owned objects
without the tuning's labels, status patches that replace sub-objects, canaries retired by a new
pass, confirmation that cannot measure not started, harvest Jobs read in their own namespace."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import kopf
import pytest
from inferasim_operator.harvest import plan_harvests, unscheduled_reason
from inferasim_operator.kube import own
from inferasim_operator.models import Harvest, TuningStatus, child_name, label_value
from inferasim_operator.passes import confirm, timer, tune
from inferasim_operator.settings import Settings
from inferasim_operator.spec_rules import parse_tuning_spec
from inferasim_operator.state import forget
from inferasim_operator.status import StatusBook
from test_operator_reconcile import SPEC

from inferasim.core.spec import SpecError
from inferasim.observed import ObservedWorkload

BODY: dict[str, Any] = {"apiVersion": "inferasim.io/v1alpha1", "kind": "ServingTuning",
                        "metadata": {"name": "chat", "namespace": "llm", "uid": "u-1", "generation": 3,
                                     "labels": {"app.kubernetes.io/instance": "llm-apps"}}, "spec": SPEC}


def test_long_names_stay_within_label_and_dns_limits() -> None:
    long = "a" * 60 + "-tuning-" + "b" * 60
    v = label_value(long)
    assert len(v) <= 63 and v != label_value(long + "x") and label_value("chat") == "chat"
    names = {child_name(long + str(i), "-canary-0") for i in range(3)}
    assert len(names) == 3 and all(len(n) <= 63 for n in names)
    assert child_name("chat", "-canary-1") == "chat-canary-1"


def test_owned_objects_do_not_inherit_the_tunings_labels() -> None:
    """kopf.adopt copied Argo CD's tracking label onto Jobs, ConfigMaps and canaries (Argo CD then
    prunes them as stray parts of the app)."""
    cm: dict[str, Any] = {"metadata": {"name": "chat-recommendation", "labels": {"inferasim.io/kind": "x"}}}
    own(cm, BODY)
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "u-1" and cm["metadata"]["namespace"] == "llm"
    assert "app.kubernetes.io/instance" not in cm["metadata"]["labels"]


def test_a_null_prefix_hit_rate_is_a_valid_status() -> None:
    """Prefix caching off: the hit rate is null, left out of the patch; the CRD once required it."""
    o = {"engine": "vllm", "window": "5m", "observedAt": 1.0, "requestRate": 2.0, "promptTokensMean": 100.0,
         "outputTokensMean": 50.0, "running": 1.0, "waiting": 0.0}
    assert ObservedWorkload.model_validate(o).prefix_hit_rate is None
    TuningStatus.model_validate({"observedWorkload": o})


class _Kube:
    """What the StatusBook and the canary retirement call, in memory."""

    def __init__(self, status: dict[str, Any], deployments: list[str]) -> None:
        self.status = copy.deepcopy(status)
        self.patches: list[dict[str, Any]] = []
        self.deployments = list(deployments)

    def patch_tuning_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        return {}

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # no live target: the canaries keep their own labels

    def delete_deployments(self, namespace: str, selector: str, keep: set[str]) -> list[str]:
        assert "inferasim.io/kind=canary" in selector and "inferasim.io/tuning=chat" in selector
        gone = [d for d in self.deployments if d not in keep]
        self.deployments = [d for d in self.deployments if d in keep]
        return gone

    config_maps: tuple[str, ...] = ("chat-recommendation",)
    templates: tuple[str, ...] = ()

    def delete_config_map(self, namespace: str, name: str) -> bool:
        had = name in self.config_maps
        self.config_maps = tuple(c for c in self.config_maps if c != name)
        return had

    def delete_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> bool:
        assert plural == "analysistemplates"
        had = name in self.templates
        self.templates = tuple(t for t in self.templates if t != name)
        return had


def test_a_status_sub_object_is_replaced_not_merged() -> None:
    """A merge patch merges nested objects: a recommendation without a price must null the old cost."""
    old = {"recommendation": {"engine": "vllm", "predicted": {"throughputPerGpu": 10.0, "costPerMillionTokens": 0.1}}}
    kube = _Kube(old, [])
    book = StatusBook({**BODY, "status": old}, kube)  # type: ignore[arg-type]
    book.set(recommendation={"engine": "sglang", "predicted": {"throughputPerGpu": 12.0}})
    asyncio.run(book.flush())
    sent = kube.patches[0]["recommendation"]
    assert sent["engine"] == "sglang" and sent["predicted"]["costPerMillionTokens"] is None


def test_a_new_pass_retires_the_canaries_it_does_not_run() -> None:
    status = {"confirmation": {"mode": "canary", "canaries": [{"name": "chat-canary-0"}, {"name": "chat-canary-1"}]}}
    kube = _Kube(status, ["chat-canary-0", "chat-canary-1"])
    book = StatusBook({**BODY, "status": status}, kube)  # type: ignore[arg-type]
    asyncio.run(tune.retire_canaries(BODY, book, kube, set()))  # type: ignore[arg-type]
    assert kube.deployments == [] and book.get("confirmation") is None
    assert book.cond("Confirmed")["reason"] == "Superseded"
    kube = _Kube(status, ["chat-canary-0", "chat-canary-1"])
    book = StatusBook({**BODY, "status": status}, kube)  # type: ignore[arg-type]
    asyncio.run(tune.retire_canaries(BODY, book, kube, {"chat-canary-0"}))  # type: ignore[arg-type]
    assert kube.deployments == ["chat-canary-0"]


def test_confirmation_that_cannot_measure_starts_nothing() -> None:
    spec = parse_tuning_spec(SPEC)  # a static workload: no Prometheus to read canaries from
    kube = _Kube({}, [])
    book = StatusBook(copy.deepcopy(BODY), kube)  # type: ignore[arg-type]
    started = asyncio.run(confirm.start_confirmation(BODY, spec, {"shortlist": []}, book, kube))  # type: ignore[arg-type]
    assert started == set() and book.cond("Confirmed")["reason"] == "CannotMeasure"
    argo = parse_tuning_spec({**SPEC, "confirmation": {"mode": "argo-rollouts"}})
    started = asyncio.run(confirm.start_confirmation(BODY, argo, {"shortlist": []}, book, kube))  # type: ignore[arg-type]
    assert started == set() and book.cond("Confirmed")["reason"] == "NoThresholds"


def test_a_window_promql_cannot_read_is_refused() -> None:
    with pytest.raises(SpecError, match="confirmation.window.*90m"):
        parse_tuning_spec({**SPEC, "confirmation": {"mode": "canary", "window": "1.5h"}})
    parse_tuning_spec({**SPEC, "confirmation": {"mode": "none", "window": "1.5h"}})


def test_a_harvest_job_records_its_namespace() -> None:
    h = Harvest(job="harvest-x", job_namespace="team-a", engine="vllm", precision="bf16",
                layout={"tp": 1}, gpu_hours=0.3)
    assert h.model_dump(by_alias=True)["jobNamespace"] == "team-a"


def test_an_unschedulable_harvest_pod_is_pending_with_the_schedulers_reason() -> None:
    """A pod no node can take counts as active: the Job read 'Running' until its deadline."""
    job = {"metadata": {"name": "harvest-x", "namespace": "llm"}, "status": {"active": 1}}
    unplaced = {"spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                                       "reason": "Unschedulable",
                                                       "message": "0/3 nodes are available: 3 node(s) didn't "
                                                                  "match Pod's node affinity/selector."}]}}

    class Pods:
        def __init__(self, pods: list[dict[str, Any]]) -> None:
            self.pods = pods

        def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
            assert (namespace, selector) == ("llm", "job-name=harvest-x")
            return self.pods

    why = unscheduled_reason(Pods([unplaced]), job)  # type: ignore[arg-type]
    assert why.startswith("Unschedulable: 0/3 nodes") and "node affinity" in why
    assert unscheduled_reason(Pods([{"spec": {"nodeName": "gpu-1"}}]), job) == ""  # type: ignore[arg-type]


def test_no_canary_is_started_for_an_engine_without_latency_histograms() -> None:
    """ATOM exports no TTFT/ITL histograms: its canary would hold GPUs for the window, unmeasured."""
    spec = parse_tuning_spec({**SPEC, "workload": {"prometheus": {
        "url": "http://prom:9090", "selector": {"namespace": "llm"}, "window": "5m"}}})
    kube = _Kube({}, [])
    book = StatusBook(copy.deepcopy(BODY), kube)  # type: ignore[arg-type]
    payload = {"shortlist": [{"engine": "atom", "layout_label": "tp8"}],
               "shortlist_deployments": [{"metadata": {"name": "chat-canary-0"}}]}
    started = asyncio.run(confirm.start_confirmation(BODY, spec, payload, book, kube))  # type: ignore[arg-type]
    assert started == set() and book.cond("Confirmed")["reason"] == "CannotMeasure" and "atom" in \
        book.cond("Confirmed")["message"]


def test_a_selector_prometheus_refuses_is_invalid_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A label name or range no Prometheus accepts cannot succeed on a retry: the tuning is Invalid
    with the reason (it was retried forever, up to every 600 s)."""
    from inferasim.observe import ObservationError

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ObservationError("workload.prometheus.selector: label name '1bad' is not valid", reason="BadSelector")

    monkeypatch.setattr(tune, "observe", refuse)
    spec = parse_tuning_spec({**SPEC, "workload": {"prometheus": {
        "url": "http://prom:9090", "selector": {"namespace": "llm"}, "window": "5m"}}})
    kube = _Kube({}, [])
    book = StatusBook(copy.deepcopy(BODY), kube)  # type: ignore[arg-type]
    with pytest.raises(tune.Invalid, match="1bad"):
        asyncio.run(tune.observe_workload(spec, book, BODY, kube, Settings(), False))  # type: ignore[arg-type]
    assert book.get("phase") == "Invalid" and book.cond("WorkloadObserved")["reason"] == "BadSelector"


def test_an_invalid_spec_stops_what_the_last_recommendation_started() -> None:
    """The timer skips Invalid tunings: canaries left running would hold GPUs and take traffic, and
    the ConfigMap would keep publishing the last recommendation, until the spec is fixed."""
    status = {"phase": "Confirming", "observedGeneration": 1, "recommendation": {"engine": "vllm"},
              "shortlist": [{"engine": "vllm"}],
              "confirmation": {"mode": "canary", "canaries": [{"name": "chat-canary-0"}]}}
    kube = _Kube(status, ["chat-canary-0"])
    body = {**BODY, "metadata": {**BODY["metadata"], "generation": 2}, "status": status,
            "spec": {**SPEC, "retune": {"every": "daily"}}}
    book = StatusBook(copy.deepcopy(body), kube)  # type: ignore[arg-type]
    with pytest.raises(tune.Invalid, match="retune.every"):
        asyncio.run(tune.run_pass(body, book, kube, Settings(), "spec changed"))  # type: ignore[arg-type]
    assert book.get("phase") == "Invalid" and book.get("observedGeneration") == 2
    assert book.get("recommendation") is None and book.get("shortlist") == []
    assert kube.deployments == [] and kube.config_maps == () and book.get("confirmation") is None
    assert book.cond("Recommended")["reason"] == "InvalidSpec"
    # An AnalysisTemplate (argo-rollouts confirmation) is withdrawn the same way.
    status = {"phase": "Recommended", "recommendation": {"engine": "vllm"},
              "confirmation": {"mode": "argo-rollouts", "analysisTemplate": "chat-inferasim"}}
    kube = _Kube(status, [])
    kube.templates = ("chat-inferasim",)
    book = StatusBook({**body, "status": status}, kube)  # type: ignore[arg-type]
    with pytest.raises(tune.Invalid):
        asyncio.run(tune.run_pass({**body, "status": status}, book, kube, Settings(), "x"))  # type: ignore[arg-type]
    assert kube.templates == () and book.get("confirmation") is None


class _CanaryKube:
    """Deployments by name, with the status a deployment controller would write; deletions recorded."""

    def __init__(self, deployments: dict[str, dict[str, Any]]) -> None:
        self.deployments = deployments
        self.deleted: list[str] = []
        self.apps = self

    def patch_tuning_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return {}

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.deployments.get(name)

    def delete_namespaced_deployment(self, name: str, namespace: str) -> None:
        self.deleted.append(name)

    def delete_deployment(self, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        return True
        self.deployments.pop(name, None)


def _available(minutes_ago: float) -> dict[str, Any]:
    from inferasim_operator.times import iso
    return {"status": {"availableReplicas": 1, "conditions": [
        {"type": "Available", "status": "True", "lastTransitionTime": iso(time.time() - 60 * minutes_ago)}]}}


def _confirming(started_minutes_ago: float, canaries: list[dict[str, Any]]) -> dict[str, Any]:
    from inferasim_operator.times import iso
    return {"phase": "Confirming", "confirmation": {"mode": "canary", "canaries": canaries,
                                                    "started": iso(time.time() - 60 * started_minutes_ago)}}


def _progress(status: dict[str, Any], kube: _CanaryKube, **confirmation: str) -> tuple[bool, Any]:
    spec = parse_tuning_spec({**SPEC, "confirmation": {"mode": "canary", **confirmation}})
    book = StatusBook({**BODY, "status": status}, kube)  # type: ignore[arg-type]
    settings = type("Settings", (), {"observe_timeout_s": 1.0})()
    done = asyncio.run(confirm.confirm_progress(BODY, spec, book, kube, settings))  # type: ignore[arg-type]
    return done, book


def test_a_canary_window_counts_from_when_it_became_available() -> None:
    """Loading the weights is not serving: 40 minutes after creation, a canary available for 10 of
    them has served 10 of its 30 minutes, and is not measured yet."""
    pending = {"name": "chat-canary-0", "engine": "vllm", "layoutLabel": "tp1", "state": "Pending"}
    kube = _CanaryKube({"chat-canary-0": {"status": {}}})
    done, book = _progress(_confirming(40, [pending]), kube, window="30m")
    assert not done and book.get("confirmation")["canaries"][0]["state"] == "Pending"
    assert "starting" in book.cond("Confirmed")["message"]
    kube.deployments["chat-canary-0"] = _available(10)
    done, book = _progress(_confirming(40, [pending]), kube, window="30m")
    c = book.get("confirmation")["canaries"][0]
    assert not done and c["state"] == "Running" and kube.deleted == []
    from inferasim_operator.times import age_s
    assert 9.9 * 60 < (age_s(c["runningSince"]) or 0) < 10.2 * 60  # the controller's time, not the timer's
    assert "10.0 of 30.0 minutes" in book.cond("Confirmed")["message"]
    # its window over (the static workload has no Prometheus to read it from): measured as failed, released
    c["runningSince"] = _available(31)["status"]["conditions"][0]["lastTransitionTime"]
    kube = _CanaryKube({"chat-canary-0": _available(31)})
    done, book = _progress(_confirming(80, [c]), kube, window="30m")
    assert done and book.get("confirmation")["canaries"][0]["state"] == "Failed"
    assert book.cond("Confirmed")["reason"] == "CanaryNotMeasured" and kube.deleted == ["chat-canary-0"]


def test_a_canary_that_never_becomes_available_is_given_up() -> None:
    pending = {"name": "chat-canary-0", "engine": "vllm", "layoutLabel": "tp1", "state": "Pending"}
    serving = {"name": "chat-canary-1", "engine": "vllm", "layoutLabel": "tp2", "state": "Running",
               "runningSince": _available(5)["status"]["conditions"][0]["lastTransitionTime"]}
    kube = _CanaryKube({"chat-canary-0": {"status": {}}, "chat-canary-1": _available(5)})
    done, book = _progress(_confirming(61, [pending, serving]), kube, window="30m", startupTimeout="1h")
    c0, c1 = book.get("confirmation")["canaries"]
    assert c0["state"] == "Failed" and "startupTimeout" in c0["message"] and kube.deleted == ["chat-canary-0"]
    assert c1["state"] == "Running" and not done  # the other one keeps serving its window
    with pytest.raises(SpecError, match="confirmation.startupTimeout"):
        parse_tuning_spec({**SPEC, "confirmation": {"mode": "canary", "startupTimeout": "soon"}})


def test_a_timer_pass_reads_the_status_inside_the_lock() -> None:
    """The timer's body was captured while Confirming; a reconcile then retired the canaries and
    recommended anew. The pass must not measure or write back the canaries of the old status."""
    stale = {**BODY, "spec": {**SPEC, "confirmation": {"mode": "canary", "window": "1m"}},
             "status": _confirming(90, [{"name": "chat-canary-0", "engine": "vllm", "layoutLabel": "tp1",
                                          "state": "Running", "runningSince": "2026-01-01T00:00:00Z"}])}

    class Kube(_CanaryKube):
        def get_tuning(self, namespace: str, name: str) -> dict[str, Any]:
            return {"spec": stale["spec"], "status": {"phase": "Recommended", "confirmation": None}}

        def patch_tuning_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
            raise AssertionError(f"a superseded pass wrote {patch}")

    kube = Kube({"chat-canary-0": _available(90)})
    settings = Settings.from_env({})
    assert asyncio.run(timer.run_tick(stale, "u-1", "Confirming", kube, settings)) == "superseded"  # type: ignore[arg-type]
    assert kube.deleted == []


def test_a_search_refusing_the_observed_workload_backs_off_instead_of_parking_invalid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the search refuses in an observed workload (a mean prompt longer than the model's
    context) comes from the traffic, not from a field the user wrote: the pass is retried with a
    growing delay, the tuning is not parked Invalid (where the drift checks would stop), and the
    retry count survives the next good observation."""
    from inferasim_operator.passes import passive
    from inferasim_operator.search import SearchFailed

    from inferasim.observed import ObservedWorkload

    obs = ObservedWorkload(engine="vllm", window="5m", observed_at=1e9, request_rate=1.0,
                           prompt_tokens_mean=200_000, output_tokens_mean=64, prefix_hit_rate=None, running=1,
                           waiting=0)
    monkeypatch.setattr(tune, "observe", lambda *a, **k: obs)

    async def no_anchors(*a: Any, **k: Any) -> int:
        return 0

    async def no_passive(*a: Any, **k: Any) -> bool:
        return False

    async def no_price(*a: Any, **k: Any) -> tuple[None, str, str, str]:
        return None, "False", "NoPrice", "no price"

    async def refuse(*a: Any, **k: Any) -> dict[str, Any]:
        raise SearchFailed("workload.static.inputTokens 200000 exceeds the model's context", invalid=True)

    monkeypatch.setattr(tune, "sync_anchors", no_anchors)
    monkeypatch.setattr(passive, "ensure_passive_anchor", no_passive)
    monkeypatch.setattr(tune, "resolve_price", no_price)
    monkeypatch.setattr(tune, "run_search", refuse)
    spec = {**SPEC, "workload": {"prometheus": {"url": "http://prom:9090", "selector": {"namespace": "llm"},
                                                "window": "5m"}}}
    kube = _Kube({}, [])
    status: dict[str, Any] = {}
    delays = []
    for _ in range(3):
        body = {**BODY, "spec": spec, "status": status}
        book = StatusBook(copy.deepcopy(body), kube)  # type: ignore[arg-type]
        with pytest.raises(kopf.TemporaryError) as err:
            asyncio.run(tune.run_pass(body, book, kube, Settings(), "test"))  # type: ignore[arg-type]
        delays.append(err.value.delay)
        status = book.status
        assert status.get("phase") != "Invalid"
        assert book.cond("Recommended")["reason"] == "WorkloadNotServable"
        assert "observed workload" in book.cond("Recommended")["message"]
    assert status["retries"] == 3 and delays[0] < delays[1] < delays[2]


def test_a_new_anchor_re_tunes_once_not_on_every_tick() -> None:
    """A ServingAnchor for a missing kernel set triggers one re-tune; if the search still reports the
    kernel set missing (another engine version, say), the next ticks do not re-tune again until the
    object changes. An object the search cannot read (a newer schema) triggers nothing."""
    import json
    from pathlib import Path

    path = next(Path(__file__).resolve().parents[2].joinpath("anchors").glob("vllm-qwen--qwen3-32b-h100_sxm-fp8-*"))
    spec = json.loads(path.read_text())

    class AnchorList:
        def __init__(self, objs: list[dict[str, Any]]) -> None:
            self.objs = objs

        def list_anchors(self) -> list[dict[str, Any]]:
            return self.objs

    obj = {"metadata": {"name": "harvested-1", "resourceVersion": "7"}, "spec": spec}
    newer = {"metadata": {"name": "from-newer-operator", "resourceVersion": "1"},
             "spec": {**spec, "schema_version": 99}}
    missing = [{"engine": "vllm", "model": "Qwen/Qwen3-32B", "gpu": "H100", "precision": "fp8"}]
    other = [{"engine": "sglang", "model": "Qwen/Qwen3-32B", "gpu": "H100", "precision": "fp8"}]
    uid = "u-anchors"
    forget(uid)
    assert not asyncio.run(timer.missing_now_available(missing, AnchorList([newer]), uid))  # type: ignore[arg-type]
    kube = AnchorList([newer, obj])
    assert not asyncio.run(timer.missing_now_available(other, kube, uid))  # type: ignore[arg-type]
    assert asyncio.run(timer.missing_now_available(missing, kube, uid))  # type: ignore[arg-type]
    assert not asyncio.run(timer.missing_now_available(missing, kube, uid))  # type: ignore[arg-type]
    obj["metadata"]["resourceVersion"] = "8"  # the anchor was re-harvested
    assert asyncio.run(timer.missing_now_available(missing, kube, uid))  # type: ignore[arg-type]
    forget(uid)


def test_only_the_recommendations_own_canary_on_enough_traffic_confirms_it() -> None:
    """Confirmed=True needs the recommendation's own canary measured on at least MIN_CANARY_REQUESTS
    requests; another canary of the short list agreeing does not stand in for it."""
    def canary(name: str, recommended: bool, **measured: Any) -> dict[str, Any]:
        return {"name": name, "engine": "vllm", "layoutLabel": "tp1", "recommended": recommended, **measured}

    agrees = {"state": "Measured", "predictionError": 0.05, "agrees": True,
              "measuredRequests": float(confirm.MIN_CANARY_REQUESTS * 4)}

    def decide(canaries: list[dict[str, Any]]) -> dict[str, Any]:
        book = StatusBook({**BODY, "status": {"confirmation": {"canaries": canaries}}}, _Kube({}, []))  # type: ignore[arg-type]
        assert confirm._decide(BODY, book, canaries)
        return book.cond("Confirmed") or {}

    failed = canary("chat-canary-0", True, state="Failed", message="not available after 1h")
    cond = decide([failed, canary("chat-canary-1", False, **agrees)])
    assert cond["status"] == "False" and cond["reason"] == "RecommendationNotMeasured"
    cond = decide([canary("chat-canary-1", False, **agrees)])
    assert cond["status"] == "False" and cond["reason"] == "RecommendationNotCanaried"
    trickle = {**agrees, "measuredRequests": 3.0}
    cond = decide([canary("chat-canary-0", True, **trickle), canary("chat-canary-1", False, **trickle)])
    assert cond["status"] == "False" and cond["reason"] == "CanaryNotMeasured" and "fewer than" in cond["message"]
    cond = decide([canary("chat-canary-0", True, **agrees), canary("chat-canary-1", False, **trickle)])
    assert cond["status"] == "True" and cond["reason"] == "CanaryMeasured" and "chat-canary-1" not in cond["message"]
    off = {**agrees, "predictionError": 0.6, "agrees": False}
    cond = decide([canary("chat-canary-0", True, **agrees), canary("chat-canary-1", False, **off)])
    assert cond["status"] == "False" and cond["reason"] == "PredictionOff"


def test_canaries_need_a_deployment_target_to_take_traffic_from() -> None:
    """A canary shares the target's traffic by its pod labels: with a StatefulSet target, or a target
    Deployment that does not exist, none is started (it would hold GPUs for the window, unmeasured)."""
    prom = {"prometheus": {"url": "http://prom:9090", "selector": {"namespace": "llm"}, "window": "5m"}}
    payload = {"shortlist": [{"engine": "vllm", "layout_label": "tp1"}],
               "shortlist_deployments": [{"metadata": {"name": "chat-canary-0"}}]}
    for target, why in (({"kind": "StatefulSet", "name": "chat"}, "target.kind StatefulSet"),
                        ({"kind": "Deployment", "name": "chat"}, "not found")):
        spec = parse_tuning_spec({**SPEC, "workload": prom, "target": target})
        kube = _Kube({}, [])  # get_deployment: None
        book = StatusBook(copy.deepcopy(BODY), kube)  # type: ignore[arg-type]
        assert asyncio.run(confirm.start_confirmation(BODY, spec, payload, book, kube)) == set()  # type: ignore[arg-type]
        assert book.cond("Confirmed")["reason"] == "CannotCanary" and why in book.cond("Confirmed")["message"]


def test_two_tunings_of_one_target_name_their_canaries_apart() -> None:
    from inferasim_operator.search import canary_base

    assert canary_base("chat", "chat") == "chat"  # one tuning named after its target: chat-canary-N
    assert canary_base("chat", "chat-latency") != canary_base("chat", "chat-cost")
    # Pairs that read alike once joined with a dash.
    assert len({canary_base("chat", "b-x"), canary_base("chat-b", "x"), canary_base("chat-b-x", "chat-b-x")}) == 3
    long = canary_base("c" * 60, "t" * 60)
    assert len(long) <= 63 and long != canary_base("c" * 60, "t" * 59 + "u")


def test_harvest_images_are_keyed_by_engine() -> None:
    """A key that names no engine would be ignored and the catalog's image harvested instead."""
    from inferasim.core.spec import SpecError

    spec = parse_tuning_spec({**SPEC, "harvest": {"images": {"vLLM": "registry/vllm:x"}}})
    assert spec.harvest.images == {"vllm": "registry/vllm:x"}
    with pytest.raises(SpecError, match="harvest.images.*'sgl' is not an engine"):
        parse_tuning_spec({**SPEC, "harvest": {"images": {"sgl": "registry/sglang:x"}}})


def test_switching_harvest_off_deletes_this_tunings_running_job_only() -> None:
    """harvest.allowed false while this tuning's Job runs: the Job (and its GPUs) goes; a Job another
    tuning started for the same anchor is left to it, and one both own is let go, not deleted. A
    tuning that waits for another's Job in its namespace owns it too (deleting the starter must not
    garbage-collect it)."""
    missing = [{"engine": "vllm", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "H100", "precision": "bf16",
                "harvest_layout": {"tp": 1}, "harvest_gpu_hours": 0.3}]

    class JobKube(_Kube):
        def __init__(self, owner_uid: str) -> None:
            super().__init__({}, [])
            self.jobs = [{"metadata": {"name": "harvest-vllm-x-tp1", "namespace": "llm",
                                       "ownerReferences": [{"uid": owner_uid}]}, "status": {"active": 1}}]
            self.deleted_jobs: list[str] = []

        def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
            return {"metadata": {"name": name, "namespace": namespace,
                                 "annotations": {"inferasim.io/job": "llm/harvest-vllm-x-tp1"}}}

        def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
            return self.jobs[0] if (namespace, name) == ("llm", "harvest-vllm-x-tp1") else None

        def delete_lease(self, namespace: str, name: str) -> None:
            pass

        def delete_job(self, namespace: str, name: str) -> bool:
            self.deleted_jobs.append(name)
            return True

        def set_job_owners(self, namespace: str, name: str, owners: list[dict[str, Any]]) -> None:
            self.jobs[0]["metadata"]["ownerReferences"] = owners

    spec = parse_tuning_spec({**SPEC, "harvest": {"allowed": False}})
    for owner, deleted in (("u-1", ["harvest-vllm-x-tp1"]), ("someone-else", [])):
        kube = JobKube(owner)
        book = StatusBook(copy.deepcopy(BODY), kube)  # type: ignore[arg-type]
        harvesting, out, _ = asyncio.run(plan_harvests(BODY, spec, missing, book, kube,  # type: ignore[arg-type]
                                                                 Settings()))
        assert kube.deleted_jobs == deleted
        assert ("was deleted" in out[0].reason) == bool(deleted) and (harvesting == []) == bool(deleted)
    # Shared: this tuning and another own it; switching off lets go, the other keeps the Job.
    kube = JobKube("u-1")
    kube.jobs[0]["metadata"]["ownerReferences"].append({"uid": "u-2"})
    book = StatusBook(copy.deepcopy(BODY), kube)  # type: ignore[arg-type]
    _, out, _ = asyncio.run(plan_harvests(BODY, spec, missing, book, kube,  # type: ignore[arg-type]
                                                    Settings()))
    assert kube.deleted_jobs == [] and kube.jobs[0]["metadata"]["ownerReferences"] == [{"uid": "u-2"}]
    assert "left to the other tunings" in out[0].reason
    # Waiting with harvesting allowed: this tuning becomes a second, non-controlling owner.
    kube = JobKube("u-2")
    allowed = parse_tuning_spec({**SPEC, "harvest": {"allowed": True}})
    book = StatusBook(copy.deepcopy(BODY), kube)  # type: ignore[arg-type]
    harvesting, _, _ = asyncio.run(plan_harvests(BODY, allowed, missing, book, kube,  # type: ignore[arg-type]
                                                           Settings()))
    refs = kube.jobs[0]["metadata"]["ownerReferences"]
    assert [r["uid"] for r in refs] == ["u-2", "u-1"] and refs[1]["controller"] is False and len(harvesting) == 1


def test_a_reason_this_pass_gave_is_not_overwritten_by_superseded() -> None:
    """Canaries of an earlier pass retired while this pass could start none (its target is gone):
    Confirmed keeps this pass's reason (CannotCanary), not Superseded."""
    status = {"confirmation": {"mode": "canary", "canaries": [{"name": "chat-canary-0"}]}}
    kube = _Kube(status, ["chat-canary-0"])
    book = StatusBook({**BODY, "status": status}, kube)  # type: ignore[arg-type]
    book.condition("Confirmed", "False", "CannotCanary", "target Deployment chat not found")
    asyncio.run(tune.retire_canaries(BODY, book, kube, set()))  # type: ignore[arg-type]
    assert kube.deployments == [] and book.cond("Confirmed")["reason"] == "CannotCanary"
