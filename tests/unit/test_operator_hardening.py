"""Hostile specs from a run on a real control plane: a recommendation that met no SLO published as
"0 tok/s/GPU". Each case drives the operator's pass against an in-memory API server."""

from __future__ import annotations

import asyncio
import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from inferasim_operator import metrics, reconcile, search
from inferasim_operator.kube import ApiException
from test_operator_reconcile import BODY, SPEC


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
    def list_jobs(self, selector: str) -> list[dict[str, Any]]:
        return []

    def list_anchors(self) -> list[dict[str, Any]]:
        return []

    def cond(self, type_: str) -> dict[str, Any]:
        return next((c for c in self.status.get("conditions") or [] if c.get("type") == type_), {})


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(reason, message) of every Event a pass posts."""
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(reconcile, "post_event", lambda body, type_, reason, message: posted.append((reason, message)))
    return posted


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> reconcile.Settings:
    """Settings for a pass with no ServingAnchors and no prices; the search runs for real."""
    async def no_anchors(*a: Any, **k: Any) -> int:
        return 0

    async def no_price(*a: Any, **k: Any) -> tuple[None, str, str, str]:
        return None, "False", "NoPrice", "no price"

    monkeypatch.setattr(reconcile, "sync_anchors", no_anchors)
    monkeypatch.setattr(reconcile, "resolve_price", no_price)
    (tmp_path / "anchors").mkdir()
    return reconcile.Settings(anchor_dirs=[str(tmp_path / "anchors")], anchor_cache=str(tmp_path / "cache"),
                              search_timeout_s=240, stage2_top=2)


def _run(kube: FakeKube, settings: reconcile.Settings) -> str:
    return asyncio.run(reconcile.reconcile(kube.body(), kube, settings, trigger="create", reason="test"))  # type: ignore[arg-type]


def _errors(kind: str, reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("inferasim_pass_errors_total", {"kind": kind, "reason": reason}) or 0.0


# -- 1. no recommendation is published that meets no SLO, or with a zero or non-finite throughput --


@pytest.mark.parametrize("ttft_ms", [12, 1e-300])
def test_an_slo_no_deployment_meets_publishes_nothing(ttft_ms: float, offline: reconcile.Settings,
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
    return asyncio.run(search.run_search(reconcile.parse_tuning_spec(SPEC).model_dump(by_alias=True, mode="json"),
                                         [str(empty)], "chat", "llm", stage2_top=2, timeout_s=240))


@pytest.mark.parametrize("throughput", [0.0, math.inf, math.nan, None])
def test_a_zero_or_non_finite_throughput_is_never_published(
        throughput: float | None, feasible_payload: dict[str, Any], offline: reconcile.Settings,
        events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    payload = copy.deepcopy(feasible_payload)
    assert payload["recommendation"]["meets_slo"]
    payload["recommendation"]["predicted"]["throughput_per_gpu_at_slo"] = throughput

    async def found(*a: Any, **k: Any) -> dict[str, Any]:
        return payload

    monkeypatch.setattr(reconcile, "run_search", found)
    kube = FakeKube(SPEC)
    assert _run(kube, offline) == "Failed"
    cond = kube.cond("Recommended")
    assert cond["reason"] == "NoFeasibleConfig" and "positive throughput" in cond["message"]
    assert kube.applied_config_maps == [] and "Recommended" not in [r for r, _ in events]
    # the same payload with its figure intact is published
    monkeypatch.setattr(reconcile, "run_search", lambda *a, **k: found())
    kube = FakeKube(SPEC)
    payload["recommendation"]["predicted"]["throughput_per_gpu_at_slo"] = 10.0
    assert _run(kube, offline) == "Recommended" and kube.applied_config_maps == ["chat-recommendation"]
