"""`draftboard demo`: a store full of honest data, built on the spot on a CPU.

Stages: a tiny Qwen3.5 target trained on stdlib source; self-distilled training data; where an
engine is installed, a Qwen3 pair measured offline and served (demo/served.py); four drafter
training runs that differ as a real team's do (tapped layers, loss weighting, one trained in bf16
while every eval runs fp32, so the environment view has a true mismatch, and a DFlash2 drafter with
its trained candidate selector); an eval of every checkpoint through the real harness; a
longer-trained drafter evaluated as the `longer-trained drafter (demo)` reference; and z-lab's
published numbers as published reference runs. Nothing is invented: every number comes from the
trainer, the harness and the engines, or from a cited publication.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mlflow.exceptions import MlflowException

from demo import served
from demo import target as demo_target
from demo.train_dflash import TrainConfig, prepare_data, train
from evaluators.drafter import DFLASH2
from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from evaluators.logging import log_eval
from tracker import redact
from tracker.jobs.demo_progress import ProgressWriter
from tracker.errors import DraftboardError
from tracker.jobs import eval_job
from tracker.store import names
from tracker.store.importers.published import import_published
from tracker.store.tracker import Tracker

DEMO_DIR = "draftboard-demo"  # in home; not `demo`, the name of this package's own folder in a checkout
MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "draftboard.demo/1"
_MANIFEST_TMP = f".{MANIFEST}.tmp"  # written, then renamed over the manifest
# Legends read "reference: longer-trained drafter (demo)", never "reference reference (demo)".
REFERENCE_NAME = "longer-trained drafter (demo)"
TARGET_NAME = "qwen35-tiny-stdlib"  # the directory name is what the dashboard shows as the target


@dataclass(frozen=True)
class Plan:
    """Sizes of one demo build; `quick` is what the tests use."""

    target_steps: int
    train_prompts: int
    eval_prompts: int
    max_new_tokens: int
    run_steps: int
    ckpt_every: int
    reference_steps: int


FULL = Plan(target_steps=demo_target.FULL_STEPS, train_prompts=128, eval_prompts=16, max_new_tokens=64,
            run_steps=200, ckpt_every=40, reference_steps=600)
QUICK = Plan(target_steps=demo_target.QUICK_STEPS, train_prompts=48, eval_prompts=8, max_new_tokens=32,
             run_steps=60, ckpt_every=30, reference_steps=120)


def runs(plan: Plan) -> list[TrainConfig]:
    """Four runs a team might compare (the last a DFlash2 drafter), and the reference recipe trained longer."""
    base = TrainConfig(steps=plan.run_steps, ckpt_every=plan.ckpt_every, block_size=8)
    return [
        replace(base, name="drafter-v1 (1 tapped layer)", n_tapped=1),
        replace(base, name="drafter-v2 (2 tapped layers)", target_layer_ids=[1, 2]),
        # Same recipe but uniform loss weights, trained in bf16: every eval below runs fp32.
        replace(base, name="drafter-v3 (uniform loss, bf16)", target_layer_ids=[1, 2], gamma=None, dtype="bf16"),
        # The v2 recipe as DFlash2: convs around every sublayer and a trained candidate selector.
        replace(base, name="drafter-v4 (DFlash2)", target_layer_ids=[1, 2], family=DFLASH2),
    ]


def reference_run(plan: Plan) -> TrainConfig:
    return TrainConfig(name="reference drafter (demo)", target_layer_ids=[1, 2], steps=plan.reference_steps,
                       ckpt_every=plan.reference_steps, block_size=8)


# Seconds per unit of work on 2 idle CPU cores, from a full build's stage times (`draftboard demo`
# prints them; measured 2026-12-04: target 39 s for 400 steps, data 4 s, 5-7 s per 200-step run (the
# DFlash2 one the slowest), 7 s for 320 eval prompts, reference 17 s, published 6 s, 96 s in all). The
# progress bar counts work with these, so each stage moves the bar as long as it takes and the ETA (the
# pace so far) holds from the first stage on; the earlier weights (target 48 s, published 0.5 s) made it
# about half the time really left.
COST_S = {"target step": 0.097, "data prompt": 0.03, "drafter step": 0.029, "eval prompt": 0.022, "published": 6.0}


def stage_work(plan: Plan, engines: Mapping[str, str] | None = None) -> list[float]:
    """Each stage's work in seconds on an idle machine (COST_S): the target, the data, the served evals
    where an engine is installed (demo.served), each training run, the evals of every checkpoint, the
    reference, the published numbers."""
    trained = runs(plan)
    checkpoints = sum(-(-cfg.steps // cfg.ckpt_every) for cfg in trained)  # every ckpt_every steps and the last
    return [plan.target_steps * COST_S["target step"], plan.train_prompts * COST_S["data prompt"],
            *([served.work_s(engines)] if engines else []),
            *(cfg.steps * COST_S["drafter step"] for cfg in trained),
            checkpoints * plan.eval_prompts * COST_S["eval prompt"],
            plan.reference_steps * COST_S["drafter step"] + plan.eval_prompts * COST_S["eval prompt"],
            COST_S["published"]]


Report = Callable[[str], None]


def build_demo(home: str | Path, *, store: str | None = None, quick: bool = False, force: bool = False,
               resume: bool = False, report: Report = print, engines: Mapping[str, str] | None = None) -> dict:
    """Build the demo store under `home` (cached: returns the manifest at once when present).

    The demo's files go to `<home>/draftboard-demo/`, its runs to `store` (default `<home>/draftboard.db`;
    the CLI passes the configured store, so that the dashboard and every command share one), shared
    with anything else there. `force` first removes what a previous build's manifest lists, and only
    that; a folder the demo did not create is never written to or removed. `resume` does the same for
    a build that did not finish (killed with the dashboard that started it), and keeps a finished
    one. A build finished into another store is built again into this one (the runs it left in the
    other store stay: the demo opens only the store it is given). Progress goes to
    `<home>/demo-progress.json` (tracker/jobs/demo_progress.py). `engines` (name: its Python) measure the
    demo's serving pair (demo.served); default: those the deployment installed (`served.installed`).
    """
    home = Path(home).resolve()
    store = store or f"sqlite:///{home / 'draftboard.db'}"
    if not store.startswith("sqlite:///"):
        raise DraftboardError(f"the demo builds into a local SQLite store, not {redact.shown_uri(store)}: "
                              "unset MLFLOW_TRACKING_URI or pass --tracking-uri sqlite:///demo.db")
    previous = read_manifest(home / DEMO_DIR)  # first: a folder that is not the demo's stops everything
    progress = ProgressWriter(home, store=store)
    try:
        return _build(home, store, previous, quick, force, resume, report, progress,
                      served.installed() if engines is None else engines)
    except BaseException as exc:  # Ctrl-C included: the page says the build stopped, and why
        progress.failed(str(exc) or type(exc).__name__)
        raise


def _build(home: Path, store: str, previous: dict | None, quick: bool, force: bool, resume: bool, report: Report,
           progress: ProgressWriter, engines: Mapping[str, str]) -> dict:
    root = home / DEMO_DIR
    built_into = previous.get("store", f"sqlite:///{home / 'draftboard.db'}") if previous is not None else None
    if previous is not None and previous["complete"] and built_into != store:
        report(f"the demo was built into {redact.shown_uri(built_into)}; building it into {redact.shown_uri(store)}")
        force = True
    if previous is not None and previous["complete"] and not force:
        report(f"demo store already built in {home} ({previous['seconds']:.0f} s, "
               f"{len(previous['train_runs'])} training runs); --force rebuilds it")
        progress.done(len(previous["runs"]))
        return previous
    if previous is not None and not (force or resume):
        raise DraftboardError(f"the demo build in {root} did not finish; `draftboard demo --force` "
                              "removes what it made and builds again")
    tracker = Tracker(store)
    tracker.find_experiment(create=True)  # creates the store's tables now, before the dashboard may open it
    progress.update(store_ready=True)
    if previous is not None:
        remove_demo(home, tracker, report)
    plan = QUICK if quick else FULL
    record = _Record(home, root, quick, on_run=lambda n: progress.update(runs=n))
    record.data["store"] = store
    t0 = time.perf_counter()
    progress.plan(stage_work(plan, engines))
    stage = _Stages(report, record.save, progress)

    stage("target: a tiny Qwen3.5 hybrid (3 Gated DeltaNet + 1 full-attention layer) on stdlib source")
    target_dir = demo_target.build_target(root / TARGET_NAME, steps=plan.target_steps,
                                          progress=_every(report, plan.target_steps // 4, "  target step", progress))

    stage(f"data: {plan.train_prompts} prompts and the target's own greedy completions")
    data = prepare_data(target_dir, demo_target.make_prompts(plan.train_prompts, seed=1, length=96,
                                                             split="drafter"), plan.max_new_tokens)
    prompts_file = root / "eval_prompts.jsonl"
    eval_prompts = demo_target.make_prompts(plan.eval_prompts, seed=2, length=96, split="eval")
    prompts_file.write_text("".join(json.dumps({"id": f"stdlib-{i}", "input_ids": p}) + "\n"
                                    for i, p in enumerate(eval_prompts)))

    settings = EvalSettings(target=str(target_dir), drafter="", prompts=str(prompts_file),
                            max_new_tokens=plan.max_new_tokens, device="cpu",
                            dtype="fp32", cache_dir=str(home / "cache"))
    tagged = _Tagged(tracker, record)
    # Before the team's drafters: Launch and Compare start on the newest runs, the demo target's.
    if engines:
        stage(f"served: a Qwen3 pair an engine serves here, offline and by {', '.join(engines)} (1 to "
              f"{max(max(served.LEVELS[e]) for e in engines)} requests in flight)")
        record.data["served"] = served.served_evals(root / "served", tagged, settings, engines, record.run, report,
                                                    progress.within_stage)
    else:
        report("served: no engine installed (DRAFTBOARD_LLAMACPP_PYTHON and DRAFTBOARD_LLAMACPP_CONVERTER, or "
               "DRAFTBOARD_VLLM_PYTHON); ./scripts/run.sh installs llama.cpp's")
    train_runs = {}
    for cfg in runs(plan):
        stage(f"train: {cfg.name}, {cfg.steps} steps")
        train_runs[cfg.name] = train(cfg, target_dir, data, tagged, root / "runs" / _slug(cfg.name),
                                     progress=_every(report, cfg.steps // 2, "  step", progress))

    stage(f"evals of every checkpoint ({plan.eval_prompts} held-out prompts x {plan.max_new_tokens} tokens, fp32)")
    todo = [(name, run_id, ckpt) for name, run_id in train_runs.items() for ckpt in tracker.checkpoints(run_id)]
    for n, (name, run_id, ckpt) in enumerate(todo):
        s = replace(settings, drafter=ckpt.path)
        results = evaluate(s)
        record.run(log_eval(tracker, results, s, train_run_id=run_id, checkpoint_step=ckpt.step,
                            name=names.eval_run_name(name, ckpt.step, asdict(s), eval_job.setting_words(asdict(s))),
                            tags={names.DEMO: "1"}))
        tree = results["ddtree"].get("8")  # none for DFlash2: its selector, not a tree, picks the path
        report(f"  {name} @ step {ckpt.step}: tau {results['tau']:.2f}"
               + (f", ddtree_tau_b8 {tree['tau']:.2f}" if tree else ""))
        progress.within_stage((n + 1) / len(todo))

    ref_cfg = reference_run(plan)
    stage(f"reference: the v2 recipe trained {ref_cfg.steps} steps, evaluated as {REFERENCE_NAME!r}")
    ref_train = train(ref_cfg, target_dir, data, tagged, root / "runs" / "reference",
                      progress=_every(report, ref_cfg.steps // 2, "  step", progress,
                                     share=ref_cfg.steps * COST_S["drafter step"] / progress.work[-2]))
    ref_ckpt = tracker.checkpoints(ref_train)[-1]
    s = replace(settings, drafter=ref_ckpt.path)
    results = evaluate(s)
    reference = record.run(log_eval(tracker, results, s, train_run_id=ref_train, checkpoint_step=ref_ckpt.step,
                                    reference=REFERENCE_NAME, name=REFERENCE_NAME, tags={names.DEMO: "1"}))
    report(f"  {REFERENCE_NAME}: tau {results['tau']:.2f}")

    stage("published: z-lab's DFlash numbers (other targets, other environments)")
    published = [record.run(run_id) for run_id in import_published(tracker, tags={names.DEMO: "1"})]

    record.data.update({"plan": asdict(plan), "target": str(target_dir), "prompts": str(prompts_file),
                        "train_runs": train_runs, "reference_train_run": ref_train, "reference": reference,
                        "published": published, "seconds": time.perf_counter() - t0, "complete": True})
    record.save()
    progress.done(len(record.data["runs"]))
    report(f"demo store ready in {record.data['seconds']:.0f} s: {tracker.uri}")
    return record.data


def read_manifest(root: Path) -> dict | None:
    """The manifest of the demo build in `root`; None when there is no `root` yet.

    DraftboardError when `root` exists without a readable manifest: then the demo did not make it,
    and it will neither write into it nor remove it.
    """
    if not root.exists() and not root.is_symlink():
        return None
    try:
        if root.is_symlink():  # the demo makes a folder, never a link to somebody else's
            raise ValueError("the folder is a symbolic link")
        data = json.loads((root / MANIFEST).read_bytes())
        if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA or not all(
                isinstance(data.get(key), list) and all(isinstance(v, str) for v in data[key])
                for key in ("files", "runs")):
            raise ValueError(f"not a {MANIFEST_SCHEMA} manifest")
    except (OSError, ValueError) as exc:
        raise DraftboardError(f"{root} exists but was not made by `draftboard demo` ({MANIFEST}: {exc}); "
                              "move it away or use another --home") from exc
    return data


def remove_demo(home: str | Path, tracker: Tracker, report: Report = print) -> None:
    """Delete what the manifest in `<home>/draftboard-demo` lists: its files and its runs, nothing else.

    A run is deleted only when it is listed *and* tagged `draftboard.demo=1`: a manifest is a file
    anyone who can write the home can forge, and must not delete the team's runs. Folders are removed only once empty, so a file someone put inside the demo's folder stays,
    and the store, the eval cache and any other file of `home` are never touched.
    """
    root = Path(home).resolve() / DEMO_DIR
    manifest = read_manifest(root)
    if manifest is None:
        return
    for run_id in manifest["runs"]:
        try:
            if tracker.client.get_run(run_id).data.tags.get(names.DEMO) != "1":
                report(f"kept run {run_id}: listed in the manifest but not tagged {names.DEMO}=1, so not the demo's")
                continue
            tracker.client.delete_run(run_id)
        except MlflowException as exc:  # already deleted by hand: nothing left to remove
            report(f"run {run_id}: {exc.message}")
    real_root = root.resolve()
    for rel in manifest["files"]:
        path = root / rel
        if real_root not in path.resolve().parents:  # a `..` or a symlink out of the folder
            report(f"skipped {rel}: outside {root}")
            continue
        path.unlink(missing_ok=True)
    (root / _MANIFEST_TMP).unlink(missing_ok=True)
    (root / MANIFEST).unlink()
    for folder in sorted((p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    if left:
        raise DraftboardError(f"removed the demo, but {root} still holds files it did not create "
                              f"({', '.join(left[:5])}{', ...' if len(left) > 5 else ''}); move them away")
    root.rmdir()


class _Record:
    """The manifest of the build in progress: saved after every stage, so even a crashed build
    can be removed exactly. It lists every file under the demo folder and every run it created."""

    def __init__(self, home: Path, root: Path, quick: bool, on_run: Callable[[int], None]):
        self.root, self.on_run = root, on_run
        root.mkdir(parents=True)  # read_manifest made sure it did not exist
        self.data = {"schema": MANIFEST_SCHEMA, "home": str(home), "quick": quick, "complete": False,
                     "files": [], "runs": []}
        self.save()

    def run(self, run_id: str) -> str:
        self.data["runs"].append(run_id)
        self.save()
        self.on_run(len(self.data["runs"]))
        return run_id

    def save(self) -> None:
        tmp = self.root / _MANIFEST_TMP
        own = {self.root / MANIFEST, tmp}
        self.data["files"] = sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*")
                                    if p.is_file() and p not in own)
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.root / MANIFEST)  # never a half-written manifest


class _Tagged:
    """The tracker, with every training run tagged as demo data and recorded in the manifest."""

    def __init__(self, tracker: Tracker, record: _Record):
        self._tracker, self._record = tracker, record

    def __getattr__(self, name):  # everything else is the tracker's own (log_eval's eval runs are tagged there)
        return getattr(self._tracker, name)

    def training_run(self, name, params, target, *, tags=None, fingerprint=None):
        run = self._tracker.training_run(name, params, target, tags={**(tags or {}), names.DEMO: "1"},
                                         fingerprint=fingerprint)
        self._record.run(run.run_id)
        return run


class _Stages:
    def __init__(self, report: Report, checkpoint: Callable[[], None], progress: ProgressWriter):
        self.report, self.n, self.t = report, 0, time.perf_counter()
        self.checkpoint, self.progress = checkpoint, progress

    def __call__(self, text: str) -> None:
        self.checkpoint()  # the files of the stage before are in the manifest before the next starts
        self.n += 1
        self.progress.stage(self.n, text)
        self.report(f"[{self.n}/{len(self.progress.work)}] {text}  (+{time.perf_counter() - self.t:.0f} s)")


def _every(report: Report, k: int, label: str, stage_progress: ProgressWriter, share: float = 1.0):
    """A training loop's progress callback: a line every k steps, and the bar after every step
    (`share`: of the stage the loop is; the rest is an eval after it)."""
    def progress(step, steps, loss):
        if step % max(k, 1) == 0 or step == steps:
            report(f"{label} {step}/{steps}: loss {loss:.3f}")
        stage_progress.within_stage(share * step / steps)

    return progress


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")
