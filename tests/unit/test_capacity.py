"""Capacity questions (issue 27 item 1): the most a GPU budget serves within the SLO, and the GPUs a rate needs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from inferasim.core.spec import SpecError, load_spec
from inferasim.search.capacity import gpus_for_rate, max_rate
from inferasim.search.tune import tune

SPEC = {
    "model": "meta-llama/Meta-Llama-3.1-70B", "precision": ["fp8"],
    "hardware": {"gpu": "MI300X", "gpusPerNode": 8, "maxGPUs": 16},
    "engines": ["vllm"],
    "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 2000, "itlP90Ms": 50}},
    "workload": {"static": {"kind": "poisson", "requestRate": 4, "inputTokens": 2000, "outputTokens": 400,
                            "numRequests": 300}},
}


def _spec(tmp_path: Path, capacity: dict) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({**SPEC, "capacity": capacity}))
    return p


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory):
    return tune(load_spec(_spec(tmp_path_factory.mktemp("cap"), {"question": "maxRate"})))


def test_max_rate_is_replicas_times_the_rate_one_replica_serves(result) -> None:
    rows = max_rate(result, 16)
    assert rows
    for r in rows:
        assert r["gpus"] <= 16 and r["replicas"] == 16 // r["gpus_per_replica"]
        assert r["rate"] == pytest.approx(r["replicas"] * r["rate_per_replica"])
        lo, hi = r["rate_interval"]
        assert lo < r["rate"] < hi and lo * hi == pytest.approx(r["rate"] ** 2)
    # A bigger budget never serves less.
    assert max_rate(result, 32)[0]["rate"] >= rows[0]["rate"]
    cap = result.as_dict()["capacity"]
    assert cap["question"] == "maxRate" and "within the SLO on 16 GPUs" in cap["headline"]


def test_gpus_for_rate_covers_the_rate_with_whole_replicas(result) -> None:
    for rate in (1.0, 40.0, 400.0):
        rows = gpus_for_rate(result, rate)
        assert rows
        for r in rows:
            assert r["rate"] >= rate - 1e-9
            assert (r["replicas"] - 1) * r["rate_per_replica"] < rate  # one replica fewer would not do
            lo, hi = r["gpus_interval"]
            assert lo <= r["gpus"] <= hi and r["gpus"] % r["gpus_per_replica"] == 0
        assert [r["gpus"] for r in rows if r["anchored"]] == sorted(r["gpus"] for r in rows if r["anchored"])
    assert gpus_for_rate(result, 400.0)[0]["gpus"] >= gpus_for_rate(result, 40.0)[0]["gpus"]
    assert math.isfinite(gpus_for_rate(result, 40.0)[0]["interval_factor_90"])


def test_a_capacity_question_is_checked_in_the_spec(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="question"):
        load_spec(_spec(tmp_path, {"question": "maxGPUs"}))
    with pytest.raises(SpecError, match="requestRate"):
        load_spec(_spec(tmp_path, {"question": "gpusForRate", "requestRate": -1}))


def test_missing_anchors_come_most_informative_first() -> None:
    """Issue 28 item 4: the harvest whose kernel set carries most of the leading candidates' bands first."""
    res = tune(load_spec(Path(__file__).resolve().parents[2] / "examples" / "llama70b-mi355x.yaml"))
    weights = [m["band_weight"] for m in res.missing_anchors]
    assert len(weights) > 1 and weights == sorted(weights, reverse=True)
    # The recommendation's own kernel set (unanchored here) is the first harvest.
    rec = res.recommendation
    assert not rec.anchored
    assert (res.missing_anchors[0]["engine"], res.missing_anchors[0]["precision"]) == \
        (rec.candidate.engine, rec.candidate.precision)


def test_a_rate_below_one_request_a_day_is_refused_with_its_field(tmp_path: Path) -> None:
    spec = {**SPEC, "workload": {"static": {**SPEC["workload"]["static"], "requestRate": 1e-308}}}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match="requestRate"):
        load_spec(p)
