"""A model is a name, never a path the operator opens: `/etc/passwd`, `/proc/self/environ` or a
kubeconfig in a ServingTuning's `model` made the operator open files on its own filesystem, and
its messages said which existed. The CLI still takes a path to a config.json."""

from __future__ import annotations

import asyncio
import copy
import os
import pathlib
from pathlib import Path
from typing import Any

import pytest
from inferasim_operator import search
from inferasim_operator.passes import tune
from inferasim_operator.settings import Settings
from inferasim_operator.spec_rules import parse_tuning_spec
from inferasim_operator.status import StatusBook
from test_operator_lifecycle import BODY, _Kube
from test_operator_reconcile import SPEC

from inferasim.catalog.models import _catalog_files, get_model
from inferasim.core.spec import SpecError, parse_spec


def _spy_filesystem(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths the code stats or opens (pathlib and os), recorded."""
    seen: list[str] = []
    real_stat, real_open, real_os_stat = pathlib.Path.stat, pathlib.Path.open, os.stat

    def stat(self: pathlib.Path, *a: Any, **k: Any) -> Any:
        seen.append(str(self))
        return real_stat(self, *a, **k)

    def open_(self: pathlib.Path, *a: Any, **k: Any) -> Any:
        seen.append(str(self))
        return real_open(self, *a, **k)

    def os_stat(path: Any, *a: Any, **k: Any) -> Any:
        seen.append(str(path))
        return real_os_stat(path, *a, **k)

    monkeypatch.setattr(pathlib.Path, "stat", stat)
    monkeypatch.setattr(pathlib.Path, "open", open_)
    monkeypatch.setattr(os, "stat", os_stat)
    return seen


def test_the_operator_never_looks_up_a_model_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/etc/passwd, /proc/self/environ, a kubeconfig: refused by their shape, with one message
    whether or not the file exists, and no file looked at."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    absent = tmp_path / "kubeconfiX"  # as long as the real one: the messages must read alike
    catalog = next(iter(_catalog_files().values()))  # a real config.json: still a path
    get_model(SPEC["model"])  # the catalog read once, before the spy
    seen = _spy_filesystem(monkeypatch)
    messages = {}
    for model in ("/etc/passwd", "/proc/self/environ", str(kubeconfig), str(absent), str(catalog),
                  "../../etc/passwd", "~/.kube/config", "config.json", "a/b/c", "m" * 100_000):
        with pytest.raises(SpecError) as err:
            parse_tuning_spec({**SPEC, "model": model})
        assert str(err.value).startswith("model: ")
        messages[model] = str(err.value)
    assert not [p for p in seen if "passwd" in p or "environ" in p or "kube" in p or "config.json" in p]
    assert messages[str(kubeconfig)].replace("kubeconfig", "kubeconfiX") == messages[str(absent)]
    # A name the catalog knows resolves; one it does not is refused by name, with no path suggested.
    assert parse_tuning_spec({**SPEC, "model": "meta-llama--Meta-Llama-3-8B"}).model
    with pytest.raises(SpecError, match="paths to config files are not accepted") as err:
        parse_tuning_spec({**SPEC, "model": "etc/passwd"})
    assert "path to a config.json" not in str(err.value)


def test_the_cli_still_takes_a_config_json_path() -> None:
    catalog = next(iter(_catalog_files().values()))
    assert parse_spec({**SPEC, "model": str(catalog)}).model == str(catalog)
    assert get_model(str(catalog)).name
    with pytest.raises(ValueError, match="not a Hugging Face id"):
        get_model(str(catalog), allow_path=False)


def test_a_pass_with_a_model_path_is_invalid_and_withdraws_the_last_recommendation() -> None:
    status = {"phase": "Recommended", "observedGeneration": 2, "recommendation": {"engine": "vllm"}}
    kube = _Kube(status, [])
    body = {**BODY, "spec": {**SPEC, "model": "/etc/passwd"}, "status": status}
    book = StatusBook(copy.deepcopy(body), kube)  # type: ignore[arg-type]
    with pytest.raises(tune.Invalid, match="model"):
        asyncio.run(tune.run_pass(body, book, kube, Settings(), "spec changed"))  # type: ignore[arg-type]
    assert book.get("phase") == "Invalid" and book.get("recommendation") is None
    cond = book.cond("Recommended")
    assert cond["reason"] == "InvalidSpec" and "model: " in cond["message"] and kube.config_maps == ()


def test_the_search_process_refuses_model_paths_too() -> None:
    """The child validates and resolves names only: a spec that reached it with a path (an older
    operator's status, a direct call) is refused there as well."""
    catalog = next(iter(_catalog_files().values()))
    spec = {**parse_tuning_spec(SPEC).model_dump(by_alias=True, mode="json"), "model": str(catalog)}
    with pytest.raises(search.SearchFailed) as err:
        asyncio.run(search.run_search(spec, [], "chat", "llm", stage2_top=1, timeout_s=120))
    assert err.value.invalid and "not a Hugging Face id" in str(err.value)
