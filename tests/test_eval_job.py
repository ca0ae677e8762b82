"""tracker/jobs/eval_job.py: the one declaration of the eval flags, and what a queued eval may hold.

The CLI's `eval` subcommand and a job's arguments come from the same fields, so what a job can
say is exactly what `draftboard eval` parses; params are validated (types, choices, the budget
cap, unknown keys), and the allowed-roots check walks folders for symlinks and shard indexes.
"""

from __future__ import annotations

import json

import pytest

from tracker import config
from tracker.cli import build_parser
from tracker.errors import DraftboardError
from tracker.jobs import eval_job
from conftest import eval_params


def _eval_parse(args: list[str]):
    return build_parser().parse_args(["eval", *args])


def test_cli_parses_back_exactly_what_a_job_says():
    nasty = "v4; rm -rf ~ && echo $(whoami) 'x' \"y\""
    params = eval_params(drafter=nasty, budgets=[16, 4, 8], max_new_tokens=64, linear_attn="fallback",
                         checkpoint_step=1200, train_run_id="abc", reference="z-lab", device="cuda", dtype="bf16",
                         drafter_precision="bf16-autocast", no_log=True, enable_thinking=False,
                         completions="/data/c.jsonl", name="n", engine="vllm", num_speculative_tokens=5,
                         concurrency=[8, 1, 4], repeats=5, context_buckets=[2048, 0, 512], prompt_tokens=4096)
    args = eval_job.cli_args(params)
    assert args[0] == "eval" and nasty in args  # one argument, never split or quoted
    parsed = _eval_parse(args[1:])
    assert {name: getattr(parsed, name) for name in params} == {
        **params, "budgets": (4, 8, 16), "concurrency": (1, 4, 8),
        "context_buckets": (0, 512, 2048)}  # sorted, as the CLI's tuples
    # The CLI's defaults are the spec's, and the fixed flags of docs/DESIGN.md are all there.
    defaults = _eval_parse(["--target", "t", "--drafter", "d", "--prompts", "p"])
    assert (defaults.max_new_tokens, defaults.budgets, defaults.dtype, defaults.linear_attn, defaults.device) == \
        (256, config.DEFAULT_BUDGETS, "fp32", "auto", None)
    assert (defaults.out, defaults.cache_dir, defaults.no_log, defaults.enable_thinking) == (None, None, False, None)
    assert [f.flag for f in eval_job.EVAL_FIELDS] == [
        "--target", "--drafter", "--prompts", "--completions", "--max-new-tokens", "--budgets", "--device",
        "--dtype", "--drafter-precision", "--linear-attn", "--out", "--tracking-uri", "--train-run-id", "--checkpoint-step",
        "--reference", "--name", "--no-log", "--cache-dir", "--enable-thinking", "--last-block", "--scoring",
        "--prompt-tokens", "--limit-per-dataset", "--batch-size", "--anchor-chunk", "--temperature", "--top-p", "--top-k", "--samples",
        "--seeds", "--seed", "--engine", "--engine-python", "--engine-url", "--engine-port",
        "--num-speculative-tokens", "--prefix-caching", "--context-buckets", "--concurrency", "--gpus", "--shards",
        "--repeats"]
    assert eval_job.cli_args(eval_params(enable_thinking=True))[-1] == "--enable-thinking"


def test_cli_caps_budgets_like_the_queue(capsys):
    with pytest.raises(SystemExit) as exit_:
        _eval_parse(["--target", "t", "--drafter", "d", "--prompts", "p", "--budgets", f"4,{10**6}"])
    assert exit_.value.code == 2
    assert "argument --budgets: each budget must be an integer from 1 to 4096" in capsys.readouterr().err
    assert _eval_parse(["--target", "t", "--drafter", "d", "--prompts", "p", "--budgets", "4096,2"]).budgets == (2, 4096)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"target": "t", "drafter": "d"}, "an eval job needs prompts"),
        (eval_params(temperature="hot"), "temperature must be a finite number >= 0"),
        (eval_params(temperature=float("nan")), "temperature must be a finite number >= 0"),
        (eval_params(top_p=True), "top_p must be a finite number >= 0"),
        (eval_params(samples=-1), "samples must be a non-negative integer"),
        (eval_params(tempreature=1), "unknown eval param.* tempreature"),
        (eval_params(out="/etc/cron.d/x"), "unknown eval param.* out"),  # the CLI's, never a job's: it writes
        (eval_params(cache_dir="/"), "unknown eval param.* cache_dir"),
        # The deployment starts engines from its own Python; a job names neither that nor a port.
        (eval_params(engine="vllm", engine_python="/tmp/evil/python"), "unknown eval param.* engine_python"),
        (eval_params(engine="vllm", engine_port=22), "unknown eval param.* engine_port"),
        (eval_params(engine="vllm", engine_url="http://127.0.0.1:8000"), "engine_url .* not one of the servers"),
        (eval_params(engine="tgi"), "engine must be one of vllm, sglang, llamacpp"),
        (eval_params(budgets="4,8"), "budgets must be a non-empty list"),
        (eval_params(budgets=[4, 10**6]), "each budget must be an integer from 1 to 4096"),
        (eval_params(budgets=[0]), "from 1 to 4096"),
        (eval_params(max_new_tokens=True), "max_new_tokens must be a non-negative integer"),
        (eval_params(drafter="--no-log"), "starts with '-'"),
        (eval_params(drafter=""), "drafter must be a non-empty string"),
        (eval_params(device="tpu"), "device must be one of cpu, cuda"),
        (eval_params(no_log="yes"), "no_log must be true or false"),
        (["eval"], "must be a JSON object"),
    ],
)
def test_bad_params_are_refused(params, message):
    with pytest.raises(DraftboardError, match=message):
        eval_job.validate(params)
    with pytest.raises(DraftboardError, match=message):
        eval_job.cli_args(params)


def test_paths_outside_the_roots_and_folders_leading_out_are_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    drafter = root / "drafter"
    drafter.mkdir(parents=True)
    outside.mkdir()
    (outside / "model.safetensors").write_bytes(b"x")
    (drafter / "config.json").write_text("{}")
    roots = [root.resolve()]

    def params(**paths):
        return {"target": str(root / "missing"), "drafter": str(drafter), "prompts": str(root / "p.jsonl"), **paths}

    eval_job.check_paths(params(), roots)  # inside the roots: fine, even where nothing exists yet
    with pytest.raises(DraftboardError, match=r"--target .*outside is outside the allowed roots"):
        eval_job.check_paths(params(target=str(outside)), roots)
    with pytest.raises(DraftboardError, match=r"--prompts .* is outside the allowed roots"):
        eval_job.check_paths(params(prompts=str(root / ".." / "outside" / "p.jsonl")), roots)

    (drafter / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(DraftboardError, match=r"--drafter .*drafter: .*model.safetensors leads to .*outside"):
        eval_job.check_paths(params(), roots)
    eval_job.check_paths(params(), roots, trusted=lambda d: d == str(drafter))  # a registered checkpoint

    (drafter / "model.safetensors").unlink()
    (drafter / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "model-1.safetensors", "v": "../../outside/model.safetensors"}}))
    with pytest.raises(DraftboardError, match=r"index.json leads to .*outside/model.safetensors"):
        eval_job.check_paths(params(), roots)


def test_a_hub_dataset_passes_the_roots_check_and_a_local_one_is_checked(tmp_path):
    roots = [tmp_path / "root"]
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    assert eval_job.check_path("--prompts", "hf:openai/gsm8k:main:test", roots) is None
    assert eval_job.check_path("--prompts", f"hf:{tmp_path / 'root'}:test", roots) == (tmp_path / "root").resolve()
    with pytest.raises(DraftboardError, match="outside the allowed roots"):
        eval_job.check_path("--prompts", f"hf:{tmp_path / 'elsewhere'}:test", roots)


def test_integer_lists_are_ascii_and_bounded_in_count_and_in_what_an_error_echoes():
    """Issue 64 (also): `1_6` and `٣` passed int(); a job row of 5 M levels validated in 2 s; an error echoed 5,000
    characters."""
    for text in ("1_6", "٣", "4,²"):
        with pytest.raises(ValueError, match="comma-separated integers") as refused:
            eval_job.parse_ints("concurrency", text)
        assert len(str(refused.value)) < 200
    with pytest.raises(ValueError) as refused:
        eval_job.parse_ints("concurrency", "x" * 5000)
    assert len(str(refused.value)) < 200
    levels = ",".join(str(n) for n in range(1, config.MAX_CONCURRENCY_LEVELS + 2))
    with pytest.raises(ValueError, match=f"at most {config.MAX_CONCURRENCY_LEVELS} concurrency levels"):
        eval_job.parse_ints("concurrency", levels)
    with pytest.raises(DraftboardError, match=f"at most {config.MAX_CONCURRENCY_LEVELS} concurrency levels"):
        eval_job.validate(eval_params(engine="vllm", concurrency=[1] * 5_000_000))
    assert eval_job.parse_ints("concurrency", "8, 1,4") == [1, 4, 8]
