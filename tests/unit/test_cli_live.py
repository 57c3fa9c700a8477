"""`inferasim anchors fit-live` / `drift` argument handling (the live path runs in
tests/integration/test_passive_live.py against a real Prometheus and emulator)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from inferasim.cli import main
from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.render import render_manifests, to_yaml


def manifest(tmp_path: Path) -> Path:
    cfg = ServingConfig(engine="vllm", model="meta-llama/Llama-3.1-8B", gpu="H100", layout=Layout(tp=1),
                        engine_version="0.10.1")
    path = tmp_path / "deploy.yaml"
    path.write_text(to_yaml(render_manifests(cfg, "chat")))
    return path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


def test_fit_live_unreachable_prometheus_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    rc = main(["anchors", "fit-live", "--prometheus", url, "--selector", "namespace=llm,app=chat",
               "--deployment", str(manifest(tmp_path)), "--window", "10m", "--step", "1m"])
    assert rc == 1 and "unreachable" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--selector", "namespace=llm"], "needs --prometheus"),
    (["--prometheus", "http://p:9090"], "--selector is required"),
    (["--prometheus", "http://p:9090", "--selector", "namespace"], "must be LABEL=VALUE"),
    (["--prometheus", "http://p:9090", "--selector", "a=b", "--window", "1 hour"], "--window: '1 hour'"),
])
def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                              message: str) -> None:
    rc = main(["anchors", "fit-live", "--deployment", str(manifest(tmp_path)), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err
