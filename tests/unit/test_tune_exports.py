"""tune's CSV exports beside the plot, and the demo's written files and next commands (issue 27 items 2, 7)."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from inferasim.search.export import PARETO_COLUMNS, SHORTLIST_COLUMNS, csv_paths, pareto_csv, shortlist_csv

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama70b-mi355x.yaml"


def _cli() -> list[str]:
    exe = shutil.which("inferasim")
    return [exe] if exe else [sys.executable, "-m", "inferasim"]


def test_csvs_hold_what_the_json_holds() -> None:
    r = subprocess.run([*_cli(), "tune", str(EXAMPLE), "-o", "json"], capture_output=True, text=True, timeout=300)
    data = json.loads(r.stdout)
    front = list(csv.DictReader(pareto_csv(data).splitlines()))
    assert tuple(front[0].keys()) == PARETO_COLUMNS and len(front) == len(data["pareto"])
    assert float(front[0]["throughput_per_gpu"]) == float(f"{data['pareto'][0]['throughput_per_gpu']:.6g}")
    short = list(csv.DictReader(shortlist_csv(data).splitlines()))
    assert tuple(short[0].keys()) == SHORTLIST_COLUMNS and len(short) == len(data["shortlist"])
    for i, (row, entry) in enumerate(zip(short, data["shortlist"], strict=True), 1):
        assert int(row["rank"]) == i and row["shape"] == entry["shape"]
        # The 90% band as a factor: exp of the log half-width, always above 1.
        assert float(row["interval_factor_90"]) == float(f"{math.exp(entry['predicted']['interval_log']):.6g}") > 1


def test_csv_paths_sit_beside_the_plot() -> None:
    front, short = csv_paths("out/x/pareto.svg")
    assert front == Path("out/x/pareto.csv") and short == Path("out/x/pareto-shortlist.csv")


def test_demo_writes_its_files_and_prints_the_next_commands(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = subprocess.run([*_cli(), "demo", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (out / "deploy.yaml").read_text().startswith(("apiVersion", "#", "---"))
    assert (out / "pareto.csv").exists() and (out / "pareto-shortlist.csv").exists()
    assert "Next: harvest the missing anchors" in r.stdout
    assert "inferasim harvest run --endpoint http://ENGINE:8000 --model meta-llama/Meta-Llama-3.1-70B --gpu MI355X" \
        in r.stdout


def test_the_table_gives_bands_the_slo_the_notation_and_piped_progress() -> None:
    """Issue 27 item 2: the short list's and the recommendation's throughput carry their 90% band,
    the SLO is repeated beside what the recommendation gives, the layout notation is explained, and
    with stderr piped (not a terminal) each stage still says when it ends."""
    r = subprocess.run([*_cli(), "tune", str(EXAMPLE)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(subprocess.run([*_cli(), "tune", str(EXAMPLE), "-o", "json"], capture_output=True, text=True,
                                     timeout=300).stdout)
    rec = data["recommendation"]
    at, f = rec["predicted"]["throughput_per_gpu_at_slo"], math.exp(rec["predicted"]["interval_log"])
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("Recommendation"))
    assert f"(90%: {at / f:,.0f}-{at * f:,.0f})" in line
    first = next(ln for ln in r.stdout.splitlines() if ln.startswith("1 "))
    assert f"{at:.0f} [{at / f:.0f}-{at * f:.0f}]" in first
    slo = next(ln for ln in r.stdout.splitlines() if ln.startswith("SLO: "))
    assert "TTFT p90 <= 2000 ms" in slo and "ITL p90 <= 50 ms" in slo and "90% bands" in slo
    assert any(ln.startswith("layout: tpN = ") and "prefill workers" in ln for ln in r.stdout.splitlines())
    stages = [ln for ln in r.stderr.splitlines() if ln.startswith("stage ")]
    assert [ln.split(":")[0] for ln in stages] == ["stage 1", "stage 2"] and all(" done in " in ln for ln in stages)


def test_a_pd_recommendation_renders_its_router(tmp_path) -> None:
    # Issue 27 item 3: the manifest of a P/D recommendation holds the engine's router, so the line that
    # said it did not is gone.
    out = tmp_path / "deploy.yaml"
    r = subprocess.run([*_cli(), "tune", str(EXAMPLE), "--manifest", str(out)], capture_output=True, text=True,
                       timeout=300)
    rec = next(line for line in r.stdout.splitlines() if line.startswith("Recommendation"))
    assert "+D" in rec  # the bundled example's recommendation is a P/D shape (P2xtp1+D2xtp1)
    assert "not the P/D router" not in r.stdout and "router" not in rec
    names = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out.read_text())]
    assert ("Deployment", "llm-router") in names and ("Service", "llm") in names
