"""The LLM proposer against a real local HTTP server speaking the OpenAI chat API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inferasim.core.spec import parse_spec
from inferasim.search.tune import tune

REPLY: dict[str, str] = {"content": "[]"}


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["messages"][0]["role"] == "system"
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": REPLY["content"]}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


SPEC = {
    "model": "meta-llama/Meta-Llama-3.1-8B", "precision": ["bf16"],
    "hardware": {"gpu": "H100", "maxGPUs": 2}, "engines": ["vllm"],
    "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 1500, "itlP90Ms": 40}},
    "workload": {"static": {"kind": "poisson", "requestRate": 4, "inputTokens": 1024, "outputTokens": 256}},
    "search": {"maxNumSeqs": [64], "maxNumBatchedTokens": [8192], "chunkedPrefill": [True], "disaggregation": False},
}


def test_proposals_are_scored_or_rejected_with_reasons(endpoint: str) -> None:
    REPLY["content"] = "Here you go:\n```json\n" + json.dumps([
        {"engine": "vllm", "precision": "bf16", "tp": 1, "max_num_seqs": 384, "max_num_batched_tokens": 4096},
        {"engine": "vllm", "precision": "bf16", "tp": 16},
        {"engine": "sglang", "precision": "bf16", "tp": 1},
        {"tp": "many"},
        "not an object",
    ]) + "\n```"
    result = tune(parse_spec(SPEC), stage2_top=0, propose_with=(endpoint, "test"))
    verdicts = [p["verdict"] for p in result.proposals]
    assert verdicts == ["accepted", "rejected", "rejected", "rejected", "rejected"]
    assert all(p["reason"] for p in result.proposals if p["verdict"] == "rejected")
    scored = [e for e in result.ranked if e.candidate.max_num_seqs == 384]
    assert scored and "proposed by the LLM proposer" in scored[0].notes[-1]


def test_unparsable_reply_is_rejected_not_fatal(endpoint: str) -> None:
    REPLY["content"] = "I would use tensor parallelism."
    result = tune(parse_spec(SPEC), stage2_top=0, propose_with=(endpoint, "test"))
    assert result.proposals[0]["verdict"] == "rejected" and "unparsable" in result.proposals[0]["reason"]
    assert result.recommendation is not None


def test_unreachable_endpoint_is_reported() -> None:
    result = tune(parse_spec(SPEC), stage2_top=0, propose_with=("http://127.0.0.1:9", "test"))
    assert "endpoint failed" in result.proposals[0]["reason"]
