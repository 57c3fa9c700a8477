"""Canary measurements stored as ServingAnchors; GPU prices from the operator's ConfigMap."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from inferasim_operator.kube import ApiException, merge_patch_to
from inferasim_operator.models import Canary, TuningStatus, dump
from inferasim_operator.passes import confirm
from inferasim_operator.pricing import PriceError, price_from_data, resolve_price
from inferasim_operator.settings import Settings
from inferasim_operator.spec_rules import parse_tuning_spec

from inferasim.calibrate import CanaryWindow
from inferasim.catalog.gpus import get_gpu
from inferasim.core.layout import Layout
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import Anchor, BenchPoint, KernelSet, LayoutModel, Provenance
from inferasim.model.predictor import fitted_from_anchor
from inferasim.model.steptime import default_params
from inferasim.observed import ObservedWorkload

SPEC: dict[str, Any] = {
    "target": {"name": "chat"}, "model": "meta-llama/Meta-Llama-3-8B", "precision": ["bf16"],
    "hardware": {"gpu": "AMD_Instinct_MI300X", "gpusPerNode": 8, "maxGPUs": 8}, "engines": ["vllm"],
    "workload": {"prometheus": {"url": "http://prom:9090", "selector": {"deployment": "chat"}, "window": "5m"}},
    "confirmation": {"mode": "canary", "candidates": 1, "window": "10m"},
}
BODY: dict[str, Any] = {"apiVersion": "inferasim.io/v1alpha1", "kind": "ServingTuning",
                        "metadata": {"name": "chat", "namespace": "llm", "uid": "u-1", "generation": 1},
                        "spec": SPEC}
KS = KernelSet(engine="vllm", model="meta-llama/Meta-Llama-3-8B", gpu="MI300X", precision="bf16")


# --------------------------------------------------------------------------------------------
# prices
# --------------------------------------------------------------------------------------------


class PriceKube:
    def __init__(self, data: dict[str, str] | None = None, status: int | None = None) -> None:
        self.data, self.status, self.asked = data, status, []

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append((namespace, name))
        if self.status is not None:
            raise ApiException(status=self.status, reason="Forbidden")
        return None if self.data is None else {"data": self.data}


def _price(spec: dict[str, Any], kube: PriceKube) -> tuple[Any, ...]:
    settings = Settings(operator_namespace="ops", price_config_map="inferasim-gpu-prices")
    return asyncio.run(resolve_price(parse_tuning_spec(spec), kube, settings))


def test_price_keys_are_gpu_names_normalized() -> None:
    assert price_from_data({"H200": "3.1", "mi300x": "2.5"}, "AMD_Instinct_MI300X", "cm") == (2.5, "mi300x")
    oam = "AMD_Instinct_MI300X_OAM"
    assert price_from_data({oam: "$2"}, "MI300X", "cm") == (2.0, oam)
    assert price_from_data({"H200": "3.1", "not-a-gpu": "x"}, "MI300X", "cm") is None
    for bad in ("cheap", "-1", "0", "nan", "inf"):
        with pytest.raises(PriceError, match="key 'MI300X'") as exc:
            price_from_data({"MI300X": bad}, "MI300X", "ConfigMap ops/p")
        assert exc.value.key == "MI300X"


def test_price_from_spec_wins_then_configmap() -> None:
    kube = PriceKube({"MI300X": "2.5"})
    spec = {**SPEC, "hardware": {**SPEC["hardware"], "pricePerGpuHour": 4.0}}
    assert _price(spec, kube)[:3] == (4.0, "True", "SpecPrice") and kube.asked == []
    price, status, reason, message = _price(SPEC, kube)
    assert (price, status, reason) == (2.5, "True", "ConfigMapPrice")
    assert kube.asked == [("ops", "inferasim-gpu-prices")] and "'MI300X'" in message


@pytest.mark.parametrize("kube,reason,words", [
    (PriceKube(None), "NoPrice", "no ConfigMap ops/inferasim-gpu-prices"),
    (PriceKube({"H200": "3"}), "NoPrice", "has no entry for AMD_Instinct_MI300X"),
    (PriceKube({"MI300X": "two"}), "BadPrice", "key 'MI300X': 'two' is not a number"),
    (PriceKube(status=403), "PriceConfigMapUnreadable", "HTTP 403"),
])
def test_no_or_bad_price_is_a_condition_not_a_crash(kube: PriceKube, reason: str, words: str) -> None:
    price, status, got, message = _price(SPEC, kube)
    assert price is None and status == "False" and got == reason and words in message
    TuningStatus.model_validate({"conditions": [{"type": "Priced", "status": status, "reason": got,
                                                 "message": message}]})


def test_settings_read_the_price_configmap_from_env() -> None:
    s = Settings.from_env({"INFERASIM_PRICE_CONFIGMAP": "prices", "INFERASIM_OPERATOR_NAMESPACE": "ops"})
    assert (s.price_config_map, s.operator_namespace) == ("prices", "ops")
    d = Settings.from_env({})
    assert (d.price_config_map, d.operator_namespace) == ("inferasim-gpu-prices", "inferasim-system")


# --------------------------------------------------------------------------------------------
# canary anchors
# --------------------------------------------------------------------------------------------


def test_merge_patch_to_removes_what_the_new_object_lacks() -> None:
    old = {"a": 1, "fit": {"per_metric": {"tpot": 0.1, "ttft": 0.2}}, "points": [1, 2]}
    new = {"fit": {"per_metric": {"tpot": 0.0}}, "points": [3]}
    assert merge_patch_to(old, new) == {"a": None, "fit": {"per_metric": {"tpot": 0.0, "ttft": None}},
                                        "points": [3]}


class AnchorKube:
    """The ServingAnchor calls of Kube, in memory."""

    def __init__(self) -> None:
        self.anchors: dict[str, dict[str, Any]] = {}
        self.statuses: dict[str, dict[str, Any]] = {}

    def list_anchors(self) -> list[dict[str, Any]]:
        return list(copy.deepcopy(self.anchors).values())

    def get_anchor(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.anchors.get(name))

    def apply_anchor(self, body: dict[str, Any], old: dict[str, Any] | None = None) -> bool:
        created = body["metadata"]["name"] not in self.anchors
        self.anchors[body["metadata"]["name"]] = copy.deepcopy(body)
        return created

    def patch_anchor_status(self, name: str, status: dict[str, Any]) -> None:
        self.statuses[name] = status


class Book:
    namespace, name = "llm", "chat"


def _parent(tmp: Path) -> Anchor:
    params = replace(default_params(get_gpu("MI300X"), "vllm"), t_fixed=5e-3)
    a = Anchor(kernel_set=KS, layout=LayoutModel(tp=1), params=params.as_dict(),
               points=[BenchPoint(isl=512, osl=128, concurrency=c, tpot_ms=10.0) for c in (1, 4, 16)],
               provenance=Provenance(method="harvest", source="test"))
    AnchorStore(tmp).save(a)
    return a


def test_measured_canary_becomes_a_servinganchor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = _parent(tmp_path / "shipped")
    settings = Settings(anchor_dirs=[str(tmp_path / "shipped")], anchor_cache=str(tmp_path / "cache"))
    kube = AnchorKube()
    windows = iter([CanaryWindow(in_flight=3.6, prompt_tokens=400, output_tokens=64, itl_s=0.012, ttft_s=0.09,
                                 queries=("q1",)),
                    CanaryWindow(in_flight=9.2, prompt_tokens=400, output_tokens=64, itl_s=0.014, ttft_s=0.12)])
    current: list[CanaryWindow] = []

    def fake_measure(observed: Any, url: str, **kw: Any) -> CanaryWindow:
        return current[0]

    monkeypatch.setattr(confirm, "measure_window", fake_measure)
    spec = parse_tuning_spec(SPEC)
    obs = ObservedWorkload(engine="vllm", window="10m", selector={"deployment": "chat-canary-0"}, observed_at=1e9,
                           request_rate=1.0, prompt_tokens_mean=400, output_tokens_mean=64, prefix_hit_rate=None,
                           running=3, waiting=0)
    canary = dump(Canary(name="chat-canary-0", engine="vllm", precision="bf16", layout={"tp": 1},
                         layout_label="tp1", gpus=1, image="vllm/vllm-openai-rocm:v0.27.1", parent_anchor=parent.id))
    results = []
    for started in ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"):
        current[:] = [next(windows)]
        c = dict(canary)
        asyncio.run(confirm.store_canary_anchor(BODY, spec, Book(), kube, settings, c, obs, "http://prom:9090",
                                                started))
        results.append(c)
    name = confirm.canary_anchor_name(KS, Layout(tp=1))
    assert list(kube.anchors) == [name]  # a re-run updates the same anchor, never a second one
    c1, c2 = results
    assert c1["anchor"] == c2["anchor"] == name and c1["measuredItlMeanMs"] == pytest.approx(12.0)
    assert c1["measuredInFlight"] == 3.6 and c1["calibrationScale"] > 0
    TuningStatus.model_validate({"confirmation": {"mode": "canary", "canaries": [c1]}})  # the CRD's model
    obj = kube.anchors[name]
    assert obj["metadata"]["labels"]["inferasim.io/kind"] == "canary"
    assert obj["metadata"]["annotations"]["inferasim.io/parent-anchor"] == parent.id
    assert "ownerReferences" not in obj["metadata"]  # cluster-scoped: a namespaced tuning cannot own it
    anchor = Anchor.model_validate(obj["spec"])
    assert anchor.provenance.method == "canary" and parent.id in anchor.provenance.notes
    assert [p.concurrency for p in anchor.points] == [4, 9] and anchor.provenance.gpu_seconds == 600
    assert kube.statuses[name]["canary"] == "llm/chat-canary-0"
    # the operator's store holds it next to the harvested one, and it predicts its own points
    cached = AnchorStore(tmp_path / "cache").all()
    assert [a.provenance.method for a in cached] == ["canary"]
    fitted = fitted_from_anchor(cached[0])
    for p in anchor.points:
        got = fitted.predict_layout(Layout(tp=1), p.isl, p.osl, p.concurrency)["tpot"] * 1e3
        assert got == pytest.approx(p.tpot_ms, rel=0.15)  # two points, one shared scale


def test_uncalibratable_canary_is_a_message_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(anchor_dirs=[], anchor_cache=str(tmp_path / "cache"))
    monkeypatch.setattr(confirm, "measure_window", lambda *a, **k: CanaryWindow(
        in_flight=2, prompt_tokens=400, output_tokens=64, itl_s=0.0, ttft_s=0.1))
    obs = ObservedWorkload(engine="vllm", window="10m", observed_at=1e9, request_rate=1.0, prompt_tokens_mean=400,
                           output_tokens_mean=64, prefix_hit_rate=None, running=3, waiting=0)
    c = dump(Canary(name="chat-canary-0", engine="vllm", precision="bf16", layout={"tp": 1}, layout_label="tp1"))
    kube = AnchorKube()
    asyncio.run(confirm.store_canary_anchor(BODY, parse_tuning_spec(SPEC), Book(), kube, settings, c, obs,
                                            "http://prom:9090", ""))
    assert not kube.anchors and "not stored as an anchor" in c["message"] and "inter-token latency" in c["message"]
