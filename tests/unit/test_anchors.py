"""Anchor data model and store: schema rules, file errors, lookup preferences, messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from inferasim.core.layout import Layout
from inferasim.model.anchor_store import AnchorStore, NoCompatibleAnchor
from inferasim.model.anchors import (
    SCHEMA_VERSION,
    Anchor,
    AnchorFileError,
    BenchPoint,
    KernelSet,
    LayoutModel,
    MeasuredRange,
    Provenance,
    StepPoint,
    anchor_json_schema,
    load_anchor,
    write_anchor_file,
)

KS = KernelSet(
    engine="vllm", engine_version="0.18.0", model="MiniMaxAI/MiniMax-M2.5", gpu="h100_sxm", precision="fp8"
)


def make_anchor(
    kernel_set: KernelSet = KS,
    layout: Layout | None = None,
    concurrencies: tuple[int, ...] = (1, 8, 64),
    isl: int = 1024,
    osl: int = 128,
) -> Anchor:
    return Anchor(
        kernel_set=kernel_set,
        layout=LayoutModel.from_layout(layout or Layout(tp=4, moe_ep=4)),
        points=[
            BenchPoint(isl=isl, osl=osl, concurrency=c, ttft_ms=50.0 + c, tpot_ms=10 + c / 8, row_id=f"r{c}")
            for c in concurrencies
        ],
        params={"t_fixed": 3.5e-3, "e_bw": 0.8},
        provenance=Provenance(method="synthetic", source="tests/unit/test_anchors.py", rows=["r1"]),
    )


# --------------------------------------------------------------------------------------------
# kernel set
# --------------------------------------------------------------------------------------------


def test_kernel_set_key_is_stable_and_short() -> None:
    again = KernelSet(**KS.model_dump())
    assert KS.key() == again.key()
    assert len(KS.key()) == 12 and int(KS.key(), 16) >= 0
    # Pinned: anchor ids in shipped files and CRD names depend on it never changing.
    ks = KernelSet(engine="vllm", model="a/b", gpu="h100_sxm", precision="fp8")
    assert ks.key() == "15fe671af054"


@pytest.mark.parametrize(
    "field,value",
    [
        ("engine", "sglang"),
        ("engine_version", "0.19.0"),
        ("model", "Qwen/Qwen3-32B"),
        ("gpu", "b200_sxm"),
        ("precision", "fp4"),
        ("kv_dtype", "fp8"),
        ("attention_backend", "FLASHINFER"),
        ("graph_mode", "eager"),
        ("spec_method", "eagle"),
    ],
)
def test_kernel_set_key_changes_with_every_field(field: str, value: str) -> None:
    other = KS.model_copy(update={field: value})
    assert other.key() != KS.key()
    assert KS.differences(other) == [(field, getattr(KS, field), value)]


def test_kernel_set_is_frozen_and_engine_lower_cased() -> None:
    assert KernelSet(engine=" SGLang ", model="m", gpu="g").engine == "sglang"
    with pytest.raises(ValidationError):
        KS.gpu = "b200_sxm"  # type: ignore[misc]


def test_trtllm_engine_rejected_naming_accepted_engines() -> None:
    with pytest.raises(ValidationError) as info:
        KernelSet(engine="trtllm", model="m", gpu="h100_sxm")
    text = str(info.value)
    assert "trtllm" in text
    for engine in ("vllm", "sglang", "atom"):
        assert engine in text


def test_kernel_set_forbids_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="gpus"):
        KernelSet(engine="vllm", model="m", gpu="g", gpus="8")  # type: ignore[call-arg]


# --------------------------------------------------------------------------------------------
# layout, points, steps
# --------------------------------------------------------------------------------------------


def test_layout_model_round_trip() -> None:
    layout = Layout(tp=4, dp=2, moe_ep=8)
    model = LayoutModel.from_layout(layout)
    assert model.moe_tp == 1  # derived value carried over
    assert model.to_layout() == layout
    assert LayoutModel(tp=4, moe_ep=4).to_layout() == Layout(tp=4, moe_ep=4)


def test_layout_model_rejects_impossible_layouts() -> None:
    with pytest.raises(ValidationError, match="tp"):
        LayoutModel(tp=0)
    with pytest.raises(ValidationError, match="moe_ep=3"):
        LayoutModel(tp=4, moe_ep=3)


def test_bench_point_without_metric_rejected() -> None:
    with pytest.raises(ValidationError, match="at least one measured metric"):
        BenchPoint(isl=128, osl=128, concurrency=4)
    assert BenchPoint(isl=128, osl=128, concurrency=4, throughput_tok_s=900.0).throughput_tok_s == 900.0


def test_bench_point_rejects_non_positive_values() -> None:
    with pytest.raises(ValidationError, match="ttft_ms"):
        BenchPoint(isl=128, osl=128, concurrency=4, ttft_ms=0.0)
    with pytest.raises(ValidationError, match="concurrency"):
        BenchPoint(isl=128, osl=128, concurrency=0, tpot_ms=5.0)
    with pytest.raises(ValidationError, match="scenario"):
        BenchPoint(isl=128, osl=128, concurrency=4, tpot_ms=5.0, scenario="open")  # type: ignore[arg-type]


def test_step_point_needs_work() -> None:
    with pytest.raises(ValidationError, match="n_decode"):
        StepPoint(n_decode=0, decode_context=0, n_prefill_tokens=0, step_ms=1.0)
    step = StepPoint(n_decode=3, decode_context=500.0, n_prefill_tokens=256, step_ms=12.0)
    assert step.tokens == 259


def test_anchor_needs_a_point_or_a_step() -> None:
    prov = Provenance(method="synthetic", source="x")
    with pytest.raises(ValidationError, match="at least one benchmark point or step"):
        Anchor(kernel_set=KS, layout=LayoutModel(), provenance=prov)
    steps_only = Anchor(
        kernel_set=KS,
        layout=LayoutModel(),
        steps=[StepPoint(n_decode=8, decode_context=1000.0, n_prefill_tokens=0, step_ms=9.0)],
        provenance=prov,
    )
    assert steps_only.measured_range is None  # no request lengths to span


# --------------------------------------------------------------------------------------------
# measured range
# --------------------------------------------------------------------------------------------


def test_measured_range_computed_from_points() -> None:
    anchor = make_anchor(concurrencies=(4, 1, 64))
    anchor.points.append(BenchPoint(isl=8192, osl=1024, concurrency=16, tpot_ms=20.0))
    rebuilt = Anchor.model_validate(anchor.model_dump(exclude={"measured_range"}))
    rng = rebuilt.measured_range
    assert rng is not None
    assert rng.concurrency == (1, 64)
    assert rng.isl == (1024, 8192)
    assert rng.osl == (128, 1024)
    assert rng.tokens_per_step is None


def test_measured_range_tokens_per_step_from_steps() -> None:
    anchor = make_anchor().model_copy(update={"measured_range": None})
    data = anchor.model_dump()
    data["steps"] = [
        {"n_decode": 4, "decode_context": 900.0, "n_prefill_tokens": 0, "step_ms": 8.0},
        {"n_decode": 2, "decode_context": 900.0, "n_prefill_tokens": 2048, "step_ms": 40.0},
    ]
    rng = Anchor.model_validate(data).measured_range
    assert rng is not None and rng.tokens_per_step == (4.0, 2050.0)


def test_given_measured_range_is_kept() -> None:
    data = make_anchor().model_dump()
    data["measured_range"] = {"concurrency": [1, 512], "isl": [1, 100000], "osl": [1, 100000]}
    assert Anchor.model_validate(data).measured_range == MeasuredRange(
        concurrency=(1, 512), isl=(1, 100000), osl=(1, 100000)
    )


def test_contains_gives_reasons() -> None:
    rng = MeasuredRange(concurrency=(1, 64), isl=(1024, 1024), osl=(128, 1024), tokens_per_step=(1.0, 2048.0))
    assert rng.contains(8, 1024, 512) == []
    assert rng.contains(256, 1024, 128) == ["concurrency 256 above measured 64"]
    assert rng.contains(1, 128, 2048) == ["isl 128 below measured 1024", "osl 2048 above measured 1024"]
    assert rng.contains(8, 1024, 512, tokens_per_step=4096) == ["tokens per step 4096 above measured 2048"]


def test_measured_range_rejects_reversed_span() -> None:
    with pytest.raises(ValidationError, match="min above max"):
        MeasuredRange(concurrency=(64, 1), isl=(1, 1), osl=(1, 1))


# --------------------------------------------------------------------------------------------
# ids, files, schema
# --------------------------------------------------------------------------------------------


def test_id_and_filename() -> None:
    anchor = make_anchor()
    assert anchor.id == f"{KS.key()}-tp4-ep4"
    name = anchor.filename()
    assert name == f"vllm-minimaxai--minimax-m2.5-h100_sxm-fp8-tp4-ep4-{KS.key()[:6]}.json"
    odd = make_anchor(KernelSet(engine="atom", model="org/Model V2:x", gpu="AMD Instinct MI300X"), Layout())
    assert odd.filename().startswith("atom-org--model_v2_x-amd_instinct_mi300x-tp1-")
    assert set(odd.filename()) <= set("abcdefghijklmnopqrstuvwxyz0123456789._-")


def test_save_then_load_round_trip(tmp_path: Path) -> None:
    anchor = make_anchor()
    anchor.steps.append(StepPoint(n_decode=8, decode_context=1100.5, n_prefill_tokens=0, step_ms=11.25))
    store = AnchorStore(tmp_path / "anchors")
    path = store.save(anchor)
    assert path == tmp_path / "anchors" / anchor.filename()
    assert load_anchor(path) == anchor
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    assert AnchorStore(tmp_path / "anchors").all() == [anchor]
    assert store.all() == [anchor]
    assert [p.name for p in (tmp_path / "anchors").iterdir()] == [anchor.filename()]  # no temp left


def test_save_replaces_same_file_and_honours_folder(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path / "a", tmp_path / "b")
    store.save(make_anchor())
    store.save(make_anchor(concurrencies=(1, 2)))
    assert len(store.all()) == 1 and len(store.all()[0].points) == 2
    other = store.save(make_anchor(layout=Layout(tp=8, moe_ep=8)), tmp_path / "b")
    assert other.parent == tmp_path / "b"
    assert len(AnchorStore(tmp_path / "a", tmp_path / "b").all()) == 2


def test_save_keeps_the_anchor_it_replaces(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    store = AnchorStore(folder)
    first = make_anchor()
    store.save(first)
    assert store.last_replaced is None
    store.save(first)  # the same text again: nothing to keep
    assert store.last_replaced is None and not (folder / "replaced").exists()
    second = make_anchor(concurrencies=(1, 2))
    path = store.save(second)
    kept = store.last_replaced
    assert kept is not None and kept.parent == folder / "replaced" and kept.name.startswith(path.stem + ".")
    assert load_anchor(kept) == first and load_anchor(path) == second
    # The folder's store sees only the new anchor: replaced/ is not read.
    assert AnchorStore(folder).all() == [second]
    # A third write in the same second does not overwrite the second one kept.
    store.save(make_anchor(concurrencies=(4, 8)))
    assert len(list((folder / "replaced").glob("*.json"))) == 2
    # Asked not to keep it, the file is simply replaced.
    assert write_anchor_file(first, path, keep_previous=False) is None
    assert len(list((folder / "replaced").glob("*.json"))) == 2 and load_anchor(path) == first


def test_bad_json_names_file_and_position(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema_version": 1,\n "kernel_set": }')
    with pytest.raises(AnchorFileError) as info:
        load_anchor(bad)
    text = str(info.value)
    assert "broken.json" in text and "not valid JSON" in text and "line 2" in text
    assert info.value.path == bad


def test_schema_error_names_file_and_field(tmp_path: Path) -> None:
    data = make_anchor().model_dump(mode="json")
    data["points"][1]["ttft_ms"] = -3.0
    del data["kernel_set"]["gpu"]
    data["layout"]["tpp"] = 2
    path = tmp_path / "vllm-bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnchorFileError) as info:
        load_anchor(path)
    text = str(info.value)
    assert "vllm-bad.json" in text
    assert "points[1].ttft_ms" in text and "-3.0" in text
    assert "kernel_set.gpu is missing" in text
    assert "layout.tpp is not part of the anchor schema" in text


@pytest.mark.parametrize(("name", "value", "says"), [
    ("t_fixed", -1.0, "t_fixed=-1.0 must be positive"),
    ("e_bw", 0.0, "e_bw=0.0 must be within (0, 1]"),
    ("e_flops", 1.5, "e_flops=1.5 must be within (0, 1]"),
    ("kv_scale", 0.0, "kv_scale=0.0 must be positive"),
])
def test_unusable_parameters_are_refused_naming_the_field(tmp_path: Path, name: str, value: float,
                                                          says: str) -> None:
    """An anchor whose parameters would give negative latencies, divide by zero or be silently
    ignored is refused when read, naming the parameter and the rule."""
    data = make_anchor().model_dump(mode="json")
    data["params"] = {"t_fixed": 0.004, "e_bw": 0.8, name: value}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnchorFileError) as info:
        load_anchor(path)
    assert "params" in str(info.value) and says in str(info.value)


def test_a_parameter_this_version_does_not_know_is_kept_not_refused(tmp_path: Path) -> None:
    """An anchor from a newer writer loads (its unknown parameter unused); `anchors check` names it."""
    import subprocess
    import sys

    data = make_anchor().model_dump(mode="json")
    data["params"] = {"t_fixed": 0.004, "e_bw": 0.8, "t_future": 0.001}
    path = tmp_path / "new.json"
    path.write_text(json.dumps(data))
    assert load_anchor(path).params["t_future"] == 0.001
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "anchors", "check", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert "parameters this version does not use" in r.stderr and "t_future" in r.stderr


def test_non_finite_parameter_refused(tmp_path: Path) -> None:
    data = make_anchor().model_dump(mode="json")
    path = tmp_path / "n.json"
    data["params"]["e_bw"] = float("nan")
    path.write_text(json.dumps(data))  # json writes NaN, as Python's json reads it
    assert '"e_bw": NaN' in path.read_text()
    with pytest.raises(AnchorFileError, match="e_bw must be a number"):
        load_anchor(path)


def test_schema_error_for_metric_less_point_names_the_point(tmp_path: Path) -> None:
    data = make_anchor().model_dump(mode="json")
    data["points"][0] = {"isl": 1, "osl": 1, "concurrency": 1}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnchorFileError, match=r"points\[0\]: a benchmark point needs at least one"):
        load_anchor(path)


def test_newer_schema_version_rejected(tmp_path: Path) -> None:
    data = make_anchor().model_dump(mode="json")
    data["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnchorFileError, match="schema_version.*newer"):
        load_anchor(path)


def test_json_schema_describes_every_field() -> None:
    schema = anchor_json_schema()
    assert schema["title"] == "Anchor"
    assert set(schema["required"]) == {"kernel_set", "layout", "provenance"}
    for name, model in schema["$defs"].items():
        for field, spec in model["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"
    assert schema["$defs"]["KernelSet"]["properties"]["engine"]["enum"] == ["vllm", "sglang", "atom"]
    # Kubernetes structural schemas have no prefixItems: ranges are plain 2-item arrays.
    rng = schema["$defs"]["MeasuredRange"]["properties"]["concurrency"]
    assert rng == {**rng, "type": "array", "minItems": 2, "maxItems": 2}
    assert "prefixItems" not in json.dumps(schema)


# --------------------------------------------------------------------------------------------
# store
# --------------------------------------------------------------------------------------------


def test_missing_and_empty_folders_give_an_empty_store(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    store = AnchorStore(tmp_path / "missing", tmp_path / "empty")
    assert store.all() == [] and store.errors() == []
    assert AnchorStore().all() == []
    with pytest.raises(NoCompatibleAnchor, match="store is empty"):
        store.find(KS)


def test_store_collects_bad_files(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path)
    store.save(make_anchor())
    (tmp_path / "bad.json").write_text("[1, 2")
    (tmp_path / "notes.txt").write_text("ignored")
    reread = AnchorStore(tmp_path)
    assert len(reread.all()) == 1
    [err] = reread.errors()
    assert err.path.name == "bad.json"


def test_find_exact_match(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path)
    wanted = make_anchor()
    store.save(wanted)
    store.save(make_anchor(KS.model_copy(update={"engine_version": "0.19.0"})))
    assert store.find(KS) == wanted
    assert store.find(KernelSet(**KS.model_dump())) == wanted


def test_find_preference_rules(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path)
    tp8 = make_anchor(layout=Layout(tp=8, moe_ep=8))
    tp4_few = make_anchor(layout=Layout(tp=4), concurrencies=(1,))
    tp4_many = make_anchor(layout=Layout(tp=4, moe_ep=4), concurrencies=(1, 2, 4, 8))
    for anchor in (tp8, tp4_few, tp4_many):
        store.save(anchor)
    assert store.find(KS, Layout(tp=8, moe_ep=8)) == tp8  # same layout first
    assert store.find(KS, Layout(tp=4)) == tp4_few
    assert store.find(KS) == tp4_many  # fewest GPUs, then most points
    assert store.find(KS, Layout(tp=2)) == tp4_many  # layout not measured: same rules
    assert store.candidates(KS) == [tp4_many, tp4_few, tp8]
    assert store.candidates(KS.model_copy(update={"gpu": "b200_sxm"})) == []


def test_find_prefers_later_folder_on_full_tie(tmp_path: Path) -> None:
    first, second = make_anchor(), make_anchor()
    second.provenance.source = "harvested"
    store = AnchorStore(tmp_path / "shipped", tmp_path / "harvested")
    store.save(first)
    store.save(second, tmp_path / "harvested")
    assert AnchorStore(tmp_path / "shipped", tmp_path / "harvested").find(KS).provenance.source == "harvested"


def test_no_compatible_anchor_message_names_differences(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path)
    near = make_anchor()
    store.save(near)
    store.save(make_anchor(KernelSet(engine="sglang", model="Qwen/Qwen3-8B", gpu="mi300x", precision="bf16")))
    wanted = KS.model_copy(update={"engine_version": "0.19.0", "gpu": "b200_sxm"})
    with pytest.raises(NoCompatibleAnchor) as info:
        store.find(wanted)
    text = str(info.value)
    assert text.startswith("no anchor for vllm 0.19.0 MiniMaxAI/MiniMax-M2.5 on b200_sxm fp8; nearest: ")
    assert (
        f"{near.filename()} differs in engine_version ('0.18.0' vs '0.19.0'), gpu ('h100_sxm' vs 'b200_sxm')"
        in text
    )
    assert text.index(near.filename()) < text.index("Qwen")  # nearest first
    assert info.value.kernel_set == wanted
    assert isinstance(info.value, LookupError)


def test_no_compatible_anchor_lists_at_most_three(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path)
    for version in ("0.1", "0.2", "0.3", "0.4"):
        store.save(make_anchor(KS.model_copy(update={"engine_version": version})))
    with pytest.raises(NoCompatibleAnchor) as info:
        store.find(KS)
    assert len(info.value.nearest) == 3
    assert str(info.value).count("differs in") == 3


def test_differences_ignore_names_the_catalogs_resolve_alike() -> None:
    here = KernelSet(engine="vllm", model="meta-llama/Meta-Llama-3.1-8B", gpu="h100", precision="fp8")
    there = KernelSet(engine="vllm", model="meta-llama/Llama-3.1-8B", gpu="NVIDIA-H100-80GB-HBM3",
                      precision="FP8", engine_version="0.12.0")
    assert here.differences(there) == [("engine_version", "", "0.12.0")]


def test_write_anchor_takes_a_trailing_slash_for_a_new_folder(tmp_path: Path) -> None:
    from inferasim.harvest import write_anchor

    anchor = make_anchor()
    path = write_anchor(anchor, f"{tmp_path}/new/")
    assert path == tmp_path / "new" / anchor.filename() and load_anchor(path) == anchor
    # Without the slash a name that does not exist is a file.
    assert write_anchor(anchor, tmp_path / "plain.json") == tmp_path / "plain.json"


def test_a_failed_write_leaves_the_previous_anchor_active(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "a"
    store = AnchorStore(folder)
    first = make_anchor()
    path = store.save(first)

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        write_anchor_file(make_anchor(concurrencies=(1, 2)), path)
    monkeypatch.undo()
    assert load_anchor(path) == first and AnchorStore(folder).all() == [first]
    assert not (folder / "replaced").exists() and [p.name for p in folder.iterdir()] == [path.name]


def test_an_empty_precision_compares_as_the_checkpoints_own_format() -> None:
    """nvidia/DeepSeek-R1-FP4 prices by DeepSeek-R1's architecture, but at "" it is an FP4 kernel
    set, not the FP8 one deepseek-ai/DeepSeek-R1 at "" names; a 16-bit model at "" is its bf16."""
    from inferasim.model.anchors import KernelSet

    def ks(model: str, precision: str) -> KernelSet:
        return KernelSet(engine="sglang", engine_version="0.5.9", model=model, gpu="b200_sxm",
                         precision=precision, kv_dtype="fp8")

    assert not ks("nvidia/DeepSeek-R1-FP4", "").same_kernels(ks("deepseek-ai/DeepSeek-R1", ""))
    assert ks("nvidia/DeepSeek-R1-FP4", "").same_kernels(ks("deepseek-ai/DeepSeek-R1", "fp4"))
    assert ks("deepseek-ai/DeepSeek-R1", "").same_kernels(ks("deepseek-ai/DeepSeek-R1", "fp8"))
    assert ks("Qwen/Qwen3-32B", "").same_kernels(ks("Qwen/Qwen3-32B", "bf16"))
    assert not ks("Qwen/Qwen3-32B", "fp16").same_kernels(ks("Qwen/Qwen3-32B", "bf16"))
