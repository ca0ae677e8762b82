import json
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


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"a": 1}', "must be fingerprints"),
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
