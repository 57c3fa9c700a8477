"""predict, tune and simulate price a kernel set without an anchor from the store's population."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.measurement_free import measurement_free, population_of
from inferasim.model.predictor import unanchored

REPO = Path(__file__).resolve().parents[2]


def test_population_of_the_shipped_store_learns_and_measures_itself() -> None:
    pop = population_of(AnchorStore(REPO / "anchors"))
    # Every engine anchor with points joins; PyTorch step anchors (harness kernels) do not.
    assert len(pop) >= 90
    assert all(m.points for m in pop.fitted.values())
    err = pop.loo_error()
    # Leave-one-out on the anchors' own points: a population is informative, not exact.
    assert 0.02 < err["tpot"] < 0.5 and 0.02 < err["ttft"] < 1.0


def test_an_empty_store_gives_the_gpu_family_defaults(tmp_path: Path) -> None:
    model, gpu = get_model("meta-llama/Llama-3.1-70B"), get_gpu("mi355x")
    got = measurement_free(AnchorStore(tmp_path), "vllm", model, gpu, "fp8", Layout(tp=8))
    assert got == unanchored("vllm", model, gpu, "fp8", Layout(tp=8))


def test_population_predictions_are_flagged_and_banded_by_the_population() -> None:
    model, gpu = get_model("meta-llama/Llama-3.1-70B"), get_gpu("mi355x")
    got = measurement_free(AnchorStore(REPO / "anchors"), "vllm", model, gpu, "fp8", Layout(tp=8))
    assert got.anchor_id == "unanchored" and got.population_spread
    assert "population prior" in got.carries(Layout(tp=8), 1024, 256)[0]
    # The band is the population's 90th-percentile leave-one-out error, TTFT wider than TPOT.
    assert 0.05 < got.spread(True, Layout(tp=8), 1024, 256, "tpot") < got.spread(True, Layout(tp=8), 1024, 256, "ttft")


def test_predict_cli_says_measurement_free_from_the_population() -> None:
    exe = shutil.which("inferasim")
    cmd = [exe] if exe else [sys.executable, "-m", "inferasim"]
    r = subprocess.run([*cmd, "predict", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "MI355X", "--engine", "vllm",
                        "--precision", "fp8", "--tp", "8", "--isl", "1024", "--osl", "256", "--concurrency", "16",
                        "-o", "json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "population" in r.stderr and "Traceback" not in r.stderr
    out = json.loads(r.stdout)
    lo, hi = out["interval"]["tpot_ms"]
    assert lo < out["tpot_ms"] < hi
