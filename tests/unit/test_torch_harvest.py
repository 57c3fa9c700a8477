"""The PyTorch step harvest's plan (harvest.torchplan) and import (harvest.torchimport)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.errors import UserError
from inferasim.harvest.torchimport import TorchResultError, import_result, read_result
from inferasim.harvest.torchplan import (
    HEADROOM_BYTES,
    UnsupportedArchitecture,
    kv_bytes_per_token,
    shard,
    torch_arch,
    torch_plan,
    weight_bytes,
)
from inferasim.model.anchors import load_anchor
from inferasim.model.predictor import fitted_from_anchor

MEASURED = Path(__file__).parents[2] / "benchmarks" / "measured" / "h200-torchstep-tp1.json"
needs_measured = pytest.mark.skipif(not MEASURED.exists(), reason="measured H200 steps not in this checkout")


def test_arch_and_weights_match_the_catalog() -> None:
    model = get_model("meta-llama/Meta-Llama-3-8B")
    arch = torch_arch(model)
    assert (arch["hidden"], arch["layers"], arch["heads"], arch["kv_heads"], arch["intermediate"]) == \
        (4096, 32, 32, 8, 14336)
    # Llama-3-8B holds 8.03e9 parameters (its model card): bf16 bytes twice that.
    assert weight_bytes(arch) == pytest.approx(2 * 8.03e9, rel=0.01)
    assert kv_bytes_per_token(arch) == 2 * 32 * 8 * 128 * 2
    assert torch_arch(get_model("Qwen/Qwen3-32B"))["qk_norm"] is True


def test_plan_fits_the_card_and_the_model() -> None:
    gpu = get_gpu("h200")
    plan = torch_plan([get_model("meta-llama/Llama-2-7b-hf")], gpu)
    entry = plan["models"][0]
    room = gpu.hbm_bytes - entry["weight_bytes"] - HEADROOM_BYTES
    assert entry["decode"] and all(b * c * kv_bytes_per_token(entry["arch"]) <= room for b, c in entry["decode"])
    # Llama-2's 4096-token window bounds every context and prompt.
    assert max(c for _, c in entry["decode"]) <= 4096 and max(entry["prefill"]) <= 4096


def test_shard_splits_heads_and_replicates_kv_heads() -> None:
    arch = torch_arch(get_model("meta-llama/Meta-Llama-3-8B"))
    s8 = shard(arch, 8)
    assert (s8["heads"], s8["kv_heads"], s8["intermediate"], s8["hidden"]) == (4, 1, 1792, 4096)
    assert shard(arch, 16)["kv_heads"] == 1
    with pytest.raises(UserError, match="tp 3"):
        shard(arch, 3)


def test_moe_and_oversized_models_are_refused_with_the_reason() -> None:
    with pytest.raises(UnsupportedArchitecture, match="MLP kind"):
        torch_arch(get_model("mistralai/Mixtral-8x7B-v0.1"))
    with pytest.raises(UserError, match="do not fit"):
        torch_plan([get_model("meta-llama/Llama-2-70b-hf")], get_gpu("h100_sxm"))


@needs_measured
def test_import_writes_usable_pytorch_anchors(tmp_path: Path) -> None:
    data = read_result(MEASURED)
    imported = import_result(data, "vllm", source=MEASURED.name)
    assert {i.anchor.kernel_set.model for i in imported} == {m["model"] for m in data["models"]}
    for item in imported:
        a = item.anchor
        assert a.provenance.method == "pytorch" and a.kernel_set.attention_backend == "torch-sdpa"
        assert len(a.steps) == next(len(m["steps"]) for m in data["models"] if m["model"] == a.kernel_set.model)
        assert a.fit is not None and a.fit.rms_log_error < 0.15
        path = tmp_path / a.filename()
        path.write_text(a.model_dump_json())
        again = fitted_from_anchor(load_anchor(path))
        assert again.fit.params.as_dict() == pytest.approx(a.params)
        # A steps-only anchor spans the decode batches it timed.
        assert again.conc_range == (1, max(s.n_decode for s in a.steps))


@needs_measured
def test_a_stale_steps_only_anchor_is_refitted_from_its_steps() -> None:
    item = import_result(read_result(MEASURED), "vllm")[0]
    old = item.anchor.model_copy(update={"fit": item.anchor.fit.model_copy(update={"step_model": "2000-01-01"}),
                                         "params": {**item.anchor.params, "e_bw": 0.3}})
    fitted = fitted_from_anchor(old)
    assert f"refitted from the anchor's {len(old.steps)} steps" in fitted.fit.message
    assert fitted.fit.params.e_bw == pytest.approx(item.anchor.params["e_bw"], rel=1e-6)


def test_bad_result_files_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    bad.write_text("{not json")
    with pytest.raises(TorchResultError, match="not JSON"):
        read_result(bad)
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(TorchResultError, match="'schema'"):
        read_result(bad)
    bad.write_text(json.dumps({"schema": "inferasim-torchstep/1", "gpu": "h200",
                               "models": [{"model": "meta-llama/Meta-Llama-3-8B",
                                           "steps": [{"n_decode": 1, "decode_context": 10, "step_ms": 1.0}]}]}))
    with pytest.raises(TorchResultError, match=r"models\[0\]\.steps\[0\]: missing field 'n_prefill_tokens'"):
        import_result(read_result(bad), "vllm")
    bad.write_text(json.dumps({"schema": "inferasim-torchstep/1", "gpu": "h200",
                               "models": [{"model": "meta-llama/Meta-Llama-3-8B", "steps": [
                                   {"n_decode": 1, "decode_context": 10, "n_prefill_tokens": 0, "step_ms": -1}]}]}))
    with pytest.raises(TorchResultError, match=r"steps\[0\]\.step_ms"):
        import_result(read_result(bad), "vllm")
    with pytest.raises(TorchResultError, match="no tp-1 model"):
        import_result({"schema": "inferasim-torchstep/1", "gpu": "h200",
                       "models": [{"model": "meta-llama/Meta-Llama-3-8B", "tp": 2, "steps": []}]}, "vllm")


@needs_measured
def test_cli_plan_import_predict(tmp_path: Path) -> None:
    exe = shutil.which("inferasim") or f"{sys.executable} -m inferasim"
    run = lambda *a: subprocess.run([*exe.split(), *a], capture_output=True, text=True, timeout=120)  # noqa: E731
    plan = run("harvest", "torch-plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "h200", "--tp", "2",
               "--out", str(tmp_path / "plan.json"))
    assert plan.returncode == 0, plan.stderr
    assert [e["tp"] for e in json.loads((tmp_path / "plan.json").read_text())["models"]] == [1, 2]
    imp = run("harvest", "torch-import", str(MEASURED), "--out", str(tmp_path / "a") + "/")
    assert imp.returncode == 0, imp.stderr
    files = sorted((tmp_path / "a").glob("*.json"))
    assert len(files) == 3
    llama = next(f for f in files if "meta-llama-3-8b" in f.name)
    pred = run("predict", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "h200", "--engine", "vllm",
               "--isl", "1024", "--osl", "128", "--concurrency", "8", "--anchor", str(llama), "-o", "json")
    assert pred.returncode == 0, pred.stderr
    out = json.loads(pred.stdout)
    # Never faster than one read of the 16 GB of weights at the H200's 4.8 TB/s per output token.
    assert out["tpot_ms"] > 16.06e9 / 4.8e12 * 1e3 and out["throughput_tok_s"] > 0
    refused = run("harvest", "torch-plan", "--model", "mistralai/Mixtral-8x7B-v0.1", "--gpu", "h200",
                  "--out", str(tmp_path / "p2.json"))
    assert refused.returncode != 0 and "MLP kind" in refused.stderr and "Traceback" not in refused.stderr
