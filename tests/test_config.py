"""tracker.config: the one place settings and their defaults are read."""

import os

from tracker import config


def test_store_uri_explicit_beats_env_beats_home_beats_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path))
    assert config.store_uri() == f"sqlite:///{tmp_path / 'draftboard.db'}"
    monkeypatch.delenv("DRAFTBOARD_HOME")
    monkeypatch.chdir(tmp_path)
    # docs/DESIGN.md fixes the default store in the working directory.
    assert config.store_uri() == f"sqlite:///{tmp_path / 'draftboard.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert config.store_uri() == "http://mlflow.internal:5000"
    assert config.store_uri("sqlite:///x.db") == "sqlite:///x.db"


def test_home_is_never_the_working_directory_itself(monkeypatch, tmp_path):
    # Cleaning up draftboard's files (demo --force, cache pruning) must never reach a project's own.
    monkeypatch.delenv("DRAFTBOARD_HOME", raising=False)
    monkeypatch.delenv("DRAFTBOARD_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert config.home_dir() == (tmp_path / ".draftboard").resolve()
    assert config.cache_dir() == (tmp_path / ".draftboard" / "cache").resolve()
    assert config.logs_dir() == (tmp_path / ".draftboard" / "logs").resolve()


def test_jobs_uri_explicit_beats_env_beats_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTBOARD_JOBS_URI", raising=False)
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path))
    assert config.jobs_uri() == f"sqlite:///{tmp_path.resolve() / 'jobs.db'}"
    monkeypatch.setenv("DRAFTBOARD_JOBS_URI", "sqlite:////elsewhere/q.db")
    assert config.jobs_uri() == "sqlite:////elsewhere/q.db"
    assert config.jobs_uri("sqlite:////explicit.db") == "sqlite:////explicit.db"


def test_allowed_roots_default_to_home_and_split_on_pathsep(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", os.pathsep.join([str(tmp_path / "a"), " ", str(tmp_path / "b")]))
    assert config.roots_configured()
    assert config.allowed_roots() == [(tmp_path / "a").resolve(), (tmp_path / "b").resolve()]
    monkeypatch.delenv("DRAFTBOARD_ALLOWED_ROOTS")
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    assert not config.roots_configured()
    assert config.allowed_roots() == [(tmp_path / "home").resolve()]


def test_readonly_and_mlflow_ui_url():
    assert config.readonly({"DRAFTBOARD_READONLY": " Yes "})
    assert not config.readonly({"DRAFTBOARD_READONLY": "0"})
    assert config.mlflow_ui_url({}) is None
    assert config.mlflow_ui_url({"DRAFTBOARD_MLFLOW_UI_URL": "http://h:5000/"}) == "http://h:5000"


def test_a_hub_dataset_is_refused_only_where_this_box_cannot_read_it(tmp_path):
    import socket

    from tracker.config import hub_dataset_problem

    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    cache = tmp_path / "cache"
    env = {"HF_DATASETS_CACHE": str(cache), "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    try:
        assert hub_dataset_problem("hf:openai/gsm8k:main:test", env) is None  # the hub answers
    finally:
        listening.close()
    closed = hub_dataset_problem("hf:openai/gsm8k:main:test", env)  # nothing listens there now
    assert closed.startswith("hf:openai/gsm8k:main:test: this box is offline (127.0.0.1 did not answer")
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    assert "(HF_HUB_OFFLINE is set) and openai/gsm8k is not in the datasets cache" in hub_dataset_problem(
        "hf:openai/gsm8k", offline)
    (cache / "openai___gsm8k").mkdir(parents=True)
    assert hub_dataset_problem("hf:openai/gsm8k", offline) is None  # downloaded before: datasets reads its cache
    assert hub_dataset_problem(str(tmp_path / "prompts.jsonl"), offline) is None  # not a hub id at all
    local = tmp_path / "my-set"
    local.mkdir()
    assert hub_dataset_problem(f"hf:{local}:train", offline) is None  # a local folder

