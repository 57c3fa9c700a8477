"""Population priors (model.priors) and leave-one-kernel-set-out validation (validate --measurement-free)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.runs import load_rows
from inferasim.model.predictor import AnchoredPredictor
from inferasim.model.priors import LEARNED, SHRINK, PriorBook, member
from inferasim.model.steptime import default_params
from inferasim.validate import run_validation

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ARGONNE = DATA / "argonne-offline" / "vllm_offline_dev.csv"
H100, MI300X = get_gpu("h100_sxm"), get_gpu("mi300x")
LLAMA = get_model("meta-llama/Llama-2-7b-hf")


def _member(key: str, gpu=H100, scale: float = 2.0):
    base = default_params(gpu, "vllm", "0.6.1")
    params = dataclasses.replace(base, e_kv=min(base.e_kv * scale, 1.0), t_fixed=base.t_fixed * scale)
    return member((key,), "vllm", "0.6.1", LLAMA, gpu, "fp16", params)


def test_an_empty_population_is_the_default() -> None:
    prior = PriorBook([]).prior("vllm", "0.6.1", LLAMA, H100, "fp16")
    assert prior.params == default_params(H100, "vllm", "0.6.1")


def test_centres_shrink_toward_the_parent_by_group_size() -> None:
    # One member doubles t_fixed: every level of its group holds n = 1, so each shrinks the
    # parent's centre toward ln 2 by 1 / (1 + K), five times over (root, engine, vendor,
    # precision, dense/MoE).
    book = PriorBook([_member("a")])
    got = book.prior("vllm", "0.6.1", LLAMA, H100, "fp16").params.t_fixed
    w = 1.0 / (1.0 + SHRINK)
    centre = 0.0
    for _ in range(5):
        centre = w * math.log(2.0) + (1 - w) * centre
    assert got == pytest.approx(default_params(H100, "vllm", "0.6.1").t_fixed * math.exp(centre), rel=1e-9)
    # Twenty alike pull it nearly all the way; an AMD kernel set shares only the engine's levels.
    many = PriorBook([_member(str(i)) for i in range(20)])
    assert many.prior("vllm", "0.6.1", LLAMA, H100, "fp16").params.t_fixed == pytest.approx(
        2 * default_params(H100, "vllm", "0.6.1").t_fixed, rel=0.15)
    amd = (many.prior("vllm", "0.6.1", LLAMA, MI300X, "fp16").params.t_fixed
           / default_params(MI300X, "vllm", "0.6.1").t_fixed)
    assert 1.0 < amd < 2.0
    # Efficiencies never leave (0, 1] of peak, whatever the population says.
    assert all(0 < getattr(many.prior("vllm", "0.6.1", LLAMA, H100, "fp16").params, n) <= 1
               for n in LEARNED if n.startswith("e_"))


def test_without_leaves_that_kernel_set_out() -> None:
    book = PriorBook([_member("a", scale=4.0), _member("b", scale=1.0)])
    assert len(book.without(("a",))) == 1
    alone = book.without(("a",)).prior("vllm", "0.6.1", LLAMA, H100, "fp16").params
    assert alone.t_fixed == pytest.approx(default_params(H100, "vllm", "0.6.1").t_fixed)


@pytest.mark.skipif(not ARGONNE.exists(), reason="shared/data not present")
def test_leave_one_out_never_reads_the_kernel_sets_own_rows() -> None:
    """Scaling every measurement of one kernel set by 10 changes nothing of its own predictions:
    each kernel set is priced from the others alone."""
    rows = load_rows(ARGONNE)
    target = next(r.kernel_key for r in rows
                  if r.model_path.endswith("Llama-2-7b-hf") and r.system.lower().startswith("h100"))

    def scaled(r):
        if r.kernel_key != target:
            return r
        return dataclasses.replace(r, batch_latency_s=r.batch_latency_s * 10 if r.batch_latency_s else None,
                                   throughput_tok_s=r.throughput_tok_s / 10 if r.throughput_tok_s else None)

    def own(res):
        return {r.row.id: r.predicted for r in res.results if r.row.kernel_key == target and r.status == "ok"}

    a = run_validation(rows, AnchoredPredictor(), measurement_free=True)
    b = run_validation([scaled(r) for r in rows], AnchoredPredictor(), measurement_free=True)
    assert own(a) and own(a) == own(b)
    # Every filtered row is a target (no anchor rows set aside), priced from the population.
    assert a.summary["anchor_share"] == 0.0
    assert {r.anchor for r in a.results if r.status == "ok"} == {"population"}
    # And the population is better than nothing: offline throughput within 25% median.
    thr = sorted(abs(r.predicted["throughput_per_gpu"] / r.measured["throughput_per_gpu"] - 1)
                 for r in a.results if r.status == "ok" and r.measured.get("throughput_per_gpu"))
    assert thr[len(thr) // 2] < 0.25
