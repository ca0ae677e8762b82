import mlflow

from tracker.environment import fingerprint
from tracker.store.importers.published import import_published, load_tables


def test_published_tables_cite_their_source_and_setting():
    tables = load_tables()
    assert any(t["target"] == "Qwen/Qwen3.5-27B" and t["backend"] == "SGLang" for t in tables)
    assert any(t["title"].startswith("DFlash paper, Table 1") for t in tables)
    for t in tables:
        assert t["source"]["url"] and t["source"]["publication"]
        assert {"hardware", "backend", "temperature", "thinking", "block_size"} <= set(t)
        assert all(isinstance(r["tau"], float) for r in t["rows"])


def test_imported_reference_runs_are_published_and_other_targets(tracker, store_uri):
    run_ids = import_published(tracker)
    assert len(run_ids) == len(load_tables())
    client = mlflow.MlflowClient(store_uri)
    qwen35 = [client.get_run(r) for r in run_ids if client.get_run(r).data.tags["draftboard.target"] == "Qwen/Qwen3.5-27B"]
    run = next(r for r in qwen35 if "block 16" in r.info.run_name)
    assert run.data.tags["draftboard.kind"] == "reference"
    assert run.data.metrics["tau_humaneval"] == 9.18
    assert "tau" not in run.data.metrics  # the card prints no average; none is made up
    fp = tracker.fingerprint(run.info.run_id)
    assert fp["source"]["kind"] == "published" and fp["source"]["backend"] == "SGLang"
    assert fp["hardware"]["gpu_name"] == "NVIDIA B200 (single)"
    assert fp["software"]["torch"] is None and fp["numerics"]["linear_attention_path"] is None
    assert fingerprint.env_tags(fp)["env.linear_attn"] == "unknown"
    table1 = next(client.get_run(r) for r in run_ids if "Qwen3-8B, temperature 0" in client.get_run(r).info.run_name)
    assert table1.data.metrics["tau"] == 6.49  # the paper's own Avg. column


def test_published_references_carry_their_datasets_and_the_stated_protocol(tracker):
    from tracker.dashboard.compare_deltas import Estimate, dataset_estimates
    from tracker.dashboard.index import run_info
    from tracker.measurement.protocol import Protocol

    tables = load_tables()
    for t in tables:  # every column but the average names its dataset as --prompts calls it
        named = {r.get("dataset") for r in t["rows"] if not r["benchmark"].lower().startswith("avg")}
        assert None not in named and (len(t["rows"]) == 1 or named >= {"gsm8k", "humaneval", "mbpp", "mt-bench"})
    run_ids = import_published(tracker)
    runs = {tracker.run(r).info.run_name: tracker.run(r) for r in run_ids}
    table1 = runs["z-lab published: DFlash paper, Table 1 (Qwen3-4B, temperature 0)"]
    proto = Protocol.from_tags(table1.data.tags)
    assert proto.datasets == {"gsm8k": "unknown", "math500": "unknown", "aime25": "unknown", "humaneval": "unknown",
                              "mbpp": "unknown", "livecodebench": "unknown", "mt-bench": "unknown"}
    assert (proto.temperature, proto.enable_thinking, proto.block_size, proto.max_new_tokens, proto.scoring) == (
        0.0, False, 16, 2048, "published")
    assert proto.prompt_digest == proto.last_block == proto.chat_template_digest == "unknown"  # not stated
    estimates = dataset_estimates(run_info(table1))
    assert estimates["gsm8k"] == Estimate(6.53) and estimates["math500"] == Estimate(7.84)
    assert None not in estimates  # the Avg. column is no dataset
    card = Protocol.from_tags(runs["z-lab published: z-lab/Qwen3.5-27B-DFlash model card, SGLang acceptance "
                                   "length (block 8)"].data.tags)
    assert card.temperature == "unknown" and card.enable_thinking is True and card.block_size == 8
    # the card's hub repository is named; its revision is not stated, so it is no proof of one drafter
    card_tags = runs["z-lab published: z-lab/Qwen3.5-27B-DFlash model card, SGLang acceptance length (block 8)"].data.tags
    assert card_tags["draftboard.drafter_repo"] == "z-lab/Qwen3.5-27B-DFlash"
    assert "draftboard.drafter_revision" not in card_tags and "draftboard.drafter_repo" not in table1.data.tags


def test_the_dflash2_model_card_is_a_sampled_reference_with_its_reproduction_interval(tracker):
    """The DFlash2 numbers are sampled (T=1, top_p 0.95, top_k 20): their protocol says so, so a greedy
    eval meets them only as a critical protocol difference; the independent reproduction carries its
    95% interval, and the card's own number lies inside it."""
    from tracker.dashboard.compare_deltas import Estimate, dataset_estimates
    from tracker.dashboard.index import run_info
    from tracker.measurement.protocol import Protocol, diff
    from tracker.store import names

    runs = {tracker.run(r).info.run_name: tracker.run(r) for r in import_published(tracker)}
    card = runs["z-lab published: z-lab/Qwen3.8-27B-DFlash2 model card, GSM8K (sampled: T=1, top_p 0.95, top_k 20)"]
    xllm = runs["xLLM published: xLLM reproduction of the Qwen3.8-27B-DFlash2 model card, GSM8K (sampled: T=1, "
                "top_p 0.95, top_k 20)"]
    for run in (card, xllm):
        proto = Protocol.from_tags(run.data.tags)
        assert (proto.temperature, proto.top_p, proto.top_k, proto.block_size, proto.enable_thinking,
                proto.max_new_tokens, proto.datasets) == (1.0, 0.95, 20, 8, True, 4096, {"gsm8k": 128})
        assert run.data.tags[names.DRAFTER_FAMILY] == "dflash2"
        greedy = Protocol(**{**proto.to_dict(), "temperature": 0})
        assert {r.field: r.severity for r in diff(greedy, proto)}["protocol.temperature"] == "critical"
    assert dataset_estimates(run_info(card))["gsm8k"] == Estimate(5.46, n_prompts=128)
    reproduced = dataset_estimates(run_info(xllm))["gsm8k"]
    assert reproduced == Estimate(5.366, 5.252, 5.479, 128) and reproduced.low < 5.46 < reproduced.high
