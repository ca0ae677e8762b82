"""Engine servers for the tests where no real engine can run here: answers shaped as the engines'
own sources write them. SGLang cannot run on these CPUs; vLLM does (tests/test_engines_vllm.py),
so only its failure modes (a server that never gets healthy, one that dies mid-run) are scripted.

SGLang 0.5.23 (`pip download --no-deps sglang==0.5.23`), read from its wheel:
- `sglang/srt/entrypoints/http_server.py`: `GET /health`; `GET /server_info` = `build_server_info`
  (`sglang/srt/utils/common.py`: `server_args.resolved_dict()` + `launch_command` + scheduler info)
  plus `version`, `startup_time`, `internal_states`, `frontend`; `POST /generate`.
- `sglang/srt/managers/tokenizer_manager.py`: a reply is {"text", "output_ids", "meta_info"};
  `_calculate_spec_decoding_metrics` writes `spec_accept_rate` (correct / proposed),
  `spec_accept_length` (completion_tokens / spec_verify_ct), `spec_num_correct_drafts`,
  `spec_num_proposed_drafts` (= spec_verify_ct x (speculative_num_draft_tokens - 1)), `spec_verify_ct`
  and `spec_correct_drafts_histogram` (`schedule_batch.py`: index = correct drafts of one step).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import time

from loopback import LoopbackServer


def sglang_meta(prompt_tokens: int, steps: list[int], num_draft_tokens: int) -> dict:
    """meta_info for a completion whose verify steps accepted `steps` draft tokens each."""
    completion_tokens = 1 + sum(a + 1 for a in steps)  # the prefill's token, then each step's
    hist = [0] * (max(steps) + 1)
    for a in steps:
        hist[a] += 1
    proposed = len(steps) * (num_draft_tokens - 1)
    return {"id": "0", "finish_reason": {"type": "length", "length": completion_tokens},
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "cached_tokens": 0,
            "spec_accept_rate": sum(steps) / proposed, "spec_accept_length": completion_tokens / len(steps),
            "spec_num_correct_drafts": sum(steps), "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": len(steps), "spec_correct_drafts_histogram": hist, "e2e_latency": 0.01}


class SGLangServer(LoopbackServer):
    """A loopback server answering /health, /server_info and /generate as SGLang does.

    replies: {tuple(input_ids): (output_ids, meta_info)}; server_info: the resolved server args."""

    def __init__(self, server_info: dict, replies: dict[tuple, tuple[list[int], dict]]):
        self.requests: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, code: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (the stdlib's name)
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/server_info":
                    self._send(200, {**server_info, "startup_time": 1.0, "internal_states": [{}],
                                     "frontend": "python"})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                ids, meta = replies[tuple(body["input_ids"])]
                self._send(200, {"text": "", "output_ids": ids, "meta_info": meta})

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def _scripted_engine(mode: str, mark: str, argv: list[str]) -> None:
    """Run as a managed engine's "Python" (`python -m vllm... --port P ...`): `never-healthy` holds its
    port open without answering /health; `dies` is healthy and vLLM-shaped until the first completion,
    then exits. Either starts a child of its own, as vLLM's engine core is, to show the group dies too;
    `mark` is in every one of their command lines, so a test can look for them. Asked to run code
    (`-c`: the eval's probes of the engine's Python), it fails at once, as an interpreter without the
    engine would: the probes then report nothing."""
    if "-c" in argv:
        sys.exit(1)
    port = int(argv[argv.index("--port") + 1])
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", mark])  # the "engine core"
    if mode == "never-healthy":
        time.sleep(600)
        return
    n_spec = json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]
    metrics = 'vllm:spec_decode_num_drafts_total{engine="0"} 0.0\n' + "".join(
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{k}"}} 0.0\n' for k in range(n_spec))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = {"/health": b"", "/version": b'{"version": "0.32.0"}', "/metrics": metrics.encode(),
                    "/v1/models": json.dumps({"data": [{"id": "t", "root": argv[argv.index("--model") + 1],
                                                        "max_model_len": 512}]}).encode()}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def do_POST(self):  # noqa: N802
            os._exit(3)

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    _scripted_engine(sys.argv[1], sys.argv[2], sys.argv[3:])
