"""Hostile specs from a run on a real control plane: a recommendation that met no SLO published as
"0 tok/s/GPU", passes that raised and left no condition, a status patch the API server refused
while the ConfigMap and the Recommended event went out, and model names that made the operator
open files of its own (test_operator_model_names). Each case drives the operator's pass against an
in-memory API server."""

from __future__ import annotations

import asyncio
import copy
import json
import math
from pathlib import Path
from typing import Any

import kopf
import pytest
from inferasim_operator import metrics, search
from inferasim_operator.kube import ApiException
from inferasim_operator.passes import timer, tune
from inferasim_operator.settings import Settings
from inferasim_operator.spec_rules import parse_tuning_spec
from inferasim_operator.state import MEMO, forget
from inferasim_operator.status import StatusBook, StatusNotWritable
from test_operator_reconcile import BODY, SPEC
from test_operator_spec_bounds import HOSTILE


def _merge(old: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies the operator's merge patches."""
    if not isinstance(patch, dict):
        return patch
    out = dict(old) if isinstance(old, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


class FakeKube:
    """The API calls of a pass, in memory: the tuning and its status, ConfigMaps, canary
    Deployments, AnalysisTemplates. `refuse` refuses status patches holding one of its keys (as
    the API server refused a patch with an infinite number)."""

    def __init__(self, spec: dict[str, Any], status: dict[str, Any] | None = None, *,
                 config_maps: tuple[str, ...] = (), canaries: tuple[str, ...] = (),
                 templates: tuple[str, ...] = (), refuse: tuple[str, ...] = ()) -> None:
        self.spec = copy.deepcopy(spec)
        self.status: dict[str, Any] = copy.deepcopy(status or {})
        self.patches: list[dict[str, Any]] = []
        self.config_maps = set(config_maps)
        self.applied_config_maps: list[str] = []
        self.canaries = set(canaries)
        self.applied_deployments: list[str] = []
        self.templates = set(templates)
        self.applied_templates: list[str] = []
        self.refuse = refuse

    def body(self) -> dict[str, Any]:
        return {**copy.deepcopy(BODY), "spec": copy.deepcopy(self.spec), "status": copy.deepcopy(self.status)}

    # the tuning
    def get_tuning(self, namespace: str, name: str) -> dict[str, Any]:
        return self.body()

    def patch_tuning_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(patch)  # what the client sends; an inf goes out as Infinity
        if any(k in patch for k in self.refuse) or "Infinity" in text or "NaN" in text:
            raise ApiException(status=500, reason="Internal Server Error")
        self.patches.append(patch)
        self.status = _merge(self.status, patch)
        return {}

    # what a pass publishes or withdraws
    def apply_config_map(self, body: dict[str, Any]) -> None:
        self.applied_config_maps.append(body["metadata"]["name"])
        self.config_maps.add(body["metadata"]["name"])

    def delete_config_map(self, namespace: str, name: str) -> bool:
        had = name in self.config_maps
        self.config_maps.discard(name)
        return had

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"spec": {"selector": {"matchLabels": {"app": "chat"}}}} if name == "chat" else None

    def apply_deployment(self, body: dict[str, Any]) -> None:
        self.applied_deployments.append(body["metadata"]["name"])
        self.canaries.add(body["metadata"]["name"])

    def delete_deployments(self, namespace: str, selector: str, keep: set[str]) -> list[str]:
        gone = sorted(self.canaries - set(keep))
        self.canaries &= set(keep)
        return gone

    def apply_custom(self, group: str, version: str, plural: str, body: dict[str, Any]) -> None:
        self.applied_templates.append(body["metadata"]["name"])
        self.templates.add(body["metadata"]["name"])

    def delete_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> bool:
        had = name in self.templates
        self.templates.discard(name)
        return had

    # harvests: none running, none started (harvest.allowed is false in these specs)
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def list_anchors(self) -> list[dict[str, Any]]:
        return []

    def cond(self, type_: str) -> dict[str, Any]:
        return next((c for c in self.status.get("conditions") or [] if c.get("type") == type_), {})


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(reason, message) of every Event a pass posts."""
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(tune, "post_event", lambda body, type_, reason, message: posted.append((reason, message)))
    return posted


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    """Settings for a pass with no ServingAnchors and no prices; the search runs for real."""
    async def no_anchors(*a: Any, **k: Any) -> int:
        return 0

    async def no_price(*a: Any, **k: Any) -> tuple[None, str, str, str]:
        return None, "False", "NoPrice", "no price"

    monkeypatch.setattr(tune, "sync_anchors", no_anchors)
    monkeypatch.setattr(tune, "resolve_price", no_price)
    (tmp_path / "anchors").mkdir()
    return Settings(anchor_dirs=[str(tmp_path / "anchors")], anchor_cache=str(tmp_path / "cache"),
                              search_timeout_s=240, stage2_top=2)


def _run(kube: FakeKube, settings: Settings) -> str:
    return asyncio.run(tune.reconcile(kube.body(), kube, settings, trigger="create", reason="test"))  # type: ignore[arg-type]


def _errors(kind: str, reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("inferasim_pass_errors_total", {"kind": kind, "reason": reason}) or 0.0


# -- 1. no recommendation is published that meets no SLO, or with a zero or non-finite throughput --


@pytest.mark.parametrize("ttft_ms", [12, 1e-300])
def test_an_slo_no_deployment_meets_publishes_nothing(ttft_ms: float, offline: Settings,
                                                      events: list[tuple[str, str]]) -> None:
    """Recommended=False (NoFeasibleConfig) naming the closest candidate and the term it misses;
    the ConfigMap, the AnalysisTemplate and the canaries of the last pass are withdrawn."""
    spec = {**SPEC, "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": ttft_ms}},
            "confirmation": {"mode": "argo-rollouts"}}
    last = {"phase": "Confirming", "observedGeneration": 2, "recommendation": {"engine": "vllm"},
            "shortlist": [{"engine": "vllm"}],
            "confirmation": {"mode": "argo-rollouts", "analysisTemplate": "chat-analysis"}}
    kube = FakeKube(spec, last, config_maps=("chat-recommendation",), canaries=("chat-canary-0",),
                    templates=("chat-analysis",))
    assert _run(kube, offline) == "Failed"
    cond = kube.cond("Recommended")
    assert cond["status"] == "False" and cond["reason"] == "NoFeasibleConfig"
    assert "closest" in cond["message"] and "vllm" in cond["message"]
    assert "misses TTFT p90" in cond["message"] and f"ttftP90Ms {ttft_ms:g}" in cond["message"]
    assert kube.status["phase"] == "Failed" and "recommendation" not in kube.status and kube.status["shortlist"] == []
    # nothing published, and what the last pass published is gone
    assert kube.applied_config_maps == [] and kube.config_maps == set()
    assert kube.applied_templates == [] and kube.templates == set()
    assert kube.applied_deployments == [] and kube.canaries == set()
    reasons = [r for r, _ in events]
    assert "Recommended" not in reasons and "NoFeasibleConfig" in reasons
    # no patch ever carried a recommendation (with its 0 tok/s/GPU)
    assert all(p.get("recommendation") is None for p in kube.patches)


@pytest.fixture(scope="module")
def feasible_payload(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    empty = tmp_path_factory.mktemp("anchors")
    return asyncio.run(search.run_search(parse_tuning_spec(SPEC).model_dump(by_alias=True, mode="json"),
                                         [str(empty)], "chat", "llm", stage2_top=2, timeout_s=240))


@pytest.mark.parametrize("throughput", [0.0, math.inf, math.nan, None])
def test_a_zero_or_non_finite_throughput_is_never_published(
        throughput: float | None, feasible_payload: dict[str, Any], offline: Settings,
        events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    payload = copy.deepcopy(feasible_payload)
    assert payload["recommendation"]["meets_slo"]
    payload["recommendation"]["predicted"]["throughput_per_gpu_at_slo"] = throughput

    async def found(*a: Any, **k: Any) -> dict[str, Any]:
        return payload

    monkeypatch.setattr(tune, "run_search", found)
    kube = FakeKube(SPEC)
    assert _run(kube, offline) == "Failed"
    cond = kube.cond("Recommended")
    assert cond["reason"] == "NoFeasibleConfig" and "positive throughput" in cond["message"]
    assert kube.applied_config_maps == [] and "Recommended" not in [r for r, _ in events]
    # the same payload with its figure intact is published
    monkeypatch.setattr(tune, "run_search", lambda *a, **k: found())
    kube = FakeKube(SPEC)
    payload["recommendation"]["predicted"]["throughput_per_gpu_at_slo"] = 10.0
    assert _run(kube, offline) == "Recommended" and kube.applied_config_maps == ["chat-recommendation"]


# -- 2. every pass is guarded ------------------------------------------------------------------------


@pytest.mark.parametrize("change,field", HOSTILE)
def test_hostile_spec_values_park_the_tuning_invalid(change: dict[str, Any], field: str, offline: Settings,
                                                     events: list[tuple[str, str]]) -> None:
    """Each once raised out of the pass (no condition; retried every 60 s) or reached the status
    patch; now the tuning is Invalid, the message names the field, and nothing is published."""
    kube = FakeKube({**SPEC, **change}, config_maps=("chat-recommendation",))
    with pytest.raises(tune.Invalid) as err:
        _run(kube, offline)
    assert field in str(err.value)
    cond = kube.cond("Recommended")
    assert kube.status["phase"] == "Invalid" and cond["reason"] == "InvalidSpec" and field in cond["message"]
    assert len(cond["message"]) <= 1024 and kube.applied_config_maps == [] and kube.config_maps == set()
    assert "InvalidSpec" in [r for r, _ in events]


def test_an_internal_error_becomes_degraded_with_backoff_and_a_later_pass_clears_it(
        offline: Settings, events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch,
        feasible_payload: dict[str, Any]) -> None:
    async def boom(*a: Any, **k: Any) -> int:
        raise RuntimeError("the anchor cache is on a read-only filesystem")

    monkeypatch.setattr(tune, "sync_anchors", boom)
    kube = FakeKube(SPEC)
    before = _errors("internal", "InternalError")
    delays = []
    for _ in range(2):
        with pytest.raises(kopf.TemporaryError) as err:
            _run(kube, offline)
        delays.append(err.value.delay)
    assert delays[0] is not None and delays[1] is not None and delays[0] < delays[1]
    cond = kube.cond("Degraded")
    assert cond["status"] == "True" and cond["reason"] == "InternalError"
    assert "RuntimeError: the anchor cache is on a read-only filesystem" in cond["message"]
    assert kube.status["retries"] == 2 and _errors("internal", "InternalError") == before + 2
    assert [r for r, _ in events].count("Degraded") == 2 and kube.applied_config_maps == []

    async def fine(*a: Any, **k: Any) -> int:
        return 0

    async def found(*a: Any, **k: Any) -> dict[str, Any]:
        return feasible_payload

    monkeypatch.setattr(tune, "sync_anchors", fine)
    monkeypatch.setattr(tune, "run_search", found)
    assert _run(kube, offline) == "Recommended"
    assert kube.cond("Degraded")["status"] == "False" and kube.status["retries"] == 0


def test_a_refused_status_write_publishes_nothing(offline: Settings, events: list[tuple[str, str]],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  feasible_payload: dict[str, Any]) -> None:
    """The API server refused the status patch (HTTP 500) after the ConfigMap and the Recommended
    Event had gone out: now they go out only once the status holding the recommendation is written."""
    async def found(*a: Any, **k: Any) -> dict[str, Any]:
        return feasible_payload

    monkeypatch.setattr(tune, "run_search", found)
    kube = FakeKube({**SPEC, "confirmation": {"mode": "argo-rollouts"}}, refuse=("recommendation",))
    with pytest.raises(kopf.TemporaryError):
        _run(kube, offline)
    assert kube.applied_config_maps == [] and kube.applied_templates == [] and kube.applied_deployments == []
    assert "Recommended" not in [r for r, _ in events] and "Degraded" in [r for r, _ in events]
    cond = kube.cond("Degraded")
    assert cond["status"] == "True" and cond["reason"] == "KubernetesApiError" and "HTTP 500" in cond["message"]
    assert "recommendation" not in kube.status


def test_a_non_finite_number_is_refused_before_the_status_is_sent(
        offline: Settings, events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch,
        feasible_payload: dict[str, Any]) -> None:
    book = StatusBook(FakeKube(SPEC).body(), FakeKube(SPEC))  # type: ignore[arg-type]
    book.set(phase="Recommended", search={"seconds": math.inf})
    with pytest.raises(StatusNotWritable, match=r"status\.search\.seconds"):
        asyncio.run(book.flush())
    assert book.get("phase") is None and book.get("search") is None  # the book reads as the server's again
    # In a pass: a search figure that is not finite ends it Degraded, publishing nothing.
    payload = copy.deepcopy(feasible_payload)
    payload["candidates"] = math.inf
    monkeypatch.setattr(tune, "run_search", lambda *a, **k: _async(payload))
    kube = FakeKube(SPEC)
    with pytest.raises(kopf.TemporaryError):
        _run(kube, offline)
    cond = kube.cond("Degraded")
    assert cond["reason"] == "StatusNotWritable" and "status.search.candidates" in cond["message"]
    assert kube.applied_config_maps == [] and "Recommended" not in [r for r, _ in events]
    assert all("Infinity" not in json.dumps(p) for p in kube.patches)


async def _async(value: Any) -> Any:
    return value


def test_a_timer_pass_that_raises_is_degraded_and_backs_off(monkeypatch: pytest.MonkeyPatch,
                                                            events: list[tuple[str, str]]) -> None:
    async def boom(*a: Any, **k: Any) -> str:
        raise KeyError("canaries")

    monkeypatch.setattr(timer, "run_tick", boom)
    kube = FakeKube(SPEC, {"phase": "Confirming", "observedGeneration": 3})
    uid = "u-tick-guard"
    body = {**kube.body(), "metadata": {**BODY["metadata"], "uid": uid}}
    forget(uid)
    assert asyncio.run(timer.tick(body, kube, Settings())) == "retry"  # type: ignore[arg-type]
    assert kube.cond("Degraded")["reason"] == "InternalError" and "KeyError" in kube.cond("Degraded")["message"]
    assert asyncio.run(timer.tick(body, kube, Settings())) == "backoff"  # type: ignore[arg-type]
    # status.retries stays as it was: above zero, the timer would re-run a whole search (and retire
    # the canaries being measured) instead of the pass that failed
    assert "retries" not in kube.status

    async def steady(*a: Any, **k: Any) -> str:
        return "steady"

    monkeypatch.setattr(timer, "run_tick", steady)
    MEMO.retry_at(uid, 0.0)  # the backoff waited out
    assert asyncio.run(timer.tick(body, kube, Settings())) == "steady"  # type: ignore[arg-type]
    assert kube.cond("Degraded")["status"] == "False"
    forget(uid)


# -- 5. a search past its time limit backs off, then gives up (it was retried forever at full cost) --


def test_search_timeouts_back_off_then_give_up(offline: Settings, events: list[tuple[str, str]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []

    async def too_slow(*a: Any, **k: Any) -> dict[str, Any]:
        calls.append(bool(k.get("background")))
        raise search.SearchTimeout("the search did not finish within 1 s", retry_in=40.0)

    monkeypatch.setattr(tune, "run_search", too_slow)
    offline.search.max_failures = 2
    kube = FakeKube(SPEC)
    with pytest.raises(kopf.TemporaryError) as first:
        _run(kube, offline)
    # Backed off at least as long as the pool's own backoff for that search; Pending meanwhile.
    assert first.value.delay == pytest.approx(40.0) and kube.status["retries"] == 1
    assert kube.status["phase"] == "Pending" and kube.cond("Recommended")["reason"] == "SearchTimeout"
    with pytest.raises(kopf.PermanentError, match="gave up after 2"):
        _run(kube, offline)
    assert kube.status["phase"] == "Failed" and kube.status["retries"] == 0 and len(calls) == 2
    assert kube.status["observedGeneration"] == kube.body()["metadata"]["generation"]
    assert [r for r, _ in events].count("SearchTimeout") == 2
    # The same generation, Failed: the timer's retry of failed passes leaves it alone.
    assert asyncio.run(timer.tick(kube.body(), kube, offline)) in ("steady", "idle")  # type: ignore[arg-type]
    assert len(calls) == 2
