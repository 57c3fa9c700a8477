"""Search: spec validation, pruning with reasons, Pareto front, and the true best on a small space."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.core.spec import SLO, SearchSpace, SpecError, parse_spec
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.layoutcost import layout_cost
from inferasim.model.predictor import unanchored
from inferasim.model.steady import closed_loop, engine_sched
from inferasim.search.estimate import CONC_GRID, Estimate, estimate_group, operate
from inferasim.search.space import Candidate, build_space
from inferasim.search.tune import tune
from inferasim.search.workload import WorkloadShape
from inferasim.sim.des import simulate_closed_loop

REPO = Path(__file__).resolve().parents[2]


def small_spec(**over: object) -> dict:
    spec = {
        "model": "meta-llama/Meta-Llama-3.1-8B",
        "precision": ["bf16"],
        "hardware": {"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 2},
        "engines": ["vllm"],
        "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 1500, "itlP90Ms": 40}},
        "workload": {"static": {"kind": "poisson", "requestRate": 4, "inputTokens": 1024, "outputTokens": 256}},
        "search": {"maxNumSeqs": [32, 256], "maxNumBatchedTokens": [2048, 8192], "chunkedPrefill": [True],
                   "disaggregation": False},
    }
    spec.update(over)
    return spec


def test_spec_errors_name_the_field() -> None:
    with pytest.raises(SpecError, match="requestRate"):
        parse_spec(small_spec(workload={"static": {"kind": "poisson"}}))
    with pytest.raises(SpecError, match="engines"):
        parse_spec(small_spec(engines=["trtllm"]))
    with pytest.raises(SpecError, match="hardware"):
        parse_spec({k: v for k, v in small_spec().items() if k != "hardware"})
    # A whole ServingTuning manifest is accepted: its spec is used.
    assert parse_spec({"apiVersion": "inferasim.io/v1alpha1", "kind": "ServingTuning",
                       "spec": small_spec()}).hardware.max_gpus == 2


def test_pruned_candidates_keep_their_reason() -> None:
    model, gpu = get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H100")
    space = build_space(model, gpu, ["vllm", "atom"], ["bf16"], 8, 8, SearchSpace())
    reasons = dict(space.pruned)
    assert any("ATOM" in r for r in reasons.values())
    tp1 = [why for what, why in space.pruned if what == "vllm bf16 tp1"]
    assert tp1 and "H100" in tp1[0] and "GB" in tp1[0]
    assert all(c.layout.gpus <= 8 for c in space.candidates)
    assert space.candidates, "tp4 / tp8 fit"


def test_pareto_front_is_non_dominated() -> None:
    result = tune(parse_spec(small_spec()), stage2_top=0)
    front = result.pareto
    assert len(front) >= 3
    for a in front:
        for b in front:
            assert not (b.tokens_per_user > a.tokens_per_user and b.throughput_per_gpu > a.throughput_per_gpu)
    users = [p.tokens_per_user for p in front]
    assert users == sorted(users, reverse=True)


def _brute_force_value(cand, slo_ttft_ms: float, slo_itl_ms: float) -> float:  # noqa: ANN001
    """Per-GPU output tokens/s at the SLO by discrete-event simulation of a concurrency sweep."""
    model, gpu = get_model("meta-llama/Meta-Llama-3.1-8B"), get_gpu("H100")
    fitted = unanchored("vllm", model, gpu, "bf16", cand.layout)
    cost = layout_cost(model, gpu, cand.layout, "bf16", fitted.kv_dtype)
    sched = engine_sched("vllm", model, gpu, cand.layout, "bf16", "", fitted.kv_dtype,
                         max_num_seqs=cand.max_num_seqs, max_batched_tokens=cand.max_batched_tokens)
    params = replace(fitted.params, burst=0.0)
    best = 0.0
    for conc in (4, 8, 16, 32, 64, 128, 256):
        res = simulate_closed_loop(params, cost, sched, 1024, 256, conc, num_requests=4 * conc + 100, seed=3,
                                   range_ratio=0.3)
        d = res.as_dict()
        if d["ttft_p90_s"] * 1e3 <= slo_ttft_ms and d["tpot_p90_s"] * 1e3 <= slo_itl_ms:
            best = max(best, res.throughput / cand.layout.gpus)
    return best


def test_search_finds_the_true_best_on_a_small_space() -> None:
    spec = parse_spec(small_spec())
    result = tune(spec, stage2_top=0)
    assert len(result.space.candidates) == 12  # tp1, tp2, pp2 x 2 x 2
    values = {c: _brute_force_value(c, 1500, 40) for c in result.space.candidates}
    truth = max(values.values())
    assert truth > 0
    picked = result.recommendation.candidate
    assert values[picked] >= 0.85 * truth, (picked.label(), values[picked], truth)


def test_tune_cli_json_shape(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    import yaml

    spec_file.write_text(yaml.safe_dump(small_spec()))
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "tune", str(spec_file), "-o", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["recommendation"]["engine"] == "vllm"
    assert len(d["shortlist"]) == 5 and d["pareto"]
    assert d["recommendation"]["mode"].startswith("unanchored")  # no H100 bf16 vLLM anchor for Llama-8B
    assert "no measurement" in d["recommendation"]["carries"][0]
    assert d["missing_anchors"] and d["missing_anchors"][0]["harvest_gpu_hours"] > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(small_spec(workload={"static": {"kind": "poisson"}})))
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "tune", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "requestRate" in r.stderr and "Traceback" not in r.stderr


def test_anchored_candidates_rank_with_their_anchor() -> None:
    spec = parse_spec(small_spec(model="meta-llama/Meta-Llama-3.1-70B", precision=["fp8"],
                                 hardware={"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8}))
    result = tune(spec, stage2_top=5)
    rec = result.recommendation
    assert rec.anchored and "tp" in result.anchors_used["vllm/fp8"] or result.anchors_used
    assert np.isfinite(rec.per_gpu_at_slo(256))


def test_tune_entries_hold_a_request_rate_against_the_anchor_sweep_by_requests_in_flight() -> None:
    """A request-rate workload has no client count: each entry is held against its anchor's
    concurrency sweep by the requests in flight per replica at the operating point, and
    `carries` says so whenever that widens its band."""
    def entries(rate: float) -> list:
        spec = parse_spec(small_spec(
            model="meta-llama/Meta-Llama-3.1-70B", precision=["fp8"],
            hardware={"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
            workload={"static": {"kind": "poisson", "requestRate": rate, "inputTokens": 1024,
                                 "outputTokens": 1024}}))
        result = tune(spec, stage2_top=5)
        return [(e, result.entry(e)) for e in result.ranked[:8] if e.anchored]

    seen_outside = seen_inside = False
    for rate in (0.05, 2.0, 500.0):  # 500 req/s: beyond every candidate's capacity
        for e, d in entries(rate):
            assert np.isfinite(e.conc)
            lo, hi = e.fitted.conc_range
            conc = max(round(e.conc), 1)
            outside = not lo <= conc <= hi
            assert any(c.startswith(f"concurrency {conc} outside") for c in d["carries"]) == outside, d["carries"]
            seen_outside |= outside
            seen_inside |= not outside
    assert seen_outside and seen_inside


def test_tune_renders_the_recommended_manifest(tmp_path: Path) -> None:
    import yaml

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(small_spec()))
    out = tmp_path / "deploy.yaml"
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "tune", str(spec_file), "--manifest", str(out),
                        "--name", "chat", "-o", "json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(out.read_text()))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget"]
    rec = json.loads(r.stdout)["recommendation"]
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == rec["gpus_per_replica"]
    assert str(rec["max_num_seqs"]) in container["args"]


def test_tune_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import yaml

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(small_spec()))
    png = tmp_path / "pareto.png"
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "tune", str(spec_file), "--plot", str(png)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("price", [None, 2.5])
def test_tune_plot_adds_a_cost_panel_with_a_price(tmp_path: Path, price: float | None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from inferasim.cli.tune import plot_pareto

    hw = {"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 2}
    if price is not None:
        hw["pricePerGpuHour"] = price
    result = tune(parse_spec(small_spec(hardware=hw)), workers=1, stage2_top=2)
    figs = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figs.append(fig), close(fig)))
    png = tmp_path / "pareto.png"
    plot_pareto(result, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = figs[0].axes
    assert len(axes) == (1 if price is None else 2)
    # The SLO's ITL (40 ms) drawn as the interactivity it asks for, inside axes scaled to the front.
    for ax in axes:
        slo = [ln for ln in ax.get_lines() if ln.get_label() == "SLO: ITL p90 40 ms"]
        assert slo and slo[0].get_xdata()[0] == pytest.approx(25.0)
        assert ax.get_xlim()[1] >= max(25.0, *(p.tokens_per_user for p in result.pareto))
    front_max = max(p.throughput_per_gpu for p in result.pareto)
    assert front_max <= axes[0].get_ylim()[1] <= 1.2 * max(front_max, result.recommendation.per_gpu_at_slo(
        result.workload.osl))
    if price is not None:
        cost = axes[1]
        assert cost.get_ylabel() == "$ per million output tokens"
        assert any(line.get_label() == "recommendation (at the SLO)" for line in cost.get_lines())


def test_tune_prefers_a_measured_anchor_over_live_ones_with_more_points(tmp_path: Path) -> None:
    """A passive or canary anchor (live traffic) never silently replaces a harvested one in the
    search, however many points it has; alone, it is used."""
    from inferasim.model.anchor_store import AnchorStore
    from inferasim.model.anchors import BenchPoint, load_anchor
    from inferasim.search.tune import _anchor_for

    src = next((Path(__file__).resolve().parents[2] / "anchors").glob("vllm-*.json"))
    measured = load_anchor(src)
    ks = measured.kernel_set
    model, gpu = get_model(ks.model), get_gpu(ks.gpu)
    from inferasim.catalog.precision import normalize_precision

    precision = normalize_precision(ks.precision or "auto")
    many = [BenchPoint(isl=100 + i, osl=50, concurrency=1 + i, tpot_ms=10.0 + i, row_id=f"w{i}")
            for i in range(len(measured.points) + 5)]
    live = {m: measured.model_copy(deep=True, update={"points": many}) for m in ("passive", "canary")}
    for m, a in live.items():
        a.provenance = a.provenance.model_copy(update={"method": m})
    store = AnchorStore(tmp_path)
    store.save(live["passive"])
    store.save(live["canary"])
    assert _anchor_for(store, ks.engine, model, gpu, precision).provenance.method in ("passive", "canary")
    store.save(measured)
    assert len(store) == 3
    got = _anchor_for(store, ks.engine, model, gpu, precision)
    assert got.provenance.method == measured.provenance.method and len(got.points) == len(measured.points)


def test_stage2_in_workers_or_in_process_gives_the_same_result() -> None:
    """Stage 2 refines copies in both paths, so the Pareto front (stage 1 over the whole space),
    the ranking and the refined figures do not depend on how many processes ran it."""
    spec = parse_spec(small_spec(workload={"static": {
        "kind": "multi-turn", "sessionsPerSecond": 1.0, "turns": 3, "thinkTimeS": 5, "inputTokens": 800,
        "userTokensPerTurn": 100, "outputTokens": 128, "numRequests": 150}}))
    one, two = tune(spec, stage2_top=6, workers=1), tune(spec, stage2_top=6, workers=2)
    assert sum(e.stage == 2 for e in one.ranked) == 6
    a, b = one.as_dict(), two.as_dict()
    for d in (a, b):
        d.pop("timings_s")
    assert a == b


def test_objective_shorthands() -> None:
    spec = parse_spec(small_spec(objective="min-cost"))
    assert spec.objective.minimize == "costPerMillionTokens" and spec.objective.maximize is None
    assert parse_spec(small_spec(objective="max-goodput")).objective.maximize == "goodput"
    with pytest.raises(SpecError, match="objective.*min-cost"):
        parse_spec(small_spec(objective="cheapest"))


def test_sglang_dp_attention_candidates_price_the_per_rank_chunk() -> None:
    """SGLang divides --chunked-prefill-size by dp_size under DP attention: a candidate rendered with
    a 16384-token chunk at dp 4 prefills 4096 tokens per rank, and the search must price that."""
    model, gpu = get_model("deepseek-ai/DeepSeek-V3"), get_gpu("B200")
    layout = Layout(tp=8, pp=1, dp=4, moe_tp=1, moe_ep=8)
    fitted = unanchored("sglang", model, gpu, "fp8", layout)
    w = WorkloadShape(isl=8192, osl=512, hit=0.0, rate=None, concurrency=64, kind="closed")
    cand = Candidate(engine="sglang", precision="fp8", layout=layout, max_num_seqs=256, max_batched_tokens=16384)
    est = estimate_group(fitted, [cand], w)[0]
    base = engine_sched("sglang", model, gpu, layout, "fp8", "", fitted.kv_dtype)
    cost = layout_cost(model, gpu, layout, "fp8", fitted.kv_dtype)
    params = replace(fitted.params, burst=0.0)
    conc = np.array([64.0])

    def ttft(per_rank_chunk: int) -> float:
        sched = replace(base, max_num_seqs=256, max_batched_tokens=per_rank_chunk,
                        max_prefill_tokens=max(base.max_prefill_tokens, 16384))
        return float(closed_loop(params, cost, sched, np.array([8192.0]), np.array([512.0]), conc).ttft[0])

    at64 = int(np.flatnonzero(CONC_GRID == 64)[0])
    assert est.curve_ttft[at64] == pytest.approx(ttft(16384 // 4), rel=1e-9)
    # and a chunk priced undivided would have given another TTFT
    assert abs(ttft(16384) - ttft(16384 // 4)) > 1e-3 * ttft(16384 // 4)


def test_an_explicit_sglang_chunk_flag_is_divided_like_the_default() -> None:
    """engine_sched reads a --chunked-prefill-size given by hand as SGLang does its default: per
    attention-DP rank; --max-prefill-tokens is not divided. vLLM keeps its budget per rank as given."""
    model, gpu = get_model("deepseek-ai/DeepSeek-V3"), get_gpu("B200")
    dp4 = Layout(tp=8, pp=1, dp=4, moe_tp=1, moe_ep=8)
    default = engine_sched("sglang", model, gpu, dp4, "fp8")
    given = engine_sched("sglang", model, gpu, dp4, "fp8", max_batched_tokens=16384)
    assert given.max_batched_tokens == 16384 // 4 == default.max_batched_tokens  # B200 default chunk 16384
    assert given.max_prefill_tokens == 16384
    assert engine_sched("sglang", model, gpu, dp4, "fp8", max_batched_tokens=32768).max_prefill_tokens == 32768
    tp8 = Layout(tp=8, pp=1, dp=1, moe_tp=1, moe_ep=8)
    assert engine_sched("sglang", model, gpu, tp8, "fp8", max_batched_tokens=16384).max_batched_tokens == 16384
    minimax = get_model("MiniMaxAI/MiniMax-M2.5")
    vdp2 = Layout(tp=2, pp=1, dp=2, moe_tp=1, moe_ep=4)
    assert engine_sched("vllm", minimax, gpu, vdp2, "fp8", max_batched_tokens=8192).max_batched_tokens == 8192


def test_a_disaggregated_recommendation_renders_both_pools() -> None:
    from inferasim.render import ANNOTATION_PD_ROUTER, LABEL_ROLE
    from inferasim.search.deploy import config_of, pool_configs, render_pools

    spec = parse_spec(small_spec(search={"maxNumSeqs": [64], "maxNumBatchedTokens": [8192],
                                         "chunkedPrefill": [True], "disaggregation": True},
                                 hardware={"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 4}))
    result = tune(spec, stage2_top=0)
    e = next(e for e in result.ranked if e.candidate.disagg is not None)
    d = e.candidate.disagg
    assert d is not None
    # One Deployment for a P/D candidate would serve the whole load on the decode pool's GPUs.
    with pytest.raises(ValueError, match="disaggregated"):
        config_of(result, e)
    pools = dict(pool_configs(result, e))
    assert pools["-prefill"].layout == d.prefill and pools["-decode"].layout == d.decode
    assert pools["-prefill"].replicas == d.prefill_workers * e.replicas
    assert pools["-decode"].replicas == d.decode_workers * e.replicas
    docs = render_pools(result, e, "chat")
    # The engine's P/D router in front of both pools (Service chat, which clients use), then the pools.
    assert [(m["kind"], m["metadata"]["name"]) for m in docs] == [
        ("ServiceAccount", "chat-router"), ("Role", "chat-router"), ("RoleBinding", "chat-router"),
        ("Deployment", "chat-router"), ("Service", "chat"),
        ("Deployment", "chat-prefill"), ("Service", "chat-prefill"), ("Deployment", "chat-decode"),
        ("Service", "chat-decode"), ("PodDisruptionBudget", "chat-router"), ("PodDisruptionBudget", "chat-prefill"),
        ("PodDisruptionBudget", "chat-decode")]
    gpus = 0
    for dep, role in ((docs[5], "prefill"), (docs[7], "decode")):
        assert dep["metadata"]["labels"][LABEL_ROLE] == role
        assert ANNOTATION_PD_ROUTER in dep["metadata"]["annotations"]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert "--kv-transfer-config" in container["args"]  # vLLM's KV transfer between the pools
        gpus += int(container["resources"]["limits"]["nvidia.com/gpu"]) * dep["spec"]["replicas"]
    assert gpus == e.gpus  # every GPU the estimate priced, and no more


def test_a_precision_the_checkpoint_cannot_run_is_pruned_with_the_fix() -> None:
    model, gpu = get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("MI355X")
    space = build_space(model, gpu, ["vllm", "atom"], ["fp8"], 8, 8, SearchSpace(),
                        model_id="meta-llama/Llama-3.1-70B-Instruct")
    # vLLM quantises the BF16 checkpoint to FP8 at load; ATOM cannot, and says where FP8 weights are.
    assert {c.engine for c in space.candidates} == {"vllm"}
    (what, why), = space.excluded
    assert what == "atom fp8" and "nvidia/Llama-3.1-70B-Instruct-FP8" in why and "bf16" in why
    assert (what, why) in space.pruned
    # Named as another org's FP8 checkpoint, the same model runs on ATOM as it is.
    fp8_id = build_space(model, gpu, ["vllm", "atom"], ["fp8"], 8, 8, SearchSpace(),
                         model_id="RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8")
    assert not fp8_id.excluded and {c.engine for c in fp8_id.candidates} == {"vllm", "atom"}
    # A config.json path is judged by its own quantization_config: DeepSeek-R1's FP8 is not fp4.
    path = str(REPO.parent / "shared" / "data" / "model-configs" / "deepseek-ai--DeepSeek-R1_config.json")
    r1 = build_space(get_model(path), get_gpu("B200"), ["vllm"], ["fp4"], 8, 8, SearchSpace(), model_id=path)
    assert not r1.candidates and "not fp4" in r1.excluded[0][1]


@pytest.mark.parametrize(("over", "field"), [
    ({"hardware": {"gpu": "H900", "gpusPerNode": 8, "maxGPUs": 2}}, "hardware.gpu"),
    ({"model": "foo/bar"}, "model"),
    ({"precision": ["fp9"]}, "precision"),
])
def test_spec_names_the_field_of_an_unknown_name(over: dict, field: str) -> None:
    with pytest.raises(SpecError, match=rf"^{field}: "):
        parse_spec(small_spec(**over))


def test_a_missing_anchor_is_harvested_at_the_plainest_smallest_layout() -> None:
    # 70B bf16 needs two H100: tp2, not pp2 (which keeps half the KV and adds pipeline bubbles).
    spec = parse_spec(small_spec(model="meta-llama/Meta-Llama-3.1-70B",
                                 hardware={"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 4}))
    result = tune(spec, store=AnchorStore(), stage2_top=0)
    (missing,) = result.missing_anchors
    assert Layout(**missing["harvest_layout"]) == Layout(tp=2)


def test_stage2_gives_a_candidate_that_misses_the_slo_in_simulation_more_replicas() -> None:
    """Stage 1 sizes replicas on mean-based percentiles; where the simulation then finds the ITL
    p90 over the SLO, the candidate is simulated again with more replicas within the budget
    (a 3-GPU budget was once reported as meeting no SLO while three tp1 replicas met it), and its
    SLO capacity is capped below the rate each replica failed at."""
    spec = parse_spec(small_spec(
        model="meta-llama/Llama-3.1-70B", precision=["fp8"], engines=["sglang"],
        hardware={"gpu": "MI355X", "gpusPerNode": 8, "maxGPUs": 3},
        objective={"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 2000, "itlP90Ms": 50}},
        workload={"static": {"kind": "poisson", "inputTokens": 1024, "outputTokens": 256, "requestRate": 12,
                             "numRequests": 300}},
        search={"disaggregation": False, "pipelineParallel": False}))
    result = tune(spec, store=AnchorStore())
    rec = result.recommendation
    assert rec is not None and rec.meets_slo and rec.stage == 2, [e.notes for e in result.ranked[:3]]
    assert rec.itl_p90 * 1e3 <= 50 and rec.ttft_p90 * 1e3 <= 2000 and rec.gpus <= 3
    for e in result.ranked[:10]:
        if e.stage == 2 and not e.meets_slo and not e.notes:
            assert e.max_rate_slo <= 12 / e.replicas + 1e-9
        if e.meets_slo:  # serving the workload within the SLO is a capacity of at least its rate
            assert e.max_rate_slo * e.replicas >= 12 - 1e-9 and e.per_gpu_at_slo(256) > 0, e.notes


def test_an_slo_nothing_meets_ranks_the_closest_first_and_prints_no_infinity(tmp_path: Path) -> None:
    spec = small_spec(objective={"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 1, "itlP90Ms": 40}},
                      hardware={"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 2, "pricePerGpuHour": 2.5})
    result = tune(parse_spec(spec), store=AnchorStore())
    from inferasim.search.tune import slo_excess

    assert not any(e.meets_slo for e in result.ranked)
    slo = result.spec.objective.slo
    excess = [slo_excess(e, slo) for e in result.ranked if e.anchored == result.ranked[0].anchored]
    assert excess[0] == min(excess)
    assert not any("needs" in n for e in result.ranked for n in e.notes)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "tune", str(path), "--anchors", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "inf" not in r.stdout.split("Short list")[1].split("\n\n")[0]
    assert "misses TTFT p90" in r.stdout


def test_an_anchor_recorded_without_a_precision_is_the_checkpoints_own() -> None:
    """A data row that names no precision is the checkpoint's own (Qwen3-32B: bf16), and bf16 and
    fp16 run the same 16-bit GEMMs: such anchors serve a bf16 request instead of the defaults."""
    from inferasim.search.tune import _anchor_for, _weights

    qwen = ("Qwen/Qwen3-32B", get_model("Qwen/Qwen3-32B"))
    assert _weights("", *qwen) == _weights("bf16", *qwen) == _weights("fp16", *qwen) == "16-bit"
    assert _weights("fp8", *qwen) == "fp8" and _weights("mxfp4", *qwen) == _weights("nvfp4", *qwen) == "fp4"
    store = AnchorStore(REPO / "anchors")
    a = _anchor_for(store, "vllm", get_model("Qwen/Qwen3-32B"), get_gpu("H100"), "bf16")
    assert a is not None and a.kernel_set.precision in ("", "bf16", "fp16")


def test_a_replay_slower_than_the_estimate_lowers_the_slo_capacity_never_raises_it() -> None:
    """Stage 1 reads the SLO capacity off its closed-form curves. When the replay at the workload's
    own rate shows p90s k times the estimate's, the curves are scaled by k before the capacity is
    read again (the capacity was 3-8x the replay's for gpt-oss-120b at dp8 on H100); a faster
    replay leaves the capacity alone, and a replay that met the SLO keeps at least its own rate."""
    from inferasim.search.stage2 import copy_estimate as _copy
    from inferasim.search.tune import _recalibrate_capacity

    model, gpu = get_model("meta-llama/Llama-3.1-70B"), get_gpu("H100")
    layout = Layout(tp=4)
    fitted = unanchored("vllm", model, gpu, "fp8", layout)
    w = WorkloadShape(isl=1024, osl=256, hit=0.0, rate=2.0, concurrency=None, kind="poisson")
    slo = SLO(ttft_p90_ms=2000, itl_p90_ms=60)
    cand = Candidate(engine="vllm", precision="fp8", layout=layout, max_num_seqs=256, max_batched_tokens=2048)
    before = operate(estimate_group(fitted, [cand], w)[0], w, slo, max_gpus=8)
    assert before.max_rate_slo > 2.0

    def replayed(k: float) -> Estimate:
        e = _copy(before)
        e.stage, e.ttft_p90, e.itl_p90 = 2, before.ttft_p90, before.itl_p90 * k
        _recalibrate_capacity(before, e, w, slo)
        return e

    same, faster, slower = replayed(1.0), replayed(0.5), replayed(2.0)
    assert same.max_rate_slo == faster.max_rate_slo == before.max_rate_slo
    assert 2.0 / slower.replicas <= slower.max_rate_slo < before.max_rate_slo
    assert "SLO capacity" in slower.notes[-1]


def test_stage2_replays_multi_turn_sessions_with_the_routing_stage1_assumes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 1 prices each replica with the sessions' whole prefix reuse: stage 2 replays a
    multi-turn workload on several replicas with session-affine (prefix) routing, which keeps it,
    not round-robin, which split the sessions and read as a slower replay; one replica, or requests
    without sessions, stay round-robin."""
    import inferasim.sim.api as api
    from inferasim.core.spec import StaticWorkload
    from inferasim.search.stage2 import simulate_one as _simulate_one
    from inferasim.search.workload import shape_of

    seen: list[str] = []

    def fake(*args: object, router: str = "rr", **kwargs: object) -> object:
        seen.append(router)
        raise RuntimeError("stop")

    monkeypatch.setattr(api, "simulate_workload", fake)
    model, gpu = get_model("meta-llama/Llama-3.1-8B"), get_gpu("H100")
    fitted = unanchored("vllm", model, gpu, "bf16", Layout(tp=1))
    multi = shape_of(StaticWorkload(kind="multi-turn", sessions_per_second=1.0, turns=4, user_tokens_per_turn=100))
    poisson = shape_of(StaticWorkload(kind="poisson", request_rate=2.0))
    cand = Candidate(engine="vllm", precision="bf16", layout=Layout(tp=1), max_num_seqs=64, max_batched_tokens=2048)
    for w, replicas in ((multi, 2), (multi, 1), (poisson, 2)):
        e = operate(estimate_group(fitted, [cand], w)[0], w, SLO(), max_gpus=8)
        e.replicas = replicas
        with pytest.raises(RuntimeError):
            _simulate_one(e, w)
    assert seen == ["prefix", "rr", "rr"]


def test_stage2_replays_a_disaggregated_candidate_whose_pools_share_a_layout() -> None:
    """The simulator's prefill and decode pools share one layout: such a candidate is replayed in
    stage 2 (its closed-form TTFT was 4-5x the replay's), one with two layouts keeps its estimate."""
    from inferasim.search.space import Disagg
    from inferasim.search.stage2 import simulate_one as _simulate_one

    model, gpu = get_model("meta-llama/Llama-3.1-70B"), get_gpu("H100")
    fitted = unanchored("vllm", model, gpu, "fp8", Layout(tp=2))
    w = WorkloadShape(isl=2048, osl=256, hit=0.0, rate=4.0, concurrency=None, kind="poisson")
    from inferasim.core.spec import StaticWorkload

    w = replace(w, source=StaticWorkload(kind="poisson", request_rate=4.0, input_tokens=2048, output_tokens=256,
                                         num_requests=200))
    from inferasim.search.estimate import estimate_disagg

    for d, replayed in ((Disagg(2, Layout(tp=2), 1, Layout(tp=2)), True), (Disagg(1, Layout(tp=4), 1, Layout(tp=2)),
                                                                           False)):
        cand = Candidate(engine="vllm", precision="fp8", layout=d.decode, max_num_seqs=64, max_batched_tokens=8192,
                         disagg=d)
        e = operate(estimate_disagg(fitted, cand, w), w, SLO(), max_gpus=16)
        out = _simulate_one(e, w)
        assert (out is not None) == replayed
        if out is not None:
            assert out["completed"] + out["dropped"] == out["requests"] == 200 and out["ttft"]["p90"] > 0


def test_disaggregated_estimates_carry_no_benchmark_wave() -> None:
    """tune's workloads are not lock-stepped benchmarks: the disaggregated estimate, like the
    colocated one, is the same whatever wave share the anchor fitted."""
    from dataclasses import replace as dc_replace

    from inferasim.search.estimate import estimate_disagg
    from inferasim.search.space import Disagg

    model, gpu = get_model("meta-llama/Llama-3.1-70B"), get_gpu("H100")
    base = unanchored("vllm", model, gpu, "fp8", Layout(tp=2))
    w = WorkloadShape(isl=2048, osl=512, hit=0.0, rate=8.0, concurrency=None, kind="poisson")
    d = Disagg(3, Layout(tp=2), 1, Layout(tp=2))
    cand = Candidate(engine="vllm", precision="fp8", layout=d.decode, max_num_seqs=64, max_batched_tokens=16384,
                     disagg=d)
    out = []
    for burst in (0.0, 0.9):
        fitted = dc_replace(base, fit=dc_replace(base.fit, params=dc_replace(base.params, burst=burst)))
        out.append(estimate_disagg(fitted, cand, w).curve_ttft)
    np.testing.assert_allclose(out[0], out[1], rtol=1e-12)


def test_a_replay_within_the_slo_at_the_whole_rate_outweighs_stage1s_capacity_notes() -> None:
    """Stage 1 said the replicas cannot serve the rate ("needs N replicas"); the replay served it
    within the SLO dropping nothing: the note goes and the capacity is at least that rate. A replay
    over the SLO, or one that dropped requests, keeps stage 1's verdict."""
    from inferasim.search.stage2 import copy_estimate as _copy
    from inferasim.search.tune import _trust_the_replay

    model, gpu = get_model("meta-llama/Llama-3.1-70B"), get_gpu("H100")
    fitted = unanchored("vllm", model, gpu, "fp8", Layout(tp=4))
    w = WorkloadShape(isl=1024, osl=256, hit=0.0, rate=6.0, concurrency=None, kind="poisson")
    slo = SLO(ttft_p90_ms=2000, itl_p90_ms=60)
    cand = Candidate(engine="vllm", precision="fp8", layout=Layout(tp=4), max_num_seqs=256, max_batched_tokens=2048)
    base = operate(estimate_group(fitted, [cand], w)[0], w, slo, max_gpus=8)

    def replayed(itl_ms: float, dropped: bool = False) -> Estimate:
        e = _copy(base)
        e.stage, e.replicas, e.max_rate_slo = 2, 1, 2.0
        e.notes = ["needs 3 replicas for 6.00 req/s; the budget allows 1"] + (["5 of 200 requests dropped"] if dropped
                                                                              else [])
        e.ttft_p90, e.itl_p90 = 0.5, itl_ms / 1e3
        _trust_the_replay(e, w, slo)
        return e

    ok = replayed(40.0)
    assert ok.max_rate_slo == 6.0 and not any("needs" in n for n in ok.notes) and "replay served" in ok.notes[-1]
    for e in (replayed(80.0), replayed(40.0, dropped=True)):
        assert e.max_rate_slo == 2.0 and any("needs" in n for n in e.notes)


def test_a_disaggregated_pool_serves_no_more_requests_than_its_prefill_workers_prefill() -> None:
    """Past the prefill pool's throughput requests queue for prefill: the estimate's rate stops there
    (a P1+D4 pool read 62 req/s where its one prefill GPU holds about 20) and TTFT takes the queue."""
    from inferasim.model.steady import engine_sched
    from inferasim.model.steptime import step_time
    from inferasim.search.estimate import estimate_disagg
    from inferasim.search.space import Disagg

    model, gpu = get_model("meta-llama/Llama-3.1-70B"), get_gpu("MI355X")
    fitted = unanchored("vllm", model, gpu, "fp8", Layout(tp=1))
    p = replace(fitted.params, burst=0.0)
    w = WorkloadShape(isl=3050, osl=400, hit=0.76, rate=8.0, concurrency=None, kind="poisson")
    new = int(w.isl * (1 - w.hit))
    for prefill_workers in (1, 2):
        d = Disagg(prefill_workers, Layout(tp=1), 4, Layout(tp=1))
        cand = Candidate(engine="vllm", precision="fp8", layout=d.decode, max_num_seqs=64, max_batched_tokens=16384,
                         disagg=d)
        est = estimate_disagg(fitted, cand, w)
        cost = layout_cost(model, gpu, Layout(tp=1), "fp8", fitted.kv_dtype, "vllm")
        sched = engine_sched("vllm", model, gpu, Layout(tp=1), "fp8", "", fitted.kv_dtype)
        chunk = float(max(min(sched.max_batched_tokens, 16384), 1024))
        tokens_per_s = chunk / float(step_time(p, cost, 0.0, 0.0, chunk, new / 2.0))
        assert est.curve_rate.max() <= prefill_workers * tokens_per_s / new * (1 + 1e-9)
        assert np.all(np.diff(est.curve_ttft) >= -1e-9)  # the queue lands in TTFT as clients grow


def test_what_tune_recommends_beyond_a_node_renders_and_starts() -> None:
    """Issue 27 item 5: Kimi-K2 does not fit one 8 x H100 node. The space keeps multi-node layouts
    only where render writes them and the engine starts them (whole nodes, an engine with a
    multi-node launch, vLLM without dp across nodes), and the recommendation renders: as a
    LeaderWorkerSet when it spans nodes."""
    from inferasim.core.engine_args import multinode_problem
    from inferasim.search.deploy import manifests_for

    model, gpu = get_model("moonshotai/Kimi-K2-Instruct"), get_gpu("H100")
    space = build_space(model, gpu, ["vllm", "sglang", "atom"], ["fp8"], 16, 8, SearchSpace())
    wide = [c for c in space.candidates if c.layout.gpus > 8]
    assert wide, "multi-node layouts are searched"
    assert all(multinode_problem(c.engine, c.layout, 8) is None for c in wide)
    assert any("vLLM data parallel across nodes" in why for _, why in space.pruned)
    spec = parse_spec({"model": "moonshotai/Kimi-K2-Instruct", "hardware": {"gpu": "H100", "maxGPUs": 16},
                       "engines": ["vllm", "sglang"], "workload": {"static": {"kind": "poisson", "requestRate": 2,
                                                                              "inputTokens": 2048,
                                                                              "outputTokens": 256}},
                       "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 5000, "itlP90Ms": 100}}})
    result = tune(spec, stage2_top=4)
    assert result.recommendation is not None and result.recommendation.candidate.layout.gpus > 8
    kinds = [line for line in manifests_for(result).splitlines() if line.startswith("kind: ")]
    assert kinds[0] == "kind: LeaderWorkerSet" and "kind: Service" in kinds
