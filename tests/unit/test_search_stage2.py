"""Stage 2's pruned replays: fewer replays, the same recommendation and short list, every
short-listed candidate replayed, and the same candidates replayed whatever the worker count."""

from __future__ import annotations

from test_search import small_spec

from inferasim.core.spec import parse_spec
from inferasim.search.stage2 import can_skip
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
