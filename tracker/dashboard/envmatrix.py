"""The Environments page's data: fingerprint matrices, the train-vs-eval table, re-evaluation plans.

`fingerprint_matrix` lays the chosen runs' fingerprints side by side (one row per field) and
grades every cell against a baseline run with `fingerprint.diff`'s severities, so a red cell
is a difference that can change the numbers. `pairs_frame` tabulates the (training run, eval)
pairs of `tracker.dashboard.lineage.train_eval_pairs`, a critically differing eval marked once a
re-evaluation matched its training run (`lineage.resolved_by`). `reeval_plan` builds the eval job that
repeats an eval with its training run's linear-attention path, dtype, drafter precision and
device, or says why none is needed (same environment already, or an eval that already did it).
`unfingerprinted` lists the runs without a fingerprint (runs other tools wrote, mostly), each
with the `draftboard fingerprint --attach` command that fixes it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tracker import config, redact
from tracker.environment import fingerprint
from tracker.jobs import eval_job
from tracker.store import names
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.dashboard.lineage import (Lineage, eval_settings_of, field_name, protocol_tags, resolved_by, same_settings,
                                       severity_background, train_eval_pairs, value_text)

# The same colours as Streamlit's own Markdown backgrounds, for the legend (no HTML needed).
SEVERITY_LEGEND = " ".join(f":{color}-background[{severity}]" for severity, color in
                           (("critical", "red"), ("warning", "orange"), ("info", "blue")))


# --------------------------------------------------------------------------- matrix


def _matrix_fields(fp: dict) -> dict[str, Any]:
    """Flattened fingerprint without the per-layer probe statistics (the digest stays)."""
    flat = fingerprint.flatten({k: v for k, v in fp.items() if k != "probe"})
    flat = {k: v for k, v in flat.items()
            if not k.startswith(fingerprint.IGNORED_FIELDS) or k == "source.kind"}
    probe = fp.get("probe")
    if isinstance(probe, dict):
        flat["probe.digest"] = probe.get("digest")
    return flat


@dataclass
class Matrix:
    values: pd.DataFrame  # index: field, columns: run labels; text cells
    severity: pd.DataFrame  # same shape: "", "critical", "warning", "info" (vs the baseline column)
    baseline: str
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # label -> severity -> count

    def styled(self):
        """A pandas Styler with differing cells coloured by severity (for st.dataframe)."""
        colors = self.severity.apply(lambda col: col.map(severity_background))
        return self.values.style.apply(lambda _: colors, axis=None)


def fingerprint_matrix(fps: dict[str, dict | None], baseline: str | None = None,
                       only_differing: bool = True) -> Matrix:
    """Fields x runs; `fps` maps a column label to a fingerprint (None: missing), in column order."""
    labels = list(fps)
    if not labels:
        empty = pd.DataFrame()
        return Matrix(empty, empty, "")
    baseline = baseline if baseline in fps else labels[0]
    flats = {label: (_matrix_fields(fp) if fp else {}) for label, fp in fps.items()}
    base_fp = fps.get(baseline)
    severities: dict[str, dict[str, str]] = {}
    counts = {}
    for label, fp in fps.items():
        sev = {}
        if label != baseline and fp and base_fp:
            for row in fingerprint.diff(base_fp, fp):
                field_key = "probe.digest" if row.field == "probe.max_rel_diff" else row.field
                sev[field_key] = row.severity
        elif label != baseline:
            sev = {"*": "warning"}  # fingerprint missing: nothing can be compared
        severities[label] = sev
        counts[label] = {s: sum(v == s for k, v in sev.items() if k != "*") for s in ("critical", "warning", "info")}
    fields = sorted(set().union(*[set(f) for f in flats.values()]),
                    key=lambda f: (_section_order(f), f))
    rows_values, rows_sev = {}, {}
    for f in fields:
        cells = [flats[label].get(f) for label in labels]
        sev_cells = [severities[label].get(f, severities[label].get("*", "")) if label != baseline else ""
                     for label in labels]
        # Columns without a fingerprint are marked, but do not make every row "differ".
        present = [i for i, label in enumerate(labels) if flats[label]]
        differs = (any(sev_cells[i] for i in present)
                   or len({json.dumps(cells[i], default=str, sort_keys=True) for i in present}) > 1)
        if only_differing and not differs:
            continue
        rows_values[f] = [_cell(c, flats[label], f) for c, label in zip(cells, labels)]
        rows_sev[f] = sev_cells
    values = pd.DataFrame.from_dict(rows_values, orient="index", columns=labels)
    severity = pd.DataFrame.from_dict(rows_sev, orient="index", columns=labels)
    # Most severe first (by the worst cell of each row), then by field.
    order = {"critical": 0, "warning": 1, "info": 2, "": 3}
    if not values.empty:
        worst = severity.apply(lambda row: min(order[s] for s in row), axis=1)
        keys = sorted(values.index, key=lambda f: (worst[f], _section_order(f), f))
        values, severity = values.loc[keys], severity.loc[keys]
    values.index.name = "field"
    severity.index.name = "field"
    return Matrix(values, severity, baseline, counts)


def _cell(value: Any, flat: dict, field_key: str) -> str:
    if not flat:
        return "no fingerprint"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value_text(value)


def _section_order(field_key: str) -> int:
    order = ("numerics", "hardware", "software", "probe", "code", "source")
    section = field_key.split(".", 1)[0]
    return order.index(section) if section in order else len(order)


EVIDENCE_COLUMNS = ["run", "field", "value", "source", "quoted", "rule"]


def evidence_frame(fps: dict[str, dict | None]) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """Where each imported run's environment fields come from: one row per citation (the run, the field,
    its value, `file:line`, the quoted line, the rule that read it), and (run, disagreement) for the
    places its own files disagree. Captured fingerprints cite nothing."""
    rows, conflicts = [], []
    for label, fp in fps.items():
        for field_key, value, cite in fingerprint.cited(fp or {}):
            line = cite.get("line")
            rows.append({"run": label, "field": field_key, "value": value_text(value),
                         "source": f"{cite.get('file')}" + (f":{line}" if line is not None else ""),
                         "quoted": str(cite.get("text"))[:300], "rule": str(cite.get("rule"))})
        conflicts += [(label, text[:500]) for text in fingerprint.contradictions(fp or {})]
    return pd.DataFrame(rows, columns=EVIDENCE_COLUMNS), conflicts


# --------------------------------------------------------------------------- pairs


def pairs_table(index: RunIndex) -> pd.DataFrame:
    """`pairs_frame` of every pair, derived once per index (one store state): Environments shows it on every
    visit, and `ui.warm` derives it before the first (at 10,000 runs, about 0.6 s)."""
    return index.memo(("pairs_frame",), lambda: pairs_frame(index, train_eval_pairs(index)))


def pairs_frame(index: RunIndex, pairs: Sequence[Lineage]) -> pd.DataFrame:
    """One row per (training run, eval) pair of `tracker.dashboard.lineage.train_eval_pairs`;
    `re-evaluated as` names the matching re-evaluation of a critically differing eval (`lineage.resolved_by`)."""
    redone = {p.eval.run_id: by.run_id for p in pairs if (by := resolved_by(index, p.eval)) is not None}
    rows = []
    for p in pairs:
        crit, warn = p.critical, p.warnings
        rows.append({
            # A critical difference a re-evaluation answered reads as answered (🟢, as on Runs), not open.
            "check": "⚪" if not p.compared else ("🟢" if p.eval.run_id in redone else "🔴") if crit else
            "🟠" if warn else "🟢",
            "training run": index.label(p.train.run_id),
            "eval": index.eval_label(p.eval),
            "step": p.eval.checkpoint_step,
            # open critical differences: one a re-evaluation answered no longer counts (its row says which)
            "critical": 0 if p.eval.run_id in redone else len(crit),
            "warning": len(warn),
            "differences": "no fingerprint to compare" if not p.compared else
            ("answered: " if p.eval.run_id in redone else "") + p.summary() if crit else
            ", ".join(field_name(r.field) for r in warn)[:200],
            "re-evaluated as": index.label(redone[p.eval.run_id]) if p.eval.run_id in redone else "",
            "training env": p.train.env_badges,
            "eval env": p.eval.env_badges,
            "eval_run_id": p.eval.run_id,
        })
    frame = pd.DataFrame(rows, columns=["check", "training run", "eval", "step", "critical", "warning",
                                        "differences", "re-evaluated as", "training env", "eval env", "eval_run_id"])
    frame["step"] = frame["step"].astype("Int64")
    return frame


# --------------------------------------------------------------------------- re-evaluation

FORCEABLE_LINEAR = tuple(m for m in config.LINEAR_ATTN_MODES if m != "auto")


@dataclass
class ReevalPlan:
    params: dict | None  # eval job params (tracker.jobs.eval_job), None when blocked or already done
    changes: list[str]  # "linear-attn fallback -> fast"
    blocked: str | None = None  # why the eval cannot (or need not) be repeated under the training environment
    existing: str | None = None  # run id of an eval that already did exactly this re-evaluation


# The eval flags that set an environment, and how a fingerprint records each.
ENV_FLAGS = {"linear_attn": "linear-attn", "dtype": "dtype", "drafter_precision": "drafter-precision",
             "device": "device"}


def environment_flags(fp: dict | None) -> dict[str, str | None]:
    """{linear_attn, dtype, drafter_precision, device} as a fingerprint records them (None: unknown).

    Fingerprints from before `numerics.drafter_precision` recorded one dtype for the target and
    the drafter (an eval cast both), so their drafter precision is that dtype."""
    num, hw = (fp or {}).get("numerics") or {}, (fp or {}).get("hardware") or {}
    return {"linear_attn": num.get("linear_attention_path"), "dtype": num.get("dtype"),
            "drafter_precision": num.get("drafter_precision") or num.get("dtype"), "device": hw.get("device")}


def training_environment(fp: dict | None) -> tuple[dict[str, str], str | None]:
    """(the eval flags that reproduce a training fingerprint's numerics, None) or ({}, why not)."""
    if not fp:
        return {}, "the training run has no fingerprint"
    env = environment_flags(fp)
    path = env["linear_attn"]
    if path not in FORCEABLE_LINEAR:
        why = ("unknown (an imported run whose files do not say, or a published one)" if path is None else
               f"'{path}', which `--linear-attn` cannot force (only fast or fallback)")
        return {}, f"the training run's linear-attention path is {why}"
    if (fp.get("source") or {}).get("kind") == "imported":
        # An imported run's files state some fields: those are matched, the rest stay the eval's own (an
        # unknown is never forced).
        env = {k: v for k, v in env.items() if v is not None}
    dtype, device = env.get("dtype", ...), env.get("device", ...)
    if dtype is not ... and dtype not in config.EVAL_DTYPES:
        return {}, f"the training run's dtype is {value_text(dtype)}; evals run in {' or '.join(config.EVAL_DTYPES)}"
    if env.get("drafter_precision", ...) not in (..., *config.DRAFTER_PRECISIONS):
        return {}, (f"the training run's drafter precision is {value_text(env['drafter_precision'])}; evals run "
                    f"the drafter in {', '.join(config.DRAFTER_PRECISIONS)}")
    if device is not ... and device not in config.DEVICES:
        return {}, f"the training run's device is {value_text(device)}; evals run on {' or '.join(config.DEVICES)}"
    return dict(env), None


def reeval_plan(index: RunIndex, eval_run_id: str,
                results: Callable[[RunInfo], dict | None] | None = None) -> ReevalPlan:
    """The job that repeats an eval (same target, drafter, prompts, settings) in its training run's environment."""
    ev = index.get(eval_run_id)
    if ev is None:
        return ReevalPlan(None, [], f"no run {eval_run_id}")
    train = index.train_of(ev)
    if train is None:
        return ReevalPlan(None, [], "this eval is not linked to a training run (tag draftboard.train_run_id)")
    env, why = training_environment(train.fingerprint)
    if why:
        return ReevalPlan(None, [], why)
    settings = eval_settings_of(ev)
    if any(settings[k] and not Path(settings[k]).is_absolute() for k in ("target", "drafter")) and results:
        settings = eval_settings_of(ev, results(ev))
    missing = [k for k in ("target", "drafter", "prompts") if not settings.get(k)]
    if missing:
        return ReevalPlan(None, [], f"the eval run does not record its {', '.join(missing)} (params)")
    relative = [k for k in ("target", "drafter", "prompts") if not Path(settings[k]).is_absolute()]
    if relative:
        return ReevalPlan(None, [], f"the eval run recorded a relative {', '.join(relative)} path "
                                    f"({settings[relative[0]]}); re-run it from the CLI in its directory")
    current = environment_flags(ev.fingerprint)
    changes = [f"{ENV_FLAGS[k]} {value_text(current[k])} → {env[k]}" for k in env if current[k] != env[k]]
    if not changes:
        return ReevalPlan(None, [], "this eval already ran in its training run's environment ("
                          + ", ".join(f"{ENV_FLAGS[k]} {v}" for k, v in env.items()) + "): a re-run would repeat it")
    params = {k: v for k, v in settings.items() if v is not None}
    params.update(env)
    params["train_run_id"] = train.run_id
    if ev.checkpoint_step is not None:
        params["checkpoint_step"] = ev.checkpoint_step
        params["name"] = names.eval_run_name(index.label(train.run_id), ev.checkpoint_step, params,
                                             eval_job.setting_words(params))
    done = next((r for r in index.evals_of(train.run_id)
                 if r.checkpoint_step == ev.checkpoint_step and _same_eval(r, ev, params)), None)
    if done is not None:
        return ReevalPlan(None, changes, existing=done.run_id)
    return ReevalPlan(params, changes)


def _same_eval(run: RunInfo, original: RunInfo, params: dict) -> bool:
    """Whether `run` measured what `params` would: same checkpoint and settings, the planned
    environment (from its fingerprint), and the same protocol tags as the eval being repeated."""
    if not same_settings(run, params):
        return False
    if any(environment_flags(run.fingerprint)[k] != params[k] for k in ENV_FLAGS if k in params):
        return False
    return protocol_tags(run) == protocol_tags(original)


# --------------------------------------------------------------------------- runs without a fingerprint

UNFINGERPRINTED_COLUMNS = ["run", "kind", "started", "fix", "run_id"]


def attach_command(run_id: str, store_uri: str) -> str:
    """The command that attaches a fingerprint to `run_id`, run on the machine (and in the
    environment) that trained it; the store is named because that machine's default is not ours."""
    return shlex.join(["draftboard", "fingerprint", "--attach", run_id, "--tracking-uri",
                       redact.shown_uri(store_uri)])


def unfingerprinted(index: RunIndex, store_uri: str) -> pd.DataFrame:
    """Runs without a fingerprint (their environment is unknown, so nothing can be compared with
    them), training runs first, each with the command that fixes it (column `fix`)."""
    runs = [r for r in index.runs.values() if not r.has_fingerprint]
    runs.sort(key=lambda r: (r.kind != "train", -(r.start_time or 0)))
    rows = [{"run": index.label(r.run_id), "kind": r.kind_label, "started": r.started,
             "fix": attach_command(r.run_id, store_uri), "run_id": r.run_id} for r in runs]
    return pd.DataFrame(rows, columns=UNFINGERPRINTED_COLUMNS)
