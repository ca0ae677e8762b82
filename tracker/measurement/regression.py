"""Regression alerts: a new eval that is worse than the previous checkpoint of its run, or than the
newest reference of its target, by the paired bootstrap's verdict ("worse"; never on "no detectable
difference").

- `paired(a, b)`: two evals' results compared prompt by prompt. They must share prompts (the same
  token ids), their protocols must not differ critically, and (for an alert) neither must their
  environments: otherwise the gap is not the drafter's, and a DraftboardError says why.
  `draftboard compare` reads the same function.
- `check(tracker, run_id)`: the alerts of a logged eval. Previous checkpoint: the eval of its training
  run at the latest earlier step measured the same way (comparable as above; the newest such). Reference:
  the newest reference of the same target that is comparable. Where either checkpoint has repeats measured the same
  way (`repeat_spread`), a worse mean alerts only beyond their spread. When the mean holds, the same pair is compared
  per context bucket (`by_context`): a bucket worse beyond its interval (Bonferroni over the buckets compared)
  raises an alert naming it, so a checkpoint that trades long contexts for short ones is caught.
- `record(tracker, run_id, alerts)`: `alerts.json` and the tag `draftboard.alert` (one line) on the eval
  run, which Runs and Run detail show.
- `post(url, alerts)`: one Slack-compatible JSON message (`{"text": ...}`) to the webhook the deployment
  configures (`config.alert_webhook`); never a URL from the store or a job. A failed POST is a warning:
  an eval is never failed by its alert.

`draftboard eval` runs `check`, `record` and `post` after logging (the worker's evals are such processes).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tracker import config
from tracker.environment import fingerprint
from tracker.measurement import context, protocol
from tracker.untrusted import escape, outgoing
from tracker.untrusted.digits import whole_number
from tracker.errors import DraftboardError
from tracker.store import names
from tracker.measurement.uncertainty import WORSE, PairedComparison, paired_comparison, prompt_score

PREVIOUS, REFERENCE = "previous checkpoint", "reference"
POST_TIMEOUT_S = 10.0


def paired(a: dict, b: dict, *, same_environment: bool = False) -> PairedComparison:
    """B against A (two results JSONs), prompt by prompt; DraftboardError when they are not comparable."""
    by_id = [{str(r["id"]): r for r in res["prompts"]} for res in (a, b)]
    changed = [pid for pid in by_id[0] if pid in by_id[1] and "input_ids" in by_id[0][pid]
               and "input_ids" in by_id[1][pid] and by_id[0][pid]["input_ids"] != by_id[1][pid]["input_ids"]]
    if changed:
        raise DraftboardError(f"prompt {changed[0]!r} has different token ids in the two evals "
                              f"({len(changed)} prompt(s) differ): not the same prompt set")
    critical = [r for r in protocol.diff(protocol.Protocol.from_results(a), protocol.Protocol.from_results(b))
                if r.severity == "critical"]
    if critical:
        raise DraftboardError("the evals' protocols differ critically (" + "; ".join(
            f"{r.field}: {r.a_value} vs {r.b_value}" for r in critical) + "): their taus are not comparable")
    if same_environment:
        rows = fingerprint.diff(a.get("fingerprint") or {}, b.get("fingerprint") or {})
        crit = [r.field for r in rows if r.severity == "critical"]
        if crit:
            raise DraftboardError(f"the evals' environments differ critically ({', '.join(crit[:3])})")
    scores = [{pid: prompt_score(r) for pid, r in ids.items()} for ids in by_id]
    shared = [pid for pid in scores[0] if pid in scores[1]]
    if not shared:
        raise DraftboardError("the evals share no prompt")
    return paired_comparison(*scores)


@dataclass(frozen=True)
class Alert:
    run_id: str
    name: str
    against: str  # PREVIOUS | REFERENCE
    against_run_id: str
    against_name: str
    delta: float  # tau(this) - tau(against)
    low: float
    high: float
    n_prompts: int
    bucket: str = ""  # a context bucket (context.bucket_text) worse while the mean holds; "": the mean is worse

    @property
    def text(self) -> str:
        where = f" at context {self.bucket} while its mean holds" if self.bucket else ""
        how = ", pooled over the bucket's blocks, Bonferroni over the buckets compared" if self.bucket else ""
        return (f"{self.name} is worse than the {self.against} {self.against_name}{where}: Δτ {self.delta:+.3f} "
                f"[{self.low:+.3f}, {self.high:+.3f}] (paired bootstrap over {self.n_prompts} prompts{how})")


def by_context(a: dict, b: dict) -> list[dict] | None:
    """B against A per context bucket (context.paired_by_walks) on their shared prompts, bucketed by B's edges
    (else A's, else octaves); None when either eval has no ordered walks (a sampled eval, an engine's histogram)."""
    walks = [context.results_walks(a), context.results_walks(b)]
    if None in walks:
        return None
    ids = [pid for pid in walks[0] if pid in walks[1]]
    edges = context.results_edges(b) or context.results_edges(a)
    return context.paired_by_walks([walks[0][i] for i in ids], [walks[1][i] for i in ids], edges)[1]


def check(tracker, run_id: str, say: Callable[[str], None] = lambda line: None) -> list[Alert]:
    """The regression alerts of the logged eval `run_id` (empty when it is no worse, or nothing compares).
    `say` hears, per comparison, what the eval was compared with or why it was not, so a check that
    found nothing to compare never passes for a check that found no regression."""
    run = tracker.run(run_id)
    tags = run.data.tags
    if tags.get(names.KIND) != "eval":
        return []
    results = tracker.read_json(run_id, names.EVAL_RESULTS_ARTIFACT, missing="not an eval run?")
    alerts = []
    train, step = tags.get(names.TRAIN_RUN_ID), tags.get(names.CHECKPOINT_STEP)
    at = whole_number(step)
    if train and at is not None:
        earlier = [r for r in tracker.find_runs("eval", f"tags.`{names.TRAIN_RUN_ID}` = '{_quoted(train)}'")
                   if (before := whole_number(r.data.tags.get(names.CHECKPOINT_STEP))) is not None and before < at]
        earlier.sort(key=lambda r: (whole_number(r.data.tags[names.CHECKPOINT_STEP]), r.info.start_time or 0),
                     reverse=True)
        alerts += _first_worse(tracker, run, results, earlier, PREVIOUS, say)
    else:
        say(f"{PREVIOUS}: not checked, the eval names no training run and checkpoint step")
    target = tags.get(names.TARGET)
    if target:
        refs = tracker.find_runs("reference", f"tags.`{names.TARGET}` = '{_quoted(target)}'")
        resolved = str(Path(target).resolve())
        if not Path(target).is_absolute() and resolved != target:  # a relative --target: references log it resolved
            refs += tracker.find_runs("reference", f"tags.`{names.TARGET}` = '{_quoted(resolved)}'")
            refs.sort(key=lambda r: r.info.start_time or 0, reverse=True)
        alerts += _first_worse(tracker, run, results, refs, REFERENCE, say)
    else:
        say(f"{REFERENCE}: not checked, the eval names no target")
    return alerts


# What makes two evals of one checkpoint repeats: the same environment (nothing critical or warning differs) and
# the same protocol as far as tau is concerned.
REPEAT_KEYS = (names.ENV_CRITICAL_KEY, names.ENV_WARNING_KEY, *(names.protocol_tag(field) for field in (
    "prompt_digest", "temperature", "top_p", "top_k", "samples", "seed", "max_new_tokens", "block_size", "scoring",
    "last_block")))


def repeat_spread(tracker, run) -> tuple[float, int]:
    """(max - min of tau, their number) over the evals of `run`'s checkpoint (training run and step) measured the
    same way (REPEAT_KEYS), `run` included; (0.0, 1) without repeats. Nondeterministic kernels (fla's autotuned
    ones on sm_103: fla #945, #1228) move a tau between repeats; an alert must clear that."""
    tags = run.data.tags
    train, step = tags.get(names.TRAIN_RUN_ID), tags.get(names.CHECKPOINT_STEP)
    if not train or whole_number(step) is None:
        return 0.0, 1
    same = [r for r in tracker.find_runs("eval", f"tags.`{names.TRAIN_RUN_ID}` = '{_quoted(train)}' and "
                                                 f"tags.`{names.CHECKPOINT_STEP}` = '{step}'")
            if all(r.data.tags.get(k) == tags.get(k) for k in REPEAT_KEYS)]
    taus = [r.data.metrics["tau"] for r in same if isinstance(r.data.metrics.get("tau"), float)]
    return (max(taus) - min(taus) if len(taus) > 1 else 0.0), max(1, len(taus))


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _first_worse(tracker, run, results: dict, candidates: list, against: str,
                 say: Callable[[str], None]) -> list[Alert]:
    """The alert against the first comparable candidate (newest first), if this eval is worse than it."""
    candidates = [c for c in candidates if c.info.run_id != run.info.run_id]
    for other in candidates:
        try:
            theirs = tracker.read_json(other.info.run_id, names.EVAL_RESULTS_ARTIFACT)
            comparison = paired(theirs, results, same_environment=True)
        except (DraftboardError, KeyError, TypeError):
            continue  # published numbers, another prompt set or environment: not this comparison's
        d = comparison.delta
        name = other.info.run_name or other.info.run_id
        this = (run.info.run_id, run.info.run_name or run.info.run_id, against, other.info.run_id, name)
        if comparison.verdict == WORSE:
            spread, repeats = max(repeat_spread(tracker, run), repeat_spread(tracker, other))
            if d.high < -spread:
                return [Alert(*this, d.value, d.low, d.high, comparison.n_prompts)]
            say(f"{against}: compared with {name}: worse by the paired bootstrap (Δτ {d.value:+.3f} [{d.low:+.3f}, "
                f"{d.high:+.3f}]), but within the spread of repeats measured the same way ({spread:.3f} over "
                f"{repeats} evals of one checkpoint): no alert")
            return []
        rows = by_context(theirs, results)
        buckets = [row for row in rows or () if row["verdict"] is not None]
        worse = [Alert(*this, row["delta"], *row["ci"], row["n_prompts"], bucket=context.bucket_text(row))
                 for row in buckets if row["verdict"] == WORSE]
        if worse:
            return worse
        say(f"{against}: compared with {name} (the newest comparable of {len(candidates)}): not worse, Δτ "
            f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]" + (
                f"; no context bucket worse ({len(buckets)} compared)" if buckets else
                "; not compared by context (a side has no ordered walks)" if rows is None else
                f"; no context bucket has {context.MIN_PROMPTS} prompts with blocks on both sides"))
        return []
    say(f"{against}: nothing to compare with" if not candidates else
        f"{against}: none of {len(candidates)} compares (another prompt set, protocol or environment, or no "
        "per-prompt results)")
    return []


def record(tracker, run_id: str, alerts: list[Alert]) -> None:
    """`alerts.json` and the `draftboard.alert` tag on the eval (nothing when there is no alert)."""
    if not alerts:
        return
    tracker.write_json(run_id, names.ALERTS_ARTIFACT, {"alerts": [asdict(a) for a in alerts]})
    tracker.set_tag(run_id, names.ALERT, "; ".join(a.text for a in alerts)[:names.MAX_TAG_CHARS])


def message(alerts: list[Alert]) -> dict:
    """The webhook's body: Slack's incoming-webhook shape, `{"text": ...}`, run names escaped as Slack's
    mrkdwn asks (no `<!channel>` ping, no disguised link)."""
    return {"text": "draftboard regression: " + "\n".join(escape.slack(a.text) for a in alerts)}


def post(url: str, alerts: list[Alert]) -> bool:
    """POST the alerts to the deployment's webhook; False (and a warning on stderr) when it fails."""
    if not alerts:
        return True
    try:
        request = urllib.request.Request(url, data=json.dumps(message(alerts)).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with outgoing.open_url(request, POST_TIMEOUT_S) as response:  # the deployment's URL
            response.read()
        return True
    except (OSError, ValueError) as exc:  # ValueError: a URL urllib cannot even parse
        host = config.webhook_host(url)
        print(f"warning: the regression alert could not be posted to {host}: {_without(exc, url, host)}",
              file=sys.stderr)
        return False


def _without(exc: BaseException, url: str, host: str) -> str:
    """What went wrong, with no part of the webhook's URL but its host (an error may quote the URL)."""
    from urllib.parse import urlsplit

    text = f"{type(exc).__name__}: {exc}"
    try:
        path = urlsplit(url).path
    except ValueError:
        path = ""
    text = text.replace(url, host)
    return text.replace(path, "/…") if len(path) > 1 else text
