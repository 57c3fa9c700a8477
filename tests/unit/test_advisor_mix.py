"""Batching advisor and mix planner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.predictor import unanchored
from inferasim.search.advisor import advise_batch
from inferasim.search.mix import MixSpec, plan_mix

REPO = Path(__file__).resolve().parents[2]


def fitted(tp: int = 4):  # noqa: ANN201
    return unanchored("vllm", get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H100"), "fp8", Layout(tp=tp),
                      kv_dtype="fp8")


def test_tighter_latency_target_means_smaller_batch_limit() -> None:
    f = fitted()
    loose = advise_batch(f, 1024, 512, 60.0)
    tight = advise_batch(f, 1024, 512, 20.0)
    assert tight.max_num_seqs < loose.max_num_seqs
    assert tight.tpot_ms * 1.25 <= 20.0 and loose.tpot_ms * 1.25 <= 60.0
    # The saturating limit never exceeds the latency-bound limit, and keeps >= 95% throughput.
    assert loose.saturating_batch <= loose.max_num_seqs
    assert loose.throughput_at_saturating >= 0.95 * loose.throughput
    assert 0 <= loose.kv_gb_returnable <= loose.kv_gb_pool
    assert 0 < loose.memory_fraction <= 0.9


def test_bigger_loss_allowance_returns_more_memory() -> None:
    f = fitted()
    strict = advise_batch(f, 1024, 512, 60.0, max_loss=0.0)
    relaxed = advise_batch(f, 1024, 512, 60.0, max_loss=0.2)
    assert relaxed.saturating_batch <= strict.saturating_batch
    assert relaxed.kv_gb_returnable >= strict.kv_gb_returnable


def test_impossible_target_is_an_error_with_the_reason() -> None:
    with pytest.raises(ValueError, match="even one sequence"):
        advise_batch(fitted(tp=1), 1024, 512, 1.0)


def test_mix_plan_fits_the_budget_and_prefers_the_first_model() -> None:
    spec = MixSpec.model_validate({
        "hardware": {"gpu": "h100_sxm", "maxGPUs": 8}, "engines": ["vllm"], "precision": ["fp8"],
        "tiers": [
            {"name": "chat", "models": ["meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-8B"],
             "requestRate": 2, "slo": {"ttftP90Ms": 1000, "itlP90Ms": 40}},
            {"name": "bulk", "models": ["meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-8B"],
             "requestRate": 6, "inputTokens": 4096, "outputTokens": 512, "slo": {"ttftP90Ms": 20000, "itlP90Ms": 150}},
        ]})
    plan = plan_mix(spec)
    assert plan.gpus <= 8 and not plan.unserved
    options = {(o.tier, o.model): o.gpus for o in plan.options}
    by_tier = {a.tier: a for a in plan.assignments}
    # Whatever it picked, no assignment that serves both tiers with more preferred models fits the budget.
    big = "meta-llama/Meta-Llama-3.1-70B"
    both_big = options[("chat", big)], options[("bulk", big)]
    if None not in both_big and sum(both_big) <= 8:
        assert by_tier["chat"].model == big and by_tier["bulk"].model == big
    assert sum(a.gpus for a in plan.assignments) == plan.gpus


def test_cli_advise_and_mix() -> None:
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "advise", "--model", "meta-llama/Llama-3.1-70B",
                        "--gpu", "h100_sxm", "--engine", "vllm", "--precision", "fp8", "--tp", "4", "--isl", "1024",
                        "--osl", "512", "--itl-p90-ms", "30", "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert '"max_num_seqs"' in r.stdout and '"anchored": true' in r.stdout
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "mix", str(REPO / "examples" / "mix-h100.yaml")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Mix plan" in r.stdout
    # What each tier gets, as predicted, and why a tier runs a model it ranked lower.
    for column in ("choice", "prec", "TTFT p90 ms", "ITL p90 ms", "SLO"):
        assert column in r.stdout
    assert "batch: choice 1 meta-llama/Meta-Llama-3.1-70B passed over:" in r.stdout


def test_cli_mix_exits_1_when_a_tier_goes_unserved(tmp_path: Path) -> None:
    """A pipeline must see that a tier was not planned, as tune's exit 1 says nothing met the SLO."""
    text = (REPO / "examples" / "mix-h100.yaml").read_text().replace("requestRate: 4", "requestRate: 400")
    spec = tmp_path / "mix.yaml"
    spec.write_text(text)
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "mix", str(spec)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "unserved tiers: interactive" in r.stderr
    assert "Mix plan" in r.stdout  # the plan of the served tiers is still printed
    assert "unserved tier interactive: " in r.stdout and "no deployment meets the SLO within" in r.stdout


def test_cli_mix_says_a_precision_the_checkpoints_cannot_run_at(tmp_path: Path) -> None:
    """bf16 checkpoints asked for at fp4: the reason is the precision, not the SLO or the budget."""
    import re

    text = re.sub(r"precision: \[.*\]", "precision: [fp4]", (REPO / "examples" / "mix-h100.yaml").read_text())
    spec = tmp_path / "mix.yaml"
    spec.write_text(text)
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "mix", str(spec)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "at bf16, not fp4" in r.stdout and "choose precision bf16" in r.stdout
