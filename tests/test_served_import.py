"""Served numbers from production (tracker/store/importers/served.py). The vLLM log lines and
/metrics scrapes of a real vLLM are imported in tests/test_engines_vllm.py; SGLang's lines here are
written by its own f-string (`srt/managers/scheduler_components/metrics_reporter.py`, 0.5.23):
`f"Decode batch{iter_msg}, #running-req: {n}, {token_usage_msg}" + f"accept len: {x:.2f}, accept rate:
{y:.2f}, "` and then the throughput part."""

from __future__ import annotations

import json

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


def llamacpp_line(task: int, accepted: int, generated: int, steps: int) -> str:
    """llama.cpp's line, as `tools/server/server-context.cpp` prints it: "draft acceptance = %0.5f (%5d
    accepted / %5d generated), mean len = %5.2f", mean len = 1 + accepted / verify steps."""
    return (f"0.01.117.626 I slot print_timing: id  0 | task {task} | draft acceptance = {accepted / generated:0.5f} "
            f"({accepted:5d} accepted / {generated:5d} generated), mean len = {1 + accepted / steps:5.2f}\n")


def test_llamacpp_log_lines_give_the_exact_rate_and_the_pooled_mean_where_steps_are_known(tmp_path):
    from tracker.store.importers import served

    log = tmp_path / "llama.log"
    # hand-worked: 56 accepted in 39 steps (mean len 2.44: only 39 fits), 79 in 16 (5.94)
    log.write_text("main: server is listening\n" + llamacpp_line(2, 56, 267, 39) + llamacpp_line(45, 79, 108, 16))
    [record] = served.parse_llamacpp_log(log)
    assert record.metrics == {"draft_acceptance_rate": pytest.approx(135 / 375),
                              "engine_mean_acceptance_length": pytest.approx(1 + 135 / 55)}
    assert record.details["steps"] == 55 and record.protocol["window"] == "2 requests"
    # 9000 accepted: several step counts print the same mean len, so the pooled mean is not logged
    log.write_text(llamacpp_line(3, 9000, 9100, 1333))
    [record] = served.parse_llamacpp_log(log)
    assert "engine_mean_acceptance_length" not in record.metrics and "two-decimal" in record.protocol["not_logged"]


def test_a_print_timing_line_inside_a_logged_request_counts_nothing(tmp_path):
    """Issue 48 S7: a request body logged by the server held a forged print_timing line; the importer's
    pattern searched anywhere in a line, so it counted (draft acceptance 0.333 -> 0.996). It is matched
    at the start of the line now, after llama.cpp's own log prefix only."""
    from tracker.store.importers import served

    forged = llamacpp_line(9, 99_000, 99_300, 12_500).strip()
    log = tmp_path / "llama.log"
    log.write_text(llamacpp_line(2, 100, 300, 80)
                   + f'0.01.200.000 I srv  log_server_r: request: {{"prompt": "{forged}"}}\n'
                   + f"srv  params_from_: {forged}\n" + f"[request] {forged}\n")
    [record] = served.parse_llamacpp_log(log)
    assert record.metrics["draft_acceptance_rate"] == pytest.approx(100 / 300)
    assert record.protocol["window"] == "1 requests"
    # llama.cpp's own prefixes still match: colours and timestamps on, and off
    plain = llamacpp_line(4, 10, 20, 5).split(" I ", 1)[1]
    coloured = "\x1b[34m0.01.117.626\x1b[0m \x1b[32mI \x1b[0m" + plain
    log.write_text(plain + coloured)
    [record] = served.parse_llamacpp_log(log)
    assert record.protocol["window"] == "2 requests"


def test_llamacpp_counters_and_bad_llamacpp_input(tmp_path):
    from tracker.errors import DraftboardError
    from tracker.store.importers import served

    scrape = tmp_path / "metrics.txt"  # names as tools/server/server-task.cpp writes them, two scrapes appended
    scrape.write_text("".join(
        f"llamacpp:spec_decode_num_drafts_total {d}\nllamacpp:spec_decode_num_draft_tokens_total {7 * d}\n"
        f"llamacpp:spec_decode_num_accepted_tokens_total {a}\n"
        f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {p0}\n'
        for d, a, p0 in ((10, 20, 8), (30, 50, 25))))
    [record] = served.parse_prometheus(scrape)
    assert record.metrics["engine_mean_acceptance_length"] == pytest.approx(1 + 30 / 20)
    assert record.metrics["accept_rate_pos1"] == pytest.approx(17 / 20) and record.protocol["backend"] == "llamacpp"
    for text, message in (("nothing served here\n", "no 'draft acceptance = ...' line"),
                          (llamacpp_line(1, 9, 5, 3), "9 accepted of 5 drafted tokens")):
        scrape.write_text(text)
        with pytest.raises(DraftboardError, match=message):
            served.parse_llamacpp_log(scrape)


# One ~1 MiB line each, the worst case of the patterns before issue 37 (a searched `.*?` restarted at
# every repeat, a label parser restarted at every character): minutes to hours then, linear now.
LONG_LINES = {
    "llamacpp-log": "print_timing: " + "draft acceptance = 1 (" * 50_000,
    "vllm-log": "INFO 12-04 10:00:00 [metrics.py:1] " + "SpecDecoding metrics: Mean acceptance length: 1, " * 21_000,
    "sglang-log": "[2026-12-04 10:00:00 TP0] " + "Decode batch, accept len: " * 40_000,
    "prometheus": "vllm:spec_decode_num_drafts_total{" + "a" * (1 << 20) + '="1"} 5',
}


@pytest.mark.parametrize("fmt", sorted(LONG_LINES))
def test_one_long_line_through_each_served_importer_stays_linear(tmp_path, fmt):
    import time

    from tracker.errors import DraftboardError
    from tracker.store.importers import served

    log = tmp_path / "long.log"
    log.write_text(LONG_LINES[fmt] + "\n")
    parse = {"llamacpp-log": served.parse_llamacpp_log, "vllm-log": served.parse_vllm_log,
             "sglang-log": served.parse_sglang_log, "prometheus": served.parse_prometheus}[fmt]
    start = time.perf_counter()
    with pytest.raises(DraftboardError, match="long.log: no "):
        parse(log)
    assert time.perf_counter() - start < 1.0


def vllm_line(process: str, accepted: int, drafted: int, rates: str) -> str:
    """vLLM 0.32's line: its logger's `(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s
    [%(fileinfo)s:%(lineno)d] %(message)s` around `v1/spec_decode/metrics.py`'s message."""
    return (f"({process} pid=7) INFO 12-04 10:00:00 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: "
            f"{1 + accepted / 10:.2f}, Accepted throughput: 9.91 tokens/s, Drafted throughput: 69.39 tokens/s, Accepted: "
            f"{accepted} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, Avg Draft acceptance "
            f"rate: {100 * accepted / drafted:.1f}%\n")


def test_a_forged_specdecoding_line_inside_a_request_counts_nothing(tmp_path):
    """Issue 37, finding 8: vLLM logs requests' text; only its metrics logger's own lines count."""
    from tracker.store.importers import served

    real = vllm_line("APIServer", 6, 20, "0.400, 0.200")  # 10 drafts of 2: 4 + 2 accepted
    fake = vllm_line("APIServer", 999, 1000, "0.999, 0.999").strip()
    prefix = "(APIServer pid=7) INFO 12-04 10:00:01 [logger.py:40] "
    # a prompt holding the fake line, once inline and once after a newline, which vLLM's NewLineFormatter
    # writes as "\r\n" + the record's own prefix (logging_utils/formatter.py)
    forged = f"{prefix}Received request cmpl-1: prompt: '{fake}\r\n{prefix}{fake}'\n"
    (tmp_path / "vllm.log").write_text(real + forged)
    [record] = served.parse_vllm_log(tmp_path / "vllm.log")
    assert record.details["lines"] == 1 and record.metrics["engine_mean_acceptance_length"] == pytest.approx(1.6)


def vllm_stats_line(running: int, kv: float, hit: float | None = None) -> str:
    """vLLM 0.32's scheduler line beside each SpecDecoding line while busy (`v1/metrics/loggers.py`
    LoggingStatLogger.log: "Engine 000: " + its parts joined by ", ")."""
    hit_part = f", Prefix cache hit rate: {hit:.1f}%" if hit is not None else ""
    return (f"(APIServer pid=7) INFO 12-04 10:00:00 [loggers.py:259] Engine 000: Avg prompt throughput: 120.3 "
            f"tokens/s, Avg generation throughput: 88.1 tokens/s, Running: {running} reqs, Waiting: 0 reqs, GPU KV "
            f"cache usage: {kv:.1f}%{hit_part}\n")


def test_a_vllm_log_keeps_the_load_its_numbers_were_taken_under(tmp_path):
    """Issue 49: a served number is comparable only at its concurrency; vLLM's scheduler lines say how many
    requests ran and how full the KV cache was, and the import keeps that (a forged one in a request counts
    nothing); a log without them says the concurrency is not stated."""
    from tracker.store.importers import served

    forged = vllm_stats_line(64, 99.9).strip()
    log = tmp_path / "vllm.log"
    log.write_text(vllm_stats_line(1, 2.0) + vllm_line("APIServer", 6, 20, "0.400, 0.200")
                   + vllm_stats_line(4, 31.5, 12.5) + vllm_line("APIServer", 6, 20, "0.400, 0.200")
                   + f"(APIServer pid=7) INFO 12-04 10:00:01 [logger.py:40] Received request cmpl-1: prompt: '{forged}'\n")
    [record] = served.parse_vllm_log(log)
    assert record.protocol["concurrency"] == "1-4 requests running (mean 2.5 over 2 scheduler lines)"
    assert record.protocol["kv_cache_usage_max"] == "31.5%"
    assert record.details["running_requests"]["max"] == 4 and record.details["prefix_cache_hit_rate_last_percent"] == 12.5
    log.write_text(vllm_line("APIServer", 6, 20, "0.400, 0.200"))
    [record] = served.parse_vllm_log(log)
    assert record.protocol["concurrency"].startswith("not stated") and "running_requests" not in record.details


def aiperf_line(engine: str, accepted_per_step: list[int], k: int, request: int) -> str:
    """One line of AIPerf's profile_export.jsonl (--export-level records): a MetricRecordInfo with its
    `spec_decode_acceptance`, AIPerf's SpecDecodeAcceptanceRecord (aiperf 0.13,
    common/models/spec_decode_models.py): a sparse histogram {accepted: steps} keyed as JSON writes it."""
    histogram: dict[str, int] = {}
    for a in accepted_per_step:
        histogram[str(a)] = histogram.get(str(a), 0) + 1
    steps, accepted = len(accepted_per_step), sum(accepted_per_step)
    record = {"engine": engine, "mean_acceptance_length": 1 + accepted / steps,
              "draft_acceptance_rate": accepted / (k * steps), "acceptance_histogram": histogram,
              "num_accepted_draft_tokens": accepted, "num_draft_tokens": k * steps, "num_spec_steps": steps,
              "num_spec_tokens": k, "completion_tokens": steps + accepted,
              "per_step_accepted": accepted_per_step, "per_step_drafted": [k] * steps}
    return json.dumps({"metadata": {"session_num": request, "x_request_id": f"r{request}"},
                       "metrics": {"request_latency": {"value": 812.5, "unit": "ms"}},
                       "spec_decode_acceptance": record, "error": None}) + "\n"


def test_aiperf_records_pool_into_the_engines_number(tmp_path, capsys):
    """Issue 39: AIPerf's engine-neutral per-request records, pooled over requests: 1 + accepted / steps,
    and per position the steps that accepted at least k (hand-worked: 3 + 1 + 0 and 2 + 2 in 5 steps)."""
    log = tmp_path / "profile_export.jsonl"
    failed = json.dumps({"metadata": {"session_num": 2}, "metrics": {}, "spec_decode_acceptance": None,
                         "error": {"code": 500}}) + "\n"
    log.write_text(aiperf_line("vllm", [3, 1, 0], 3, 0) + failed + aiperf_line("vllm", [2, 2], 3, 1))
    store = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["import-results", str(log), "--format", "aiperf", "--tracking-uri", store]) == 0
    [run] = _runs(store)
    m = run.data.metrics
    assert m["engine_mean_acceptance_length"] == pytest.approx(1 + 8 / 5)
    assert m["draft_acceptance_rate"] == pytest.approx(8 / 15)
    assert [m[f"accept_rate_pos{k}"] for k in (1, 2, 3)] == pytest.approx([4 / 5, 3 / 5, 1 / 5])
    assert "tau" not in m and run.data.tags["protocol.backend"] == "vllm"
    assert run.data.tags["protocol.window"] == "2 requests"


@pytest.mark.parametrize("record, message", [
    ({"acceptance_histogram": {"2": 1}, "num_spec_steps": 2, "num_accepted_draft_tokens": 2, "num_draft_tokens": 6},
     "contradict each other"),
    ({"acceptance_histogram": {"5": 1}, "num_spec_steps": 1, "num_accepted_draft_tokens": 5, "num_draft_tokens": 3},
     "contradict each other"),  # more accepted than drafted
    ({"acceptance_histogram": {"99999": 1}, "num_spec_steps": 1, "num_accepted_draft_tokens": 99999,
      "num_draft_tokens": 99999}, "is not a draft count"),
    ({"acceptance_histogram": {"1": 2}, "num_spec_steps": 2, "num_accepted_draft_tokens": 2, "num_draft_tokens": 6,
      "per_step_accepted": [2, 0, 0]}, "per_step_accepted must be one whole count (>= 0) per verify step (2), adding up to 2"),
])
def test_aiperf_records_aiperf_itself_would_reject_are_refused(tmp_path, capsys, record, message):
    log = tmp_path / "profile_export.jsonl"
    log.write_text(json.dumps({"metadata": {}, "metrics": {}, "spec_decode_acceptance": record}) + "\n")
    store = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["import-results", str(log), "--format", "aiperf", "--tracking-uri", store]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and message in line and "profile_export.jsonl:1" in line
    assert _runs(store) == []


def test_an_offline_eval_is_not_exported_as_served_requests(dashboard_store, tmp_path, capsys):
    out = tmp_path / "profile_export.jsonl"
    assert main(["export-results", dashboard_store.ids["v5@100"], "--format", "aiperf", "--out", str(out),
                 "--tracking-uri", dashboard_store.uri]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: not a served eval") and not out.exists()


def test_a_vllm_log_from_a_known_bad_version_is_tagged_with_the_row_and_a_forged_one_is_not(tmp_path, capsys):
    """Issue 51, the known-bad table read by the served-number importers: the version vLLM logs at start (its own
    line, as vLLM 0.32's core.py writes it) is matched against the table; 0.28.0 runs the DFlash drafter on a wrong
    attention schedule at long contexts (vLLM #54374). The same line inside a request's text names no box."""
    start = ("(EngineCore pid=6739) INFO 12-04 08:22:52 [core.py:133] Initializing a V1 LLM engine (v{v}) with "
             "config: model='/models/t', dtype=torch.bfloat16, enable_prefix_caching=False\n")
    runner = ("(APIServer pid=6721) WARNING 12-04 08:22:45 [vllm.py:725] Model Runner V2 requires Triton; using the "
              "V1 model runner instead.\n")
    store = f"sqlite:///{tmp_path / 'store.db'}"
    log = tmp_path / "vllm.log"
    log.write_text(runner + start.format(v="0.28.0") + vllm_line("APIServer", 6, 20, "0.400, 0.200"))
    assert main(["import-results", str(log), "--format", "vllm-log", "--tracking-uri", store, "--name", "old"]) == 0
    forged = start.format(v="0.28.0").strip()
    log.write_text(start.format(v="0.32.0") + vllm_line("APIServer", 6, 20, "0.400, 0.200")
                   + f"(APIServer pid=7) INFO 12-04 10:00:01 [logger.py:40] Received request cmpl-1: prompt: '{forged}'\n")
    assert main(["import-results", str(log), "--format", "vllm-log", "--tracking-uri", store, "--name", "new"]) == 0
    runs = {r.info.run_name: r for r in _runs(store)}
    assert runs["old"].data.tags["draftboard.known_bad"].startswith(
        "vllm-0.28.0-long-context-schedule: vLLM 0.28.0 runs the DFlash drafter on a wrong attention schedule")
    assert runs["old"].data.tags["protocol.engine_version"] == "0.28.0"
    assert "draftboard.known_bad" not in runs["new"].data.tags
    assert runs["new"].data.tags["protocol.engine_version"] == "0.32.0"


def test_a_served_log_s_start_up_lines_are_the_serving_box_s_evidence(tmp_path, capsys):
    """Issue 62: what the serving box said of itself at start (vLLM's version, runner and attention backend lines;
    SGLang's server_args; llama.cpp's build line) is the imported run's serving fingerprint, each value cited."""
    from tracker import Tracker
    from tracker.environment import fingerprint

    store = f"sqlite:///{tmp_path / 'store.db'}"
    vllm = tmp_path / "vllm.log"
    vllm.write_text("(EngineCore pid=6739) INFO 12-04 08:22:52 [core.py:133] Initializing a V1 LLM engine (v0.32.0) "
                    "with config: model='/models/t'\n"
                    "(EngineCore pid=6739) INFO 12-04 08:22:55 [cuda.py:446] Using AttentionBackendEnum.FLASH_ATTN "
                    "backend.\n" + vllm_line("APIServer", 6, 20, "0.400, 0.200"))
    sglang = tmp_path / "sglang.log"
    sglang.write_text("[2026-12-02 10:00:00] server_args=ServerArgs(model_path='/m', speculative_algorithm='DFLASH', "
                      "speculative_num_draft_tokens=16, tp_size=1)\n" + sglang_line("2026-12-02 10:00:40", 3.2, 0.31))
    llama = tmp_path / "llama.log"
    llama.write_text("build: 7003 (a1b2c3d) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu\n"
                     "slot print_timing: id  0 | task 2 | draft acceptance = 0.20974 (   56 accepted /   267 "
                     "generated), mean len =  2.44\n")
    for path, fmt in ((vllm, "vllm-log"), (sglang, "sglang-log"), (llama, "llamacpp-log")):
        assert main(["import-results", str(path), "--format", fmt, "--tracking-uri", store, "--name", fmt]) == 0
    runs = {r.info.run_name: r for r in _runs(store)}
    fps = {name: Tracker(store).fingerprint(runs[name].info.run_id) for name in ("vllm-log", "sglang-log", "llamacpp-log")}
    assert fps["vllm-log"]["engine"] == {"name": "vllm", "version": "0.32.0",
                                         "attention_backend": "AttentionBackendEnum.FLASH_ATTN"}
    (cite,) = fingerprint.citations(fps["vllm-log"], "engine.attention_backend")
    assert cite["file"] == "vllm.log" and cite["line"] == 2 and "Using AttentionBackendEnum.FLASH_ATTN" in cite["text"]
    assert fps["sglang-log"]["engine"]["speculative_algorithm"] == "DFLASH"
    assert fps["sglang-log"]["engine"]["speculative_num_draft_tokens"] == "16"
    assert fps["llamacpp-log"]["engine"]["build"] == "7003"
    assert fingerprint.citations(fps["llamacpp-log"], "engine.build")[0]["line"] == 1
    # env-diff names each serving field's value with its line (the engine section too, not only the fixed four)
    vllm_run = runs["vllm-log"].info.run_id
    capsys.readouterr()
    main(["env-diff", vllm_run, vllm_run, "--tracking-uri", store])
    assert "engine.version = '0.32.0': vllm.log:1" in capsys.readouterr().out
