"""Importers of files other tools write, each on a file in the tool's real format written here.

Formats, from the tools' sources: z-lab dflash/benchmark.py prints its summary (rich wraps long
lists when stdout is a file); speculators' evaluate script writes acceptance.csv; DDTree's
benchmark.py `torch.save`s responses of SimpleNamespaces; SpecForge / speculators write
TensorBoard events through torch's SummaryWriter; speculators' eval_command.txt and spec_acceptance.py
folders and SpecForge's evaluate-checkpoint report come from tests/evalformats.py.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from mlflow import MlflowClient

from tracker import redact
from tracker.cli import main
from tracker.errors import DraftboardError
from tracker.store import adoption, names
from tests import evalformats
from tracker.store.importers import (ddtree_benchmark, foreign_run, results, spec_acceptance, specforge_eval, speculators_acceptance,
                                     tensorboard, zlab_benchmark)

HIST_16 = [0.0, 10.0, 9.0, 8.0, 7.0, 6.0, 6.0, 5.0, 5.0, 4.0, 4.0, 4.0, 3.0, 3.0, 3.0, 3.0, 20.0]

ZLAB_LOG = """\
[download] gsm8k ...
[cached] /home/u/dflash/cache/gsm8k.jsonl  (1319 samples)
100%|██████████| 128/128 [10:02<00:00,  4.71s/it]
Baseline throughput: 41.20 tok/s
DFlash throughput:  160.11 tok/s
Decoding speedup: 3.89
Average Acceptance length: 6.52
Acceptance length histogram: ['0.0%', '10.0%', '9.0%', '8.0%', '7.0%', '6.0%', '6.0%', '5.0%',
'5.0%', '4.0%', '4.0%', '4.0%', '3.0%', '3.0%', '3.0%', '3.0%', '20.0%']
[cached] /home/u/dflash/cache/math500.jsonl  (500 samples)
Baseline throughput: 40.00 tok/s
DFlash throughput:  \x1b[1;36m200.00\x1b[0m tok/s
Decoding speedup: 5.00
Average Acceptance length: 7.10
Acceptance length histogram: ['0.0%', '50.0%', '50.0%']
"""


@pytest.fixture
def train_run(tracker):
    with tracker.training_run("drafter-v4", {"block_size": 16}, "Qwen/Qwen3-8B", fingerprint={"source": {}}) as run:
        run.log_step(1, loss=1.0)
    return run.run_id


def test_zlab_benchmark_log_gives_tau_and_rates_per_dataset(tmp_path, tracker, train_run):
    log = tmp_path / "bench.log"
    log.write_text(ZLAB_LOG)
    gsm8k, math500 = zlab_benchmark.parse_benchmark_log(log)
    assert (gsm8k.dataset, math500.dataset) == ("gsm8k", "math500")
    assert gsm8k.metrics["tau"] == 6.52 and gsm8k.metrics["streak"] == pytest.approx(5.52)
    assert gsm8k.protocol["block_size"] == "16"
    # draft k accepted <=> acceptance length >= k + 1
    assert gsm8k.metrics[names.accept_rate_metric(1)] == pytest.approx(sum(HIST_16[2:]) / 100)
    assert gsm8k.metrics[names.accept_rate_metric(15)] == pytest.approx(0.20)
    assert gsm8k.details["printed"]["speedup"] == 3.89 and math500.details["printed"]["dflash_tok_s"] == 200.0
    assert gsm8k.metrics["decoding_speedup"] == 3.89  # the quantity `--scoring online` measures, by the same name
    assert math500.protocol["block_size"] == "2" and math500.metrics[names.accept_rate_metric(1)] == 0.5

    run_ids = results.log_imported(tracker, [gsm8k, math500], source=log, fmt=zlab_benchmark.FORMAT,
                                   name="z-lab bench", train_run_id=train_run)
    run = tracker.run(run_ids[0])
    assert run.data.tags["protocol.scoring"] == "imported" and run.data.tags[names.IMPORTED] == "1"
    assert run.data.tags["protocol.dataset"] == "gsm8k" and run.data.tags["protocol.block_size"] == "16"
    assert run.data.tags[names.TRAIN_RUN_ID] == train_run and run.data.tags[names.TARGET] == "Qwen/Qwen3-8B"
    assert run.data.tags[names.KIND] == "eval" and run.data.metrics["tau"] == 6.52
    assert run.info.run_name == "z-lab bench · gsm8k"


def test_zlab_log_without_any_summary_or_with_unnamed_sections_is_refused(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("[download] gsm8k ...\nTraceback (most recent call last):\n")
    with pytest.raises(DraftboardError, match="no z-lab benchmark summary"):
        zlab_benchmark.parse_benchmark_log(empty)
    twice = tmp_path / "twice.log"
    twice.write_text("Average Acceptance length: 6.0\nAverage Acceptance length: 5.0\n")
    with pytest.raises(DraftboardError, match="names no dataset"):
        zlab_benchmark.parse_benchmark_log(twice)
    single = tmp_path / "humaneval.log"
    single.write_text("Average Acceptance length: 8.9\n")
    assert zlab_benchmark.parse_benchmark_log(single)[0].dataset == "humaneval"


def _acceptance_csv(rows: list[tuple]) -> str:
    header = "subset,num_drafts,num_draft_tokens,num_accepted_tokens,acceptance_length," \
             "acceptance_at_pos_0,acceptance_at_pos_1,acceptance_at_pos_2\n"
    return header + "".join(",".join(str(v) for v in row) + "\n" for row in rows)


def test_speculators_acceptance_csv_is_pooled_tau_and_shifted_positions(tmp_path, tracker, store_uri, capsys):
    path = tmp_path / "acceptance.csv"
    path.write_text(_acceptance_csv([("HumanEval", 20.0, 60.0, 26.0, 2.3, 0.9, 0.4, 0.0),
                                     ("qa", 10.0, 30.0, 8.0, 1.8, 0.6, 0.2, 0.0)]))
    humaneval, qa = speculators_acceptance.parse_acceptance_csv(path)
    assert humaneval.dataset == "HumanEval" and humaneval.metrics["tau_pooled"] == 2.3
    assert "tau" not in humaneval.metrics  # pooled over drafts, not the per-prompt macro average
    assert humaneval.metrics[names.accept_rate_metric(1)] == 0.9  # acceptance_at_pos_0 = draft position 1
    assert humaneval.protocol["num_speculative_tokens"] == "3"
    assert qa.details["counts"] == {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 8}

    assert main(["import-results", str(path), "--format", "speculators-acceptance", "--name", "spec eval",
                 "--target", "Qwen/Qwen3-8B", "--tracking-uri", store_uri]) == 0
    ids = capsys.readouterr().out.strip().rsplit(" ", 2)[-2:]
    run = tracker.run(ids[0].rstrip(","))
    assert run.data.tags["protocol.source_format"] == "speculators-acceptance"
    assert run.data.tags["protocol.num_speculative_tokens"] == "3"

    bad = tmp_path / "bad.csv"
    bad.write_text(_acceptance_csv([("qa", 10.0, 30.0, 8.0, 2.5, 0.6, 0.2, 0.0)]))
    with pytest.raises(DraftboardError, match="inconsistent"):
        speculators_acceptance.parse_acceptance_csv(bad)
    assert main(["import-results", str(bad), "--format", "speculators-acceptance", "--tracking-uri", store_uri]) == 2
    assert "error:" in capsys.readouterr().err
    wrong = tmp_path / "perf.csv"
    wrong.write_text("subset,latency\nqa,1.0\n")
    with pytest.raises(DraftboardError, match="missing column"):
        speculators_acceptance.parse_acceptance_csv(wrong)


def _generate(lengths: list[int], tpot: float) -> SimpleNamespace:
    """What DDTree's dflash_generate / ddtree_generate return (the fields benchmark.py saves)."""
    return SimpleNamespace(output_ids=torch.arange(sum(lengths)).unsqueeze(0), num_input_tokens=4,
                           num_output_tokens=sum(lengths), time_to_first_token=0.05, time_per_output_token=tpot,
                           acceptance_lengths=lengths, decode_rounds=len(lengths), stage_times={"draft": 0.1})


def test_ddtree_results_file_gives_tau_and_tree_budgets(tmp_path, tracker):
    responses = [{"baseline": _generate([1] * 6, 0.04), "dflash": _generate([4, 2, 1], 0.02),
                  "ddtree_tb16": _generate([4, 4], 0.01)},
                 {"baseline": _generate([1] * 4, 0.04), "dflash": _generate([3, 1], 0.02),
                  "ddtree_tb16": _generate([2, 2], 0.02)}]
    path = tmp_path / "gsm8k.pt"
    torch.save({"responses": responses, "block_size": 4, "draft_attn_implementation": "flash_attention_2",
                "target_attn_implementation": "sdpa",
                "args": {"model_name_or_path": "Qwen/Qwen3-4B", "draft_name_or_path": "z-lab/Qwen3-4B-DFlash-b16",
                         "dataset": "gsm8k", "temperature": 0.0, "max_new_tokens": 2048, "tree_budget": "16"}}, path)
    (record,) = ddtree_benchmark.parse_ddtree_results(path)
    assert record.dataset == "gsm8k" and record.protocol["target"] == "Qwen/Qwen3-4B"
    assert record.metrics["tau"] == pytest.approx((7 / 3 + 2) / 2)  # mean over responses of their means
    assert record.metrics["tau_pooled"] == pytest.approx(11 / 5)
    assert record.metrics[names.accept_rate_metric(1)] == pytest.approx(3 / 5)  # blocks with length >= 2
    assert record.metrics[names.accept_rate_metric(3)] == pytest.approx(1 / 5)
    assert record.metrics[names.ddtree_tau_metric(16)] == pytest.approx(3.0)
    assert record.metrics[names.dds_metric(16)] == pytest.approx(2.0)
    assert record.details["accept_len_histogram"] == [2, 1, 1, 1]
    assert record.details["speedup_vs_baseline"]["dflash"] == pytest.approx(2.0)
    (run_id,) = results.log_imported(tracker, [record], source=path, fmt=ddtree_benchmark.FORMAT, name="ddtree")
    run = tracker.run(run_id)
    assert run.data.tags[names.TARGET] == "Qwen/Qwen3-4B" and run.data.tags["protocol.temperature"] == "0.0"


class _Payload:
    """Unpickling calls `call(*args)`: the code a results file could smuggle in."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return (self.call, self.args)


@pytest.mark.parametrize("call", ["open", "os.system"])
def test_ddtree_file_that_would_run_code_is_refused_and_nothing_runs(tmp_path, tracker, capsys, call):
    import builtins

    from tracker.cli import main

    marker = tmp_path / "marker"
    payload = _Payload(builtins.open, str(marker), "w") if call == "open" else _Payload(os.system, f"touch {marker}")
    path = tmp_path / "evil.pt"
    responses = [{"dflash": _generate([2, 1], 0.02), "ddtree_tb16": payload}]
    torch.save({"responses": responses, "block_size": 4, "args": {}}, path)
    with pytest.raises(DraftboardError, match=r"refused: it names (io\.open|posix\.system|os\.system)"):
        ddtree_benchmark.parse_ddtree_results(path)
    assert main(["import-results", str(path), "--format", "ddtree", "--tracking-uri", tracker.uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "trust the source" not in err
    assert not marker.exists()


def test_spec_acceptance_is_linear_in_num_spec_tokens_and_bounded(tmp_path):
    """Issue 37, finding 9: the per-position rates were a sum over the histogram's tail for every position
    (quadratic in num_spec_tokens, minutes at 4096 drafts); now suffix sums, and a num_spec_tokens no
    drafter drafts is refused before its histogram is read."""
    k = 4096
    requests = [(100, evalformats.vllm_request_metrics([i % (k + 1), k], k)) for i in range(300)]
    evalformats.spec_acceptance(tmp_path / "long", requests)
    (record,) = spec_acceptance.parse_folder(tmp_path / "long")
    # 600 steps: every second accepted all k drafts, the others i % (k + 1) of them
    assert record.metrics[names.accept_rate_metric(k)] == pytest.approx(300 / 600)
    assert record.metrics[names.accept_rate_metric(1)] == pytest.approx((300 + 299) / 600)
    assert record.metrics[names.accept_rate_metric(300)] == pytest.approx((300 + 0) / 600)
    assert record.metrics[names.accept_rate_metric(299)] == pytest.approx((300 + 1) / 600)
    evalformats.spec_acceptance(tmp_path / "huge", [(100, evalformats.vllm_request_metrics([0], 10**6))])
    with pytest.raises(DraftboardError, match="num_spec_tokens 1000000 is more than any drafter drafts"):
        spec_acceptance.parse_folder(tmp_path / "huge")


class _Punycode:
    """Pickled as `_codecs.encode(text, "punycode")`, which weights_only allows: a quadratic encoder."""

    def __reduce__(self):
        import codecs

        return codecs.encode, ("ü" * 60_000, "punycode")


def test_a_pickle_that_encodes_with_another_codec_than_torch_s_is_refused(tmp_path):
    """Issue 64, F10: torch.save writes bytes as _codecs.encode(text, "latin1"); any other codec is refused before
    torch reads the file (punycode spent minutes of CPU on 60,000 characters)."""
    import time

    path = tmp_path / "punycode.pt"
    torch.save({"responses": [{"dflash": _generate([1], 0.02)}], "block_size": 4, "args": {"x": _Punycode()}}, path)
    started = time.perf_counter()
    with pytest.raises(DraftboardError, match="names the codec 'punycode'"):
        ddtree_benchmark.parse_ddtree_results(path)
    assert time.perf_counter() - started < 5
    torch.save({"responses": [{"dflash": _generate([1], 0.02)}], "block_size": 4, "args": {"b": b"\x00\xffbytes"}},
               path)  # bytes, as torch.save writes them (latin1): read
    assert ddtree_benchmark.parse_ddtree_results(path)


def _deflated(path):
    """The same archive with its records deflated: what a zip bomb is (torch.save stores records)."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        records = [(m.filename, archive.read(m)) for m in archive.infolist()]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in records:
            archive.writestr(name, data)


def test_ddtree_files_that_would_burn_cpu_or_memory_are_refused_before_they_are_walked(tmp_path):
    """Issue 37, finding 7: inside torch's allowlist a file could still inflate a record to gigabytes,
    hand an allowlisted codec call a huge string, or share one list across a million responses (10^8
    rounds to walk from a file of a few MB). Each is refused in one line."""
    path = tmp_path / "r.pt"
    one = {"dflash": _generate([2, 1], 0.02)}
    torch.save({"responses": [one], "block_size": 4, "args": {}}, path)
    _deflated(path)
    with pytest.raises(DraftboardError, match="is compressed; torch.save stores its records uncompressed"):
        ddtree_benchmark.parse_ddtree_results(path)
    torch.save({"responses": [one], "block_size": 4, "args": {"note": "x" * (2 << 20)}}, path)
    with pytest.raises(DraftboardError, match="refused: a string of 2048 KiB in its pickle"):
        ddtree_benchmark.parse_ddtree_results(path)
    shared = {"dflash": _generate([1] * 100, 0.02)}
    torch.save({"responses": [shared] * 1_000_000, "block_size": 4, "args": {}}, path)
    assert path.stat().st_size < 16 << 20
    with pytest.raises(DraftboardError, match="refused: more than 20000000 decode rounds"):  # counted, not walked
        ddtree_benchmark.parse_ddtree_results(path)
    torch.save({"responses": [one], "block_size": 10**9, "args": {}}, path)
    with pytest.raises(DraftboardError, match="block_size must be an integer in 2..4096"):
        ddtree_benchmark.parse_ddtree_results(path)


def test_tensorboard_folder_becomes_a_detected_training_run(tmp_path, tracker, store_uri):
    from torch.utils.tensorboard import SummaryWriter

    runs_dir = tmp_path / "output" / "runs"
    writer = SummaryWriter(str(runs_dir))
    for step in (50, 100):  # SpecForge's legacy script, --report-to tensorboard
        writer.add_scalar("train/loss", 3.0 / step, step)
        writer.add_scalar("train/accuracy", step / 200, step)
    writer.add_hparams({"block_size": 16, "num_anchors": 512, "mask_token_id": 151669, "wandb_key": "wk-123"}, {},
                       run_name=".")
    writer.close()
    (event_run,) = tensorboard.read_event_folder(tmp_path / "output")
    assert [event_run.history[step]["train/accuracy"] for step in (50, 100)] == [0.25, 0.5]
    assert event_run.params["block_size"] == "16"
    (run_id,) = foreign_run.log_runs(tracker, [event_run], "tb import")
    run = tracker.run(run_id)
    assert run.data.tags[adoption.TOOL_TAG] == adoption.SPECFORGE_LEGACY
    assert run.data.tags[adoption.STEP_UNIT_TAG] == "micro-batch" and run.data.tags[names.KIND] == "train"
    assert run.data.params["wandb_key"] == redact.MASK and run.data.params["block_size"] == "16"
    history = MlflowClient(tracking_uri=store_uri).get_metric_history(run_id, "train/accuracy")
    assert [(m.step, m.value) for m in history] == [(50, 0.25), (100, 0.5)]
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DraftboardError, match="no TensorBoard scalars"):
        tensorboard.read_event_folder(tmp_path / "nothing")


def test_eval_command_beside_acceptance_csv_gives_the_fingerprint_and_the_sampling(tmp_path, tracker, capsys):
    path = tmp_path / "acceptance.csv"
    path.write_text(_acceptance_csv([("HumanEval", 20.0, 60.0, 26.0, 2.3, 0.9, 0.4, 0.0)]))
    argv = ["evaluate.py", "--target", "http://gpu-7:8000/v1", "sweep", "--subsets", "HumanEval",
            "--gen-kwargs", '{"temperature":0.6, "top_p": 0.95}', "--output-dir", str(tmp_path)]
    evalformats.eval_command(tmp_path, argv, {"speculators": "0.4.0", "vllm": "0.32.0", "torch": "2.13.0",
                                              "transformers": "5.9.0"}, sha="c0ffee1")
    (record,) = speculators_acceptance.parse_acceptance_csv(path)
    assert record.protocol["temperature"] == "0.6" and record.protocol["top_p"] == "0.95"
    assert record.environment["engine.name"] == "vllm" and record.environment["engine.version"] == "0.32.0"
    assert record.environment["code.git_commit"] == "c0ffee1"
    assert "source.compressed-tensors" not in record.environment  # "not installed" is not a version
    assert main(["import-results", str(path), "--format", "speculators-acceptance", "--tracking-uri",
                 tracker.uri]) == 0
    run_id = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    fp = tracker.fingerprint(run_id)
    assert fp["source"]["kind"] == "imported" and fp["software"]["torch"] == "2.13.0"
    assert fp["engine"] == {"name": "vllm", "version": "0.32.0"} and fp["source"]["speculators"] == "0.4.0"
    assert "client" in fp["source"]["versions_of"]
    assert tracker.run(run_id).data.tags["protocol.temperature"] == "0.6"

    (tmp_path / "eval_command.txt").write_text("# Git SHA: unknown\nevaluate.py --gen-kwargs '[0.6]'\n")
    with pytest.raises(DraftboardError, match="--gen-kwargs must be a JSON object"):
        speculators_acceptance.parse_acceptance_csv(path)


def test_spec_acceptance_folder_pools_its_requests_and_keeps_both_slicings(tmp_path, tracker, capsys):
    folder = tmp_path / "mrcr-8k"
    # K = 3. Request 1: steps accepting 3, 1, 0 drafts; request 2 (a longer prompt): 2, 2.
    requests = [(100, evalformats.vllm_request_metrics([3, 1, 0], 3)),
                (5000, evalformats.vllm_request_metrics([2, 2], 3))]
    evalformats.spec_acceptance(folder, requests)
    (record,) = spec_acceptance.parse_folder(folder)
    assert record.dataset == "mrcr-8k"
    assert record.metrics["engine_mean_acceptance_length"] == pytest.approx(1 + 8 / 5)
    # draft k accepted in the steps that accepted at least k: k=1: 4 of 5 steps, k=2: 3, k=3: 1
    assert [record.metrics[names.accept_rate_metric(k)] for k in (1, 2, 3)] == pytest.approx([0.8, 0.6, 0.2])
    assert "tau" not in record.metrics and record.protocol["num_speculative_tokens"] == "3"
    assert [row["bucket"] for row in record.details["by_start_length"]] == ["0-4096", "4096-8192"]
    assert record.details["by_position"][0]["bucket"] == "0-256"
    # Issue 50: the input lengths it states place every step at its context, draftboard's rule: request 1's
    # steps (lengths 4, 2, 1) at 101, 105, 107; request 2's (3, 3) at 5001, 5004; octave edges from 64.
    curve = {r["from"]: (r["blocks"], r["tau"]) for r in record.details["engine_tau_by_context"] if r["blocks"]}
    assert curve == {64: (3, pytest.approx(7 / 3)), 4096: (2, 3.0)}
    assert record.details["context_buckets"][:3] == [0, 64, 128]
    assert main(["import-results", str(folder), "--format", "speculators-spec-acceptance", "--tracking-uri",
                 tracker.uri]) == 0
    run = tracker.run(capsys.readouterr().out.strip().rsplit(" ", 1)[-1])
    assert run.data.metrics["engine_mean_acceptance_length"] == pytest.approx(2.6)

    # The CSVs alone give the pooled length; a CSV from another run next to these raw lines is refused.
    (folder / "raw_requests.jsonl").rename(tmp_path / "raw.jsonl")
    (csv_only,) = spec_acceptance.parse_folder(folder)
    assert csv_only.metrics == {"engine_mean_acceptance_length": pytest.approx(2.6)}
    other = tmp_path / "one-request"
    evalformats.spec_acceptance(other, requests[:1])
    (folder / spec_acceptance.BY_START).replace(other / spec_acceptance.BY_START)
    with pytest.raises(DraftboardError, match="they come from different runs"):
        spec_acceptance.parse_folder(other)


def test_spec_acceptance_raw_line_that_disagrees_with_its_histogram_is_refused(tmp_path):
    metrics = evalformats.vllm_request_metrics([2, 1], 3)
    metrics["num_accepted_draft_tokens"] = 4
    evalformats.spec_acceptance(tmp_path, [(10, metrics)])
    with pytest.raises(DraftboardError, match=r"raw_requests.jsonl:1: acceptance_histogram disagrees"):
        spec_acceptance.parse_folder(tmp_path)
    metrics = evalformats.vllm_request_metrics([2, 1], 3)
    metrics["per_step_accepted"] = [2, 2]  # 4 accepted where the counts say 3
    evalformats.spec_acceptance(tmp_path, [(10, metrics)])
    with pytest.raises(DraftboardError, match=r"raw_requests.jsonl:1: per_step_accepted must be one whole count \(0 to \d+\) per verify step"):
        spec_acceptance.parse_folder(tmp_path)


def _specforge_example(i: int, reached: float, accepted: float) -> dict:
    return {"id": f"example-{i}", "seed": 42 + i, "sha256": f"{i:064x}",
            "metrics": {"loss": 2.0 + i, "accuracy": 0.4, "dflash/hard_label/unary_greedy_accepted_length": 2.0 + i},
            "ratio_metrics": {"position_1/selector/greedy_prefix_acceptance": [accepted, reached],
                              "position_7/selector/greedy_prefix_acceptance": [0.0, 0.0]},
            "sum_metrics": {"position_1/selector/greedy_reached_count": reached}}


def test_specforge_checkpoint_report_is_a_teacher_forced_eval_of_its_checkpoint(tmp_path, tracker, capsys):
    index = tmp_path / "development" / "index.json"
    index.parent.mkdir()
    index.write_text('{"rows": []}')
    report = tmp_path / "development-step1000.json"
    recipe = {"model": {"target_model_path": "Qwen/Qwen3.6-27B"}, "tracking": {"wandb_key": "wk-SECRET"}}
    evalformats.specforge_report(report, [_specforge_example(0, 10.0, 6.0), _specforge_example(1, 30.0, 12.0)],
                                 checkpoint="/ckpts/qwen36-dflash2-step1000", index=index, recipe=recipe,
                                 draft_config={"architectures": ["DFlash2DraftModel"], "block_size": 8})
    (record,) = specforge_eval.parse_report(report)
    assert record.checkpoint_step == 1000 and record.dataset == "development"
    assert record.metrics["eval/position_1/selector/greedy_prefix_acceptance"] == pytest.approx(18 / 40)  # pooled
    assert record.metrics["eval/loss"] == pytest.approx(2.5)  # a mean over examples
    assert "eval/position_7/selector/greedy_prefix_acceptance" not in record.metrics  # no exposure: not a 0% rate
    assert record.details["unexposed"] == ["position_7/selector/greedy_prefix_acceptance"]
    assert not [k for k in record.metrics if k in ("tau", "tau_pooled")]
    assert record.protocol["block_size"] == "8" and "not serving acceptance" in record.protocol["metric_scope"]
    assert "wk-SECRET" not in repr(record)

    train = tracker.client.create_run(tracker.client.create_experiment("specforge-run")).info.run_id
    assert main(["import-results", str(report), "--format", "specforge-eval", "--train-run-id", train,
                 "--tracking-uri", tracker.uri]) == 0
    run = tracker.run(capsys.readouterr().out.strip().rsplit(" ", 1)[-1])
    assert run.data.tags[names.TRAIN_RUN_ID] == train and run.data.tags[names.TARGET] == "Qwen/Qwen3.6-27B"
    assert run.data.tags["protocol.scoring"] == "imported" and run.data.tags[names.CHECKPOINT_STEP] == "1000"

    data = json.loads(report.read_text())
    data["mean"]["position_1/selector/greedy_prefix_acceptance"] = 0.9
    report.unlink()
    report.write_text(json.dumps(data))
    with pytest.raises(DraftboardError, match="disagrees with its pooled counts"):
        specforge_eval.parse_report(report)


def test_an_imported_eval_of_a_training_run_is_keyed_by_its_checkpoint_step(tmp_path, tracker, train_run, capsys):
    """Issue 39: an eval imported into a training run lands at its checkpoint's step (`--checkpoint-step`
    where the file names none), never in the order it was logged; without one it is refused in one line,
    and a step that contradicts the file's is refused too. Nothing is written when refused."""
    log = tmp_path / "bench.log"
    log.write_text(ZLAB_LOG)
    base = ["import-results", str(log), "--format", "zlab-benchmark", "--train-run-id", train_run,
            "--tracking-uri", tracker.uri]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--checkpoint-step N" in err
    def imported():  # the store is shared by this module's tests: this training run's evals
        return [r for r in tracker.find_runs("eval") if r.data.tags.get(names.TRAIN_RUN_ID) == train_run]

    assert imported() == []
    assert main([*base, "--checkpoint-step", "1200"]) == 0
    steps = {r.info.run_name: r.data.tags[names.CHECKPOINT_STEP] for r in imported()}
    assert steps == {"bench · gsm8k": "1200", "bench · math500": "1200"}
    assert main([*base, "--checkpoint-step", "-1"]) == 2
    assert "--checkpoint-step must be >= 0" in capsys.readouterr().err


def test_a_checkpoint_step_that_contradicts_the_file_is_refused(tmp_path):
    from tracker.cli.imports import keyed_by_step
    from tracker.store.importers.results import ImportedEval

    named = ImportedEval("dev", {"tau": 3.0}, {}, checkpoint_step=1000)
    assert keyed_by_step([named], 1000, "t")[0].checkpoint_step == 1000
    assert keyed_by_step([named], None, "t")[0].checkpoint_step == 1000
    with pytest.raises(DraftboardError, match="the file names checkpoint step 1000, --checkpoint-step says 900"):
        keyed_by_step([named], 900, "t")
    unnamed = ImportedEval("dev", {"tau": 3.0}, {})
    assert keyed_by_step([unnamed], None, None) == [unnamed]  # no training run: nothing to key
