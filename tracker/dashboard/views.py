"""What the dashboard shows, computed from the store: runs, lineage, environment checks, tables.

The Streamlit pages only render what these functions return (DataFrames, dataclasses,
lists of strings); everything here is plain Python over MLflow entities and can be tested
without Streamlit. `load_run_index` reads every run of the experiment once (one paged
`search_runs`) plus each run's `fingerprint.json`, and `RunIndex` answers the lineage
questions (evals of a training run, the training run of an eval) from memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd

from tracker import fingerprint as fpm
from tracker.dashboard import metric_docs
from tracker.store.runs import (
    CHECKPOINT,
    CHECKPOINT_SHA256,
    CHECKPOINT_STEP,
    ERROR,
    FINGERPRINT_ARTIFACT,
    KIND,
    REFERENCE_NAME,
    TARGET,
    TRAIN_RUN_ID,
)

DEFAULT_MLFLOW_UI = "http://127.0.0.1:5000"
PUBLISHED_TAG = "draftboard.published"  # set by tracker.store.importers.published on imported publication tables
EVAL_RESULTS_ARTIFACT = "eval_results.json"

# Readable names of fingerprint fields, for banners and tables.
FIELD_NAMES = {
    "numerics.linear_attention_path": "linear-attn",
    "numerics.dtype": "dtype",
    "hardware.device": "device",
    "numerics.attn_implementation": "attention impl.",
    "numerics.tf32_matmul": "TF32 matmul",
    "numerics.tf32_cudnn": "TF32 cuDNN",
    "numerics.float32_matmul_precision": "fp32 matmul precision",
    "hardware.gpu_name": "GPU",
    "probe.max_rel_diff": "hidden-state probe",
    "probe.digest": "hidden-state probe digest",
}
# The differences named first in banners.
HEADLINE_FIELDS = ["numerics.linear_attention_path", "numerics.dtype", "hardware.device",
                   "numerics.attn_implementation"]
LINEAR_ATTN_ICONS = {"fast": "🟢", "partial": "🟡", "fallback": "🟠", "n/a": "⚪"}
SEVERITY_ICONS = {"critical": "🔴", "warning": "🟠", "info": "🔵"}


def field_name(field: str) -> str:
    """`numerics.linear_attention_path` -> `linear-attn`; software versions -> the package name."""
    if field in FIELD_NAMES:
        return FIELD_NAMES[field]
    if field.startswith("numerics.linear_attention.functions."):
        return field.rsplit(".", 1)[1] + " impl."
    if field.startswith("software."):
        return field.split(".", 1)[1]
    return field


def _text(value) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunInfo:
    """One MLflow run as the dashboard sees it."""

    run_id: str
    name: str
    kind: str  # train | eval | reference | "" for runs draftboard did not create
    status: str  # RUNNING | FINISHED | FAILED | KILLED | SCHEDULED
    experiment_id: str
    start_time: int | None  # ms since the epoch
    end_time: int | None
    artifact_uri: str
    tags: Mapping[str, str]
    params: Mapping[str, str]
    metrics: Mapping[str, float]  # latest value of each metric
    metric_steps: Mapping[str, int]  # latest step of each metric
    fingerprint: dict | None = None

    @property
    def target(self) -> str | None:
        return self.tags.get(TARGET)

    @property
    def target_name(self) -> str:
        """The target's last path component (`/models/Qwen3.5-4B` -> `Qwen3.5-4B`)."""
        return target_key(self.target) or "—"

    @property
    def train_run_id(self) -> str | None:
        return self.tags.get(TRAIN_RUN_ID)

    @property
    def checkpoint_step(self) -> int | None:
        value = self.tags.get(CHECKPOINT_STEP)
        try:
            return None if value is None else int(value)
        except ValueError:
            return None

    @property
    def checkpoint(self) -> str | None:
        return self.tags.get(CHECKPOINT)

    @property
    def checkpoint_sha256(self) -> str | None:
        return self.tags.get(CHECKPOINT_SHA256)

    @property
    def reference_name(self) -> str | None:
        return self.tags.get(REFERENCE_NAME)

    @property
    def error(self) -> str | None:
        return self.tags.get(ERROR)

    @property
    def linear_attn(self) -> str:
        return self.tags.get("env.linear_attn", "unknown")

    @property
    def device(self) -> str:
        return self.tags.get("env.device", "unknown")

    @property
    def dtype(self) -> str:
        return self.tags.get("env.dtype", "unknown")

    @property
    def gpu(self) -> str | None:
        gpu = self.tags.get("env.gpu")
        return None if gpu in (None, "none", "unknown") else gpu

    @property
    def env_hash(self) -> str | None:
        return self.tags.get("env.hash")

    @property
    def source_kind(self) -> str | None:
        """`published` / `imported` for fingerprints not captured by draftboard, else None."""
        source = (self.fingerprint or {}).get("source")
        return source.get("kind") if isinstance(source, dict) else None

    @property
    def published(self) -> bool:
        """A reference of published numbers (fingerprint source `published`, or tag draftboard.published=1)."""
        return self.kind == "reference" and (self.source_kind == "published"
                                             or self.tags.get(PUBLISHED_TAG) == "1")

    @property
    def steps(self) -> int | None:
        """Training: the last step logged; eval/reference: the checkpoint's step."""
        if self.kind == "train":
            return max(self.metric_steps.values()) if self.metric_steps else None
        return self.checkpoint_step

    @property
    def env_badges(self) -> str:
        """`🟢 fast · cuda (H100) · bf16`."""
        icon = LINEAR_ATTN_ICONS.get(self.linear_attn, "⚪")
        device = f"{self.device} ({self.gpu})" if self.gpu and self.device == "cuda" else self.device
        return f"{icon} {self.linear_attn} · {device} · {self.dtype}"

    @property
    def kind_label(self) -> str:
        if self.published:
            return "reference · published"
        if self.kind == "train" and self.source_kind == "imported":
            return "train · imported"
        return self.kind or "other"

    @property
    def started(self) -> datetime | None:
        """Start time, naive UTC."""
        if self.start_time is None:
            return None
        return datetime.fromtimestamp(self.start_time / 1000, timezone.utc).replace(tzinfo=None)


def target_key(target: str | None) -> str | None:
    """What identifies a target across machines: the last component of its path or hub id."""
    if not target:
        return None
    return Path(str(target).rstrip("/\\")).name or str(target)


def same_target(a: str | None, b: str | None) -> bool:
    """Equal paths, or the same final component (`/models/Qwen3.5-4B` ~ `Qwen/Qwen3.5-4B`)."""
    if not a or not b:
        return False
    return a == b or (target_key(a) or "").lower() == (target_key(b) or "").lower()


def run_info(run, fingerprint: dict | None = None) -> RunInfo:
    """A RunInfo from an `mlflow.entities.Run` (from search_runs or get_run)."""
    data = run.data
    metric_objs = getattr(data, "_metric_objs", None) or []
    steps = {m.key: int(m.step) for m in metric_objs}
    tags = dict(data.tags)
    return RunInfo(
        run_id=run.info.run_id,
        name=run.info.run_name or tags.get("mlflow.runName") or run.info.run_id[:8],
        kind=tags.get(KIND, ""),
        status=run.info.status,
        experiment_id=run.info.experiment_id,
        start_time=run.info.start_time,
        end_time=run.info.end_time,
        artifact_uri=run.info.artifact_uri or "",
        tags=tags,
        params=dict(data.params),
        metrics=dict(data.metrics),
        metric_steps=steps,
        fingerprint=fingerprint,
    )


def local_artifact_dir(artifact_uri: str) -> Path | None:
    """The directory of a `file://` (or plain path) artifact URI, else None."""
    if not artifact_uri:
        return None
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and artifact_uri[1:3] in (":\\", ":/")):  # Windows drive
        return Path(artifact_uri)
    return None


def read_json_artifact(client, run_id: str, artifact_uri: str, artifact: str) -> dict | None:
    """A JSON artifact of a run; None when it is missing or unreadable.

    Read straight from disk for local artifact stores (no temp copy), else downloaded.
    """
    local = local_artifact_dir(artifact_uri)
    try:
        if local is not None:
            path = local / artifact
            return json.loads(path.read_text()) if path.is_file() else None
        import tempfile

        with tempfile.TemporaryDirectory(prefix="draftboard-ui-") as tmp:
            return json.loads(Path(client.download_artifacts(run_id, artifact, tmp)).read_text())
    except Exception:  # a missing artifact, a network error, broken JSON: shown as "unknown"
        return None


FingerprintLoader = Callable[[str, str], "dict | None"]  # (run_id, artifact_uri) -> fingerprint


class RunIndex:
    """All runs of the experiment, newest first, with lineage lookups."""

    def __init__(self, runs: Iterable[RunInfo]) -> None:
        self.runs: dict[str, RunInfo] = {r.run_id: r for r in runs}
        self._evals: dict[str, list[RunInfo]] = {}
        for r in self.runs.values():
            if r.kind in ("eval", "reference") and r.train_run_id:
                self._evals.setdefault(r.train_run_id, []).append(r)
        for evals in self._evals.values():
            evals.sort(key=lambda r: (r.checkpoint_step if r.checkpoint_step is not None else -1, r.start_time or 0))
        names: dict[str, int] = {}
        for r in self.runs.values():
            names[r.name] = names.get(r.name, 0) + 1
        self._dupes = {n for n, c in names.items() if c > 1}

    def __len__(self) -> int:
        return len(self.runs)

    def __contains__(self, run_id: str) -> bool:
        return run_id in self.runs

    def get(self, run_id: str | None) -> RunInfo | None:
        return self.runs.get(run_id) if run_id else None

    def of_kind(self, *kinds: str) -> list[RunInfo]:
        return [r for r in self.runs.values() if r.kind in kinds]

    def evals_of(self, train_run_id: str, kinds: Sequence[str] = ("eval",)) -> list[RunInfo]:
        """Eval runs of a training run's checkpoints, by checkpoint step."""
        return [r for r in self._evals.get(train_run_id, []) if r.kind in kinds]

    def train_of(self, run: RunInfo) -> RunInfo | None:
        return self.get(run.train_run_id)

    def label(self, run_id: str) -> str:
        """The run's name, with a short id where names repeat."""
        run = self.runs.get(run_id)
        if run is None:
            return run_id[:8]
        return f"{run.name} ({run_id[:6]})" if run.name in self._dupes else run.name

    def targets(self) -> list[str]:
        return sorted({r.target for r in self.runs.values() if r.target})

    def user_tags(self) -> list[str]:
        """`key=value` of every tag except MLflow's own and draftboard's lineage tags."""
        out = set()
        for r in self.runs.values():
            for key, value in r.tags.items():
                if key.startswith(("mlflow.", "draftboard.")) or key == "env.hash":
                    continue
                out.add(f"{key}={value}")
        return sorted(out)


def load_run_index(tracker, fingerprints: FingerprintLoader | None = None) -> RunIndex:
    """Every run of the tracker's experiment, with fingerprints (via `fingerprints`, default: read now)."""
    runs = tracker.find_runs()
    if fingerprints is None:
        def fingerprints(run_id: str, artifact_uri: str) -> dict | None:
            return read_json_artifact(tracker.client, run_id, artifact_uri, FINGERPRINT_ARTIFACT)

    return RunIndex(run_info(r, fingerprints(r.info.run_id, r.info.artifact_uri or "")) for r in runs)


# --------------------------------------------------------------------------- environment checks


@dataclass(frozen=True)
class Mismatch:
    """Differences between the environments of two runs (a: the run, b: what it is compared with)."""

    run_id: str
    other_id: str
    relation: str  # e.g. "eval vs its training run"
    rows: tuple  # tuple[DiffRow, ...], most severe first

    @property
    def critical(self) -> list:
        return [r for r in self.rows if r.severity == "critical"]

    @property
    def warnings(self) -> list:
        return [r for r in self.rows if r.severity == "warning"]


def env_diff(a: RunInfo, b: RunInfo) -> list | None:
    """fingerprint.diff of two runs; None when either fingerprint is missing."""
    if a.fingerprint is None or b.fingerprint is None:
        return None
    return fpm.diff(a.fingerprint, b.fingerprint)


def summarize_rows(rows: Sequence, a_name: str, b_name: str, limit: int = 4) -> str:
    """`linear-attn fallback vs training: fast; dtype fp32 vs training: bf16`.

    The per-function kernel rows are left out when the linear-attention path itself differs
    (they say the same thing).
    """
    fields = {r.field for r in rows}
    shown = [r for r in rows if not (r.field.startswith("numerics.linear_attention.functions.")
                                     and "numerics.linear_attention_path" in fields)]
    shown.sort(key=lambda r: (fpm.SEVERITY_ORDER.get(r.severity, 3),
                              HEADLINE_FIELDS.index(r.field) if r.field in HEADLINE_FIELDS else len(HEADLINE_FIELDS)))
    parts = [f"{field_name(r.field)} {_text(r.a_value)} vs {b_name}: {_text(r.b_value)}" for r in shown[:limit]]
    if len(shown) > limit:
        parts.append(f"{len(shown) - limit} more")
    return f"{a_name}: " + "; ".join(parts) if a_name else "; ".join(parts)


def lineage_mismatches(index: RunIndex, run: RunInfo) -> list[Mismatch]:
    """Critical differences between a run and the runs it is compared with.

    A training run is compared with each of its evals; an eval with its training run.
    Only mismatches with at least one critical row are returned.
    """
    out = []
    if run.kind == "train":
        for ev in index.evals_of(run.run_id, ("eval", "reference")):
            rows = env_diff(ev, run)
            if rows and fpm.has_critical(rows):
                out.append(Mismatch(ev.run_id, run.run_id, "eval vs its training run", tuple(rows)))
    elif run.kind in ("eval", "reference"):
        train = index.train_of(run)
        if train is not None:
            rows = env_diff(run, train)
            if rows and fpm.has_critical(rows):
                out.append(Mismatch(run.run_id, train.run_id, "eval vs its training run", tuple(rows)))
    return out


def mismatch_text(index: RunIndex, m: Mismatch) -> str:
    """`v4 @ step 200 (eval): linear-attn fallback vs training: fast`."""
    run = index.get(m.run_id)
    name = eval_label(index, run) if run is not None else m.run_id[:8]
    return summarize_rows(m.critical, name, "training")


def eval_label(index: RunIndex, run: RunInfo) -> str:
    """`v4 @ step 200` for an eval of a known training run, else the eval's own name."""
    train = index.train_of(run)
    if train is not None and run.checkpoint_step is not None:
        return f"{index.label(train.run_id)} @ step {run.checkpoint_step}"
    return index.label(run.run_id)


# --------------------------------------------------------------------------- runs table


def tau_of(index: RunIndex, run: RunInfo) -> tuple[float | None, float | None]:
    """(latest, best) `tau`: an eval's own; for a training run, over its evals (latest checkpoint / max)."""
    if run.kind == "train":
        points = [(e.checkpoint_step or 0, e.start_time or 0, e.metrics["tau"])
                  for e in index.evals_of(run.run_id) if _finite(e.metrics.get("tau"))]
        if not points:
            return None, None
        return max(points)[2], max(p[2] for p in points)
    tau = run.metrics.get("tau")
    return (tau, tau) if _finite(tau) else (None, None)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def filter_runs(index: RunIndex, kinds: Sequence[str] = (), targets: Sequence[str] = (),
                tags: Sequence[str] = (), search: str = "") -> list[RunInfo]:
    """Runs matching every given filter (empty filter: no restriction); search is over name and id."""
    needle = search.strip().lower()
    wanted_tags = [t.split("=", 1) for t in tags]
    out = []
    for run in index.runs.values():
        if kinds and run.kind not in kinds:
            continue
        if targets and run.target not in targets:
            continue
        if any(run.tags.get(k) != v for k, v in wanted_tags):
            continue
        if needle and needle not in run.name.lower() and not run.run_id.startswith(needle):
            continue
        out.append(run)
    return out


RUNS_TABLE_COLUMNS = ["env check", "name", "kind", "status", "target", "steps", "tau latest", "tau best",
                      "linear-attn", "device", "dtype", "started", "detail", "run_id"]


def runs_table(index: RunIndex, runs: Sequence[RunInfo]) -> pd.DataFrame:
    """One row per run; `env check` carries a red mark and the fields of any critical mismatch."""
    rows = []
    for run in runs:
        mismatches = lineage_mismatches(index, run)
        check = ""
        if mismatches:
            check = "🔴 " + " | ".join(mismatch_text(index, m) for m in mismatches[:2])
            if len(mismatches) > 2:
                check += f" | {len(mismatches) - 2} more"
        elif run.fingerprint is None:
            check = "⚪ no fingerprint"
        latest, best = tau_of(index, run)
        gpu = run.gpu if run.gpu is None or len(run.gpu) <= 28 else run.gpu[:27] + "…"
        device = f"{run.device} ({gpu})" if gpu and run.device == "cuda" else run.device
        rows.append({
            "env check": check,
            "name": run.name,
            "kind": run.kind_label,
            "status": run.status,
            "target": run.target_name,
            "steps": run.steps,
            "tau latest": latest,
            "tau best": best,
            "linear-attn": f"{LINEAR_ATTN_ICONS.get(run.linear_attn, '⚪')} {run.linear_attn}",
            "device": device,
            "dtype": run.dtype,
            "started": run.started,
            "detail": f"run?run={run.run_id}",
            "run_id": run.run_id,
        })
    frame = pd.DataFrame(rows, columns=RUNS_TABLE_COLUMNS)
    frame["steps"] = frame["steps"].astype("Int64")
    frame["tau latest"] = frame["tau latest"].astype("float64")
    frame["tau best"] = frame["tau best"].astype("float64")
    return frame


# --------------------------------------------------------------------------- run detail


def mlflow_ui_url(run: RunInfo, base: str | None = None) -> str:
    """`<ui>/#/experiments/<exp_id>/runs/<run_id>`."""
    base = (base or DEFAULT_MLFLOW_UI).rstrip("/")
    return f"{base}/#/experiments/{run.experiment_id}/runs/{run.run_id}"


def params_frame(run: RunInfo) -> pd.DataFrame:
    return pd.DataFrame(sorted(run.params.items()), columns=["param", "value"])


def metrics_frame(run: RunInfo) -> pd.DataFrame:
    """Latest metric values with their unit and definition."""
    rows = []
    for name in metric_docs.sort_metrics(run.metrics):
        doc = metric_docs.describe(name)
        rows.append({"metric": name, "value": run.metrics[name], "unit": doc.unit,
                     "step": run.metric_steps.get(name), "definition": doc.definition})
    frame = pd.DataFrame(rows, columns=["metric", "value", "unit", "step", "definition"])
    frame["step"] = frame["step"].astype("Int64")
    return frame


def fingerprint_frame(fp: dict | None) -> pd.DataFrame:
    """The fingerprint as (section, field, value) rows; probe layers summarised."""
    rows = []
    if fp:
        probe = fp.get("probe")
        flat = fpm.flatten({k: v for k, v in fp.items() if k != "probe"})
        for key, value in flat.items():
            section, _, rest = key.partition(".")
            rows.append({"section": section, "field": rest or section, "value": _text(value) if not
                         isinstance(value, (list, dict)) else json.dumps(value)})
        if isinstance(probe, dict):
            layers = probe.get("layers") or {}
            rows.append({"section": "probe", "field": "digest", "value": _text(probe.get("digest"))})
            rows.append({"section": "probe", "field": "layers", "value": ", ".join(sorted(layers)) or "none"})
    return pd.DataFrame(rows, columns=["section", "field", "value"])


def diff_frame(rows: Sequence | None, a_name: str = "this run", b_name: str = "other") -> pd.DataFrame:
    rows = rows or []
    return pd.DataFrame(
        [{"severity": f"{SEVERITY_ICONS[r.severity]} {r.severity}", "field": r.field, "what": field_name(r.field),
          a_name: _text(r.a_value), b_name: _text(r.b_value)} for r in rows],
        columns=["severity", "field", "what", a_name, b_name])


def checkpoints_frame(index: RunIndex, run: RunInfo, checkpoints: Sequence) -> pd.DataFrame:
    """Registered checkpoints (step, size, digest) and, per checkpoint, its evals.

    Evals of steps without a registered checkpoint get a row too (digest unknown).
    """
    evals = index.evals_of(run.run_id, ("eval", "reference"))
    by_step: dict[int | None, list[RunInfo]] = {}
    for ev in evals:
        by_step.setdefault(ev.checkpoint_step, []).append(ev)
    rows = []
    known = {c.step for c in checkpoints}
    for c in checkpoints:
        rows.append(_checkpoint_row(index, run, c.step, c.size_bytes, c.sha256, c.path, by_step.get(c.step, [])))
    for step in sorted((s for s in by_step if s not in known), key=lambda s: -1 if s is None else s):
        first = by_step[step][0]
        rows.append(_checkpoint_row(index, run, step, None, first.checkpoint_sha256, first.checkpoint, by_step[step]))
    frame = pd.DataFrame(rows, columns=["step", "size (MB)", "sha256", "path", "evals", "tau", "env check"])
    frame["step"] = frame["step"].astype("Int64")
    return frame


def _checkpoint_row(index, train, step, size, sha, path, evals) -> dict:
    evals_text, taus, checks = [], [], []
    for ev in evals:
        tau = ev.metrics.get("tau")
        evals_text.append(f"{ev.name} [{ev.env_badges}]" + (f" tau {tau:.3f}" if _finite(tau) else ""))
        if _finite(tau):
            taus.append(tau)
        rows = env_diff(ev, train)
        if rows and fpm.has_critical(rows):
            checks.append("🔴 " + summarize_rows([r for r in rows if r.severity == "critical"], ev.name, "training"))
    return {
        "step": step,
        "size (MB)": None if size is None else round(size / 1e6, 3),
        "sha256": (sha or "")[:16] or "—",
        "path": path or "—",
        "evals": "\n".join(evals_text) or "not evaluated",
        "tau": max(taus) if taus else None,
        "env check": " | ".join(checks),
    }


def eval_positions(run: RunInfo, results: dict | None = None) -> list[float]:
    """Acceptance rate by draft position: metrics accept_rate_pos{k}, else eval_results.json."""
    found = {}
    for name, value in run.metrics.items():
        if name.startswith("accept_rate_pos") and name[len("accept_rate_pos"):].isdigit():
            found[int(name[len("accept_rate_pos"):])] = value
    if found:
        return [found.get(k, math.nan) for k in range(1, max(found) + 1)]
    if results and isinstance(results.get("accept_rate_by_position"), list):
        return [float(v) for v in results["accept_rate_by_position"]]
    return []


def ddtree_points(run: RunInfo, results: dict | None = None) -> list[tuple[int, float]]:
    """(budget, DDTree tau) pairs from metrics ddtree_tau_b{B}, else eval_results.json."""
    found = {}
    for name, value in run.metrics.items():
        if name.startswith("ddtree_tau_b") and name[len("ddtree_tau_b"):].isdigit():
            found[int(name[len("ddtree_tau_b"):])] = value
    if not found and results and isinstance(results.get("ddtree"), dict):
        for budget, d in results["ddtree"].items():
            if str(budget).isdigit() and isinstance(d, dict) and "tau" in d:
                found[int(budget)] = float(d["tau"])
    return sorted(found.items())


@dataclass
class EmptyState:
    """What to say when there is nothing to show."""

    title: str
    hint: str = ""
    extra: list[str] = field(default_factory=list)


def empty_store_message(uri: str) -> EmptyState:
    return EmptyState(
        "No runs yet.",
        "Run `draftboard demo` to build a demo store, or log a training run with "
        "`tracker.Tracker().training_run(...)`, import one with `draftboard import-log FILE --name NAME`, "
        "or evaluate a checkpoint with `draftboard eval ...`.",
        [f"Store: `{uri}`"],
    )
