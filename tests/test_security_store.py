"""Issue 10, as tried there, against the store, the CLI and the demo: each finding now fails safely.

- #3 `draftboard demo --force` deletes only what the demo created (its manifest), never a folder
  of someone else's; without DRAFTBOARD_HOME the home is `./.draftboard`.
- #8 a damaged checkpoint record is skipped with a warning; a broken fingerprint given to
  `env-diff` (#14: or a non-UTF-8 file) is one `error:` line and exit 2.
- #9 `import-log` of a 50 MB log streams in bounded memory, and an interrupted import (SIGINT,
  SIGTERM) ends its run FAILED with the steps read so far.
- #15 torch >= 2.6 (CVE-2025-32434).
"""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from packaging.requirements import Requirement

from demo.build import DEMO_DIR, MANIFEST, remove_demo
from tracker import Tracker, config
from tracker.cli import main
from tracker.errors import DraftboardError
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# --------------------------------------------------------------------------- #3 demo --force


def _plant(folder: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)


def _kept(folder: Path, files: dict[str, str]) -> bool:
    return all((folder / rel).read_text() == text for rel, text in files.items())


def test_demo_force_removes_only_what_its_manifest_lists(demo_home, demo_foreign_files, tmp_path):
    assert _kept(demo_home, demo_foreign_files)  # the session's `--force` build in their folder left them alone
    home = tmp_path / "home"
    shutil.copytree(demo_home, home)
    manifest = json.loads((home / DEMO_DIR / MANIFEST).read_text())
    assert manifest["complete"] and manifest["files"] and manifest["runs"]
    stray = {f"{DEMO_DIR}/runs/my-notes.md": "written by a person into the demo's folder\n"}
    _plant(home, stray)
    tracker = Tracker(f"sqlite:///{home / 'draftboard.db'}")
    with tracker.training_run("not the demo's", {}, None, fingerprint={"software": {}}) as mine:
        pass

    with pytest.raises(DraftboardError, match="still holds files it did not create .*my-notes.md"):
        remove_demo(home, tracker, report=lambda line: None)

    assert not any((home / DEMO_DIR / rel).exists() for rel in manifest["files"])
    assert _kept(home, demo_foreign_files) and _kept(home, stray)
    assert (home / "draftboard.db").is_file() and (home / "cache").is_dir()  # shared: never the demo's to delete
    stages = {run_id: tracker.client.get_run(run_id).info.lifecycle_stage for run_id in manifest["runs"]}
    assert set(stages.values()) == {"deleted"}
    assert tracker.client.get_run(mine.run_id).info.lifecycle_stage == "active"


def test_demo_force_refuses_a_folder_it_did_not_make(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(config.HOME_VAR, raising=False)
    theirs = {f".draftboard/{DEMO_DIR}/data.csv": "a,b\n", "demo/__init__.py": "x = 1\n", "README.md": "mine\n"}
    _plant(tmp_path, theirs)
    try:
        assert main(["demo", "--quick", "--force"]) == 2
    finally:
        os.environ.pop(config.HOME_VAR, None)  # main() sets it for --home only; keep the test env clean
    line = _one_error_line(capsys)
    # The default home is ./.draftboard, never the working directory itself.
    assert f"{tmp_path / '.draftboard' / DEMO_DIR} exists but was not made by `draftboard demo`" in line
    assert _kept(tmp_path, theirs)
    assert sorted(p.name for p in (tmp_path / ".draftboard").iterdir()) == [DEMO_DIR]  # nothing else created


# --------------------------------------------------------------------------- #8 / #14 malformed records


def test_a_damaged_checkpoint_record_is_skipped_with_a_warning(tracker, machine_fp, tmp_path, caplog):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"w" * 10)
    with tracker.training_run("damaged-records", {}, "t", fingerprint=machine_fp) as run:
        good = run.log_checkpoint(weights, 10)
    client = tracker.client
    client.log_dict(run.run_id, {**good.to_dict(), "step": "x"}, "checkpoints/step_x.json")
    client.log_dict(run.run_id, {**good.to_dict(), "step": "20"}, "checkpoints/step_20.json")
    client.log_text(run.run_id, '{"step": 30, "path": ', "checkpoints/step_30.json")
    client.log_text(run.run_id, "[1, 2]", "checkpoints/step_40.json")
    with caplog.at_level(logging.WARNING, logger="tracker.store.tracker"):
        assert tracker.checkpoints(run.run_id) == [good]
    for name in ("step_x.json", "step_20.json", "step_30.json", "step_40.json"):
        assert name in caplog.text


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe\x00\x01 not text", "not a JSON text file"),
    (b'{"software": {}, "hardware": [1]}', "section 'hardware' is not a JSON object"),
    (b'{"software": {"torch": "2.6"}, "probe": "deadbeef"}', "section 'probe' is not a JSON object"),
])
def test_env_diff_on_a_broken_fingerprint_file_is_one_error_line(tmp_path, machine_fp, capsys, content, message):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(machine_fp))
    bad.write_bytes(content)
    assert main(["env-diff", str(good), str(bad)]) == 2
    assert message in _one_error_line(capsys)


def test_env_diff_on_a_run_with_a_broken_fingerprint_is_one_error_line(tracker, store_uri, machine_fp, capsys):
    with tracker.training_run("broken-fp", {}, "t", fingerprint=machine_fp) as run:
        pass
    tracker.client.log_text(run.run_id, '{"software": {"torch": ', "fingerprint.json")  # overwritten, truncated
    assert main(["env-diff", run.run_id, run.run_id, "--tracking-uri", store_uri]) == 2
    assert "fingerprint.json is not valid JSON" in _one_error_line(capsys)


# --------------------------------------------------------------------------- #9 import-log

STEPS = 4000
NOISE_PER_STEP = 130  # a real log is mostly not metrics: warnings, progress bars, stack traces
NOISE = "2025-06-01 10:00:01 WARNING tokenizer: token indices sequence length is longer than the maximum\n"


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> Path:
    """A 50 MB key=value training log: 4000 steps among 520,000 lines of other output."""
    path = tmp_path_factory.mktemp("biglog") / "train.log"
    noise = NOISE * NOISE_PER_STEP
    with open(path, "w") as fh:
        for step in range(STEPS):
            fh.write(f"step={step} loss={3.0 / (step + 1):.6f} acc={step / STEPS:.4f}\n")
            fh.write(noise)
    assert path.stat().st_size > 50 * 10**6
    return path


def _import_with_peak_rss(log: Path, store: str) -> tuple[subprocess.CompletedProcess, float]:
    """`draftboard import-log` in a child of a fresh wrapper, and the child's peak RSS in MB."""
    wrapper = ("import resource, subprocess, sys; "
               "rc = subprocess.call([sys.executable, '-m', 'tracker.cli', *sys.argv[1:]]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", wrapper, "import-log", str(log), "--name", log.stem,
                          "--tracking-uri", store], capture_output=True, text=True, timeout=600, cwd=ROOT)
    return out, int(out.stdout.strip().splitlines()[-1]) / 1024


@pytest.mark.slow
@pytest.mark.sqlite_only(reason="measures one local process; a server's memory is not the CLI's")
def test_import_log_of_50_mb_streams_in_bounded_memory(big_log, store_uri, tmp_path):
    small = tmp_path / "small.log"
    small.write_text("".join(f"step={s} loss={3.0 / (s + 1):.6f} acc={s / 100:.4f}\n" for s in range(100)))
    out, baseline_mb = _import_with_peak_rss(small, store_uri)  # MLflow itself: about 220 MB here
    assert out.returncode == 0, out.stderr
    out, peak_mb = _import_with_peak_rss(big_log, store_uri)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.split()[-2]  # "imported FILE as run ID" then the wrapper's number
    # The log adds less than a tenth of its size: it is never held whole (it used to cost 17x).
    assert peak_mb - baseline_mb < 50, (baseline_mb, peak_mb)
    client = MlflowClient(store_uri)
    assert client.get_run(run_id).data.params["import.skipped_lines"] == str(STEPS * NOISE_PER_STEP)
    assert [m.step for m in client.get_metric_history(run_id, "acc")] == list(range(STEPS))


@pytest.mark.slow
@pytest.mark.sqlite_only(reason="watches the run from a second process through the sqlite file")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_import_ends_failed_with_the_steps_read_so_far(big_log, store_uri, sig):
    client = MlflowClient(store_uri)
    name = f"interrupted-{sig.name}-{time.time_ns()}"
    # The child takes Ctrl-C as a user's shell gives it, whatever this run inherited: a suite started as a
    # background job without job control ignores SIGINT, and the child would inherit that (and finish, 0).
    child = subprocess.Popen([sys.executable, "-m", "tracker.cli", "import-log", str(big_log), "--name", name,
                              "--tracking-uri", store_uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def first_steps_logged():
            if child.poll() is not None:
                return "finished"
            experiment = client.get_experiment_by_name("draftboard")
            found = client.search_runs(experiment.experiment_id, f"attributes.run_name = '{name}'") if experiment else []
            return found[0] if found and "loss" in found[0].data.metrics else None

        run = wait_until(first_steps_logged, 300, interval=0.2, what="the import's first steps in the store")
        assert run != "finished" and child.poll() is None, "the import finished before it could be interrupted"
        child.send_signal(sig)
        _, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130 and err.strip().splitlines()[-1] == "error: interrupted"
    got = client.get_run(run.info.run_id)
    assert got.info.status == "FAILED" and got.data.tags["draftboard.error"].startswith("KeyboardInterrupt")
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert 0 < len(steps) < STEPS and steps == list(range(len(steps)))  # every step read, in order, no more


# --------------------------------------------------------------------------- #15 torch


def test_requirements_exclude_torch_before_2_6():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    torch = next(Requirement(line.split("#")[0]) for line in lines if line.startswith("torch"))
    assert not torch.specifier.contains("2.5.1") and torch.specifier.contains("2.6.0")
