"""The pure pieces of passive anchors and prediction-error tracking in the operator: names, status
shaping, the PredictionDrift threshold logic, refit ranges, what the search sees, the gauge."""

from __future__ import annotations

import time

import pytest
from inferasim_operator import metrics
from inferasim_operator.models import PredictionErrorStatus, TuningStatus
from inferasim_operator.passes.passive import (
    describe_error,
    epoch,
    iso,
    passive_anchor_name,
    passive_object,
    passive_status,
    prediction_status,
    refit_due,
)
from inferasim_operator.settings import Settings
from inferasim_operator.status import set_condition

from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.drift import PredictionError
from inferasim.live import drift_transition, read_live, refit_range, search_view, used_provenance
from inferasim.model.anchors import Anchor, BenchPoint, FitReport, KernelSet, LayoutModel, Provenance
from inferasim.passive import Window
from inferasim.render import render_deployment

KS = KernelSet(engine="vllm", model="meta-llama/Llama-3.1-8B", gpu="MI300X", precision="bf16")


def anchor(method: str, n_points: int = 4, ks: KernelSet = KS, layout: Layout | None = None) -> Anchor:
    return Anchor(
        kernel_set=ks, layout=LayoutModel.from_layout(layout or Layout(tp=1)),
        points=[BenchPoint(isl=512, osl=64, concurrency=2 ** i, tpot_ms=8.0 + i, row_id=f"{method}{i}")
                for i in range(n_points)],
        params={"t_fixed": 0.005},
        fit=FitReport(n_points=n_points, rms_log_error=0.04, max_abs_log_error=0.08),
        provenance=Provenance(method=method, source=f"test {method}",  # type: ignore[arg-type]
                              measured_at="2025-01-01T00:00:00Z/2025-01-01T01:00:00Z"))


def error(itl_rel: float) -> PredictionError:
    pred = {"ttft": 40.0, "itl": 6.0, "throughput": 1000.0}
    rel = {"ttft": 0.05, "itl": itl_rel, "throughput": -0.1}
    obs = {m: pred[m] * (1 + rel[m]) for m in pred}
    return PredictionError(anchor_id=f"{KS.key()}-tp1", concurrency=3.7, observed=obs, predicted=pred, relative=rel)


def test_passive_anchor_name_is_deterministic_and_dns_safe() -> None:
    name = passive_anchor_name(KS, Layout(tp=2, moe_ep=2))
    assert name == passive_anchor_name(KS, Layout(tp=2, moe_ep=2))
    assert name.startswith(f"passive-{KS.key()}-") and name == name.lower() and "_" not in name
    # apart from the harvested anchor's object name (the anchor id) and from other layouts
    assert name != f"{KS.key()}-tp2" and name != passive_anchor_name(KS, Layout(tp=1))


def test_passive_object_says_where_it_came_from() -> None:
    a = anchor("passive")
    obj = passive_object(a, "passive-x-tp1", "llm/chat", "llm/chat-tuning")
    assert obj["kind"] == "ServingAnchor" and obj["metadata"]["name"] == "passive-x-tp1"
    assert obj["metadata"]["labels"]["inferasim.io/kind"] == "passive"
    notes = obj["metadata"]["annotations"]
    assert notes["inferasim.io/deployment"] == "llm/chat" and notes["inferasim.io/measured-by"] == "llm/chat-tuning"
    assert notes["inferasim.io/window"] == a.provenance.measured_at
    assert Anchor.model_validate(obj["spec"]) == a


def test_status_shapes_validate_against_the_crd_models() -> None:
    a = anchor("passive", 5)
    pa = passive_status(a, "passive-x-tp1", "llm/chat", since="2025-01-01T00:30:00Z")
    assert pa.state == "Fitted" and pa.windows == 5 and pa.rms_log_error == 0.04 and "1-16 requests" in pa.message
    w = Window(start=1_700_000_000, end=1_700_000_060, in_flight=3.7, prompt_tokens=700, output_tokens=48,
               itl_s=0.009, ttft_s=0.042, requests=120)
    ps = prediction_status(error(0.5), 0.25, "passive", w)
    wire = ps.model_dump(by_alias=True, exclude_none=True)
    assert wire["relative"]["itlMs"] == 0.5 and wire["predicted"]["throughput"] == 1000.0
    assert wire["worst"] == 0.5 and wire["provenance"] == "passive" and wire["window"].count("Z") == 2
    # the whole status, as the operator writes it, is what the CRD (generated from TuningStatus) accepts
    TuningStatus.model_validate({"passiveAnchor": pa.model_dump(by_alias=True), "predictionError": wire,
                                 "conditions": set_condition([], "PredictionDrift", "True", "PredictionError", "x", 1)})
    PredictionErrorStatus.model_validate({"message": "no request finished", "checkedAt": iso(time.time())})


def test_describe_error_gives_the_numbers_worst_first() -> None:
    text = describe_error(error(1.4), 0.5)
    assert text.startswith("ITL +140% (observed 14.4 ms, predicted 6 ms)")
    assert "threshold 50%" in text and "3.7 in flight" in text and KS.key() in text


@pytest.mark.parametrize("previous,worst,expected", [
    (None, 0.1, ("False", "WithinThreshold")),  # the first check sets it
    (None, 0.9, ("True", "PredictionError")),
    ("False", 0.1, None),
    ("False", 0.5, None),  # at the threshold: not past it
    ("False", 0.51, ("True", "PredictionError")),
    ("True", 0.9, None),
    ("True", 0.2, ("False", "WithinThreshold")),
])
def test_drift_transition(previous: str | None, worst: float, expected: tuple[str, str] | None) -> None:
    assert drift_transition(previous, worst, 0.5) == expected


def test_drift_transition_needs_a_positive_threshold() -> None:
    with pytest.raises(ValueError):
        drift_transition(None, 0.1, 0)


def test_refit_range_never_reads_before_a_change() -> None:
    assert refit_range(1000.0, 400.0, 60.0, None) == (640.0, 1000.0)  # whole steps ending at `end`
    assert refit_range(1000.0, 400.0, 60.0, 900.0) is None  # 100 s since the change: fewer than 3 steps
    assert refit_range(1000.0, 400.0, 60.0, 800.0) == (820.0, 1000.0)
    assert refit_range(1000.0, 400.0, 60.0, 100.0) == (640.0, 1000.0)  # an old change does not widen it


def test_refit_due() -> None:
    now = epoch("2025-01-01T01:00:00Z")
    assert now is not None
    assert refit_due({}, 3600, now)
    assert refit_due({"fittedAt": "2025-01-01T00:10:00Z", "since": "2025-01-01T00:50:00Z"}, 3600, now)
    # refitted after the detection: not again (it is reported) until a window has passed
    assert not refit_due({"fittedAt": "2025-01-01T00:55:00Z", "since": "2025-01-01T00:50:00Z"}, 3600, now)
    assert refit_due({"fittedAt": "2025-01-01T00:55:00Z", "since": "2025-01-01T00:50:00Z"}, 60, now)
    assert epoch("yesterday") is None and epoch(iso(1_700_000_000.0)) == 1_700_000_000.0


def test_search_view_hides_passive_only_beside_a_measurement_taken_on_purpose() -> None:
    harvested, passive = anchor("harvest"), anchor("passive", 12)
    other = anchor("passive", 6, KernelSet(engine="vllm", model="meta-llama/Llama-3.1-8B", gpu="MI300X",
                                           precision="fp8"))
    canary = anchor("canary", 1)
    assert search_view([passive, other]) == [passive, other]
    assert search_view([harvested, passive, other, canary]) == [harvested, other, canary]
    # a shipped (public) anchor of the same engine/model/GPU/precision, any version, counts too
    shipped = anchor("public-data", 4, KernelSet(engine="vllm", engine_version="0.9.0", model="meta-llama/Llama-3.1-8B",
                                            gpu="AMD_Instinct_MI300X_OAM", precision="bf16"))
    assert search_view([passive], [shipped]) == []
    # live-traffic anchors alone never hide one another
    assert search_view([passive, canary]) == [passive, canary]


def test_used_provenance_follows_the_search_choice() -> None:
    passive, canary = anchor("passive", 6), anchor("canary", 1)
    assert passive.id == canary.id
    assert used_provenance([canary, passive], passive.id) == "passive"
    assert used_provenance([canary], canary.id) == "canary"
    assert used_provenance([passive], "nope") == ""


def test_read_live_names_the_checkpoint_precision() -> None:
    cfg = ServingConfig(engine="vllm", model="meta-llama/Llama-3.1-8B", gpu="MI300X", layout=Layout(tp=1),
                        precision="bf16")
    dep = render_deployment(cfg, "chat", "llm")
    dep["metadata"]["annotations"].pop("inferasim.io/precision")  # a manifest that names no precision
    live = read_live(dep)
    assert live.kernel_set().precision == "bf16"  # the checkpoint's own, as the search spells it


def test_prediction_gauge_drops_metrics_not_observed_any_more() -> None:
    metrics.set_prediction_error("uid-1", "llm", "chat", {"ttft": 0.1, "itl": 0.6})
    text = metrics.PREDICTION_ERROR.collect()[0].samples
    assert {(s.labels["metric"], s.value) for s in text if s.labels["tuning"] == "chat"} == {("ttft", 0.1),
                                                                                            ("itl", 0.6)}
    metrics.set_prediction_error("uid-1", "llm", "chat", {"itl": 0.2})
    text = metrics.PREDICTION_ERROR.collect()[0].samples
    assert {(s.labels["metric"], s.value) for s in text if s.labels["tuning"] == "chat"} == {("itl", 0.2)}
    metrics.forget("uid-1")
    assert not [s for s in metrics.PREDICTION_ERROR.collect()[0].samples if s.labels["tuning"] == "chat"]


def test_settings_from_env() -> None:
    s = Settings.from_env({"INFERASIM_PASSIVE_WINDOW_S": "40", "INFERASIM_PASSIVE_STEP_S": "4",
                           "INFERASIM_PREDICTION_WINDOW_S": "6", "INFERASIM_ENGINE_SPEEDUP": "5"})
    assert (s.passive_window_s, s.passive_step_s, s.prediction_window_s, s.engine_speedup) == (40, 4, 6, 5)
    d = Settings.from_env({})
    assert (d.passive_window_s, d.passive_step_s, d.prediction_window_s, d.engine_speedup) == (3600, 60, 300, 1)
    with pytest.raises(ValueError, match="INFERASIM_PASSIVE_WINDOW_S"):
        Settings.from_env({"INFERASIM_PASSIVE_WINDOW_S": "60", "INFERASIM_PASSIVE_STEP_S": "60"})


def test_a_check_that_cannot_compute_the_error_clears_the_gauge() -> None:
    """Once the target is gone, the last published error is no measurement of the running configuration."""
    import asyncio

    from inferasim_operator.passes.passive import check_prediction
    from inferasim_operator.spec_rules import parse_tuning_spec
    from test_operator_reconcile import BODY, SPEC

    class Kube:  # the target Deployment deleted; the tuning itself still there
        def get_deployment(self, namespace: str, name: str) -> None:
            return None

        def get_tuning(self, namespace: str, name: str) -> dict[str, object]:
            return {"status": {}}

        def patch_tuning_status(self, namespace: str, name: str, patch: dict[str, object]) -> dict[str, object]:
            self.patch = patch
            return {}

    spec = parse_tuning_spec({**SPEC, "workload": {"prometheus": {"url": "http://127.0.0.1:1",
                                                                  "selector": {"deployment": "chat"}}}})
    metrics.set_prediction_error("u-1", "llm", "chat", {"ttft": 0.1, "itl": 0.6})
    kube = Kube()
    done = asyncio.run(check_prediction(BODY, "u-1", spec, kube, Settings.from_env({})))  # type: ignore[arg-type]
    assert done == "prediction: no target" and "not found" in kube.patch["predictionError"]["message"]
    assert not [s for s in metrics.PREDICTION_ERROR.collect()[0].samples if s.labels["tuning"] == "chat"]
