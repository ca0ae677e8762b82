"""Regression alerts (tracker/measurement/regression.py): a real eval worse than its run's previous checkpoint, by the
paired bootstrap, is recorded on the run and POSTed once to the deployment's webhook (a loopback receiver
here); an eval that is not worse, or not comparable, raises none."""

from __future__ import annotations

import http.server
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from demo.serving_pair import MAX_NEW_TOKENS
from loopback import LoopbackServer
from tracker import Tracker, config
from tracker.measurement import regression
from tracker.cli import main
from tracker.errors import DraftboardError
from tracker.store import names

pytestmark = pytest.mark.sqlite_only(reason="one store is enough: the alert logic reads what any store returns")


class Receiver(LoopbackServer):
    """A webhook that keeps every JSON body POSTed to it."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the stdlib's name)
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        super().__init__(Handler)


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def _scrambled(src, dst):
    """The drafter with its weights replaced by noise: a checkpoint that forgot what it learned."""
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(v.shape, generator=gen, dtype=torch.float32).to(v.dtype) * 0.5
               for k, v in weights.items()}, dst / "model.safetensors")
    return dst


def test_a_worse_checkpoint_posts_one_alert_and_a_steady_one_none(serving_pair, tmp_path, monkeypatch, receiver,
                                                                   capsys):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("DRAFTBOARD_ALERT_WEBHOOK", receiver.url + "/hooks/T000/B000")
    tracker = Tracker(uri)
    with tracker.training_run("drafter-v9", {"lr": 1e-3}, str(serving_pair / "target")) as train:
        train.log_step(1, loss=1.0)
    bad = _scrambled(serving_pair / "drafter", tmp_path / "scrambled")

    def evaluate(drafter, step):
        assert main(["eval", "--target", str(serving_pair / "target"), "--drafter", str(drafter), "--prompts",
                     str(serving_pair / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS), "--cache-dir",
                     str(serving_pair / "cache"), "--train-run-id", train.run_id, "--checkpoint-step", str(step),
                     "--tracking-uri", uri]) == 0
        return tracker.find_runs("eval")[0]

    evaluate(serving_pair / "drafter", 100)
    steady = evaluate(serving_pair / "drafter", 200)
    assert receiver.bodies == [] and names.ALERT not in steady.data.tags  # the same drafter: no difference
    worse = evaluate(bad, 300)
    (body,) = receiver.bodies
    assert body["text"].startswith(f"draftboard regression: {worse.info.run_name} is worse than the previous "
                                   f"checkpoint {steady.info.run_name}: Δτ -")
    assert "paired bootstrap over 8 prompts" in body["text"]
    assert worse.data.tags[names.ALERT] == body["text"].removeprefix("draftboard regression: ")
    (alert,) = tracker.read_json(worse.info.run_id, names.ALERTS_ARTIFACT)["alerts"]
    assert alert["against"] == regression.PREVIOUS and alert["high"] < 0
    assert f"regression: {worse.info.run_name} is worse" in capsys.readouterr().err


def test_an_unreachable_webhook_warns_and_never_fails_the_eval(capsys):
    alert = regression.Alert("r", "v @ step 2", regression.REFERENCE, "ref", "z-lab", -0.5, -0.8, -0.2, 16)
    secret = "/services/T000/B000/XXXXhushXXXX"
    assert regression.post(f"http://127.0.0.1:9{secret}", [alert]) is False  # port 9: nothing listens
    err = capsys.readouterr().err
    # Issue 64, F1: a job's log (read by every dashboard visitor) names the webhook by its host, never its path.
    assert "could not be posted to 127.0.0.1:" in err and "hush" not in err and "T000" not in err
    assert regression.post(f"http://[::1{secret}", [alert]) is False  # a URL urllib cannot parse
    assert "hush" not in capsys.readouterr().err
    with pytest.raises(DraftboardError) as refused:
        config.alert_webhook({"DRAFTBOARD_ALERT_WEBHOOK": f"ftp://hooks.example{secret}"})
    assert "hush" not in str(refused.value) and "T000" not in str(refused.value)
    assert regression.message([alert]) == {"text": "draftboard regression: v @ step 2 is worse than the reference "
                                                    "z-lab: Δτ -0.500 [-0.800, -0.200] (paired bootstrap over 16 "
                                                    "prompts)"}


def test_a_run_name_reaches_slack_as_text_not_as_a_ping_or_a_link(receiver):
    """Issue 37, finding 6: a run name is the user's; Slack's mrkdwn would turn `<!channel>` into a ping
    of everyone and `<url|text>` into a link that reads as something else."""
    name = "<!channel> v2 <https://evil.example/x|see the fix> & <@U0123>"
    alert = regression.Alert("r", name, regression.REFERENCE, "ref", "z-lab <b>", -0.5, -0.8, -0.2, 16)
    assert regression.post(receiver.url + "/hooks/T000/B000", [alert]) is True
    (body,) = receiver.bodies
    assert "<" not in body["text"] and ">" not in body["text"]
    assert body["text"].startswith("draftboard regression: &lt;!channel&gt; v2 &lt;https://evil.example/x|see the "
                                   "fix&gt; &amp; &lt;@U0123&gt; is worse than the reference z-lab &lt;b&gt;")


def _results(lengths: dict[str, list[int]], device: str = "cpu") -> dict:
    return {"prompts": [{"id": pid, "input_ids": [1, 2, len(pid)], "acceptance_lengths": walk}
                        for pid, walk in lengths.items()],
            "protocol": {"scoring": "offline", "temperature": 0, "block_size": 8},
            "fingerprint": {"software": {"torch": "2.13.0"}, "hardware": {"device": device},
                            "numerics": {"dtype": "fp32", "linear_attention_path": "n/a"}}}


def test_paired_refuses_what_is_not_the_drafters_gap():
    good = _results({str(i): [4, 4, 3] for i in range(8)})
    worse = _results({str(i): [1, 2, 1] for i in range(8)})
    assert regression.paired(good, worse).verdict == "worse"
    with pytest.raises(DraftboardError, match="environments differ critically"):
        regression.paired(good, _results({str(i): [1] for i in range(8)}, device="cuda"), same_environment=True)
    other = _results({str(i): [1] for i in range(8)})
    other["prompts"][0]["input_ids"] = [9, 9]
    with pytest.raises(DraftboardError, match="different token ids"):
        regression.paired(good, other)
    with pytest.raises(DraftboardError, match="share no prompt"):
        regression.paired(good, _results({"x": [1]}))


def test_an_alert_shows_on_runs_and_run_detail_as_text(tmp_path, monkeypatch):
    from apptest import run_page, serve, shown

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("v9", {"lr": 1e-3}, "/models/t") as train:
        train.log_step(1, loss=1.0)
    with tracker.eval_run("v9 @ step 300", target="/models/t", train_run_id=train.run_id, checkpoint_step=300) as ev:
        ev.log_metrics({"tau": 1.2}, step=0)
    hostile = "v9 @ step 300 is worse than the reference <img src=x onerror=alert(1)> **z**: Δτ -0.500"
    tracker.set_tag(ev.run_id, names.ALERT, hostile)
    serve(monkeypatch, uri, tmp_path, tmp_path)
    table = run_page("pages/runs.py").dataframe[0].value.set_index("run_id")
    assert table.loc[ev.run_id, "status"] == "📉 Finished" and table.loc[train.run_id, "status"] == "Finished"
    at = run_page("pages/run_detail.py", run=ev.run_id)
    (warning,) = [w.value for w in at.warning if "Regression" in w.value]
    assert shown(warning) == f"**Regression** — {hostile}"  # every character escaped: shown as written


def test_the_check_says_what_it_compared_with_and_a_relative_target_meets_its_references(tmp_path, monkeypatch):
    """Issue 39: a regression check that found nothing to compare says so (it had been silent), one that
    compared says with what; an eval whose --target was relative meets the references logged with the
    same target resolved."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "t").mkdir(parents=True)
    tracker = Tracker(f"sqlite:///{tmp_path / 'store.db'}")

    def logged(name, target, walks, kind="eval"):
        results = {"prompts": [{"id": f"p{i}", "acceptance_lengths": w} for i, w in enumerate(walks)]}
        with tracker.eval_run(name, target=target, kind=kind, reference_name=name if kind == "reference" else None,
                              params={"prompts": "p.jsonl"}) as ev:
            ev.log_metrics({"tau": 1.0}, step=0)
        tracker.write_json(ev.run_id, names.EVAL_RESULTS_ARTIFACT, results)
        return ev.run_id

    said: list[str] = []
    alone = logged("alone", "models/t", [[2, 2]] * 8)
    assert regression.check(tracker, alone, said.append) == []
    assert said == [f"{regression.PREVIOUS}: not checked, the eval names no training run and checkpoint step",
                    f"{regression.REFERENCE}: nothing to compare with"]
    logged("z-lab", str(tmp_path / "models" / "t"), [[4, 4, 4]] * 8, kind="reference")  # logged resolved
    worse = logged("worse", "models/t", [[1, 1]] * 8)  # --target models/t, relative
    said.clear()
    (alert,) = regression.check(tracker, worse, said.append)
    assert alert.against == regression.REFERENCE and alert.against_name == "z-lab" and alert.high < 0
    assert said == [f"{regression.PREVIOUS}: not checked, the eval names no training run and checkpoint step"]
    said.clear()
    steady = logged("steady", "models/t", [[4, 4, 4]] * 8)
    assert regression.check(tracker, steady, said.append) == []
    assert said[1].startswith(f"{regression.REFERENCE}: compared with z-lab (the newest comparable of 1): not worse")


def test_the_same_mean_with_a_worse_long_context_bucket_raises_the_alert_naming_the_bucket(tmp_path):
    """Issue 50: two checkpoints with the same mean tau, the later one accepting less at long contexts and more at
    short ones. The paired mean says no difference; the bucket [16, ∞) is worse on every prompt: one alert, on the
    run, naming the bucket. The same pair the other way round alerts on the short bucket."""
    tracker = Tracker(f"sqlite:///{tmp_path / 'store.db'}")
    with tracker.training_run("v9", {"lr": 1e-3}, "/models/t") as train:
        train.log_step(1, loss=1.0)

    def logged(step, walk):  # 8 prompts of 10 tokens, one walk each: contexts 11 + the tokens walked before
        results = {"prompts": [{"id": f"p{i}", "input_ids": list(range(10)), "acceptance_lengths": walk}
                               for i in range(8)], "context_buckets": [0, 16]}
        with tracker.eval_run(f"v9 @ step {step}", target="/models/t", train_run_id=train.run_id,
                              checkpoint_step=step) as ev:
            ev.log_metrics({"tau": 3.0}, step=step)
        tracker.write_json(ev.run_id, names.EVAL_RESULTS_ARTIFACT, results)
        return ev.run_id

    logged(100, [1, 4, 4])  # [0,16): 1,4 at 11, 12; [16,∞): 4 at 16
    said: list[str] = []
    later = logged(200, [3, 3, 3])  # [0,16): 3,3 at 11, 14; [16,∞): 3 at 17; the same mean, 3
    (alert,) = regression.check(tracker, later, said.append)
    assert (alert.against, alert.bucket, alert.delta, alert.low, alert.high, alert.n_prompts) == (
        regression.PREVIOUS, "[16, ∞)", -1.0, -1.0, -1.0, 8)
    assert alert.text == ("v9 @ step 200 is worse than the previous checkpoint v9 @ step 100 at context [16, ∞) "
                          "while its mean holds: Δτ -1.000 [-1.000, -1.000] (paired bootstrap over 8 prompts, pooled "
                          "over the bucket's blocks, Bonferroni over the buckets compared)")
    regression.record(tracker, later, [alert])
    assert tracker.read_json(later, names.ALERTS_ARTIFACT)["alerts"][0]["bucket"] == "[16, ∞)"
    (back,) = regression.check(tracker, logged(300, [1, 4, 4]), said.append)
    assert back.bucket == "[0, 16)" and back.delta == -0.5
    said.clear()
    assert regression.check(tracker, logged(400, [1, 4, 4]), said.append) == []  # the same walks: nothing worse
    assert said[0].endswith("; no context bucket worse (2 compared)")


def test_an_eval_naming_no_run_is_linked_to_the_run_that_registered_its_bytes(serving_pair, tmp_path, capsys):
    """Issue 52: an eval run as the README shows (no --train-run-id) of a checkpoint a training run registered is
    logged as that checkpoint's, at its step, by the content digest the run recorded (one indexed tag search); a
    copy registered by two runs links to neither and says so."""
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("drafter-v9", {"lr": 1e-3}, str(serving_pair / "target")) as train:
        train.log_step(1, loss=1.0)
        train.log_checkpoint(serving_pair / "drafter", 300)
    args = ["eval", "--target", str(serving_pair / "target"), "--drafter", str(serving_pair / "drafter"), "--prompts",
            str(serving_pair / "prompts.jsonl"), "--max-new-tokens", "16", "--cache-dir", str(serving_pair / "cache"),
            "--tracking-uri", uri]
    assert main(args) == 0
    ev = tracker.find_runs("eval")[0]
    assert (ev.data.tags[names.TRAIN_RUN_ID], ev.data.tags[names.CHECKPOINT_STEP]) == (train.run_id, "300")
    assert f"training run {train.run_id}'s at step 300" in capsys.readouterr().err
    # Issue 64, F2: any store user can tag any run. Bare tags (no draftboard training run, or one without the
    # checkpoint's record), with steps `²` and 5,000 digits, neither unlink the owner nor capture the eval.
    from tracker.store import checkpoints

    tag = names.checkpoint_digest_tag(checkpoints.digest(serving_pair / "drafter")[1])
    planted = tracker.client.create_experiment("someone-else")
    for kind, step in ((None, "7"), (None, "²"), ("train", "9" * 5000), ("train", "8")):
        tags = {tag: step, **({names.KIND: kind} if kind else {})}
        tracker.client.set_terminated(tracker.client.create_run(planted, tags=tags).info.run_id)
    assert main(args) == 0
    ev = tracker.find_runs("eval")[0]
    assert (ev.data.tags[names.TRAIN_RUN_ID], ev.data.tags[names.CHECKPOINT_STEP]) == (train.run_id, "300")
    capsys.readouterr()
    with tracker.training_run("drafter-v9 again", {"lr": 1e-3}, str(serving_pair / "target")) as other:
        other.log_checkpoint(serving_pair / "drafter", 10)
    assert main(args) == 0
    ev = tracker.find_runs("eval")[0]
    assert names.TRAIN_RUN_ID not in ev.data.tags and "2 registered checkpoints have these bytes" in \
        capsys.readouterr().err


def test_a_worse_mean_within_the_spread_of_repeats_raises_no_alert(tmp_path):
    """Issue 51, item 6: checkpoint 200 is worse than 100 by the paired bootstrap (Δτ -0.125 on every prompt), but
    checkpoint 100 was measured twice in the same environment and protocol, 0.25 apart: the gap is within what
    repeats of one checkpoint move, so no alert; without the repeat, the alert."""
    tracker = Tracker(f"sqlite:///{tmp_path / 'store.db'}")
    with tracker.training_run("v9", {"lr": 1e-3}, "/models/t") as train:
        train.log_step(1, loss=1.0)

    def logged(step, walk, tau):
        results = {"prompts": [{"id": f"p{i}", "input_ids": list(range(10)), "acceptance_lengths": walk}
                               for i in range(8)]}
        with tracker.eval_run(f"v9 @ step {step}", target="/models/t", train_run_id=train.run_id, checkpoint_step=step,
                              tags={"protocol.prompt_digest": "abc", "env.critical_key": "k"}) as ev:
            ev.log_metrics({"tau": tau}, step=step)
        tracker.write_json(ev.run_id, names.EVAL_RESULTS_ARTIFACT, results)
        return ev.run_id

    logged(100, [3, 3, 3, 3], 3.0)
    later = logged(200, [3, 3, 3, 2.5], 2.875)
    (alert,) = regression.check(tracker, later)
    assert alert.delta == -0.125 and alert.bucket == ""
    logged(100, [3, 3, 3, 3], 2.75)  # a repeat of checkpoint 100 that measured 0.25 lower
    assert regression.repeat_spread(tracker, tracker.run(later)) == (0.0, 1)
    said: list[str] = []
    assert regression.check(tracker, later, said.append) == []
    assert "within the spread of repeats measured the same way (0.250 over 2 evals of one checkpoint)" in said[0]
