#!/usr/bin/env bash
# Throwaway services for the server-mode tests and benchmarks: a PostgreSQL cluster and an
# `mlflow server` on it (PostgreSQL backend store, proxied artifacts, basic auth), both on
# loopback ports that were free, with all their data in one temp directory.
#
#   eval "$(bash scripts/services.sh start)"      # prints `export NAME=value` lines
#   bash scripts/services.sh start --postgres-only  # PostgreSQL alone (benchmarks/job_claims.py)
#   bash scripts/services.sh stop "$DRAFTBOARD_SERVICES_DIR"
#   bash scripts/services.sh status [DIR]          # exit 0 when everything it started answers
#
# start exports, for the tests (tests/conftest.py) and benchmarks:
#   DRAFTBOARD_SERVICES_DIR         the temp directory (data, logs, pid files); `stop` removes it
#   DRAFTBOARD_TEST_PG_URI          postgresql://draftboard:...@127.0.0.1:PORT/jobs (job queue tests)
#   DRAFTBOARD_TEST_PG_ADMIN_URI    the same role on database `postgres` (creates test databases)
#   DRAFTBOARD_TEST_SERVER_URI      http://127.0.0.1:PORT (the MLflow server; not with --postgres-only)
#   DRAFTBOARD_TEST_ADMIN_USER / DRAFTBOARD_TEST_ADMIN_PASSWORD   the MLflow admin account
# Idempotent: with DRAFTBOARD_SERVICES_DIR set to a directory whose services still answer,
# start prints the same exports and starts nothing. Logs stay in the directory until `stop`
# (pg.log, mlflow.log). Root runs PostgreSQL as the `postgres` OS user (initdb refuses root);
# where the server binaries are missing and we are root, Debian's `postgresql` is installed.
# Waits are polls against a deadline (DRAFTBOARD_SERVICES_TIMEOUT, default 120 s), never fixed sleeps.
set -euo pipefail
cd "$(dirname "$0")/.."

TIMEOUT_S=${DRAFTBOARD_SERVICES_TIMEOUT:-120}
log() { echo "services: $*" >&2; }
die() { echo "services: error: $*" >&2; exit 1; }

as_pg() {  # run a PostgreSQL binary as an unprivileged user
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

pg_bin() {
  local initdb
  initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$initdb" ]; then
    [ "$(id -u)" -eq 0 ] || die "PostgreSQL server binaries are missing: apt-get install postgresql"
    log "installing PostgreSQL (Debian package postgresql)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$initdb" ] || die "apt-get install postgresql left no initdb under /usr/lib/postgresql"
  fi
  dirname "$initdb"
}

python_bin() {  # absolute: the server is started from its data directory
  local venv=${DRAFTBOARD_VENV:-.venv}
  if [ -x "$venv/bin/python" ]; then (cd "$venv/bin" && echo "$PWD/python"); else command -v python3; fi
}

free_port() {
  "$(python_bin)" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {  # wait_for WHAT PID COMMAND...: poll until COMMAND succeeds; give up at the deadline or when PID exits
  local what=$1 pid=$2; shift 2
  local deadline=$(( $(date +%s) + TIMEOUT_S ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "$what: no answer within ${TIMEOUT_S} s"
      return 1
    fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      log "$what: the process exited"
      return 1
    fi
    sleep 0.2
  done
  log "$what is up"
}

print_env() {
  local dir=$1
  # shellcheck disable=SC1091  # written by start
  . "$dir/env"
  for name in DRAFTBOARD_SERVICES_DIR DRAFTBOARD_TEST_PG_URI DRAFTBOARD_TEST_PG_ADMIN_URI \
              DRAFTBOARD_TEST_SERVER_URI DRAFTBOARD_TEST_ADMIN_USER DRAFTBOARD_TEST_ADMIN_PASSWORD; do
    if [ -n "${!name:-}" ]; then printf 'export %s=%q\n' "$name" "${!name}"; fi
  done
}

status() {
  local dir=${1:-${DRAFTBOARD_SERVICES_DIR:-}}
  [ -n "$dir" ] && [ -f "$dir/env" ] || return 1
  # shellcheck disable=SC1091
  . "$dir/env"
  as_pg "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -d postgres || return 1
  [ -z "${DRAFTBOARD_TEST_SERVER_URI:-}" ] \
    || mlflow_ready "$DRAFTBOARD_TEST_SERVER_URI" "$DRAFTBOARD_TEST_ADMIN_USER" "$DRAFTBOARD_TEST_ADMIN_PASSWORD"
}

mlflow_ready() {  # /health answers, and an authenticated API call gets through
  "$(python_bin)" - "$@" <<'EOF'
import base64, sys, urllib.request
uri, user, password = sys.argv[1:4]
urllib.request.urlopen(f"{uri}/health", timeout=5).read()
request = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1")
token = base64.b64encode(f"{user}:{password}".encode()).decode()
request.add_header("Authorization", f"Basic {token}")
urllib.request.urlopen(request, timeout=5).read()
EOF
}

stop() {
  local dir=${1:-${DRAFTBOARD_SERVICES_DIR:-}}
  [ -n "$dir" ] && [ -d "$dir" ] || return 0
  case "$dir" in */draftboard-services.*) ;; *) die "refusing to remove $dir: not a services directory";; esac
  if [ -f "$dir/mlflow.pid" ]; then
    local pid
    pid=$(cat "$dir/mlflow.pid")
    # The server was started in its own session: its group holds uvicorn and its workers.
    kill -TERM -- "-$pid" 2>/dev/null || true
    local deadline=$(( $(date +%s) + 15 ))
    while kill -0 -- "-$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  if [ -f "$dir/pg/postmaster.pid" ]; then
    local bin
    bin=$(sed -n 's/^PG_BIN=//p' "$dir/env" 2>/dev/null || true)
    as_pg "${bin:-$(pg_bin)}/pg_ctl" -D "$dir/pg" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
  log "stopped and removed $dir"
}

start() {
  local postgres_only=${1:-}
  if status "${DRAFTBOARD_SERVICES_DIR:-}" 2>/dev/null \
      && { [ "$postgres_only" = "--postgres-only" ] || grep -q '^DRAFTBOARD_TEST_SERVER_URI=' "$DRAFTBOARD_SERVICES_DIR/env"; }; then
    log "already running in $DRAFTBOARD_SERVICES_DIR"
    print_env "$DRAFTBOARD_SERVICES_DIR"
    return 0
  fi
  local bin py dir
  bin=$(pg_bin)
  py=$(python_bin)
  "$py" -c "import psycopg2" 2>/dev/null || die "psycopg2 is missing: pip install -e '.[postgres]'"
  if ! "$py" -c "import flask_wtf" 2>/dev/null; then
    # `mlflow server --app-name basic-auth` needs Flask-WTF (mlflow's `auth` extra).
    log "installing Flask-WTF for mlflow's basic-auth app"
    "$py" -m pip install -q -c constraints.txt Flask-WTF WTForms >&2
  fi
  dir=$(mktemp -d "${TMPDIR:-/tmp}/draftboard-services.XXXXXX")
  chmod 755 "$dir"
  # Anything that fails from here on leaves nothing running behind.
  trap 'stop "$dir" || true' EXIT
  local pg_port mlflow_port pg_password admin_password
  pg_port=$(free_port)
  pg_password=$("$py" -c 'import secrets; print(secrets.token_hex(16))')
  admin_password=$("$py" -c 'import secrets; print(secrets.token_hex(16))')

  # ---------------------------------------------------------------- PostgreSQL
  mkdir "$dir/pg"
  printf '%s\n' "$pg_password" > "$dir/pg.pw"
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$dir/pg" "$dir/pg.pw"; fi
  chmod 700 "$dir/pg"
  as_pg "$bin/initdb" -D "$dir/pg" -U draftboard --pwfile="$dir/pg.pw" --auth=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  rm -f "$dir/pg.pw"
  # A throwaway cluster: no fsync (a crash loses nothing worth keeping), loopback only, its
  # socket in its own directory. Enough connections for the tests' many engines and the server.
  as_pg "$bin/pg_ctl" -D "$dir/pg" -l "$dir/pg/pg.log" -w -t "$TIMEOUT_S" \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $dir/pg -c fsync=off -c synchronous_commit=off \
-c full_page_writes=off -c max_connections=300" start >/dev/null \
    || { cat "$dir/pg/pg.log" >&2 || true; die "PostgreSQL did not start"; }
  wait_for "PostgreSQL on 127.0.0.1:$pg_port" "" as_pg "$bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -d postgres \
    || die "PostgreSQL did not answer"
  for db in mlflow jobs; do
    PGPASSWORD=$pg_password "$bin/createdb" -h 127.0.0.1 -p "$pg_port" -U draftboard "$db"
  done
  local pg_base="postgresql://draftboard:$pg_password@127.0.0.1:$pg_port"
  cat > "$dir/env" <<EOF
PG_BIN=$bin
PG_PORT=$pg_port
DRAFTBOARD_SERVICES_DIR=$dir
DRAFTBOARD_TEST_PG_URI=$pg_base/jobs
DRAFTBOARD_TEST_PG_ADMIN_URI=$pg_base/postgres
EOF
  chmod 600 "$dir/env"
  if [ "$postgres_only" = "--postgres-only" ]; then
    trap - EXIT
    print_env "$dir"
    return 0
  fi

  # ---------------------------------------------------------------- MLflow server
  mlflow_port=$(free_port)
  mkdir "$dir/artifacts"
  cat > "$dir/basic_auth.ini" <<EOF
[mlflow]
default_permission = READ
database_uri = sqlite:///$dir/basic_auth.db
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
# Without it every request re-hashes the password (werkzeug's scrypt): about 0.35 s of CPU per
# request on 2 cores, which would dominate every test. Successful logins are cached per worker.
auth_cache_ttl_seconds = 300
EOF
  cat >> "$dir/env" <<EOF
DRAFTBOARD_TEST_SERVER_URI=http://127.0.0.1:$mlflow_port
DRAFTBOARD_TEST_ADMIN_USER=admin
DRAFTBOARD_TEST_ADMIN_PASSWORD=$admin_password
EOF
  # One uvicorn worker: with several, uvicorn listens on a socket that asyncio does not give
  # TCP_NODELAY, and every request on a kept-alive connection (how MlflowClient talks) stalls
  # ~40 ms on Nagle + delayed ACK (seen with uvicorn 0.54; one worker answers in ~2 ms).
  # No server-side job execution (MLflow's GenAI jobs, unused here): it would start three huey
  # consumer processes (~250 MB each). setsid: its own process group, which `stop` signals as a
  # whole (uvicorn and its workers).
  # The backend URI (it holds a password) goes by environment, not on the command line.
  (cd "$dir" && exec env MLFLOW_BACKEND_STORE_URI="${pg_base/postgresql:/postgresql+psycopg2:}/mlflow" \
      MLFLOW_AUTH_CONFIG_PATH="$dir/basic_auth.ini" \
      MLFLOW_AUTH_ADMIN_USERNAME=admin MLFLOW_AUTH_ADMIN_PASSWORD="$admin_password" \
      MLFLOW_FLASK_SERVER_SECRET_KEY="$("$py" -c 'import secrets; print(secrets.token_hex(24))')" \
      MLFLOW_DISABLE_TELEMETRY=true MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
      setsid "$(dirname "$py")/mlflow" server --app-name basic-auth \
        --artifacts-destination "$dir/artifacts" --serve-artifacts \
        --host 127.0.0.1 --port "$mlflow_port" --workers "${DRAFTBOARD_SERVICES_MLFLOW_WORKERS:-1}" \
        </dev/null >"$dir/mlflow.log" 2>&1) &
  echo $! > "$dir/mlflow.pid"
  if ! wait_for "mlflow server on 127.0.0.1:$mlflow_port" "$(cat "$dir/mlflow.pid")" mlflow_ready "http://127.0.0.1:$mlflow_port" admin "$admin_password"; then
    tail -n 40 "$dir/mlflow.log" >&2 || true
    die "the MLflow server did not start (log above)"
  fi
  trap - EXIT
  print_env "$dir"
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  status)
    if status "${2:-}"; then echo "running"; else echo "not running"; exit 1; fi ;;
  *) echo "usage: $0 start [--postgres-only] | stop DIR | status [DIR]" >&2; exit 2 ;;
esac
