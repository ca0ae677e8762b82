"""`Tracker`: draftboard's view of an MLflow tracking store.

Each Tracker holds its own `MlflowClient` bound to one URI and never touches
MLflow's global (fluent) state, so several stores can be used side by side in one
process. The same code serves a local sqlite file and a remote `mlflow server`
(http URI, e.g. PostgreSQL-backed with basic auth via MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD); only the default artifact location is local.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import sqlalchemy
import sqlalchemy.exc
from mlflow import MlflowClient
from mlflow.entities import Run, RunTag
from mlflow.exceptions import MlflowException

from tracker import config
from tracker.errors import DraftboardError
from tracker.untrusted.digits import whole_number
from tracker.store import names
from tracker.store.checkpoints import Checkpoint
from tracker.store.retry import RetryPolicy, call_with_retry
from tracker.store.runs import EvalRun, StoreContext, TrainingRun, describe_error

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "draftboard"
# mlflow ui guesses an experiment's kind from its runs and, for a guess of "GenAI", files everything
# under a "Training runs" tab; draftboard's experiment holds training runs, evals and references,
# so it says its kind (a model-development experiment: plain "Runs") and what it holds.
EXPERIMENT_TAGS = {
    "mlflow.experimentKind": "custom_model_development",
    "mlflow.note.content": "draftboard: DFlash drafter training runs, checkpoint evals and reference runs "
                           "(tag draftboard.kind = train / eval / reference).",
}


def local_artifact_location(uri: str) -> str | None:
    """`<dir of the sqlite file>/mlartifacts` for a sqlite store, else None (the server decides).

    For the default store that is `<home>/mlartifacts`, next to draftboard.db, so
    `mlflow ui --backend-store-uri sqlite:///draftboard.db` run there shows the artifacts.
    """
    db = config.sqlite_path(uri)
    if db is None:
        return None
    db.parent.mkdir(parents=True, exist_ok=True)
    return (db.parent / config.ARTIFACT_DIR).as_uri()


def access_problem(exc: BaseException) -> str | None:
    """What an authentication or authorization refusal from a tracking server means, else None."""
    code = getattr(exc, "error_code", None)
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if code == "UNAUTHENTICATED":
        if not user:
            return ("the server requires a login (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD to an account of this server")
        return (f"the server refused the login of MLflow user {user!r} (HTTP 401): check "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    if code == "PERMISSION_DENIED":
        who = f"MLflow user {user!r}" if user else "this MLflow user"
        return f"permission denied (HTTP 403): {who} lacks the permission for this request"
    return None


def create_whole(uri: str) -> None:
    """Make a new SQLite store appear whole or not at all.

    MLflow creates a store's tables and runs its ~50 migrations in place, so a process killed meanwhile
    (an eval cancelled as it logs first to a new store) would leave a file that every later process
    fails on ("duplicate column name"). The store is built beside it under a name of this process's
    own and linked into place; a store another process linked first is kept, and this one's copy goes.
    Other stores (an existing file, a server) are left to MLflow.
    """
    path = config.sqlite_path(uri)
    if path is None or path.exists():
        return
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store  # what MlflowClient builds

    path.parent.mkdir(parents=True, exist_ok=True)
    building = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        _get_sqlalchemy_store(f"sqlite:///{building}", None).engine.dispose()
        os.link(building, path)
    except FileExistsError:
        pass  # another process's store came first: it is as whole as this one
    except (OSError, MlflowException) as exc:
        raise DraftboardError(f"cannot create tracking store {path}: {exc}") from exc
    finally:
        for suffix in ("", "-journal", "-wal", "-shm"):
            building.with_name(building.name + suffix).unlink(missing_ok=True)


MIN_ID_PREFIX = 6  # the shortest run id prefix taken for a whole id (one in 16 million ids)


def _reachable(uri: str) -> None:
    """A database store answers, or one DraftboardError line says why: MLflow's own failure is a logged
    traceback of some 50 lines before its exception (a driver missing, the server down, a password refused)."""
    if not uri.startswith(("postgresql", "mysql", "mssql")):
        return
    try:
        engine = sqlalchemy.create_engine(uri)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DraftboardError(f"cannot open tracking store {uri}: {type(exc).__name__}: {why}") from None


class Tracker:
    """Runs, lineage, checkpoints and fingerprints in one MLflow experiment.

    The experiment is looked up (and created if missing) on first use, so building a
    Tracker is cheap and read-only helpers work on a store nobody has written to yet.
    """

    def __init__(
        self,
        uri: str | None = None,
        *,
        experiment: str = DEFAULT_EXPERIMENT,
        retry: RetryPolicy = RetryPolicy(),
        create: bool = True,
    ) -> None:
        """`create=False`: a command that only reads (compare, report, env-diff of a run id) is refused on a SQLite
        store that does not exist, rather than leaving an empty one where it was run."""
        self.uri = config.store_uri(uri)
        missing = None if create else config.missing_local_store(self.uri)
        if missing is not None:
            raise DraftboardError(f"no store at {missing}: nothing was logged there (give --tracking-uri, or run "
                                  "where the runs are)")
        # MLflow draws a progress bar for every download, even of a 1 kB JSON; on the CLI's
        # stderr that is noise. An explicit setting by the user still wins.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # Against a server MLflow writes `🏃 View run ... at: URL` to stdout as each run ends: stdout is the
        # commands' own (a --json document, a table), so the link is left to the commands that print one.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.experiment_name = experiment
        self.retry = retry
        self._artifact_location = local_artifact_location(self.uri)
        create_whole(self.uri)
        _reachable(self.uri)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
        except MlflowException as exc:
            raise DraftboardError(f"cannot open tracking store {self.uri}: {exc.message}") from exc
        except (ImportError, OSError, sqlalchemy.exc.SQLAlchemyError) as exc:  # a missing driver, a store not there
            raise DraftboardError(f"cannot open tracking store {self.uri}: {describe_error(exc)}") from exc
        self._experiment_id: str | None = None

    # ------------------------------------------------------------------ experiment

    @property
    def experiment_id(self) -> str:
        """Id of the experiment, created on first use."""
        if self._experiment_id is None:
            self._experiment_id = self.find_experiment(create=True)
        return self._experiment_id

    def find_experiment(self, create: bool = False) -> str | None:
        """Id of the experiment, None when nobody has written to this store yet (unless `create`).

        Reaching the store is part of the answer: DraftboardError when it is down or refuses
        this user, which is what a caller checking access before writing needs to know.
        """
        try:
            found = self.client.get_experiment_by_name(self.experiment_name)
            if found is None and create:
                try:
                    return self.client.create_experiment(
                        self.experiment_name, artifact_location=self._artifact_location, tags=EXPERIMENT_TAGS
                    )
                except MlflowException as exc:  # created concurrently by another process
                    if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                        raise
                    found = self.client.get_experiment_by_name(self.experiment_name)
        except MlflowException as exc:
            raise DraftboardError(f"cannot use tracking store {self.uri}: {access_problem(exc) or exc.message}") from exc
        except Exception as exc:  # connection errors from a remote store
            raise DraftboardError(f"cannot reach tracking store {self.uri}: {exc}") from exc
        if found is None:
            return None
        if found.lifecycle_stage == "deleted":
            raise DraftboardError(
                f"experiment {self.experiment_name!r} is deleted in {self.uri}; restore it with "
                f"`mlflow experiments restore --experiment-id {found.experiment_id}` or use another name"
            )
        if create and any(found.tags.get(k) != v for k, v in EXPERIMENT_TAGS.items()):
            self._label(found.experiment_id)
        return found.experiment_id

    def _label(self, experiment_id: str) -> None:
        """Give an experiment made before EXPERIMENT_TAGS existed its labels (only when about to write:
        a read-only reader never changes the store). A store that refuses keeps its old label."""
        try:
            for key, value in EXPERIMENT_TAGS.items():
                self.client.set_experiment_tag(experiment_id, key, value)
        except Exception as exc:  # a permission refusal, a server hiccup: the runs matter, the label does not
            log.warning("could not label experiment %s: %s", experiment_id, getattr(exc, "message", exc))

    def _context(self) -> StoreContext:
        return StoreContext(self.client, self.experiment_id, self.uri, self.retry)

    # ------------------------------------------------------------------ writing runs

    def training_run(
        self,
        name: str,
        params: Mapping[str, Any],
        target: str | None,
        *,
        tags: Mapping[str, str] | None = None,
        fingerprint: dict | None = None,
        max_pending_steps: int | None = None,
    ) -> TrainingRun:
        """Start a training run; use as `with tracker.training_run(...) as run:`.

        The fingerprint (captured here unless given) is stored before the first step.
        `max_pending_steps`: see TrainingRun (leave it unset in a training loop).
        """
        return TrainingRun(self._context(), name, params, target, tags=tags, fingerprint=fingerprint,
                           max_pending_steps=max_pending_steps)

    def eval_run(
        self,
        name: str,
        *,
        target: str,
        train_run_id: str | None = None,
        checkpoint: str | Path | Checkpoint | None = None,
        checkpoint_step: int | None = None,
        params: Mapping[str, Any] | None = None,
        fingerprint: dict | None = None,
        kind: str = "eval",
        reference_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        start_time: int | None = None,
    ) -> EvalRun:
        """Start an eval (or reference) run with lineage tags; use as a context manager.

        `start_time` (ms since the epoch): when the eval began, as evals are logged once done, so
        that the run's start and end span the eval, not the few ms its logging takes.
        """
        if train_run_id is not None:
            self.run(train_run_id)  # a typo in the lineage would otherwise go unnoticed
        return EvalRun(
            self._context(),
            name,
            target=target,
            train_run_id=train_run_id,
            checkpoint=checkpoint,
            checkpoint_step=checkpoint_step,
            params=params,
            fingerprint=fingerprint,
            kind=kind,
            reference_name=reference_name,
            tags=tags,
            start_time=start_time,
        )

    def set_kind(self, run_id: str, kind: str) -> None:
        """Promote an eval run to a reference, or demote it back to an eval run."""
        if kind not in ("eval", "reference"):
            raise DraftboardError(f"kind must be 'eval' or 'reference', got {kind!r}")
        current = self.run(run_id).data.tags.get(names.KIND)
        if current not in ("eval", "reference"):
            raise DraftboardError(
                f"run {run_id} is a {current or 'non-draftboard'} run; only eval runs can become references"
            )
        self.client.set_tag(run_id, names.KIND, kind)

    # ------------------------------------------------------------------ reading runs

    def run(self, run_id: str) -> Run:
        """The MLflow run; DraftboardError if the id is unknown."""
        try:
            return self.client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise DraftboardError(f"no run with id {run_id!r} in {self.uri}") from exc
            raise DraftboardError(
                f"cannot read run {run_id!r} from {self.uri}: {access_problem(exc) or exc.message}"
            ) from exc

    def resolve_run_id(self, ref: str) -> str:
        """A run id, or the whole id of a unique prefix of one (as Runs' search takes them: at least MIN_ID_PREFIX
        hex digits; the CLI's commands take either); DraftboardError if it names no run, or several."""
        try:
            return self.run(ref).info.run_id
        except DraftboardError:
            if not (MIN_ID_PREFIX <= len(ref) < 32 and all(c in "0123456789abcdef" for c in ref)):
                raise
        found = [r.info.run_id for r in self.find_runs(foreign=True) if r.info.run_id.startswith(ref)]
        if len(found) > 1:
            raise DraftboardError(f"run id prefix {ref!r} names {len(found)} runs in {self.uri}: give more of the id")
        if not found:
            raise DraftboardError(f"no run with id {ref!r} (or an id starting so) in {self.uri}")
        return found[0]

    def find_runs(self, kind: str | None = None, filter: str | None = None, *, foreign: bool = False) -> list[Run]:
        """Runs of this experiment, newest first; `filter` is an MLflow search filter string.

        `foreign=True` adds the runs other training stacks wrote into other experiments of the
        store (SpecForge logs into `specforge`, speculators into `speculators`, the HF Trainer into
        `Default`): those without a `draftboard.kind` tag, or adopted ones (`draftboard.tool`).
        Another team's draftboard experiment stays out, as without `foreign`.
        """
        if kind is not None and kind not in names.KINDS:
            raise DraftboardError(f"kind must be one of {', '.join(names.KINDS)}, got {kind!r}")
        experiment_id = self.find_experiment()
        mine = [experiment_id] if experiment_id is not None else []
        others = [e for e in self.experiment_names() if e != experiment_id] if foreign else []
        clauses = [f"tags.`{names.KIND}` = '{kind}'"] if kind else []
        if filter:
            clauses.append(filter)
        # Every run (the dashboard's listing) from a database store: read in bulk (store/listing.py)
        from tracker.store import listing

        listed = listing.list_runs(self.uri, mine) if not clauses else None
        runs = listed if listed is not None else self._search(mine, clauses)
        if foreign:
            theirs = listing.list_runs(self.uri, others) if listed is not None else None
            theirs = theirs if theirs is not None else self._search(others, clauses)
            runs += [r for r in theirs if names.KIND not in r.data.tags or names.TOOL in r.data.tags]
            runs.sort(key=lambda r: r.info.start_time or 0, reverse=True)
        return runs

    def experiment_names(self) -> dict[str, str]:
        """{experiment id: name} of the store's active experiments."""
        try:
            return {e.experiment_id: e.name for e in self.client.search_experiments()}
        except MlflowException as exc:
            raise DraftboardError(f"cannot list experiments in {self.uri}: {access_problem(exc) or exc.message}") from exc

    def _search(self, experiment_ids: list[str], clauses: list[str]) -> list[Run]:
        if not experiment_ids:
            return []
        runs: list[Run] = []
        token = None
        try:
            while True:
                page = self.client.search_runs(
                    experiment_ids,
                    filter_string=" and ".join(clauses),
                    order_by=["attributes.start_time DESC"],
                    page_token=token,
                )
                runs.extend(page)
                token = page.token
                if not token:
                    return runs
        except MlflowException as exc:
            raise DraftboardError(f"cannot search runs in {self.uri}: {access_problem(exc) or exc.message}") from exc

    # ------------------------------------------------------------------ runs made elsewhere

    def attach_fingerprint(self, run_id: str, fingerprint: dict | None = None) -> dict:
        """Store a fingerprint (captured here unless given) and its `env.*` tags on an existing run.

        For runs another tool created: run it on the training machine, in the training
        environment, so env-diff compares what actually trained. An existing fingerprint.json
        is replaced (the run's environment is the one measured now).
        """
        from tracker import fingerprint as fingerprints  # capture() pulls in torch

        self.run(run_id)
        fp = fingerprints.capture() if fingerprint is None else fingerprint
        fingerprints.check(fp, f"the fingerprint for run {run_id}")
        tags = [*(RunTag(k, v) for k, v in fingerprints.env_tags(fp).items()), RunTag(names.CHANGED_AT, names.changed_at())]
        self._write(lambda: self.client.log_dict(run_id, fp, names.FINGERPRINT_ARTIFACT),
                    f"writing {names.FINGERPRINT_ARTIFACT} to run {run_id}")
        self._write(lambda: self.client.log_batch(run_id, tags=tags, synchronous=True),
                    f"writing the env.* tags of run {run_id}")
        return fp

    def record_checkpoint(self, run_id: str, record: Checkpoint) -> None:
        """Register a checkpoint (already described) on an existing run: its record and the count tag."""
        self._write(lambda: self.client.log_dict(run_id, record.to_dict(), record.artifact_file),
                    f"registering checkpoint {record.path} on run {run_id}")
        count = str(len(self.checkpoints(run_id)))
        tags = [RunTag(names.CHECKPOINT_COUNT, count), RunTag(names.checkpoint_digest_tag(record.sha256), str(record.step))]
        self._write(lambda: self.client.log_batch(run_id, tags=tags, synchronous=True),
                    f"counting the checkpoints of run {run_id}")

    def runs_with_checkpoint(self, sha256: str) -> list[tuple[str, int]]:
        """(training run, step) of every registered checkpoint with these bytes (its content digest): the tag
        (one indexed search over this experiment and the foreign runs') only finds candidates, since any store
        user can tag any run; a candidate counts only as a draftboard training run (`draftboard.kind` train) holding
        a checkpoint record with that digest, at the record's step. A damaged candidate is skipped, never fatal."""
        tag = names.checkpoint_digest_tag(sha256)
        found = []
        for run in self.find_runs(None, f"tags.`{tag}` LIKE '%'", foreign=True):
            if run.data.tags.get(names.KIND) != "train" or whole_number(run.data.tags.get(tag)) is None:
                continue
            try:
                records = self.checkpoints(run.info.run_id)
            except DraftboardError as exc:
                log.warning("run %s: its checkpoint records could not be read: %s", run.info.run_id, exc)
                continue
            found += [(run.info.run_id, r.step) for r in records if r.sha256 == sha256]
        return found

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        """One tag on an existing run, under the retry policy."""
        tags = [RunTag(key, value), RunTag(names.CHANGED_AT, names.changed_at())]  # a rewrite the change check sees
        self._write(lambda: self.client.log_batch(run_id, tags=tags, synchronous=True), f"tagging run {run_id} with {key}")

    def write_json(self, run_id: str, artifact: str, obj: Any) -> None:
        """Store obj as the run's JSON artifact `artifact` (replacing it), under the retry policy."""
        self._write(lambda: self.client.log_dict(run_id, obj, artifact), f"writing {artifact} to run {run_id}")

    def read_json(self, run_id: str, artifact: str, missing: str = "") -> Any:
        """The run's JSON artifact `artifact`; DraftboardError if it is missing (`missing` says what
        that likely means) or not JSON."""
        raw = self._download(run_id, artifact, missing)
        try:
            return json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise DraftboardError(f"run {run_id}: {artifact} is not valid JSON ({exc})") from exc

    def _write(self, fn, what: str) -> None:
        """fn under the store's retry policy; a failure is one DraftboardError saying what failed."""
        try:
            call_with_retry(fn, self.retry, what)
        except Exception as exc:
            raise DraftboardError(f"{what} failed: {describe_error(exc)}") from exc

    def fingerprint(self, run_id: str) -> dict:
        """The run's fingerprint.json; DraftboardError if it is missing or not a JSON object."""
        self.run(run_id)
        artifact = names.FINGERPRINT_ARTIFACT
        raw = self._download(run_id, artifact, missing="not logged by draftboard?")
        try:
            data = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise DraftboardError(f"run {run_id}: {artifact} is not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise DraftboardError(f"run {run_id}: {artifact} is not a JSON object")
        return data

    def checkpoints(self, run_id: str) -> list[Checkpoint]:
        """Checkpoints registered on a training run, by step.

        A damaged record is skipped with a warning: one bad file must not hide the others from
        the Launch and Run detail pages (or from the worker's trusted-drafter check).
        """
        self.run(run_id)
        records = []
        for f in self.client.list_artifacts(run_id, names.CHECKPOINTS_DIR):
            if f.is_dir:
                continue
            raw = self._download(run_id, f.path)
            try:
                records.append(Checkpoint.from_dict(json.loads(raw)))
            except (ValueError, DraftboardError) as exc:  # JSONDecodeError and UnicodeDecodeError
                log.warning("run %s: skipping checkpoint record %s: %s", run_id, f.path, exc)
        return sorted(records, key=lambda c: c.step)

    def _download(self, run_id: str, artifact: str, missing: str = "") -> bytes:
        with tempfile.TemporaryDirectory(prefix="draftboard-") as tmp:
            try:
                local = self.client.download_artifacts(run_id, artifact, tmp)
            except Exception as exc:
                why = f" ({missing})" if missing else ""
                first = str(exc).splitlines()[0] if str(exc) else repr(exc)  # one line: the CLI prints it as one
                raise DraftboardError(f"run {run_id} has no readable {artifact}{why}: {first}") from exc
            return Path(local).read_bytes()


def attach_fingerprint(run_id: str | None = None, fingerprint: dict | None = None) -> dict:
    """Attach this environment's fingerprint to `mlflow.active_run()` (or `run_id`): one line in a
    launch script of a tool that logs to MLflow itself (SpecForge, speculators, the HF Trainer).

    Uses the fluent tracking URI the tool logs to, so the fingerprint lands next to its run.
    """
    import mlflow

    if run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise DraftboardError("attach_fingerprint(): no active MLflow run; call it after the tool started "
                                  "its run, or pass run_id")
        run_id = active.info.run_id
    return Tracker(mlflow.get_tracking_uri()).attach_fingerprint(run_id, fingerprint)
