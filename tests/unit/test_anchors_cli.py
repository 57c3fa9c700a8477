"""`inferasim anchors list | show | check` as a user runs them: subprocesses, exit codes, messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.core.layout import Layout
from inferasim.model.anchors import Anchor, BenchPoint, FitReport, KernelSet, LayoutModel, Provenance
from inferasim.model.steptime import default_params

GOOD = "good.json"


def make_anchor() -> Anchor:
    """A usable anchor of its own (the shipped files are rebuilt from time to time)."""
    return Anchor(
        kernel_set=KernelSet(engine="vllm", engine_version="0.10.1", model="meta-llama/Meta-Llama-3-8B", gpu="H100",
                             precision="bf16"),
        layout=LayoutModel.from_layout(Layout(tp=1)),
        points=[BenchPoint(isl=512, osl=128, concurrency=c, ttft_ms=40.0 + c, tpot_ms=7.0 + c / 16, row_id=f"r{c}")
                for c in (1, 8, 32)],
        params=default_params(get_gpu("H100"), "vllm").as_dict(),
        fit=FitReport(n_points=3, rms_log_error=0.05, max_abs_log_error=0.08, per_metric={"tpot": 0.04},
                      converged=True),
        provenance=Provenance(method="synthetic", source="tests/unit/test_anchors_cli.py", rows=["r1", "r8", "r32"]),
    )


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferasim.cli", "anchors", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "anchors"
    d.mkdir()
    (d / GOOD).write_text(make_anchor().model_dump_json(indent=2))
    return d


def _variant(src: Path, dst: Path, edit: dict[str, dict[str, object]]) -> Path:
    data = json.loads(src.read_text())
    for section, fields in edit.items():
        data[section].update(fields)
    dst.write_text(json.dumps(data))
    return dst


def test_list_shows_the_ids_that_show_takes(folder: Path) -> None:
    r = run("list", "--dir", str(folder))
    assert r.returncode == 0, r.stderr
    header, _rule, row = r.stdout.splitlines()[:3]
    assert header.split()[0] == "id"
    anchor_id = row.split()[0]
    r = run("list", "--dir", str(folder), "-o", "json")
    assert [a["id"] for a in json.loads(r.stdout)] == [anchor_id]
    fname = json.loads(r.stdout)[0]["file"]
    assert fname == make_anchor().filename()
    # By id, by id prefix, by the anchor's file name with or without .json, by path.
    for name in (anchor_id, anchor_id[:6], fname, fname.removesuffix(".json"), str(folder / GOOD)):
        r = run("show", name, "--dir", str(folder), "-o", "json")
        assert r.returncode == 0, (name, r.stderr)
        assert json.loads(r.stdout)["provenance"]["method"] == "synthetic"
    r = run("show", "no-such-anchor", "--dir", str(folder))
    assert r.returncode == 2 and "anchors list" in r.stderr and "Traceback" not in r.stderr


def test_check_a_folder_a_file_and_bad_paths(folder: Path, tmp_path: Path) -> None:
    r = run("check", "--dir", str(folder))
    assert r.returncode == 0, r.stderr
    assert "1 anchor files: 1 usable, 0 invalid, 0 unusable" in r.stdout
    r = run("check", str(folder / GOOD))
    assert r.returncode == 0 and "1 usable" in r.stdout, r.stderr
    # A name inside --dir, with or without .json.
    for name in (Path(GOOD).name, Path(GOOD).stem):
        r = run("check", name, "--dir", str(folder))
        assert r.returncode == 0 and "1 usable" in r.stdout, (name, r.stderr)
    # A named file is checked, not the default folder.
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    r = run("check", str(bad))
    assert r.returncode == 1 and "1 anchor files: 0 usable, 1 invalid" in r.stdout
    assert f"invalid: {bad}: not valid JSON" in r.stderr and "Traceback" not in r.stderr
    # Schema: the field is named.
    schema = _variant(folder / GOOD, tmp_path / "schema.json", {"layout": {"tp": "x"}})
    r = run("check", str(schema))
    assert r.returncode == 1 and "field layout.tp" in r.stderr
    # Compatibility: a model this version's catalog does not know.
    unknown = _variant(folder / GOOD, tmp_path / "unknown.json", {"kernel_set": {"model": "acme/Nope-1B"}})
    r = run("check", str(unknown))
    assert r.returncode == 1 and "unusable" in r.stderr and "acme/Nope-1B" in r.stderr
    assert "1 anchor files: 0 usable, 0 invalid, 1 unusable" in r.stdout  # one file, counted once
    # A layout the engine refuses was never measured: unusable, by name.
    tp3 = _variant(folder / GOOD, tmp_path / "tp3.json", {"layout": {"tp": 3}})
    r = run("check", str(tp3))
    assert r.returncode == 1 and "does not divide" in r.stderr
    for args in (("check", str(tmp_path / "missing.json")), ("check", "--dir", str(tmp_path / "nope")),
                 ("list", "--dir", str(tmp_path / "nope"))):
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert "missing.json" in r.stderr or "--dir" in r.stderr, r.stderr


def test_check_reports_a_poor_fit_without_failing(folder: Path) -> None:
    _variant(folder / GOOD, folder / "poor.json", {"fit": {"rms_log_error": 0.9}, "kernel_set": {"precision": "fp8"}})
    r = run("check", "--dir", str(folder))
    assert r.returncode == 0, r.stderr
    assert "2 anchor files: 2 usable, 0 invalid, 0 unusable; 1 with a poor fit" in r.stdout
    assert "poor fit:" in r.stderr and "0.900" in r.stderr


DEV_FILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"


@pytest.mark.skipif(not DEV_FILE.exists(), reason="development data not present")
def test_build_writes_where_asked_and_never_replaces_a_different_fit_unasked(tmp_path: Path) -> None:
    lines = DEV_FILE.read_text(encoding="utf-8").splitlines()
    kept = [ln for ln in lines[1:] if ",vllm," in ln and "Qwen3-32B" in ln and "h100_sxm" in ln][:40]
    assert kept
    data = tmp_path / "runs.csv"
    data.write_text("\n".join([lines[0], *kept]) + "\n", encoding="utf-8")
    shipped = Path(__file__).resolve().parents[2] / "anchors"
    before = {p.name: p.stat().st_mtime_ns for p in shipped.glob("*.json")}
    out = tmp_path / "built"
    r = run("build", str(data), "--out", str(out))
    assert r.returncode == 0, r.stderr
    files = sorted(out.glob("*.json"))
    assert files and f"wrote {len(files)} anchors to {out}" in r.stdout
    assert {p.name: p.stat().st_mtime_ns for p in shipped.glob("*.json")} == before  # anchors/ untouched
    # The same data again: every fit unchanged, nothing rewritten.
    stamps = {p: p.stat().st_mtime_ns for p in files}
    r = run("build", str(data), "--out", str(out))
    assert r.returncode == 0 and f"{len(files)} unchanged" in r.stdout
    assert {p: p.stat().st_mtime_ns for p in files} == stamps
    # Other measurements of the same kernel sets fit differently: refused unless --replace.
    header = lines[0].split(",")
    col = header.index("silicon_tpot_ms")
    slower = [",".join(f"{float(v) * 1.5}" if i == col else v for i, v in enumerate(ln.split(","))) for ln in kept]
    data.write_text("\n".join([lines[0], *slower]) + "\n", encoding="utf-8")
    r = run("build", str(data), "--out", str(out))
    assert r.returncode == 2 and "--replace" in r.stderr and "Traceback" not in r.stderr
    assert {p: p.stat().st_mtime_ns for p in files} == stamps
    r = run("build", str(data), "--out", str(out), "--replace")
    assert r.returncode == 0 and "replaced" in r.stdout
    # A flag of another action is refused, not ignored (nor taken as an abbreviation of --output).
    r = run("list", "--out", str(out))
    assert r.returncode == 2 and "unrecognized arguments: --out" in r.stderr
    r = run("build", str(data), "--threshold", "0.1", "--out", str(out))
    assert r.returncode == 2 and "--threshold" in r.stderr
    # --dir names the destination as well, a new folder included
    r = run("build", str(data), "--dir", str(tmp_path / "new"))
    assert r.returncode == 0 and sorted(p.name for p in (tmp_path / "new").glob("*.json")) == [p.name for p in files]
    r = run("fit-live", "--dir", str(out), "--prometheus", "http://127.0.0.1:1")
    assert r.returncode == 2 and "unrecognized arguments: --dir" in r.stderr
    # build reports for programs too
    r = run("build", str(data), "--out", str(out), "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["unchanged"] == sorted(p.name for p in files)


def test_build_from_rows_that_make_no_anchor_fails_and_says_why(tmp_path: Path) -> None:
    dev = Path(__file__).resolve().parents[3] / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
    lines = dev.read_text().splitlines()
    header = lines[0]
    trt = next(line for line in lines[1:] if ",trtllm," in line)
    csv = tmp_path / "only_trtllm.csv"
    csv.write_text(header + "\n" + trt + "\n")
    r = run("build", str(csv), "--out", str(tmp_path / "out"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "not used: 1 of 1 rows" in r.stderr and "no anchor built" in r.stderr


def test_check_of_a_folder_without_anchors_fails(tmp_path: Path) -> None:
    r = run("check", str(tmp_path))
    assert r.returncode == 1 and "no anchor JSON file found" in r.stderr
