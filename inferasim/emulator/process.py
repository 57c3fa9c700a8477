"""The emulator in a child process (`python -m inferasim.emulator`): :func:`spawn_emulator` starts
one and waits until it serves, :class:`EmulatorProcess` talks to it over HTTP and stops it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from inferasim.emulator.config import EmulatorConfig, resolve
from inferasim.model.steptime import StepParams

# ------------------------------------------------------------------------------------------------
# a separate process: timing-sensitive tests keep the emulator off the test process's GIL
# ------------------------------------------------------------------------------------------------

class EmulatorProcess:
    """An emulator in a child process (`python -m inferasim.emulator`); the EmulatorHandle
    interface over HTTP. Why: an in-process emulator shares the GIL with the client under test,
    and on small machines the client's parsing then delays the emulator's token delivery."""

    def __init__(self, proc: Any, url: str, config: EmulatorConfig) -> None:
        self.proc = proc
        self.url = url
        self.config = config
        self.port = int(url.rsplit(":", 1)[1])
        self.served_model_name = config.served_model_name or config.model

    def set_params(self, params: StepParams) -> None:
        import httpx

        r = httpx.post(f"{self.url}/_inferasim/params", json=params.as_dict(), timeout=10.0)
        r.raise_for_status()

    @property
    def params(self) -> StepParams:
        import httpx

        return StepParams.from_dict(httpx.get(f"{self.url}/_inferasim/params", timeout=10.0).json()["params"])

    def stats(self) -> dict[str, Any]:
        import httpx

        return dict(httpx.get(f"{self.url}/_inferasim/stats", timeout=10.0).json())

    def metrics_text(self) -> str:
        import httpx

        return httpx.get(f"{self.url}/metrics", timeout=10.0).text

    def stop(self, timeout: float = 10.0) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> EmulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def config_to_argv(config: EmulatorConfig) -> list[str]:
    argv = ["--model", config.model, "--gpu", config.gpu, "--engine", config.engine, "--tp", str(config.tp),
            "--ep", str(config.ep), "--pp", str(config.pp), "--dp", str(config.dp), "--host", config.host,
            "--port", str(config.port), "--speedup", repr(float(config.speedup)), "--precision", config.precision,
            "--seed", str(config.seed), "--natural-output-mean", str(config.natural_output_mean)]
    if config.stream_interval is not None:
        argv += ["--stream-interval-ms", repr(config.stream_interval * 1e3)]
    if config.stall_at_batch is not None:
        argv += ["--stall-at-batch", str(config.stall_at_batch), "--stall-s", repr(float(config.stall_s))]
    if config.params is not None:
        argv += ["--params-json", json.dumps(config.params.as_dict())]
    elif config.anchor:
        argv += ["--anchor", str(config.anchor)]
    for flag, value in (("--kv-cache-dtype", config.kv_dtype), ("--engine-version", config.engine_version or None),
                        ("--served-model-name", config.served_model_name), ("--max-num-seqs", config.max_num_seqs),
                        ("--max-num-batched-tokens", config.max_batched_tokens),
                        ("--max-model-len", config.max_model_len)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def spawn_emulator(config: EmulatorConfig, ready_timeout: float = 60.0) -> EmulatorProcess:
    """Start `python -m inferasim.emulator` with `config` and wait for its "listening on" line."""
    import subprocess
    import sys
    import tempfile

    resolve(config)  # bad input fails here, with the catalogs' message, not in the child
    # stderr goes to a file, not a pipe: nobody reads a pipe after start-up, and a full one
    # would block the child.
    errfile = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "inferasim.emulator", *config_to_argv(config)],
                            stdout=subprocess.PIPE, stderr=errfile, text=True)
    result: dict[str, str] = {}

    def read_line() -> None:
        assert proc.stdout is not None
        result["line"] = proc.stdout.readline()

    reader = threading.Thread(target=read_line, daemon=True)
    reader.start()
    reader.join(ready_timeout)
    line = result.get("line", "")
    if "listening on " not in line:
        proc.kill()
        proc.wait(timeout=10)
        errfile.seek(0)
        err = errfile.read()
        errfile.close()
        raise RuntimeError(f"the emulator process did not start: {line.strip()} {err.strip()[-2000:]}")
    errfile.close()
    return EmulatorProcess(proc, line.rsplit("listening on ", 1)[1].strip(), config)
