"""`draftboard eval --shards N` (evaluators.shards): the prompts split across shard processes and merged equal the
one-process eval on every prompt; shards that ran in critically different environments fail the eval, naming how."""

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

from evaluators.settings import EvalSettings
from evaluators.pooling import Share
from evaluators.shards import LINE, merge, shard_environments
from tracker import config
from tracker.cli import main
from tracker.errors import DraftboardError

# What a sharded eval adds or sizes per process; every other key must equal the one process's.
PER_PROCESS = {"timing", "settings", "fingerprint", "shards"}


def _sharded(pair, out, *extra):
    from demo.serving_pair import MAX_NEW_TOKENS

    return main(["eval", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"), "--prompts",
                 str(pair / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS), "--no-log", "--device", "cpu",
                 "--cache-dir", str(out.parent / "cache"), "--out", str(out), *extra])


def _same_as_one_process(sharded: dict, one: dict) -> None:
    assert set(sharded) - PER_PROCESS == set(one) - PER_PROCESS
    for key in set(one) - PER_PROCESS:
        assert sharded[key] == one[key], key  # walks, tau, DDTree, curves and intervals: exactly equal
    assert sharded["fingerprint"]["numerics"] == one["fingerprint"]["numerics"]


def test_two_shards_equal_one_process_on_the_qwen3_pair(serving_pair, tmp_path):
    one = json.loads((serving_pair / "offline.json").read_text())
    out = tmp_path / "sharded.json"
    assert _sharded(serving_pair, out, "--shards", "2") == 0
    sharded = json.loads(out.read_text())
    _same_as_one_process(sharded, one)
    ids = [p["id"] for p in one["prompts"]]
    assert [s["prompts"] for s in sharded["shards"]] == [ids[0::2], ids[1::2]]  # z-lab's range(rank, n, world)
    assert [s["shard"] for s in sharded["shards"]] == [0, 1] and {s["device"] for s in sharded["shards"]} == {"cpu"}
    assert len({s["env_hash"] for s in sharded["shards"]}) == 1
    # A re-run is warm per shard: its target work comes from the cache each shard wrote.
    again = tmp_path / "again.json"
    assert _sharded(serving_pair, again, "--shards", "2") == 0
    warm = json.loads(again.read_text())
    assert warm["timing"]["loaded"] == "heads" and warm["tau"] == sharded["tau"]


def test_a_sampled_eval_sharded_keeps_each_prompts_draws_together(serving_pair, tmp_path):
    sampled = ("--temperature", "0.7", "--samples", "2")
    assert _sharded(serving_pair, tmp_path / "one.json", *sampled) == 0
    assert _sharded(serving_pair, tmp_path / "sharded.json", *sampled, "--shards", "3") == 0
    one, sharded = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "sharded.json"))
    _same_as_one_process(sharded, one)
    assert one["monte_carlo"] and all(len(p["samples"]) == 2 for p in sharded["prompts"])


def test_three_shards_equal_one_process_on_the_hybrid_pair(hybrid_serving_pair, tmp_path):
    one = json.loads((hybrid_serving_pair / "offline-bf16.json").read_text())
    out = tmp_path / "sharded.json"
    assert _sharded(hybrid_serving_pair, out, "--shards", "3", "--dtype", "bf16") == 0
    sharded = json.loads(out.read_text())
    _same_as_one_process(sharded, one)
    assert [len(s["prompts"]) for s in sharded["shards"]] == [3, 3, 2]  # 8 prompts over 3 shards


def _share(pair, tmp_path, shard: int, environ: dict) -> Share:
    """Shard `shard` of 2 run as its own process, in `environ`: a node of a cluster as its environment has it."""
    from demo.serving_pair import MAX_NEW_TOKENS

    settings = EvalSettings(target=str(pair / "target"), drafter=str(pair / "drafter"),
                            prompts=str(pair / "prompts.jsonl"), max_new_tokens=MAX_NEW_TOKENS, device="cpu",
                            cache_dir=str(pair / "cache"))
    spec, out = tmp_path / "settings.json", tmp_path / f"shard-{shard}.json"
    spec.write_text(json.dumps(asdict(settings)))
    done = subprocess.run([sys.executable, "-m", "evaluators.shards", str(spec), str(shard), "2", str(out)],
                          env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(line.startswith(LINE) for line in done.stdout.splitlines())  # its progress, for the parent
    return settings, Share.from_json(json.loads(out.read_text()))


def test_a_shard_in_another_numerics_environment_fails_the_eval_naming_it(serving_pair, tmp_path):
    # NGC's PyTorch containers set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1: a node started from one runs float32 matmuls
    # in TF32, a critical difference from a node that does not.
    base = {k: v for k, v in os.environ.items() if k != "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"}
    settings, first = _share(serving_pair, tmp_path, 0, base)
    _, second = _share(serving_pair, tmp_path, 1, {**base, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"})
    with pytest.raises(DraftboardError, match=r"shard 1's environment differs critically from shard 0's "
                                              r"\(numerics\.float32_matmul_precision: highest vs high"):
        merge(settings, [first, second])
    # The same two shards in one environment merge into the one-process eval.
    _, second = _share(serving_pair, tmp_path, 1, base)
    one = json.loads((serving_pair / "offline.json").read_text())
    _same_as_one_process(merge(settings, [second, first]), one)


def test_a_failing_shard_fails_the_eval_in_one_line(serving_pair, tmp_path, capsys):
    assert _sharded(serving_pair, tmp_path / "out.json", "--shards", "9") == 2  # 8 prompts
    err = capsys.readouterr().err.strip().splitlines()[-1]
    # the shard that failed is named, not one of those stopped because of it
    assert err == "error: shard 8 of 9: --shards 9: only 8 prompt(s) to split; use at most 8 shards"
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("extra, message", [
    (["--shards", "0"], "--shards: processes from 1 to 64, got 0"),
    (["--shards", "2", "--scoring", "online"], "--shards with --scoring online"),
    (["--shards", "2", "--engine", "vllm"], "--shards splits an offline eval's prompts across processes"),
])
def test_shards_refused_in_one_line(serving_pair, tmp_path, capsys, extra, message):
    args = ["eval", "--target", str(serving_pair / "target"), "--drafter", str(serving_pair / "drafter"),
            "--prompts", str(serving_pair / "prompts.jsonl"), "--no-log", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_each_gpu_shard_sees_its_own_gpu_and_cpu_shards_split_the_cores():
    gpus = shard_environments(2, "cuda", {"CUDA_VISIBLE_DEVICES": "4,6,7", "PATH": "/bin"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in gpus] == ["4", "6"] and gpus[0]["PATH"] == "/bin"
    with pytest.raises(DraftboardError, match="--shards 3 on cuda needs 3 GPUs, one per shard; this eval sees 2"):
        shard_environments(3, "cuda", {"CUDA_VISIBLE_DEVICES": "0,1"})
    cpu = shard_environments(2, "cpu", {"CUDA_VISIBLE_DEVICES": "0"})
    assert {e["CUDA_VISIBLE_DEVICES"] for e in cpu} == {""}
    assert {e["OMP_NUM_THREADS"] for e in cpu} == {str(max(1, (os.cpu_count() or 1) // 2))}


def test_job_params_shards():
    from tracker.jobs import eval_job, gpus

    params = {"target": "/t", "drafter": "/d", "prompts": "/p.jsonl", "shards": 4}
    assert eval_job.validate(params)["shards"] == 4 and gpus.needed(params) == 4  # one GPU per shard
    assert gpus.needed({**params, "device": "cpu"}) == 0
    assert eval_job.cli_args(params)[-2:] == ["--shards", "4"]
    for bad, message in [({"shards": 4, "gpus": 2}, "shards 4 on a GPU hold one GPU each; gpus is 2"),
                         ({"shards": 2, "engine": "vllm"}, "shards splits an offline eval"),
                         ({"shards": config.MAX_SHARDS + 1}, "shards: processes from 1 to 64")]:
        with pytest.raises(DraftboardError, match=message):
            eval_job.validate({**params, **bad})
