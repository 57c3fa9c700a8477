"""Bounded spec fields: values that once made the operator's pass raise (a 5,000-digit window, 2,000
selector labels, a toleration Kubernetes has no field for) are refused when the spec is read,
naming the field; the CRD generated from the same models bounds them on the API server too
(test_operator_crds)."""

from __future__ import annotations

from typing import Any

import pytest
from inferasim_operator.spec_rules import parse_duration, parse_tuning_spec
from test_operator_reconcile import SPEC

from inferasim.core.spec import SpecError

HOSTILE = [
    ({"model": "m" * 100_000}, "model"),
    ({"workload": {"prometheus": {"url": "http://prom:9090", "window": "5m",
                                  "selector": {f"l{i}": "v" for i in range(2000)}}}}, "workload.prometheus.selector"),
    ({"workload": {"prometheus": {"url": "http://prom:9090", "selector": {"l": "v" * 10_000}}}},
     "workload.prometheus.selector"),
    ({"confirmation": {"mode": "canary", "window": "9" * 5000 + "m"}}, "confirmation.window"),
    ({"confirmation": {"mode": "canary", "window": "400d"}}, "confirmation.window"),
    ({"retune": {"every": "9" * 30 + "w"}}, "retune.every"),
    ({"harvest": {"allowed": True, "tolerations": [{"weird": 1}]}}, "harvest.tolerations"),
    ({"harvest": {"tolerations": [{"key": "gpu", "operator": "Sometimes"}]}}, "harvest.tolerations"),
    ({"objective": {"slo": {"ttftP90Ms": float("inf")}}}, "objective.slo.ttftP90Ms"),
    ({"hardware": {"gpu": "MI300X", "maxGPUs": 10**9}}, "hardware.maxGPUs"),
    ({"target": {"name": "t" * 300}}, "target.name"),
]


@pytest.mark.parametrize("change,field", HOSTILE)
def test_hostile_values_are_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_tuning_spec({**SPEC, **change})
    assert field in str(err.value) and len(str(err.value)) < 2000


def test_durations_are_bounded() -> None:
    assert parse_duration("366d", "x") == 366 * 86400
    for text in ("367d", "9" * 400 + "s", "53w"):
        with pytest.raises(SpecError, match="longer than a year"):
            parse_duration(text, "retune.every")


def test_typed_tolerations_reach_the_harvest_job() -> None:
    spec = parse_tuning_spec({**SPEC, "harvest": {"tolerations": [
        {"key": "gpu", "operator": "Equal", "value": "mi300x", "effect": "NoExecute", "tolerationSeconds": 60},
        {"operator": "Exists"}]}})
    from inferasim_operator.harvest_job import HarvestTarget, build_job, job_limits

    missing = {"engine": "vllm", "model": SPEC["model"], "gpu": "MI300X", "precision": "bf16",
               "harvest_layout": {"tp": 1}, "harvest_gpu_hours": 0.3}
    target = HarvestTarget.from_missing(missing)
    limits = job_limits(target, spec.harvest, 10.0)
    assert limits is not None
    job = build_job(target, spec.harvest, limits, namespace="llm", tuning="chat", harvester_image="h:1")
    assert job["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Equal", "value": "mi300x", "effect": "NoExecute", "tolerationSeconds": 60},
        {"operator": "Exists"}]
    for bad in ({"operator": "Exists", "value": "x", "key": "k"}, {"value": "x"},
                {"key": "k", "tolerationSeconds": 5, "effect": "NoSchedule"}):
        with pytest.raises(SpecError, match="harvest.tolerations"):
            parse_tuning_spec({**SPEC, "harvest": {"tolerations": [bad]}})


def test_a_query_no_url_can_carry_is_a_bad_selector_not_a_crash() -> None:
    """httpx's InvalidURL is no HTTPError: it escaped observe() and the tuning stayed Observing."""
    from inferasim.observe import ObservationError, PrometheusClient

    with PrometheusClient("http://127.0.0.1:9") as client, pytest.raises(ObservationError) as err:
        client._data("/api/v1/query", {"query": "up{" + ",".join(f'l{i}="v"' for i in range(20000)) + "}"}, "query")
    assert err.value.reason == "BadSelector" and "too long" in str(err.value)
