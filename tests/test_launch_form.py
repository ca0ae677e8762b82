"""The Launch page's logic (tracker.dashboard.launch_form): pre-filled values, job cards, log tails."""

import sys
from pathlib import Path

import pytest
import torch
from test_views import fp, run

from tracker.dashboard.index import RunIndex
from tracker.dashboard.launch_form import error_line, form_defaults, result_line, shown_log
from tracker.events import PREFIX


def launch_inputs(root: Path, target: bool = True) -> None:
    """What Launch takes as a target (its config.json), a checkpoint (`ck`, its safetensors) and prompts, under
    `root`: real enough for the look the worker takes before an eval (tracker/jobs/inputs.py)."""
    if target:
        (root / "target").mkdir()
        (root / "target" / "config.json").write_text("{}")
    (root / "ck").mkdir()
    (root / "ck" / "model.safetensors").write_bytes(b"")
    (root / "p.jsonl").write_text('{"id": "a", "input_ids": [1, 2, 3]}\n')


def test_form_defaults_come_from_the_run_and_the_project_never_an_odd_job(tmp_path):
    train_fp = fp(path="fallback", dtype="fp32")
    train_fp["numerics"]["drafter_precision"] = "bf16-autocast"
    usual = {"prompts": "/data/p.jsonl", "max_new_tokens": "64", "budgets": "[4, 8]"}
    odd = {"prompts": "/tmp/other.jsonl", "max_new_tokens": "9", "budgets": "[100000]"}
    index = RunIndex([
        run("t", "train", train_fp),
        run("e1", "eval", fp(), train="t", step=100, params=usual, start=1),
        run("e2", "eval", fp(), train="t", step=200, params=usual, start=2),
        run("e3", "eval", fp(), train="t", step=200, params=odd, start=3),  # the latest: someone's odd job
        run("other", "eval", fp(), params=odd, start=4),
    ])
    d = form_defaults(index, index.runs["t"])
    assert d == {"prompts": "/data/p.jsonl", "max_new_tokens": 64, "budgets": "4,8,16,32",
                 "target": "/models/Qwen3.5-4B", "device": "cpu", "dtype": "fp32",
                 "drafter_precision": "bf16-autocast"}
    # No run chosen: the project's defaults, not the store's latest eval.
    assert form_defaults(index, None) == {"prompts": None, "max_new_tokens": 256, "budgets": "4,8,16,32",
                                          "target": None, "device": None, "dtype": None, "drafter_precision": None}


def test_log_tail_drops_progress_and_protocol_lines_unless_asked():
    tail = "\n".join([
        "loading target",
        "target: features:  40%|████      | 2/5 [00:01<00:01,  1.9it/s]",
        PREFIX + '{"event": "progress", "stage": "drafter", "done": 1, "total": 3}',
        "drafter:   0%|          | 0/3\rdrafter: 100%|██████████| 3/3",
        "", "   ",
        "tau 2.410  streak 1.410",
    ])
    assert shown_log(tail) == "loading target\ntau 2.410  streak 1.410"
    assert shown_log(tail, everything=True) == tail


def test_error_line_finds_the_cause_under_the_workers_message():
    error = ("exit code 1; last output:\nTraceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
             "    torch.zeros(1, device='cuda')\n"
             "AssertionError: Torch not compiled with CUDA enabled\n")
    assert error_line(error) == "AssertionError: Torch not compiled with CUDA enabled"
    assert error_line("exit code 2; last output:\nerror: --prompts p.jsonl: no such file") == \
        "error: --prompts p.jsonl: no such file"
    assert error_line("worker w1 stopped while the job ran") == "worker w1 stopped while the job ran"
    assert error_line(None) is None


def test_result_line_shows_tau_and_ddtree_at_8():
    assert result_line(run("e", "eval", metrics={"tau": 2.4104, "ddtree_tau_b8": 3.1})) == \
        "τ 2.410 · ddtree_tau_b8 3.100"
    assert result_line(run("e", "eval", metrics={"tau": 2.0})) == "τ 2.000"
    assert result_line(run("e", "eval")) is None and result_line(None) is None


def test_evals_are_named_after_their_training_run_step_and_settings(tmp_path):
    from tracker.dashboard.launch_form import LaunchForm, eval_params
    from tracker.store.names import eval_run_name

    launch_inputs(tmp_path)
    form = LaunchForm(target=str(tmp_path / "target"), prompts=str(tmp_path / "p.jsonl"), drafter=str(tmp_path / "ck"),
                      train_run_id="t", train_name="drafter-v1 (1 tapped layer)", checkpoint_step=200,
                      dtype="fp32", drafter_precision="bf16-autocast", linear_attn="fallback")
    params = eval_params(form, [tmp_path])
    assert params["name"] == "drafter-v1 (1 tapped layer) @ step 200 · fp32 · drafter bf16-autocast · fallback · cpu"
    assert eval_run_name("v4", 100, {"dtype": "bf16", "drafter_precision": "bf16"}) == "v4 @ step 100 · bf16"
    # `auto` is what the badge resolves (fast or fallback): the name never says "auto" beside it
    assert eval_run_name("v4", 100, {"dtype": "fp32", "linear_attn": "auto", "device": "cpu"}) == "v4 @ step 100 · fp32 · cpu"


def test_a_device_no_running_worker_has_is_refused_at_submit(tmp_path):
    from tracker.dashboard.launch_form import submit_eval, workers_caption
    from tracker.errors import DraftboardError
    from tracker.jobs.launchers.local import LocalLauncher
    from tracker.jobs.queue import JobQueue

    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    params = {"target": "/m/t", "drafter": "/m/d", "prompts": "/m/p.jsonl", "device": "cuda"}
    # the commands are code spans, not backticks shown as text (the caption is Markdown: the page renders it)
    assert "No worker is running" in workers_caption(queue.workers())
    assert "`draftboard worker`" in workers_caption(queue.workers()) and "\\`" not in workers_caption(queue.workers())
    assert not submit_eval(queue, params).existing  # nobody to ask yet: queued, and the page says so
    queue.register_worker("w1", LocalLauncher([sys.executable, "-m", "tracker.cli"]).devices(), "local")
    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU: a local worker can run cuda")
    assert [w.devices for w in queue.workers()] == [("cpu",)]
    with pytest.raises(DraftboardError, match=r"^not queued: device cuda: no running worker can use it "
                                              r"\(their torch offers cpu; a CPU-only torch has no cuda\)$"):
        submit_eval(queue, {**params, "prompts": "/m/q.jsonl"})
    assert submit_eval(queue, {**params, "prompts": "/m/q.jsonl", "device": "cpu"}).state == "queued"
    queue.register_worker("ray", None, "ray")  # a launcher that cannot tell: nothing is refused
    assert submit_eval(queue, {**params, "prompts": "/m/r.jsonl"}).state == "queued"
    queue.unregister_worker("ray")
    assert [w.id for w in queue.workers()] == ["w1"] and queue.workers(max_age_s=-1) == []
    # issue 63: a worker that hands out 4 GPUs; a job asking for 8 is refused at submit, one for 4 is queued
    queue.register_worker("w1", ["cpu", "cuda"], "local", ["0", "1", "2", "3"])
    assert queue.workers()[0].gpus == ("0", "1", "2", "3")
    with pytest.raises(DraftboardError, match=r"^not queued: the job asks for 8 GPUs; the most any running worker "
                                              r"has is 4$"):
        submit_eval(queue, {**params, "prompts": "/m/s.jsonl", "gpus": 8})
    assert submit_eval(queue, {**params, "prompts": "/m/s.jsonl", "gpus": 4}).state == "queued"
    assert submit_eval(queue, {**params, "prompts": "/m/t.jsonl", "device": "cpu"}).state == "queued"  # needs none


def test_a_job_whose_targets_weights_exceed_its_gpus_memory_is_refused_at_submit(tmp_path):
    """Issue 63: a worker declares its GPUs' memory (`worker --gpu-memory`); a job whose target's weights alone do
    not fit the GPUs it asks for is refused in one line, naming how many it needs; one that asks for enough is
    queued. The bound comes from the weight files and the dtype the config says they were saved in."""
    import json

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tiny import save_target
    from tracker.dashboard.launch_form import submit_eval
    from tracker.errors import DraftboardError
    from tracker.jobs import inputs
    from tracker.jobs.queue import JobQueue

    torch.manual_seed(0)
    save_target(Qwen3ForCausalLM(Qwen3Config(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=16, intermediate_size=128,
                                             vocab_size=1000, tie_word_embeddings=False)).eval(), tmp_path / "t")
    saved = json.loads((tmp_path / "t" / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "float32"
    fp32 = inputs.weights_bytes(str(tmp_path / "t"), "fp32")
    assert 1_104_704 <= fp32 < 1_110_000 and inputs.weights_bytes(str(tmp_path / "t"), "bf16") == fp32 // 2
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    queue.register_worker("w", ["cpu", "cuda"], "local", ["0", "1", "2", "3"], gpu_memory=2**19 + 2**18)  # 768 KiB
    params = {"target": str(tmp_path / "t"), "drafter": "/m/d", "prompts": "/m/p.jsonl", "device": "cuda",
              "dtype": "fp32"}
    with pytest.raises(DraftboardError, match=rf"^not queued: the target's weights are {fp32 / 2**30:.3g} GiB in fp32; 1 "
                                              r"GPU\(s\) of 0\.000732 GiB \(the workers' --gpu-memory\) cannot hold "
                                              r"them: ask for 2 GPUs$"):
        submit_eval(queue, params)
    assert submit_eval(queue, {**params, "gpus": 2}).state == "queued"
    with pytest.raises(DraftboardError, match=r"a shard's one GPU of 0\.000732 GiB .* cannot hold them$"):
        submit_eval(queue, {**params, "shards": 2})  # each shard loads the whole target on its own GPU
    assert submit_eval(queue, {**params, "dtype": "bf16"}).state == "queued"  # half the bytes: one GPU holds them
    queue.register_worker("w", ["cpu", "cuda"], "local", ["0", "1", "2", "3"])  # memory not declared: not checked
    assert submit_eval(queue, {**params, "prompts": "/m/q.jsonl"}).state == "queued"


def test_a_sampled_launch_carries_its_sampling_and_no_ddtree_budgets(tmp_path):
    """A sampled job says how tokens are drawn (and its name does); a greedy job keeps the params it always
    had, so the queue's dedup still meets older greedy jobs; bad numbers are refused before queueing."""
    import pytest

    from tracker.dashboard.launch_form import LaunchForm, eval_params
    from tracker.errors import DraftboardError

    launch_inputs(tmp_path)
    common = dict(target=str(tmp_path / "target"), prompts=str(tmp_path / "p.jsonl"), drafter=str(tmp_path / "ck"),
                  train_run_id="t", train_name="v5", checkpoint_step=100)
    greedy = eval_params(LaunchForm(**common), [tmp_path])
    assert "temperature" not in greedy and greedy["budgets"] == [4, 8, 16, 32]
    sampled = eval_params(LaunchForm(**common, temperature=1.0, top_p=0.95, top_k=20, samples=16), [tmp_path])
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"], sampled["samples"]) == (1.0, 0.95, 20, 16)
    assert "budgets" not in sampled and sampled["name"].endswith("· T=1 · top_p 0.95 · top_k 20 · 16 draws")
    served = eval_params(LaunchForm(**common, temperature=0.6, samples=16, measured_by=("vllm", None)), [tmp_path])
    assert served["temperature"] == 0.6 and "samples" not in served  # an engine sends each prompt once
    # The queue's rule, naming the form's fields as its other errors do (not the CLI's flags).
    for bad, said in (({"temperature": -1.0}, "temperature must be a finite number >= 0, got -1.0"),
                      ({"temperature": 1.0, "top_p": 1.5}, "top_p must lie in (0, 1], got 1.5"),
                      ({"temperature": 1.0, "samples": 5000}, "samples must lie in 1..1024, got 5000")):
        with pytest.raises(DraftboardError) as caught:
            eval_params(LaunchForm(**common, **bad), [tmp_path])
        assert str(caught.value) == said


def test_a_hybrid_served_by_the_workers_engine_asks_for_a_dtype_it_runs(tmp_path, monkeypatch):
    """A managed vLLM on CPU runs a Gated DeltaNet target in bf16 only: Launch says so in one line
    before queueing; bf16 queues; an attached server (another box) and a dense target are not judged."""
    import json

    import pytest

    from demo.target import target_config
    from tracker.dashboard.launch_form import LaunchForm, eval_params
    from tracker.errors import DraftboardError

    for name, family in (("hybrid", "qwen3_next"), ("dense", "qwen3")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(target_config(family).to_dict()))
    launch_inputs(tmp_path, target=False)
    monkeypatch.setenv("DRAFTBOARD_ENGINE_URLS", "http://127.0.0.1:8000")
    common = dict(prompts=str(tmp_path / "p.jsonl"), drafter=str(tmp_path / "ck"), device="cpu")
    with pytest.raises(DraftboardError, match=r"^vllm's cpu Gated DeltaNet kernels take bf16 only; this hybrid "
                                              r"target was asked for in fp32: use --dtype bf16$"):
        eval_params(LaunchForm(target=str(tmp_path / "hybrid"), measured_by=("vllm", None), **common), [tmp_path])
    served = eval_params(LaunchForm(target=str(tmp_path / "hybrid"), measured_by=("vllm", None), dtype="bf16",
                                    **common), [tmp_path])
    assert (served["engine"], served["dtype"]) == ("vllm", "bf16")
    for target, measured_by in (("hybrid", ("vllm", "http://127.0.0.1:8000")), ("dense", ("vllm", None)),
                                ("hybrid", (None, None))):
        assert eval_params(LaunchForm(target=str(tmp_path / target), measured_by=measured_by, **common),
                           [tmp_path])["dtype"] == "fp32"


def test_launch_says_what_a_sampled_or_greedy_eval_will_not_use_and_refuses_fractions(tmp_path):
    """Issue 39: DDTree budgets of a sampled eval and Samples at T=0 were dropped in silence, and
    fractions rounded; now each unused setting is named with why, and a fraction is refused."""
    import pytest

    from tracker.dashboard.launch_form import LaunchForm, eval_params, unused_settings
    from tracker.errors import DraftboardError

    launch_inputs(tmp_path)
    common = dict(target=str(tmp_path / "target"), prompts=str(tmp_path / "p.jsonl"), drafter=str(tmp_path / "ck"))
    assert unused_settings(LaunchForm(**common)) == []
    assert unused_settings(LaunchForm(**common, samples=16)) == [
        "Samples 16 (T = 0 draws one greedy continuation per prompt)"]
    assert unused_settings(LaunchForm(**common, temperature=1.0, samples=16)) == [
        "DDTree budgets (DDTree verifies greedily: a sampled eval runs none)"]
    assert unused_settings(LaunchForm(**common, temperature=1.0, samples=16, budgets="", measured_by=("vllm", None))) \
        == ["Samples 16 (an engine eval sends each prompt once)"]
    assert unused_settings(LaunchForm(**common, drafter_family="DFlash2")) == [
        "DDTree budgets (DDTree is not run for a DFlash2 drafter: its candidate selector walks one path)"]
    for field, value, label in (("samples", 2.5, "samples"), ("top_k", 20.7, "top_k"),
                                ("limit_per_dataset", 3.5, "prompts per dataset"),
                                ("prompt_tokens", 100.5, "prompt tokens"), ("max_new_tokens", 12.5, "max new tokens"),
                                ("samples", float("inf"), "samples")):
        with pytest.raises(DraftboardError, match=f"{label} must be a whole number"):
            eval_params(LaunchForm(**common, temperature=1.0, **{field: value}), [tmp_path])
    assert eval_params(LaunchForm(**common, temperature=1.0, samples=16.0), [tmp_path])["samples"] == 16
    # Issue 50: a long-context set's prompt length reaches the job, checked against the target's context
    assert eval_params(LaunchForm(**common, prompt_tokens=100), [tmp_path])["prompt_tokens"] == 100
    with pytest.raises(DraftboardError, match="prompt tokens must be a positive integer"):
        eval_params(LaunchForm(**common, prompt_tokens=0), [tmp_path])


def test_launch_offers_load_levels_for_an_engine_that_sweeps_and_refuses_them_otherwise(tmp_path):
    """Issue 49: Launch's concurrency levels reach the job as the CLI's --concurrency would (sorted, bounded),
    with the eval's name saying so; offline or on an engine that cannot sweep, one line before queueing."""
    from tracker.dashboard.launch_form import LaunchForm, eval_params
    from tracker.errors import DraftboardError

    launch_inputs(tmp_path)
    common = dict(target=str(tmp_path / "target"), prompts=str(tmp_path / "p.jsonl"), drafter=str(tmp_path / "ck"),
                  train_run_id="t", train_name="v5", checkpoint_step=100)
    params = eval_params(LaunchForm(**common, measured_by=("vllm", None), concurrency="8, 1,4"), [tmp_path])
    assert params["concurrency"] == [1, 4, 8] and params["name"].endswith("concurrency 1,4,8")
    assert "concurrency" not in eval_params(LaunchForm(**common, measured_by=("vllm", None)), [tmp_path])
    # issue 66: rounds per level, as the CLI's --repeats (empty: the default, not written into the job)
    # issue 63: the GPUs a job holds, as the job param `gpus`; none on the CPU
    assert eval_params(LaunchForm(**common, gpus=2.0, device="cuda"), [tmp_path])["gpus"] == 2
    with pytest.raises(DraftboardError, match="GPUs: a CPU eval holds none"):
        eval_params(LaunchForm(**common, gpus=1.0, device="cpu"), [tmp_path])
    # issue 63: shards, one GPU each on cuda; an engine eval is one server
    from tracker.jobs import eval_job

    params = eval_params(LaunchForm(**common, shards=2.0, device="cuda"), [tmp_path])
    assert params["shards"] == 2 and params["name"].endswith("2 shards")
    with pytest.raises(DraftboardError, match="^Shards splits an offline eval's prompts across processes"):
        eval_params(LaunchForm(**common, shards=2.0, measured_by=("vllm", None)), [tmp_path])
    with pytest.raises(DraftboardError, match="shards 2 on a GPU hold one GPU each; gpus is 1"):
        eval_job.validate(eval_params(LaunchForm(**common, shards=2.0, gpus=1.0, device="cuda"), [tmp_path]))
    params = eval_params(LaunchForm(**common, measured_by=("vllm", None), concurrency="1,4", repeats=5.0), [tmp_path])
    assert params["repeats"] == 5 and params["name"].endswith("5 rounds")
    assert "repeats" not in eval_params(LaunchForm(**common, measured_by=("vllm", None), concurrency="4"), [tmp_path])
    for form, message in ((LaunchForm(**common, concurrency="1,4"), "choose an engine to measure by"),
                          (LaunchForm(**common, measured_by=("sglang", None), concurrency="4"),
                           "a load sweep runs on vllm, llamacpp so far"),
                          (LaunchForm(**common, measured_by=("llamacpp", "http://127.0.0.1:9"), concurrency="4"),
                           "llamacpp's replies carry no verify steps"),
                          (LaunchForm(**common, measured_by=("vllm", None), concurrency="1,999"),
                           "each concurrency level must be an integer from 1 to 64"),
                          (LaunchForm(**common, measured_by=("vllm", None), concurrency="a lot"),
                           "concurrency must be comma-separated integers"),
                          (LaunchForm(**common, measured_by=("vllm", None), repeats=3.0),
                           "Rounds: rounds repeat a load sweep's levels: give concurrency levels too"),
                          (LaunchForm(**common, measured_by=("vllm", None), concurrency="4", repeats=50.0),
                           "Rounds: rounds per level from 1 to 20, got 50"),
                          (LaunchForm(**common, measured_by=("vllm", None), concurrency="4", repeats=2.5),
                           "Rounds must be a whole number")):
        with pytest.raises(DraftboardError, match=message):
            eval_params(form, [tmp_path])


def test_edit_restores_every_setting_a_job_holds_and_names_what_it_cannot():
    """Issue 52 (HIGH): Edit on a sampled job filled the form as greedy. Every setting the form has comes back
    (the sampling preset, its numbers, samples, the engine, the reference); what it has no field for, or what
    this deployment no longer offers, is a line, never a silent change."""
    from tracker import config
    from tracker.dashboard.launch_form import CUSTOM_SAMPLING, OFFLINE, edit_state

    preset = "DFlash paper, T=1"
    sampled = {"target": "/t", "drafter": "/d", "prompts": "/p", "max_new_tokens": 64, "temperature": 1.0,
               "top_p": 1.0, "top_k": 0, "samples": 16, "device": "cpu", "dtype": "fp32", "reference": "z-lab v1",
               "checkpoint_step": 160, "engine": "vllm", "concurrency": [1, 4], "repeats": 5, "prompt_tokens": 4096,
               "gpus": 2, "shards": 2}
    state, notes = edit_state(sampled, [OFFLINE, ("vllm", None)])
    assert state["launch_sampling"] == preset and config.SAMPLING_PRESETS[preset] == (1.0, 1.0, 0)
    assert (state["launch_temperature"], state["launch_top_p"], state["launch_top_k"], state["launch_samples"]) == \
        (1.0, 1.0, 0, 16)
    assert state["launch_measured_by"] == ("vllm", None) and state["launch_concurrency"] == "1,4"
    assert state["launch_repeats"] == 5 and state["launch_gpus"] == 2 and state["launch_shards"] == 2
    assert (state["launch_reference"], state["launch_reference_name"], state["launch_step"]) == (True, "z-lab v1", 160)
    assert (state["launch_target"], state["launch_max_new"]) == ("/t", 64) and notes == []
    assert state["launch_prompt_tokens"] == 4096

    custom = {**sampled, "top_p": 0.9, "engine_url": "http://gone:8000", "scoring": "online", "seeds": 4}
    state, notes = edit_state(custom, [OFFLINE, ("vllm", None)])
    assert state["launch_sampling"] == CUSTOM_SAMPLING and state["launch_top_p"] == 0.9
    assert state["launch_measured_by"] == OFFLINE
    assert [n.split(":")[0] for n in notes] == ["measured by vLLM at http", "scoring 'online'", "seeds 4"]
    greedy, _ = edit_state({"target": "/t", "budgets": [4, 8]}, [OFFLINE])
    assert greedy["launch_sampling"].startswith("greedy") and greedy["launch_budgets"] == "4,8"
    assert greedy["launch_reference"] is False and greedy["launch_step"] is None


# Launch's form as the page builds it from session state (pages/launch.py): the fields Edit fills in.
def _form_from_state(state: dict, common: dict):
    from tracker.dashboard.launch_form import LaunchForm

    return LaunchForm(**common, budgets=state["launch_budgets"], max_new_tokens=state["launch_max_new"],
                      device=state["launch_device"], dtype=state["launch_dtype"],
                      drafter_precision=state["launch_precision"], linear_attn=state["launch_linear"],
                      limit_per_dataset=state["launch_limit"], prompt_tokens=state["launch_prompt_tokens"],
                      measured_by=state["launch_measured_by"], temperature=state["launch_temperature"],
                      top_p=state["launch_top_p"], top_k=state["launch_top_k"], samples=state["launch_samples"],
                      concurrency=state["launch_concurrency"], repeats=state["launch_repeats"],
                      gpus=state["launch_gpus"], shards=state["launch_shards"],
                      reference=state["launch_reference"], reference_name=state["launch_reference_name"],
                      checkpoint_step=state["launch_step"])


@pytest.mark.parametrize("kind", ["offline", "engine", "sampled"])
def test_edit_then_queue_is_the_same_job_field_by_field(tmp_path, kind):
    """Issue 65 M2: Edit on a cancelled llama.cpp job (linear attention auto, custom T 0.7 / top_p 0.9 / top_k 50,
    Samples 6, budgets 4,8, concurrency 1,2) came back as "match training run", Samples 8, budgets 4,8,16,32 and the
    checkpoint as a typed path. Each job, edited and queued again with the form left as Edit filled it (and over a
    form that held another job's values before), is the same job, every param."""
    from tracker.dashboard.launch_form import OFFLINE, LaunchForm, edit_state, eval_params, registered_step

    launch_inputs(tmp_path)
    common = dict(target=str(tmp_path / "target"), prompts=str(tmp_path / "p.jsonl"), drafter=str(tmp_path / "ck"),
                  train_run_id="t", train_name="v5", training_fingerprint=fp(path="n/a"))
    forms = {
        "offline": LaunchForm(**common, checkpoint_step=200, budgets="2,8", max_new_tokens=96, device="cpu",
                              dtype="bf16", drafter_precision="bf16-autocast", linear_attn="fallback",
                              limit_per_dataset=12, prompt_tokens=40, shards=2),
        "engine": LaunchForm(**common, checkpoint_step=200, budgets="4,8", linear_attn="auto",
                             measured_by=("llamacpp", None), temperature=0.7, top_p=0.9, top_k=50, samples=6,
                             concurrency="1,2", repeats=4),
        "sampled": LaunchForm(**common, checkpoint_step=200, temperature=1.0, top_p=0.95, top_k=20, samples=6,
                              device="cuda", gpus=2, limit_per_dataset=3, reference=True, reference_name="mine"),
    }
    params = eval_params(forms[kind], [tmp_path])
    other = edit_state(eval_params(forms["offline" if kind != "offline" else "engine"], [tmp_path]),
                       [OFFLINE, ("llamacpp", None)])[0]  # the form as another job's Edit left it
    other.update(launch_linear="match training run", launch_samples=8, launch_budgets="4,8,16,32", launch_limit=5)
    state, notes = edit_state(params, [OFFLINE, ("llamacpp", None)])
    assert notes == [] and set(state) >= set(other)  # every field the other job's Edit set is set again
    again = eval_params(_form_from_state({**other, **state}, {k: v for k, v in common.items()}), [tmp_path])
    assert again == params
    if kind == "engine":  # what the form shows where the job holds nothing: what ran
        assert (state["launch_linear"], state["launch_samples"], state["launch_budgets"]) == ("auto", 1, "")
    # The checkpoint comes back as the registered step it was, not as a typed path.
    assert registered_step(params, {100: str(tmp_path / "x"), 200: str(tmp_path / "ck")}) == 200
    assert registered_step(params, {200: str(tmp_path / "elsewhere")}) is None
