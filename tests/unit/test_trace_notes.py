"""A trace whose times the reader changes says so: negative timestamps, records out of order."""

import json
from pathlib import Path

from inferasim.sim.workload import load_trace


def _mooncake(path: Path, stamps: list[int]) -> Path:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 100, "output_length": 10, "hash_ids": []})
                            + "\n" for t in stamps))
    return path


def test_negative_timestamps_are_shifted_and_said(tmp_path: Path) -> None:
    notes: list[str] = []
    reqs = load_trace(_mooncake(tmp_path / "t.jsonl", [-2000, -1000, 500]), notes=notes)
    assert [r.arrival for r in reqs] == [0.0, 1.0, 2.5]
    assert len(notes) == 1 and "2 record(s) have a negative timestamp (the first at -2.000 s)" in notes[0]


def test_records_out_of_order_are_sorted_and_said(tmp_path: Path) -> None:
    notes: list[str] = []
    reqs = load_trace(_mooncake(tmp_path / "t.jsonl", [0, 3000, 1000]), notes=notes)
    assert [r.arrival for r in reqs] == [0.0, 1.0, 3.0] and [r.rid for r in reqs] == [0, 1, 2]
    assert len(notes) == 1 and "not in time order" in notes[0]


def test_a_clean_trace_says_nothing(tmp_path: Path) -> None:
    notes: list[str] = []
    load_trace(_mooncake(tmp_path / "t.jsonl", [1000, 2000]), notes=notes)
    assert notes == []


def test_simulate_cli_warns(tmp_path: Path, capsys) -> None:
    from inferasim.cli.main import main

    trace = _mooncake(tmp_path / "t.jsonl", [-500, 0, 500, 1000])
    rc = main(["simulate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "vllm",
               "--trace", str(trace)])
    assert rc == 0
    assert "warning:" in capsys.readouterr().err
