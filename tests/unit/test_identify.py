"""model.identify: what an anchor's points decide, what they leave to priors, and which
predictions lean on the latter; `inferasim anchors check` reporting it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.anchors import Anchor, BenchPoint, KernelSet, LayoutModel, Provenance
from inferasim.model.fit import FitPoint, fit_anchor_params, predict_points
from inferasim.model.identify import anchor_slopes, identify_fit, leaning
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steady import engine_sched
from inferasim.model.steptime import default_params

MODEL, GPU = get_model("meta-llama/Meta-Llama-3-8B"), get_gpu("h100_sxm")
COST = layout_cost(MODEL, GPU, Layout(), "bf16", "auto", "vllm", "")
SCHED = engine_sched("vllm", MODEL, GPU, Layout(), "bf16", "", "auto")
PRIOR = default_params(GPU, "vllm", "")
TRUTH = replace(PRIOR, e_bw=0.85, t_fixed=4e-3, e_flops=0.55)


def _measured(blank: list[FitPoint], ttft_factor: float = 1.0) -> list[FitPoint]:
    pred = predict_points(TRUTH, COST, SCHED, blank)
    return [replace(p, ttft=float(pred["ttft"][i]) * ttft_factor, tpot=float(pred["tpot"][i]))
            for i, p in enumerate(blank)]


def _fit(points: list[FitPoint]):  # noqa: ANN202
    params = fit_anchor_params(COST, SCHED, points, PRIOR).params
    return params, identify_fit(COST, SCHED, points, PRIOR, params)


def test_a_concurrency_sweep_identifies_decode_terms_and_leaves_others_to_priors() -> None:
    points = _measured([FitPoint(isl=1024, osl=256, concurrency=c) for c in (1, 4, 16, 64)])
    params, ident = _fit(points)
    assert {"t_fixed", "e_bw"} <= set(ident.data_led())
    # One prompt length: nothing here separates the per-prompt-token front-end cost.
    assert "t_front_token" in ident.prior_led()
    by_name = {p.name: p for p in ident.params}
    assert by_name["t_front_token"].share is None and by_name["t_front_token"].source == "prior only"
    assert all(p.share is None or 0.0 <= p.share <= 1.0 for p in ident.params)
    # A dense model has no expert skew to identify.
    assert "moe_skew" not in by_name
    assert not any("one measured point" in h for h in ident.hints)


def test_one_point_leaves_nearly_everything_to_priors_and_says_so() -> None:
    params, ident = _fit(_measured([FitPoint(isl=1024, osl=256, concurrency=16)]))
    assert any("one measured point" in h for h in ident.hints)
    assert len(ident.prior_led()) > len(ident.data_led())


def test_ttft_faster_than_the_compute_ceiling_hints_at_cached_or_shorter_prompts() -> None:
    # Long prompts measured 4x faster than prefill at the truth's efficiency: no efficiency within
    # (0, 1] explains them, as when a benchmark's prompts hit the prefix cache.
    blank = [FitPoint(isl=8192, osl=64, concurrency=c) for c in (1, 2, 4)]
    params, ident = _fit(_measured(blank, ttft_factor=0.25))
    assert any("partly cached" in h for h in ident.hints), ident.hints
    honest = _fit(_measured(blank))[1]
    assert not any("partly cached" in h for h in honest.hints)


def test_a_first_token_wait_no_engine_step_explains_is_named_with_its_point() -> None:
    points = _measured([FitPoint(isl=1024, osl=256, concurrency=c) for c in (1, 4, 16, 64)])
    stalled = [replace(p, ttft=p.ttft * 8.0) if p.concurrency == 16 else p for p in points]  # type: ignore[operator]
    _, ident = _fit(stalled)
    named = [h for h in ident.hints if "what the fitted engine explains" in h]
    assert len(named) == 1 and "at 16 clients (1024x256)" in named[0], ident.hints
    assert not any("what the fitted engine explains" in h for h in _fit(points)[1].hints)


def test_a_max_throughput_sweep_is_named() -> None:
    blank = [FitPoint(isl=1024, osl=128, concurrency=256), FitPoint(isl=4096, osl=1024, concurrency=64),
             FitPoint(isl=128, osl=2048, concurrency=128)]
    _, ident = _fit(_measured(blank))
    assert any("max-throughput sweep" in h for h in ident.hints)


def test_no_leaning_at_the_anchors_own_points_and_leaning_far_from_them() -> None:
    points = _measured([FitPoint(isl=256, osl=64, concurrency=c) for c in (32, 64, 128)])
    params, ident = _fit(points)
    seen = anchor_slopes(ident, params, COST, SCHED, points)
    for p in points:  # the points saw their own slopes: nothing beyond them
        assert leaning(seen, params, COST, SCHED, replace(p, ttft=None, tpot=None)) == {}
    far = leaning(seen, params, COST, SCHED, FitPoint(isl=16384, osl=2048, concurrency=2))
    assert far, "a 64x longer prompt leans on the prefill terms the short sweep left to priors"
    assert all(excess >= 0.1 for by in far.values() for excess in by.values())
    assert set().union(*far.values()) <= set(ident.prior_led())


def _anchor(points: list[BenchPoint]) -> Anchor:
    return Anchor(kernel_set=KernelSet(engine="vllm", engine_version="0.10.1", model=MODEL.name, gpu="H100",
                                       precision="bf16"),
                  layout=LayoutModel.from_layout(Layout(tp=1)), points=points,
                  provenance=Provenance(method="synthetic", source="tests/unit/test_identify.py",
                                        rows=[p.row_id for p in points]))


def test_anchors_check_reports_what_each_anchor_identifies(tmp_path: Path) -> None:
    one = _anchor([BenchPoint(isl=1024, osl=256, concurrency=16, ttft_ms=90.0, tpot_ms=8.0, row_id="a")])
    sweep = _anchor([BenchPoint(isl=1024, osl=256, concurrency=c, ttft_ms=60.0 + 3 * c, tpot_ms=7.0 + c / 16,
                                row_id=f"r{c}") for c in (1, 4, 16, 64)])
    (tmp_path / "one.json").write_text(one.model_dump_json())
    (tmp_path / "sweep.json").write_text(sweep.model_dump_json())
    cmd = [sys.executable, "-m", "inferasim.cli", "anchors", "check", "--dir", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "fitted from its points" in r.stdout and "left to priors" in r.stdout
    assert "hint: one: one measured point" in r.stdout
    j = subprocess.run([*cmd, "-o", "json"], capture_output=True, text=True, timeout=120)
    data = json.loads(j.stdout)
    by_name = {a["name"]: a for a in data["anchors"]}
    assert set(by_name) == {"one", "sweep"}
    sweep_params = by_name["sweep"]["identification"]["params"]
    assert sweep_params["t_fixed"]["source"] == "data"
    assert data["summary"].startswith("2 anchor files: 2 usable")
