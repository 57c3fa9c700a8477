"""The CLI as a user runs it: real subprocesses, exit codes, JSON shape, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferasim.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_models_show_json_has_params() -> None:
    r = run("models", "show", "meta-llama/Meta-Llama-3.1-70B", "--output", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["total_params"] == pytest.approx(70.6e9, rel=0.02)
    assert d["active_params"] > 0


def test_models_show_accepts_file_style_names_and_yaml() -> None:
    r = run("models", "show", "openai--gpt-oss-120b", "-o", "yaml")
    assert r.returncode == 0 and "total_params" in r.stdout


def test_models_list_and_gpus_table() -> None:
    r = run("models")
    assert r.returncode == 0 and "deepseek-ai/DeepSeek-V3" in r.stdout
    r = run("gpus", "-o", "json")
    names = {g["name"] for g in json.loads(r.stdout)}
    assert {"MI300X", "MI325X", "MI355X", "H100", "H200", "B200", "B300", "GB200", "GB300", "A100"} <= names


@pytest.mark.parametrize(("args", "needle"), [
    (("models", "show", "acme/Nope-1B"), "unknown model"),
    (("memory", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h20", "--tp", "1"), "MI355X"),
    (("memory", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "trtllm"), "vllm"),
    (("memory", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--tp", "0"), "--tp"),
    (("memory", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--tp", "4", "--ep", "3"), "moe_ep"),
])
def test_bad_input_exit_2_with_named_field(args: tuple[str, ...], needle: str) -> None:
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_memory_json_and_infeasible_reason() -> None:
    r = run("memory", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm", "--tp", "1",
            "--precision", "bf16", "-o", "json")
    d = json.loads(r.stdout)
    assert d["feasible"] is False and "H100" in d["reasons"][0]
    r = run("memory", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "AMD_Instinct_MI355X", "--tp", "8",
            "--engine", "sglang", "--context", "8192", "-o", "json")
    d = json.loads(r.stdout)
    assert d["feasible"] and d["max_concurrency_at_context"]["sequences"] > 100


@pytest.mark.parametrize(("config", "needle"), [
    ('{"hidden_size": "abc", "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4}', "hidden_size"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 0}',
     "num_attention_heads"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, '
     '"intermediate_size": 8, "quantization_config": "fp8"}', "quantization_config"),
    ("[1, 2]", "JSON object"),
    ("not json", "not valid JSON"),
])
def test_malformed_user_config_exit_2_naming_the_field(tmp_path, config: str, needle: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(config)
    for args in (("models", "show", str(path)), ("memory", "--model", str(path), "--gpu", "h100")):
        r = run(*args)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr


def test_python_dash_m_inferasim_is_the_cli() -> None:
    r = subprocess.run([sys.executable, "-m", "inferasim", "gpus", "-o", "json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "MI355X" in {g["name"] for g in json.loads(r.stdout)}
    r = subprocess.run([sys.executable, "-m", "inferasim", "memory", "--model", "x", "--gpu", "h100"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown model" in r.stderr
