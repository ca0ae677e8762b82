import json
import os
import re
import subprocess
import sys

import pytest

from tracker.cli import main


@pytest.fixture(scope="module")
def fp_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp") / "fp.json"
    assert main(["fingerprint", "--device", "cpu", "--out", str(out)]) == 0
    return out


def test_fingerprint_writes_json_and_says_the_path(fp_file, capsys):
    fp = json.loads(fp_file.read_text())
    assert fp["numerics"]["linear_attention_path"] == "fallback"


def test_env_diff_identical_is_exit_0(fp_file, capsys):
    assert main(["env-diff", str(fp_file), str(fp_file)]) == 0
    assert "no differences" in capsys.readouterr().out


def test_env_diff_critical_is_exit_1_with_a_table(fp_file, tmp_path, capsys):
    other = json.loads(fp_file.read_text())
    other["numerics"]["dtype"] = "bf16"
    other["hardware"]["gpu_name"] = "NVIDIA H200"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    assert main(["env-diff", str(fp_file), str(path)]) == 1
    out = capsys.readouterr().out
    assert "numerics.dtype" in out and "critical" in out and "hardware.gpu_name" in out
    assert out.index("numerics.dtype") < out.index("hardware.gpu_name")  # most severe first
    assert "2 fields differ: 1 critical, 1 warning\n" in out  # counted in words, no "0 info"
    # a fingerprint file carries no protocol: said once for both, in the plural
    assert "not compared: " + str(fp_file) + " and " + str(path) + " are not evals (no protocol)" in out


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"a": 1}', "not a fingerprint"),
    ('{"software": {}, "numerics": "fast"}', "section 'numerics' is not a JSON object"),
    ('{"software": {}, "probe": {"digest": "ab", "layers": {"1": {"mean": "x"}}}}', "numeric mean/std/absmax"),
])
def test_env_diff_bad_input_is_one_error_line_exit_2(fp_file, tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    assert main(["env-diff", str(fp_file), str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_console_script_entry_point_exit_status(tmp_path):
    # The installed `draftboard` script, as a user runs it.
    out = subprocess.run([sys.executable, "-m", "tracker.cli", "env-diff", str(tmp_path / "x.json"), "y.json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and out.stdout == ""


def test_import_log_cli_round_trip_and_env_diff_by_run_id(tmp_path, store_uri, fp_file, capsys):
    log = tmp_path / "train.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 3.0 / (s + 1), "streak": 0.1 * s}) + "\n" for s in range(5)))
    assert main(["import-log", str(log), "--name", "v3 (imported)", "--tracking-uri", store_uri]) == 0
    run_id = capsys.readouterr().out.strip().split()[-1]
    import mlflow

    history = mlflow.MlflowClient(store_uri).get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3, 4]
    # An imported run's environment is unknown, so nothing critical can be claimed either way.
    rc = main(["env-diff", run_id, str(fp_file), "--tracking-uri", store_uri])
    out = capsys.readouterr().out
    assert rc == 0 and "warning" in out and not re.search(r"\d+ critical", out)  # nothing critical claimed


@pytest.mark.parametrize("args, message", [
    (["import-log", "{tmp}/missing.log", "--name", "x"], "missing.log"),
    (["import-log", "{tmp}/bad.jsonl", "--name", "x"], "bad.jsonl:2: malformed JSON"),
    (["env-diff", "0123456789abcdef0123456789abcdef", "{tmp}/bad.jsonl"], "0123456789abcdef"),
])
def test_cli_bad_input_is_one_error_line_exit_2(tmp_path, store_uri, capsys, args, message):
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, loss\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args] + ["--tracking-uri", store_uri]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_cache_ls_and_prune(tmp_path, capsys, monkeypatch):
    import torch

    from evaluators.cache import EvalCache
    from evaluators.target import cache_key

    root = tmp_path / "cache"
    cache = EvalCache(root, max_bytes=10**9)
    old, new = cache_key("old"), cache_key("new")
    cache.put_features(old, 1, [torch.zeros(64, 32)], target="sha256:aaaa")
    cache.put_continuations(new, [[1, 2]], target="sha256:bbbb")
    for path in root.glob(f"features/{old}/*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))  # 2023-11-14 22:13:20 UTC
    (root / "keep.txt").write_text("mine")
    assert main(["cache", "ls", "--cache-dir", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["kind", "key", "target", "digest", "layers", "size", "last", "use"]
    assert lines[2].split()[:4] == ["features", old, "sha256:aaaa", "1"]  # least recently used first
    assert "2023-11-14 22:13:20 UTC" in lines[2] and f"{cache.entries()[0].size / 1e9:.3f} GB" in lines[2]
    assert lines[3].split()[:3] == ["continuations", new, "sha256:bbbb"]
    assert lines[4].startswith(f"2 entries, {cache.size() / 1e9:.3f} GB in {root}")
    # the features entry holds 8 kB of floats: a cap of 1 kB leaves only the newer continuations
    assert main(["cache", "prune", "--max-gb", "0.000001", "--cache-dir", str(root)]) == 0
    assert capsys.readouterr().out.startswith("removed 1 entries")
    assert [e.key for e in cache.entries()] == [new]
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path))  # the default folder is <home>/cache
    assert main(["cache", "prune", "--all"]) == 0
    assert cache.entries() == [] and (root / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("args, env, message", [
    (["cache", "prune", "--max-gb", "-3"], {}, "--max-gb must be a positive number of GB, not '-3'"),
    (["cache", "prune", "--max-gb", "2", "--all"], {}, "give --max-gb or --all, not both"),
    (["cache", "ls", "--all"], {}, "options of `cache prune`"),
    (["cache", "prune"], {"DRAFTBOARD_CACHE_MAX_GB": "ten"}, "DRAFTBOARD_CACHE_MAX_GB must be a positive number"),
])
def test_cache_bad_input_is_one_error_line(tmp_path, capsys, monkeypatch, args, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([*args, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_an_out_file_is_written_whole_and_only_the_commands_own_file_is_touched(tmp_path):
    """`write_whole` (report, export-results): the file appears complete, nothing is left beside it, and a
    file it did not create, even one named like its temporary file, is never opened or removed."""
    from tracker.cli.common import write_whole
    from tracker.errors import DraftboardError

    out = tmp_path / "report.html"
    write_whole(out, "<p>whole</p>\n")
    assert out.read_text() == "<p>whole</p>\n" and [p.name for p in tmp_path.iterdir()] == ["report.html"]
    theirs = tmp_path / f".other.html.{os.getpid()}.tmp"
    theirs.write_text("a user's file")
    with pytest.raises(DraftboardError, match=r"^cannot write --out .*other\.html"):
        write_whole(tmp_path / "other.html", "x")
    assert theirs.read_text() == "a user's file" and not (tmp_path / "other.html").exists()


@pytest.mark.parametrize("port", ["99999", "0", "8_501", "٨٥٠١"])
def test_a_port_that_is_not_one_is_argparse_s_one_line(port, capsys):
    """Issue 65 (low): `draftboard ui --port 99999` was a traceback from socket.bind."""
    with pytest.raises(SystemExit) as exited:
        main(["ui", "--port", port])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "is not a TCP port (1-65535) (see `draftboard ui --help`)")


@pytest.mark.parametrize("args", [["compare", "a" * 32, "b" * 32], ["env-diff", "a" * 32, "b" * 32],
                                  ["report", "a" * 32, "--out", "r.html"], ["reconcile", "a" * 32, "b" * 32]])
def test_a_command_that_only_reads_leaves_no_store_where_there_was_none(tmp_path, capsys, args):
    """Issue 65 (low): a read-only command run elsewhere created an empty draftboard.db there."""
    store = tmp_path / "draftboard.db"
    out = [a if a != "r.html" else str(tmp_path / "r.html") for a in args]
    assert main([*out, "--tracking-uri", f"sqlite:///{store}"]) == 2
    assert "no store at" in capsys.readouterr().err and not store.exists()


def test_an_argument_error_is_one_line_and_says_where_to_read_more(capsys):
    """Issue 65 LOW: 21 lines of usage came before an argparse error."""
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--target", "x"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("draftboard eval: error: the following arguments are required: --drafter, "
                                       "--prompts (see `draftboard eval --help`)\n")
