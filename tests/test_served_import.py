"""Served numbers from production (tracker/store/importers/served.py). The vLLM log lines and
/metrics scrapes of a real vLLM are imported in tests/test_engines_vllm.py; SGLang's lines here are
written by its own f-string (`srt/managers/scheduler_components/metrics_reporter.py`, 0.5.23):
`f"Decode batch{iter_msg}, #running-req: {n}, {token_usage_msg}" + f"accept len: {x:.2f}, accept rate:
{y:.2f}, "` and then the throughput part."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from tracker.cli import main


def sglang_line(time: str, accept_len: float, rate: float, iteration: int | None = None) -> str:
    iter_msg = f" [{iteration}]" if iteration is not None else ""
    return (f"[{time} TP0] Decode batch{iter_msg}, #running-req: 1, #token: 812, token usage: 0.01, "
            f"accept len: {accept_len:.2f}, accept rate: {rate:.2f}, cuda graph: True, gen throughput (token/s): "
            f"181.22, #queue-req: 0, \n")


def _runs(store: str):
    client = MlflowClient(store)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_sglang_log_lines_become_a_served_run_with_their_window(tmp_path, capsys):
    log = tmp_path / "sglang.log"
    log.write_text("[2026-12-02 10:00:00] server_args=ServerArgs(...)\n"
                   + sglang_line("2026-12-02 10:00:40", 3.20, 0.31)
                   + sglang_line("2026-12-02 10:01:20", 3.60, 0.37, iteration=80)
                   + "[2026-12-02 10:01:21] INFO: 127.0.0.1 - \"POST /generate HTTP/1.1\" 200 OK\n")
    store = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["import-results", str(log), "--format", "sglang-log", "--tracking-uri", store]) == 0
    [run] = _runs(store)
    assert run.data.metrics["sglang_accept_len"] == pytest.approx(3.4)  # the mean of the two intervals
    assert "tau" not in run.data.metrics and "engine_mean_acceptance_length" not in run.data.metrics
    tags = run.data.tags
    assert tags["protocol.scoring"] == "imported" and tags["protocol.backend"] == "sglang"
    assert (tags["protocol.window_start"], tags["protocol.window_end"]) == ("2026-12-02 10:00:40", "2026-12-02 10:01:20")


def test_a_sglang_gauge_scrape_and_files_with_nothing_served(tmp_path, capsys):
    scrape = tmp_path / "metrics.txt"
    scrape.write_text('# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.\n'
                      '# TYPE sglang:spec_accept_length gauge\n'
                      'sglang:spec_accept_length{model_name="Qwen/Qwen3.5-27B"} 4.25\n')
    store = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["import-results", str(scrape), "--format", "prometheus", "--tracking-uri", store]) == 0
    assert _runs(store)[0].data.metrics["sglang_accept_len"] == 4.25
    capsys.readouterr()
    empty = tmp_path / "empty.log"
    empty.write_text("INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n")
    for fmt in ("vllm-log", "sglang-log", "prometheus"):
        assert main(["import-results", str(empty), "--format", fmt, "--tracking-uri", store]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: ") and "empty.log" in line
    assert len(_runs(store)) == 1  # nothing half-imported
