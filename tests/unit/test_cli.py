"""The CLI as a user runs it: real subprocesses, exit codes, JSON shape, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferasim.core.layout import Layout

REPO = Path(__file__).resolve().parents[2]
PREDICT = ("predict", "--model", "meta-llama/Llama-3.1-70B", "--engine", "vllm", "--precision", "fp8", "--gpu",
           "h100_sxm", "--tp", "2", "--isl", "1024", "--osl", "1024")


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
    (("memory", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--memory-fraction", "1.5"),
     "--memory-fraction must be within (0, 1]"),
    (PREDICT + ("--request-rate", "-1"), "--request-rate must be a positive number"),
    (PREDICT + ("--request-rate", "nan"), "--request-rate must be a positive number"),
    (PREDICT + ("--concurrency", "8", "--isl", "200000"), "prompt = 200000 tokens exceeds"),
    (PREDICT + ("--concurrency", "8", "--anchors", "/no/such/folder"), "--anchors '/no/such/folder' is not a folder"),
    (PREDICT + ("--concurrency", "8", "--anchor", "anchors/sglang-zhipuai--glm-5-b200_sxm-fp8-tp8-22605d.json"),
     "is for engine sglang, not --engine vllm"),
    (("advise", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--tp", "2", "--isl", "1024", "--osl",
      "128", "--itl-p90-ms", "40", "--max-loss", "1"), "--max-loss must be within [0, 1)"),
    # observe checks its flags before asking Prometheus (port 1: nothing listens there)
    (("observe", "--prometheus", "notaurl"), "--prometheus 'notaurl' is not an http(s) URL"),
    (("observe", "--prometheus", "http://127.0.0.1:1", "--window", "5x"), "--window: '5x' is not a Prometheus"),
    (("observe", "--prometheus", "http://127.0.0.1:1", "--window", "0m"), "--window '0m' must be longer than 0"),
    (("observe", "--prometheus", "http://127.0.0.1:1", "--engine", "trt"), "invalid choice: 'trt'"),
    (("mix", "/no/such/plan.yaml"), "mix plan: /no/such/plan.yaml does not exist"),
    (("tune", "/"), "spec file: / is a folder"),
    (("simulate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "vllm", "--workload", "/"),
     "--workload: / is a folder"),
    # A layout the engine would not start is refused by every command, not only predict.
    (("advise", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "vllm", "--tp", "3", "--isl",
      "1024", "--osl", "128", "--itl-p90-ms", "40"), "tp=3 does not divide the 32 attention heads"),
    (("advise", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--engine", "vllm", "--isl", "1024",
      "--osl", "128", "--itl-p90-ms", "300", "--precision", "bf16"), "weights need"),
    (("simulate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "vllm", "--tp", "3", "--trace",
      "../shared/data/traces/conversation_trace.jsonl"), "tp=3 does not divide"),
    (("harvest", "run", "--endpoint", "http://127.0.0.1:1", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100",
      "--engine", "vllm", "--tp", "3", "--out", "-"), "tp=3 does not divide"),
    (("advise", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "vllm", "--isl", "1024",
      "--osl", "128", "--itl-p90-ms", "40", "--anchor", "anchors/sglang-zhipuai--glm-5-b200_sxm-fp8-tp8-22605d.json"),
     "is for engine sglang, not --engine vllm"),
    (("anchors", "drift", "--prometheus", "prom:9090", "--deployment", "d.yaml"), "--prometheus 'prom:9090' is not"),
    (("models", "list", "foo"), "models list takes no name"),
    (("predict", "--model", "meta-llama/Llama-3.1-70B", "--engine", "atom", "--gpu", "h100", "--tp", "2", "--isl",
      "1024", "--osl", "128", "--concurrency", "4"), "ATOM runs on AMD Instinct GPUs only (ROCm); H100 is not one"),
    (PREDICT + ("--concurrency", "8", "--ep", "2"), "moe_ep=2 on a dense model"),
    # An unknown precision is refused by the argument parser, before any anchor note.
    (("predict", "--model", "meta-llama/Llama-3.1-8B", "--engine", "vllm", "--gpu", "h100", "--precision", "fp9",
      "--isl", "64", "--osl", "8", "--concurrency", "1"), "argument --precision: unknown precision 'fp9'"),
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


def test_predict_beyond_capacity_reports_capacity_not_the_offered_load() -> None:
    """A request rate the deployment cannot serve: the queue grows, so TTFT has no steady value and
    the output rate is what the replica serves, not the rate asked for (was: 25,600 tok/s offered
    reported as throughput, 15x the closed-loop figure)."""
    r = run(*PREDICT, "--request-rate", "50", "-o", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["stable"] is False and d["ttft_ms"] is None and "queue grows" in r.stderr
    capacity = d["capacity_request_rate"]
    assert 0 < capacity < 50 and d["throughput_tok_s"] == pytest.approx(capacity * 1024, rel=1e-3)
    busy = json.loads(run(*PREDICT, "--concurrency", "64", "-o", "json").stdout)
    assert d["throughput_tok_s"] < 3 * busy["throughput_tok_s"]


def test_predict_splits_clients_over_replicas_as_they_go() -> None:
    """One client keeps one replica busy, not four; three over two replicas are priced as one
    replica of two and one of one (integer division once priced them as two of one)."""
    def tput(conc: int, replicas: int) -> float:
        r = run(*PREDICT, "--concurrency", str(conc), "--replicas", str(replicas), "-o", "json")
        assert r.returncode == 0, r.stderr
        return float(json.loads(r.stdout)["throughput_tok_s"])

    one = tput(1, 1)
    assert tput(1, 4) == pytest.approx(one, rel=1e-9)
    assert tput(3, 2) == pytest.approx(tput(2, 1) + one, rel=1e-9)


def test_anchor_folder_with_an_unreadable_file_is_named(tmp_path) -> None:
    (tmp_path / "broken.json").write_text("{")
    r = run(*PREDICT, "--concurrency", "8", "--anchors", str(tmp_path))
    assert r.returncode == 0 and "skipped an unreadable anchor file" in r.stderr and "broken.json" in r.stderr


def test_validate_refuses_bad_outputs_and_values_before_scoring(tmp_path) -> None:
    from pathlib import Path

    data = Path(__file__).resolve().parents[3] / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
    if not data.exists():
        pytest.skip("shared data not present")
    afile = tmp_path / "afile"
    afile.write_text("")
    r = run("validate", str(data), "--out", str(afile))
    assert r.returncode == 2 and "--out" in r.stderr and "is a file" in r.stderr and "Traceback" not in r.stderr
    lines = data.read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    (tmp_path / "head.csv").write_text(lines[0] + "\n")
    r = run("validate", str(tmp_path / "head.csv"), "--out", str(tmp_path / "o1"))
    assert r.returncode == 1 and "no row was scored" in r.stderr
    pool_tp = header.index("prefill_tp_size")
    disagg = next(i for i, ln in enumerate(lines) if ",disagg," in ln and ln.split(",")[pool_tp]
                  and ln.split(",")[header.index("backend")] in ("vllm", "sglang"))
    # A cell it cannot read is listed, not fatal: the rest of the file is still scored. A row that
    # cannot be placed without it is left out (and counted unpredicted), a measurement is dropped.
    for col, value, says, at, kept in (("silicon_tpot_ms", "0", "a positive number", 1, True),
                                       ("silicon_ttft_ms", "N/A", "a positive number", 1, True),
                                       ("tp_size", "0", "a positive integer", 1, False),
                                       ("isl", "1k", "a positive integer", 1, False),
                                       ("prefill_tp_size", "0", "a positive integer", disagg, False)):
        row = lines[at].split(",")
        row[header.index(col)] = value
        (tmp_path / "bad.csv").write_text(lines[0] + "\n" + ",".join(row) + "\n" + "\n".join(lines[2:40]) + "\n")
        r = run("validate", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "o2"))
        assert r.returncode in (0, 1) and "could not be read" in r.stderr and "Traceback" not in r.stderr, r.stderr
        summary = json.loads((tmp_path / "o2" / "summary.json").read_text())
        (entry,) = summary["unreadable"]
        assert entry["column"] == col and entry["value"] == value and says in entry["reason"]
        assert entry["row"] == ("scored without this value" if kept else "left out")
        lost = [u for u in summary["unpredicted"]["rows"] if u["reason"].startswith("unreadable")]
        assert len(lost) == (0 if kept else 1) and summary["counts"]["rows"] == 39, col


def test_tune_checks_outputs_first_and_fails_when_nothing_meets_the_slo(tmp_path) -> None:
    import yaml

    spec = {"model": "meta-llama/Meta-Llama-3.1-8B", "precision": ["bf16"],
            "hardware": {"gpu": "H100", "gpusPerNode": 8, "maxGPUs": 2}, "engines": ["vllm"],
            "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 1500, "itlP90Ms": 0.001}},
            "workload": {"static": {"kind": "poisson", "requestRate": 4, "inputTokens": 1024, "outputTokens": 256}}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = run("tune", str(path), "--plot", str(tmp_path / "missing" / "p.png"))
    assert r.returncode == 2 and "--plot" in r.stderr and "does not exist" in r.stderr
    r = run("tune", str(path))
    assert r.returncode == 1 and "no deployment meets the SLO" in r.stderr
    assert "No deployment within 2 GPUs meets the SLO. Closest:" in r.stdout
    # Each short-listed row that misses says which term: the ITL of 0.001 ms here.
    assert "#1 misses the SLO: no request rate meets the SLO on one replica (ITL p90" in r.stdout
    assert "against 0.001 ms" in r.stdout
    assert "checked: sim = replayed" in r.stdout
    # A rate the 2-GPU budget cannot serve within a loose SLO: the rows say it is the budget.
    spec["objective"]["slo"] = {"ttftP90Ms": 5000, "itlP90Ms": 200}
    spec["workload"]["static"]["requestRate"] = 400
    path.write_text(yaml.safe_dump(spec))
    r = run("tune", str(path))
    assert "misses the SLO:" in r.stdout and ("the budget allows" in r.stdout or "exceeds its capacity" in r.stdout)
    spec["workload"]["static"]["inputTokens"] = 10_000_000
    path.write_text(yaml.safe_dump(spec))
    r = run("tune", str(path))
    assert r.returncode == 2 and "workload.static" in r.stderr and "context" in r.stderr


def test_specs_that_are_not_what_they_claim_are_refused(tmp_path) -> None:
    import yaml

    dep = tmp_path / "dep.yaml"
    dep.write_text(yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}))
    r = run("tune", str(dep))
    assert r.returncode == 2 and "kind 'Deployment' is not a ServingTuning" in r.stderr
    plan = yaml.safe_load((REPO / "examples" / "mix-h100.yaml").read_text())
    plan["tiers"].append(dict(plan["tiers"][0]))
    twice = tmp_path / "mix.yaml"
    twice.write_text(yaml.safe_dump(plan))
    r = run("mix", str(twice))
    assert r.returncode == 2 and "each name once" in r.stderr and plan["tiers"][0]["name"] in r.stderr
    r = run("tune", str(REPO / "examples" / "llama70b-mi355x.yaml"), "--propose-model", "m")
    assert r.returncode == 2 and "--propose-endpoint" in r.stderr


def test_tune_names_a_measurement_free_candidate_that_meets_the_slo_the_anchored_one_misses(tmp_path) -> None:
    """Anchored candidates rank first; when the best of them misses the SLO and a measurement-free
    one meets it, tune says so (and exits 1: the recommendation misses), not "none meets it"."""
    import yaml

    shipped = next((REPO / "anchors").glob("vllm-meta-llama--llama-3.1-70b-h100_sxm-fp8-tp2-*.json"))
    slow = json.loads(shipped.read_text())
    slow["params"]["t_fixed"] = 0.06  # a host cost no 40 ms ITL survives
    (tmp_path / "anchors").mkdir()
    (tmp_path / "anchors" / shipped.name).write_text(json.dumps(slow))
    spec = {"model": "meta-llama/Meta-Llama-3.1-70B", "precision": ["fp8"],
            "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8}, "engines": ["vllm", "sglang"],
            "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 3000, "itlP90Ms": 40}},
            "workload": {"static": {"kind": "poisson", "requestRate": 4, "inputTokens": 1024, "outputTokens": 256}},
            "search": {"disaggregation": False}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = run("tune", str(path), "--anchors", str(tmp_path / "anchors"))
    assert r.returncode == 1
    assert "No anchored deployment meets the SLO (a measurement-free sglang" in r.stdout
    assert "only measurement-free candidates are predicted to meet it" in r.stderr


def test_prompt_plus_output_beyond_the_context_is_noted_not_refused() -> None:
    """The public offline data runs 2048 + 2048 tokens on 2048-context models: such a request is
    predicted, with a note; only a prompt beyond the context is refused."""
    r = run("predict", "--engine", "vllm", "--engine-version", "0.6.1", "--precision", "fp16", "--model",
            "facebook/opt-6.7b", "--gpu", "gh200", "--isl", "2048", "--osl", "2048", "--concurrency", "1")
    assert r.returncode == 0, r.stderr
    assert "prompt + output = 4096 tokens exceeds facebook/opt-6.7b's context of 2048" in r.stderr


def test_tune_table_shows_a_proposer_that_could_not_be_reached() -> None:
    r = run("tune", str(REPO / "examples" / "llama70b-mi355x.yaml"), "--propose-endpoint", "http://127.0.0.1:1")
    assert "proposal rejected" in r.stdout and "endpoint failed" in r.stdout


def test_an_anchor_of_an_unknown_gpu_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    src = REPO / "anchors" / "sglang-zhipuai--glm-5-b200_sxm-fp8-tp8-22605d.json"
    data = json.loads(src.read_text())
    data["kernel_set"]["gpu"] = "h900"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = run("predict", "--model", "zai-org/GLM-5", "--gpu", "b200", "--engine", "sglang", "--tp", "8",
            "--precision", "fp8", "--isl", "1024", "--osl", "128", "--concurrency", "8", "--anchor", str(bad))
    assert r.returncode == 2 and "Unknown GPU 'h900'" in r.stderr and "Traceback" not in r.stderr


def test_tune_prints_its_result_when_an_output_file_cannot_be_written(tmp_path: Path) -> None:
    import yaml

    spec = yaml.safe_load((REPO / "examples" / "llama70b-mi355x.yaml").read_text())
    spec["engines"] = ["vllm"]
    spec["search"] = {"maxNumSeqs": [128], "maxNumBatchedTokens": [2048], "disaggregation": False}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = run("tune", str(path), "--manifest", "/dev/full", "-o", "json")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["recommendation"]  # the search's result is not lost
    assert "--manifest /dev/full: cannot write" in r.stderr


def test_predict_without_a_version_uses_the_anchor_tune_uses() -> None:
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import get_model
    from inferasim.model.anchor_store import AnchorStore
    from inferasim.model.anchors import SHIPPED_ANCHORS
    from inferasim.search.tune import _anchor_for

    # Three shipped anchors of this kernel set differ in engine version and layout.
    model, gpu = get_model("deepseek-ai/DeepSeek-R1"), get_gpu("b200")
    store = AnchorStore(SHIPPED_ANCHORS)
    same = [a for a in store.all() if a.kernel_set.engine == "sglang" and a.kernel_set.model == model.name
            and a.kernel_set.gpu == "b200_sxm" and a.kernel_set.precision == "fp8"]
    assert len({a.kernel_set.engine_version for a in same}) > 1
    expected = _anchor_for(store, "sglang", model, gpu, "fp8")
    assert expected is not None
    r = run("predict", "--model", model.name, "--gpu", "b200", "--engine", "sglang", "--precision", "fp8", "--tp",
            "4", "--isl", "1024", "--osl", "1024", "--concurrency", "16", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["anchor"] == expected.id


def test_render_writes_what_read_deployment_reads_back(tmp_path: Path) -> None:
    from inferasim.deployment import read_deployment

    out = tmp_path / "deploy.yaml"
    r = run("render", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "MI355X", "--engine", "sglang", "--precision",
            "fp8", "--tp", "2", "--replicas", "3", "--max-num-seqs", "96", "--name", "chat", "--namespace", "llm",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    live = read_deployment(out)
    cfg = live.config
    assert (live.name, live.namespace, cfg.engine, cfg.layout, cfg.replicas) == ("chat", "llm", "sglang", Layout(tp=2),
                                                                               3)
    assert cfg.max_num_seqs == 96 and cfg.precision == "fp8" and cfg.gpu == "MI355X"
    # stdout without --out; refusals name what to change
    assert run("render", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "vllm").stdout.startswith(
        "apiVersion: apps/v1")
    bad = run("render", "--model", "deepseek-ai/DeepSeek-R1", "--gpu", "b200", "--engine", "vllm", "--precision",
              "fp4", "--tp", "8")
    assert bad.returncode == 2 and "not fp4" in bad.stderr and "choose precision fp8" in bad.stderr
    # A replica of two nodes renders as a LeaderWorkerSet (and says what it needs).
    wide = run("render", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--engine", "vllm", "--tp", "16")
    assert wide.returncode == 0 and "kind: LeaderWorkerSet" in wide.stdout


def test_predict_says_when_clients_queue_for_kv() -> None:
    args = ("predict", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "vllm", "--isl", "65536",
            "--osl", "512", "--concurrency", "256", "-o", "json")
    r = run(*args)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert 1 <= d["running_per_replica"] < 256 and "the KV pool holds" in r.stderr
    small = json.loads(run(*args[:-6], "--isl", "1024", "--osl", "128", "--concurrency", "8", "-o", "json").stdout)
    assert "running_per_replica" not in small  # all 8 run at once


def test_version_names_the_release_and_the_step_model() -> None:
    from inferasim.model.steptime import STEP_MODEL_REVISION

    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("inferasim ") and STEP_MODEL_REVISION in r.stdout


def test_anchor_file_at_another_precision_or_kv_dtype_is_refused() -> None:
    """--anchor prices its own kernels: asking for bf16 with an fp8 anchor once returned fp8 figures
    labelled fp8 with no word; now the mismatch is named, and a matching or unset flag passes."""
    anchor = str(REPO / "anchors" / "vllm-meta-llama--llama-3.1-70b-h100_sxm-fp8-tp2-1716c3.json")
    base = ("predict", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm", "--engine", "vllm", "--tp", "4",
            "--isl", "1024", "--osl", "256", "--concurrency", "16", "--anchor", anchor)
    r = run(*base, "--precision", "bf16")
    assert r.returncode == 2 and "measured at precision fp8, not --precision bf16" in r.stderr
    r = run(*base, "--kv-cache-dtype", "bf16")
    assert r.returncode == 2 and "--kv-cache-dtype bf16" in r.stderr
    assert run(*base, "--precision", "fp8").returncode == 0 and run(*base).returncode == 0


def test_memory_and_render_default_to_the_kv_dtype_predictions_price(tmp_path) -> None:
    args = ("--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm", "--engine", "vllm", "--precision", "fp8",
            "--tp", "4")
    mem = json.loads(run("memory", *args, "-o", "json").stdout)
    sim_kv = json.loads(run("memory", *args, "--kv-cache-dtype", "fp8", "-o", "json").stdout)
    assert mem["kv_tokens_per_replica"] == sim_kv["kv_tokens_per_replica"]
    bf16 = json.loads(run("memory", *args, "--kv-cache-dtype", "bf16", "-o", "json").stdout)
    assert mem["kv_tokens_per_replica"] > 1.9 * bf16["kv_tokens_per_replica"]
    out = run("render", *args).stdout
    assert "--kv-cache-dtype\n        - fp8" in out
    assert "--kv-cache-dtype" not in run("render", *args[:-4], "--precision", "bf16", "--tp", "4").stdout


def test_sglang_refuses_a_tp_that_does_not_divide_a_gqa_models_heads() -> None:
    """SGLang's Llama attention asserts tp divides the heads (only its MLA models pad them): a
    tp3 manifest would crash-loop, so predict and render refuse it as they do for vLLM."""
    for cmd in (("predict", "--isl", "1024", "--osl", "256", "--concurrency", "8"), ("render",)):
        r = run(cmd[0], "--model", "meta-llama/Llama-3.1-70B", "--gpu", "MI355X", "--engine", "sglang", "--precision",
                "fp8", "--tp", "3", *cmd[1:])
        assert r.returncode == 2 and "does not divide the 64 attention heads" in r.stderr
        assert "no anchor" not in r.stderr  # refused before the anchor search and its notes


def test_limits_the_engine_enforces_are_refused() -> None:
    llama = ("--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm", "--engine", "vllm", "--precision", "fp8")
    r = run("render", *llama, "--tp", "2", "--max-model-len", "1000000")
    assert r.returncode == 2 and "context of 131072" in r.stderr
    r = run("memory", *llama, "--tp", "4", "--context", "10000000")
    assert r.returncode == 2 and "--context 10000000" in r.stderr
    r = run("render", *llama, "--tp", "2", "--max-num-batched-tokens", "64", "--max-num-seqs", "256")
    assert r.returncode == 2 and "below max_num_seqs 256" in r.stderr
    r = run(*PREDICT, "--concurrency", "8", "--kv-cache-dtype", "fp9")
    assert r.returncode == 2 and "unknown kv_cache_dtype 'fp9'" in r.stderr and "no anchor" not in r.stderr


def test_predict_reports_no_tpot_for_one_output_token() -> None:
    r = run(*PREDICT[:-2], "--osl", "1", "--concurrency", "8", "-o", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["tpot_ms"] is None and d["interval"]["tpot_ms"] is None and d["throughput_tok_s"] > 0


def test_tune_refuses_bad_names_and_plot_formats_before_searching(tmp_path) -> None:
    spec = str(REPO / "examples" / "llama70b-mi355x.yaml")
    r = run("tune", spec, "--name", "Bad_Name", "--manifest", str(tmp_path / "m.yaml"))
    assert r.returncode == 2 and "DNS-1035" in r.stderr and r.stdout == ""
    r = run("tune", spec, "--plot", str(tmp_path / "p.txt"))
    assert r.returncode == 2 and ".png" in r.stderr and r.stdout == ""


def test_anchors_show_table_is_a_table() -> None:
    r = run("anchors", "show", "1716c3")
    assert r.returncode == 0 and "fit rms(log)" in r.stdout and not r.stdout.lstrip().startswith("{")
    assert json.loads(run("anchors", "show", "1716c3", "-o", "json").stdout)["layout"]["tp"] == 2


def test_a_checkpoint_that_cannot_run_at_the_asked_precision_is_noted() -> None:
    r = run("predict", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--engine", "vllm", "--isl", "1000",
            "--osl", "100", "--concurrency", "8", "--precision", "fp4")
    assert r.returncode == 0 and "the checkpoint holds bf16 weights" in r.stderr


def test_a_config_with_kv_heads_not_dividing_the_heads_is_refused(tmp_path) -> None:
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
           "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 3, "head_dim": 128,
           "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 40960}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run("predict", "--model", str(path), "--gpu", "h100", "--engine", "vllm", "--isl", "100", "--osl", "10",
            "--concurrency", "1")
    assert r.returncode == 2 and "'num_key_value_heads' (3) must divide" in r.stderr


def test_validate_says_which_measured_columns_are_absent(tmp_path) -> None:
    """A file without silicon_tpot_ms is scored on TTFT alone, and says so; one without any
    measured column is refused by name (it once ended in 'scoring needs at least two layouts')."""
    import csv

    data = REPO.parent / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
    if not data.exists():
        pytest.skip("shared data not present")
    with data.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))[:200]

    def write(name: str, drop: tuple[str, ...]) -> str:
        path = tmp_path / name
        keep = [c for c in rows[0] if c not in drop]
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, keep, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        return str(path)

    r = run("validate", write("nottpot.csv", ("silicon_tpot_ms",)), "--out", str(tmp_path / "o1"))
    assert "no column silicon_tpot_ms or tpot_ms: TPOT is not scored" in r.stderr
    r = run("validate", write("none.csv", ("silicon_tpot_ms", "silicon_ttft_ms")), "--out", str(tmp_path / "o2"))
    assert r.returncode == 2 and "no measured column" in r.stderr


def test_a_replica_beyond_one_node_is_noted() -> None:
    r = run("predict", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm", "--engine", "vllm", "--precision",
            "fp8", "--tp", "16", "--isl", "1024", "--osl", "256", "--concurrency", "16")
    assert r.returncode == 0 and "2 nodes of 8 H100" in r.stderr and "beyond 8 GPUs are priced over" in r.stderr
    assert "nodes of" not in run(*PREDICT, "--concurrency", "8").stderr
    # GB200 NVL72: four GPUs a node, one NVLink domain across the rack
    r = run("predict", "--model", "deepseek-ai/DeepSeek-R1", "--gpu", "GB200", "--engine", "sglang", "--precision",
            "fp8", "--tp", "8", "--dp", "2", "--isl", "1024", "--osl", "256", "--concurrency", "16")
    assert "4 nodes of 4 GB200" in r.stderr and "stay on NVLink 5 (NVL72), one 72-GPU domain" in r.stderr


def test_render_gives_vllm_a_max_model_len_its_kv_pool_holds() -> None:
    """70B bf16 on two H100 keeps ~15k tokens of KV: vLLM refuses to start at the 131k context, so
    the manifest carries a --max-model-len within the pool; a longer one asked for is refused."""
    base = ("render", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--tp", "2", "--precision", "bf16")
    r = run(*base, "--engine", "vllm")
    assert r.returncode == 0 and "vLLM would refuse to start, so --max-model-len" in r.stderr
    import yaml

    args = next(yaml.safe_load_all(r.stdout))["spec"]["template"]["spec"]["containers"][0]["args"]
    limit = int(args[args.index("--max-model-len") + 1])
    assert 8192 < limit < 131072 and limit % 16 == 0
    r = run(*base, "--engine", "vllm", "--max-model-len", "100000")
    assert r.returncode == 2 and "vLLM refuses to start" in r.stderr and f"give at most {limit}" in r.stderr
    roomy = run("render", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--tp", "8", "--precision", "bf16",
                "--engine", "vllm")
    assert roomy.returncode == 0 and "--max-model-len" not in roomy.stdout


def test_a_request_longer_than_the_kv_pool_is_not_priced() -> None:
    r = run("predict", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--tp", "2", "--precision", "bf16",
            "--engine", "vllm", "--isl", "100000", "--osl", "100", "--concurrency", "4")
    assert r.returncode == 2 and "one request needs 100,100 tokens of KV cache" in r.stderr


def test_observe_reads_a_comma_list_selector_as_anchors_does() -> None:
    r = run("observe", "--prometheus", "http://127.0.0.1:9", "--selector", "namespace=llm,app=chat")
    out = r.stderr + r.stdout
    assert 'app="chat"' in out and 'namespace="llm"' in out  # two matchers, not one value "llm,app=chat"


def test_weights_the_gpu_has_no_tensor_cores_for_are_noted() -> None:
    """NVFP4 on H200, FP8 on A100: priced as weight-only 16-bit GEMMs, and said so."""
    r = run("predict", "--model", "nvidia/DeepSeek-V3.1-NVFP4", "--gpu", "h200", "--engine", "sglang", "--tp", "8",
            "--isl", "1000", "--osl", "100", "--concurrency", "8")
    assert r.returncode == 0 and "H200 has no FP4 tensor cores: nvfp4 weights" in r.stderr
    r = run("render", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "a100", "--engine", "vllm", "--tp", "4",
            "--precision", "fp8")
    assert "A100 has no FP8 tensor cores" in r.stderr
    r = run("predict", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--engine", "vllm", "--tp", "4",
            "--precision", "fp8", "--isl", "1000", "--osl", "100", "--concurrency", "8")
    assert "tensor cores" not in r.stderr


def test_anchor_messages_say_what_an_unset_field_means_and_point_a_folder_at_anchors() -> None:
    base = ("predict", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100", "--engine", "vllm", "--tp", "4",
            "--isl", "2048", "--osl", "512", "--concurrency", "32")
    r = run(*base)
    assert "precision ('fp8' vs auto (the checkpoint's))" in r.stderr and "vs '')" not in r.stderr
    r = run(*base, "--anchor", str(REPO / "anchors"))
    assert r.returncode == 2 and "is a folder, not an anchor file" in r.stderr and "--anchors" in r.stderr


def test_render_refuses_an_empty_out_and_predict_notes_idle_replicas() -> None:
    r = run("render", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "MI355X", "--engine", "sglang", "--precision",
            "fp8", "--tp", "2", "--out", "")
    assert r.returncode == 2 and "--out names no file" in r.stderr and not r.stdout
    cwd = Path.cwd()
    r = run("render", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "MI355X", "--engine", "sglang", "--precision",
            "fp8", "--tp", "2", "--out", "-")
    assert r.returncode == 0 and "kind: Deployment" in r.stdout and not (cwd / "-").exists()
    r = run("predict", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm", "--engine", "vllm", "--precision",
            "fp8", "--tp", "4", "--isl", "2048", "--osl", "512", "--concurrency", "3", "--replicas", "5")
    assert r.returncode == 0 and "2 replicas get no client and sit idle" in r.stderr


def test_validate_reports_json_for_programs(tmp_path: Path) -> None:
    csv_path = REPO.parent / "shared" / "data" / "argonne-offline" / "vllm_offline_dev.csv"
    r = run("validate", str(csv_path), "--out", str(tmp_path / "v"), "-o", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data == json.loads((tmp_path / "v" / "summary.json").read_text())
    assert "wrote" in r.stderr and "median APE" not in r.stdout


def test_anchors_build_of_a_header_only_csv_writes_nothing_and_says_so(tmp_path: Path) -> None:
    data = REPO.parent / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
    header = tmp_path / "header.csv"
    header.write_text(data.read_text().splitlines()[0] + "\n")
    r = run("anchors", "build", str(header), "--out", str(tmp_path / "built"))
    assert r.returncode == 1 and "no anchor built" in r.stderr and "wrote" not in r.stdout


def test_predict_notes_an_anchor_that_fits_its_own_points_poorly() -> None:
    """The shipped Qwen3-32B fp8 H100 anchor holds one point its fit misses (anchors check flags it):
    a prediction from it says so; a well-fitted anchor's does not."""
    r = run("predict", "--model", "Qwen/Qwen3-32B", "--gpu", "h100", "--engine", "vllm", "--precision", "fp8",
            "--tp", "1", "--isl", "1024", "--osl", "1024", "--concurrency", "8")
    assert r.returncode == 0 and "fits its own 1 point(s) poorly" in r.stderr and "harvest the kernel set" in r.stderr
    r = run(*PREDICT, "--concurrency", "8")
    assert r.returncode == 0 and "poorly" not in r.stderr
