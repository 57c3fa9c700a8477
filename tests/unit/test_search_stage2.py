"""Stage 2's pruned replays: fewer replays, the same recommendation and short list, every
short-listed candidate replayed, and the same candidates replayed whatever the worker count."""

from __future__ import annotations

from test_search import small_spec

from inferasim.core.spec import parse_spec
from inferasim.search.stage2 import can_skip, copy_estimate
from inferasim.search.tune import tune


def _spec():  # noqa: ANN202
    return parse_spec(small_spec(
        hardware={"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 4}, engines=["vllm", "sglang"],
        precision=["bf16", "fp8"],
        workload={"static": {"kind": "poisson", "requestRate": 2, "inputTokens": 512, "outputTokens": 64,
                             "numRequests": 100}}))


def test_can_skip_counts_distinct_shapes_strictly_above() -> None:
    finals = [((0, 1, 9.0), "a"), ((0, 1, 8.0), "a"), ((0, 1, 7.0), "b"), ((1, 0, 0.0), "c")]
    assert can_skip((0, 1, 6.0), finals, 3)  # a, b, c above
    assert not can_skip((0, 1, 7.0), finals, 3)  # b ties: not above
    assert not can_skip((0, 1, 6.0), finals, 4)  # three shapes only
    assert not can_skip((1, 1, 0.0), finals, 1)  # an anchored bound outranks every unanchored score


def test_pruned_stage2_keeps_the_answer_and_replays_it() -> None:
    spec = _spec()
    pruned, full = tune(spec, stage2_top=24, workers=1), tune(spec, stage2_top=24, workers=1, stage2_prune=False)
    assert full.timings["stage2_replays"] == 24
    assert pruned.timings["stage2_replays"] < 24  # replays were left out: the test can tell
    a, b = pruned.as_dict(), full.as_dict()
    assert a["recommendation"] == b["recommendation"]
    assert a["shortlist"] == b["shortlist"]
    assert all(e.stage == 2 for e in pruned.shortlist())
    # Left-out candidates keep their stage-1 estimate and stay off the short list.
    left = [e for e in pruned.ranked[:24] if e.stage == 1]
    assert left and not set(map(id, left)) & set(map(id, pruned.shortlist()))


def test_pruning_does_not_depend_on_the_worker_count() -> None:
    spec = _spec()
    one, two = tune(spec, stage2_top=24, workers=1), tune(spec, stage2_top=24, workers=2)
    a, b = one.as_dict(), two.as_dict()
    for d in (a, b):
        d.pop("timings_s")
    assert a == b
    assert one.timings["stage2_replays"] == two.timings["stage2_replays"]


def test_a_replay_stands_for_a_sibling_only_where_the_sibling_would_replay_the_same() -> None:
    """SGLang's KV pool does not depend on max_num_seqs: a replay whose peak stayed below a
    sibling's limit is the sibling's replay (checked against the sibling's own), one whose peak
    reached it is not."""
    from inferasim.search.stage2 import Replays, simulate_one
    from inferasim.search.stage2 import _summary_fields as fields

    spec = parse_spec(small_spec(
        engines=["sglang"], precision=["fp8"], hardware={"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 1},
        search={"maxNumSeqs": [8, 48, 256], "maxNumBatchedTokens": [8192], "chunkedPrefill": [True],
                "disaggregation": False},
        workload={"static": {"kind": "poisson", "requestRate": 6, "inputTokens": 512, "outputTokens": 128,
                             "numRequests": 200}}))
    r = tune(spec, stage2_top=0, workers=1)
    by = {e.candidate.max_num_seqs: e for e in r.ranked}
    replays = Replays(r.workload)
    d = replays.get(by[256])
    assert d is not None and replays.simulations == 1
    assert 8 <= d["limits"]["peak_running_per_rank"] < 48  # the test's premise: 8 binds, 48 does not
    own = fields(simulate_one(by[48], r.workload))
    assert replays.find(by[48]) is d
    assert {k: v for k, v in own.items() if k != "limits"} == {k: v for k, v in d.items() if k != "limits"}
    assert replays.find(by[8]) is None
    assert fields(simulate_one(by[8], r.workload))["ttft"] != d["ttft"]  # and it would have been wrong
    # Different replica counts never share.
    more = copy_estimate(by[48])
    more.replicas += 1
    assert replays.find(more) is None


def test_siblings_of_a_decided_shape_are_not_replayed_and_the_answer_holds() -> None:
    """Candidates that differ only in batching limits are one shape: once the first is final,
    those whose bound does not beat it are decided without a replay; recommendation and short
    list as with every replay, all of them replayed."""
    spec = _spec()
    pruned, full = tune(spec, stage2_top=24, workers=1), tune(spec, stage2_top=24, workers=1, stage2_prune=False)
    assert pruned.timings["stage2_simulations"] <= 6 < full.timings["stage2_simulations"]
    assert pruned.as_dict()["shortlist"] == full.as_dict()["shortlist"]
    shapes = [e.candidate.shape for e in pruned.ranked[:24]]
    assert len(set(shapes)) < len(shapes)  # the premise: siblings among the top


def test_every_short_listed_candidate_is_replayed_past_stage2s_top() -> None:
    spec = _spec()
    r = tune(spec, stage2_top=1, workers=1)
    assert len({e.candidate.shape for e in r.shortlist()}) == 5
    assert all(e.stage == 2 for e in r.shortlist())
    # No stage 2 asked for: nothing replayed.
    none = tune(spec, stage2_top=0, workers=1)
    assert none.timings["stage2_simulations"] == 0 and all(e.stage == 1 for e in none.ranked)


def test_attention_dp_ranks_in_lockstep_put_prefill_steps_in_the_itl_p90() -> None:
    """Ranks that meet at every MoE layer wait for the slowest: once some rank prefills more than a
    tenth of the time, the 90th percentile gap is a step carrying a prefill. One rank prefilling 5%
    of its time stays on the mean's ratio; eight such ranks do not; dp 1 never changes."""
    import numpy as np

    from inferasim.search.estimate import ITL_P90_RATIO, lockstep_itl_p90

    t_dec, t_pf = np.array([0.010, 0.010]), np.array([0.080, 0.080])
    tpot = t_dec / (1.0 - np.array([0.05, 0.0]))  # a rank prefills 5% of its time; none at all
    one = lockstep_itl_p90(tpot, t_dec, t_pf, 1)
    eight = lockstep_itl_p90(tpot, t_dec, t_pf, 8)
    assert np.allclose(one, tpot * ITL_P90_RATIO)
    assert eight[0] == 0.080 and eight[1] == tpot[1] * ITL_P90_RATIO


def test_the_bench_spec_replays_five_and_answers_as_every_replay_does() -> None:
    """make bench's MoE spec on 16 MI355X (vLLM fp8): with attention-dp layouts priced with their
    lockstep ITL tails in stage 1, the pruned search replays a handful and gives the recommendation
    and short list of replaying all of the top."""
    spec = parse_spec({
        "model": "Qwen/Qwen3-235B-A22B", "precision": ["fp8"],
        "hardware": {"gpu": "MI355X", "gpusPerNode": 8, "maxGPUs": 16}, "engines": ["vllm"],
        "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 2000, "itlP90Ms": 50}},
        "workload": {"static": {"kind": "multi-turn", "sessionsPerSecond": 2, "turns": 4, "thinkTimeS": 10,
                                "inputTokens": 2000, "userTokensPerTurn": 300, "outputTokens": 400,
                                "numRequests": 400}}})
    pruned, full = tune(spec, stage2_top=30, workers=1), tune(spec, stage2_top=30, workers=1, stage2_prune=False)
    assert pruned.timings["stage2_simulations"] <= 8 < full.timings["stage2_simulations"]
    assert pruned.as_dict()["recommendation"] == full.as_dict()["recommendation"]
    assert pruned.as_dict()["shortlist"] == full.as_dict()["shortlist"]
