"""The operator's decisions that need no API server: settings, spec rules, conditions, the search in
a child process (real `tune`), status pieces, canaries and the Argo Rollouts analysis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from inferasim_operator import search
from inferasim_operator.harvest import job_failure, job_state
from inferasim_operator.kube import without_empty_strings
from inferasim_operator.models import TuningStatus, dump
from inferasim_operator.passes import confirm, timer, tune
from inferasim_operator.results import config_map_for, recommendation_of, shortlist_of
from inferasim_operator.settings import Settings, backoff
from inferasim_operator.spec_rules import parse_duration, parse_tuning_spec, render_name
from inferasim_operator.status import StatusBook, set_condition
from inferasim_operator.times import now_iso

from inferasim.core.spec import SpecError

REPO = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = {
    "target": {"name": "chat"}, "model": "meta-llama/Meta-Llama-3-8B", "precision": ["bf16"],
    "hardware": {"gpu": "AMD_Instinct_MI300X", "gpusPerNode": 8, "maxGPUs": 8}, "engines": ["vllm"],
    "workload": {"static": {"kind": "poisson", "requestRate": 5, "inputTokens": 512, "outputTokens": 128}},
    "confirmation": {"mode": "canary", "candidates": 2, "window": "30m"},
    "deploy": {"modelCachePVC": "models", "rocmRenderGID": 110},
}
BODY: dict[str, Any] = {"apiVersion": "inferasim.io/v1alpha1", "kind": "ServingTuning",
                        "metadata": {"name": "chat", "namespace": "llm", "uid": "u-1", "generation": 3}, "spec": SPEC}


def test_settings_from_env() -> None:
    s = Settings.from_env({"INFERASIM_TIMER_SECONDS": "2", "INFERASIM_ANCHOR_DIRS": "/a:/b",
                                     "INFERASIM_HARVEST_ARGS": "--speedup 20 --quiet", "INFERASIM_STAGE2_TOP": "7"})
    assert s.timer_seconds == 2 and s.anchor_dirs == ["/a", "/b"] and s.stage2_top == 7
    assert s.harvest_extra_args == ["--speedup", "20", "--quiet"]
    assert Settings.from_env({}).anchor_dirs == [str(REPO / "anchors")]
    with pytest.raises(ValueError, match="INFERASIM_TIMER_SECONDS"):
        Settings.from_env({"INFERASIM_TIMER_SECONDS": "soon"})
    with pytest.raises(ValueError, match="INFERASIM_SEARCH_TIMEOUT_S"):
        Settings.from_env({"INFERASIM_SEARCH_TIMEOUT_S": "0"})


def test_backoff_grows_and_is_capped() -> None:
    s = Settings(backoff_base_s=10, backoff_max_s=100)
    assert [backoff(s, n) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 80, 100]


def test_durations() -> None:
    assert parse_duration("24h", "x") == 86400
    assert parse_duration("1h30m", "x") == 5400 and parse_duration(None, "x") is None
    with pytest.raises(SpecError, match="retune.every"):
        parse_duration("daily", "retune.every")


@pytest.mark.parametrize("change,field", [
    ({"target": None}, "target"),
    ({"workload": {"trace": {"path": "/t.jsonl"}}}, "workload.trace"),
    ({"retune": {"every": "weekly"}}, "retune.every"),
    ({"confirmation": {"window": "a while"}}, "confirmation.window"),
    ({"engines": ["tgi"]}, "engines"),
    ({"hardware": {"gpu": "MI300X", "maxGPUs": 0}}, "hardware.maxGPUs"),
])
def test_operator_spec_rules(change: dict[str, Any], field: str) -> None:
    spec = {**SPEC, **change}
    if change.get("target", 1) is None:
        del spec["target"]
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse_tuning_spec(spec)


def test_empty_prometheus_url_is_the_operators_default() -> None:
    prom_spec = {**SPEC, "workload": {"prometheus": {"selector": {"deployment": "chat"}, "window": "5m"}}}
    spec = parse_tuning_spec(prom_spec, "http://prometheus.monitoring:9090")
    assert spec.workload.prometheus is not None and spec.workload.prometheus.url == "http://prometheus.monitoring:9090"
    given = {**SPEC, "workload": {"prometheus": {"url": "http://mine:9090"}}}
    assert parse_tuning_spec(given, "http://other:9090").workload.prometheus.url == "http://mine:9090"
    with pytest.raises(SpecError, match=r"workload\.prometheus\.url.*prometheus\.url"):
        parse_tuning_spec(prom_spec)
    assert Settings.from_env({"INFERASIM_PROMETHEUS_URL": " http://p:9090 "}).prometheus_url == "http://p:9090"


def test_render_name() -> None:
    spec = parse_tuning_spec(SPEC)
    assert render_name(spec, "t") == "chat"
    bad = parse_tuning_spec({**SPEC, "target": {"name": "Chat.v2"}})
    assert render_name(bad, "tuning") == "tuning"


def test_conditions_keep_transition_time_until_status_changes() -> None:
    c1 = set_condition([], "Recommended", "True", "SearchComplete", "ok", 1)
    c1[0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    c2 = set_condition(c1, "Recommended", "True", "SearchComplete", "again", 2)
    assert c2[0]["lastTransitionTime"] == "2020-01-01T00:00:00Z" and c2[0]["message"] == "again"
    c3 = set_condition(c2, "Recommended", "False", "SearchTimeout", "slow", 2)
    assert c3[0]["lastTransitionTime"] != "2020-01-01T00:00:00Z" and c3[0]["observedGeneration"] == 2
    c4 = set_condition(c3, "WorkloadObserved", "True", "StaticWorkload", "", 2)
    assert [c["type"] for c in c4] == ["WorkloadObserved", "Recommended"]


def test_job_states() -> None:
    assert job_state({"status": {}}) == "Pending"
    assert job_state({"status": {"active": 1}}) == "Running"
    assert job_state({"status": {"succeeded": 1}}) == "Succeeded"
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                         "message": "too slow"}]}}
    assert job_state(failed) == "Failed"
    assert job_failure(failed) == "DeadlineExceeded: too slow"


def test_empty_strings_are_dropped_or_deleted() -> None:
    obj = {"a": "", "b": {"c": "", "d": "x"}, "e": ["", "y", {"f": ""}]}
    assert without_empty_strings(obj, patch=False) == {"b": {"d": "x"}, "e": ["y", {}]}
    assert without_empty_strings(obj, patch=True) == {"a": None, "b": {"c": None, "d": "x"}, "e": ["y", {}]}


# -- the search in a child process (real tune) ---------------------------------------------------


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    empty = tmp_path_factory.mktemp("anchors")
    sel = {"matchLabels": {"app": "chat"}}
    return asyncio.run(search.run_search(parse_tuning_spec(SPEC).model_dump(by_alias=True, mode="json"),
                                         [str(empty)], "chat", "llm", stage2_top=2, timeout_s=240,
                                         target_selector=sel))


def test_search_payload(payload: dict[str, Any]) -> None:
    assert payload["recommendation"]["engine"] == "vllm" and payload["candidates"] > 10
    assert payload["missing_anchors"] and payload["missing_anchors"][0]["gpu"] == "MI300X"
    docs = list(yaml.safe_load_all(payload["manifest"]))
    dep = docs[0]
    # the live target's (immutable) selector is kept, so the manifest applies over it
    assert dep["spec"]["selector"] == {"matchLabels": {"app": "chat"}}
    assert dep["spec"]["template"]["metadata"]["labels"]["app"] == "chat"
    assert payload["container"]["image"].startswith("vllm/") and payload["container"]["args"][0] == "vllm"
    assert 1 <= len(payload["shortlist"]) <= 5
    # One canary Deployment per colocated entry; a disaggregated one (two pools) is not canaried.
    n = 0
    for dep, entry in zip(payload["shortlist_deployments"], payload["shortlist"], strict=True):
        if entry["disaggregation"]:
            assert "disaggregated" in dep["error"]
        else:
            assert dep["metadata"]["name"] == f"chat-canary-{n}"
            n += 1
    assert n >= 1


def test_status_pieces(payload: dict[str, Any]) -> None:
    rec = recommendation_of(payload, "chat-recommendation")
    assert rec is not None and rec.manifest_config_map == "chat-recommendation"
    assert rec.predicted.throughput_per_gpu and rec.predicted.throughput_per_gpu > 0 and rec.extrapolated
    short = shortlist_of(payload, 1800)
    assert short[0].confirm_gpu_hours == pytest.approx(short[0].gpus / short[0].replicas * 0.5, rel=1e-3)
    # An empty anchor folder: every prediction is measurement-free, and says what it is wide for.
    assert rec.measurement_free and rec.carries and rec.carries[0].startswith("no measurement")
    status = TuningStatus(phase="Recommended", recommendation=rec, shortlist=short)  # validates the wire model
    assert dump(status)["recommendation"]["layoutLabel"] == rec.layout_label
    assert dump(status)["recommendation"]["measurementFree"] is True
    cm = config_map_for(BODY, rec, payload)
    assert cm["metadata"]["name"] == "chat-recommendation" and cm["data"]["manifest.yaml"] == payload["manifest"]
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert "manifest" not in yaml.safe_load(cm["data"]["recommendation.yaml"])


def _claims(pod: dict[str, Any]) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v]


def test_canary_and_analysis_template(payload: dict[str, Any]) -> None:
    dep = confirm.canary_deployment(payload["shortlist_deployments"][0], {"app": "chat"}, "chat")
    assert dep["spec"]["replicas"] == 1
    # The canary runs as the spec's deploy section asks, like the recommendation's manifest.
    rec_pod = next(d for d in yaml.safe_load_all(payload["manifest"]) if d["kind"] == "Deployment")
    rec_pod = rec_pod["spec"]["template"]["spec"]
    pod = dep["spec"]["template"]["spec"]
    assert _claims(pod) == _claims(rec_pod) == ["models"]
    assert 110 in pod["securityContext"]["supplementalGroups"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["app"] == "chat" and labels["inferasim.io/kind"] == "canary"
    assert dep["spec"]["selector"]["matchLabels"] == {"inferasim.io/canary": "chat-canary-0"}
    from inferasim_operator.pod_security import is_restricted

    assert is_restricted(payload["shortlist_deployments"][0]["spec"]["template"]["spec"])  # as rendered: not
    assert is_restricted(dep["spec"]["template"]["spec"]) == []  # as the operator starts it: restricted
    # A target running inferasim's own manifest routes by app.kubernetes.io/name: the canary's pods
    # carry the target's value of it (they once carried their own name and got no traffic).
    served = confirm.canary_deployment(payload["shortlist_deployments"][0], {"app.kubernetes.io/name": "chat"}, "chat")
    pod = served["spec"]["template"]["metadata"]["labels"]
    assert pod["app.kubernetes.io/name"] == "chat" and pod["inferasim.io/canary"] == "chat-canary-0"
    assert served["spec"]["selector"]["matchLabels"].items() <= pod.items()
    assert confirm.canary_selector({"namespace": "llm", "deployment": "chat"}, "chat", "chat-canary-0") == \
        {"namespace": "llm", "deployment": "chat-canary-0"}
    assert confirm.canary_selector({"job": "x"}, "chat", "c") == {"job": "x", "deployment": "c"}
    spec = parse_tuning_spec({**SPEC, "workload": {"prometheus": {
        "url": "http://prom:9090", "selector": {"namespace": "llm", "deployment": "chat"}, "window": "5m"}}})
    t = confirm.analysis_template(BODY, spec, payload)
    assert t["kind"] == "AnalysisTemplate" and t["metadata"]["name"] == "chat-analysis"
    names = [m["name"] for m in t["spec"]["metrics"]]
    assert names == ["ttft-p90", "itl-p90"]
    m = t["spec"]["metrics"][1]
    assert "vllm:inter_token_latency_seconds_bucket" in m["provider"]["prometheus"]["query"]
    assert m["successCondition"].startswith("result[0] <= ")
    # The limit is the bucket bound a deployment within the tolerance can read back, never below it.
    from inferasim.catalog.engines import VLLM_ITL_BUCKETS

    limit = float(m["successCondition"].split("<=")[1])
    pred_s = payload["recommendation"]["predicted"]["itl_p90_ms"] / 1e3
    assert limit >= pred_s * (1 + confirm.TOLERANCE)
    assert limit in VLLM_ITL_BUCKETS or limit == pytest.approx(pred_s * (1 + confirm.TOLERANCE), rel=1e-5)


def test_search_time_limit_kills_the_child() -> None:
    t0 = time.monotonic()
    big = {**parse_tuning_spec(SPEC).model_dump(by_alias=True, mode="json"), "engines": ["vllm", "sglang"]}
    with pytest.raises(search.SearchTimeout):
        asyncio.run(search.run_search(big, [str(REPO / "anchors")], "chat", "llm", stage2_top=50, timeout_s=0.5))
    assert time.monotonic() - t0 < 20


def test_search_refuses_bad_input() -> None:
    bad = {**parse_tuning_spec(SPEC).model_dump(by_alias=True, mode="json"), "model": "nobody/nothing-1b"}
    with pytest.raises(search.SearchFailed) as err:
        asyncio.run(search.run_search(bad, [], "chat", "llm", stage2_top=1, timeout_s=120))
    assert err.value.invalid and "nothing-1b" in str(err.value)


def test_backoff_survives_a_week_of_failures() -> None:
    s = Settings(backoff_base_s=10, backoff_max_s=600)
    assert backoff(s, 5000) == 600


class _PassKube:
    """What one full pass touches, in memory: status patches, the ConfigMap, canaries, templates."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.config_maps: list[str] = []
        self.templates = ["chat-inferasim"]
        self.deleted: list[str] = []

    def patch_tuning_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        return {}

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def apply_config_map(self, body: dict[str, Any]) -> None:
        self.config_maps.append(body["metadata"]["name"])

    def delete_config_map(self, namespace: str, name: str) -> bool:
        return False

    def delete_deployments(self, namespace: str, selector: str, keep: set[str]) -> list[str]:
        return []

    def delete_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        had = name in self.templates
        self.templates = [t for t in self.templates if t != name]
        return had

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


def test_a_pass_that_no_longer_publishes_the_analysis_template_withdraws_it(
        payload: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Confirmation switched from argo-rollouts to none: the template with the last thresholds goes,
    and Confirmed says why (it stayed live, checking Rollouts against an old recommendation)."""
    async def found(*a: Any, **k: Any) -> dict[str, Any]:
        return payload

    async def none(*a: Any, **k: Any) -> int:
        return 0

    async def no_price(*a: Any, **k: Any) -> tuple[None, str, str, str]:
        return None, "False", "NoPrice", "no price"

    monkeypatch.setattr(tune, "run_search", found)
    monkeypatch.setattr(tune, "sync_anchors", none)
    monkeypatch.setattr(tune, "resolve_price", no_price)
    status = {"phase": "Recommended", "observedGeneration": 3, "recommendation": {"engine": "vllm"},
              "confirmation": {"mode": "argo-rollouts", "analysisTemplate": "chat-inferasim"}}
    body = {**BODY, "spec": {**SPEC, "confirmation": {"mode": "none"}}, "status": status}
    kube = _PassKube()
    book = StatusBook(body, kube)  # type: ignore[arg-type]
    assert asyncio.run(tune.run_pass(body, book, kube, Settings(), "test")) == "Recommended"  # type: ignore[arg-type]
    assert kube.templates == [] and book.get("confirmation") is None
    assert book.cond("Confirmed")["reason"] == "Superseded" and kube.config_maps == ["chat-recommendation"]


def test_a_failed_timer_pass_is_retried_by_the_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drift pass that failed after its observation became the baseline: the next drift check
    sees no drift, so the timer itself runs the pass again once tick() waited out the backoff."""
    calls: list[str] = []

    async def record(body: dict[str, Any], kube: Any, settings: Any, *, trigger: str, reason: str,
                     force: bool = False) -> str:
        calls.append(trigger)
        return "Recommended"

    monkeypatch.setattr(timer, "reconcile", record)
    body = {**BODY, "status": {"phase": "Recommended", "retries": 2, "lastTuneTime": now_iso()}}
    assert asyncio.run(timer.run_tick(body, "u-1", "Recommended", object(), Settings())) == "Recommended"  # type: ignore[arg-type]
    assert calls == ["retry"]


def test_a_candidates_carries_are_bounded_and_an_anchor_is_not_measurement_free() -> None:
    from inferasim_operator.models import CARRIES_MAX, CARRY_CHARS
    from inferasim_operator.results import candidate_of

    entry = {"engine": "vllm", "precision": "fp8", "layout": {"tp": 2}, "layout_label": "tp2", "replicas": 1,
             "gpus": 2, "anchor": "abc-tp2", "carries": ["x" * 1000] * 20}
    c = candidate_of(entry)
    assert not c.measurement_free and len(c.carries) == CARRIES_MAX
    assert all(len(r) == CARRY_CHARS for r in c.carries)
