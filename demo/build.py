"""`draftboard demo`: a store full of honest data, built on the spot on a CPU.

Stages: a tiny Qwen3.5 target trained on stdlib source; self-distilled training data; three
drafter training runs that differ as a real team's do (tapped layers, loss weighting, and one
trained in bf16 while every eval runs fp32, so the environment view has a true mismatch); an
eval of every checkpoint through the real harness; a longer-trained drafter evaluated as the
`reference (demo)`; and z-lab's published numbers as published reference runs. Nothing is
invented: every number comes from the trainer and the harness, or from a cited publication.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from demo import target as demo_target
from demo.train_dflash import TrainConfig, prepare_data, train
from evaluators.harness import EvalSettings, evaluate, log_eval
from tracker.store.importers.published import import_published
from tracker.store.tracker import Tracker

DEMO_TAG = "draftboard.demo"
MANIFEST = "manifest.json"
REFERENCE_NAME = "reference (demo)"
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
    """Three runs a team might compare, and the reference recipe trained longer."""
    base = TrainConfig(steps=plan.run_steps, ckpt_every=plan.ckpt_every, block_size=8)
    return [
        replace(base, name="drafter-v1 (1 tapped layer)", n_tapped=1),
        replace(base, name="drafter-v2 (2 tapped layers)", target_layer_ids=[1, 2]),
        # Same recipe but uniform loss weights, trained in bf16: every eval below runs fp32.
        replace(base, name="drafter-v3 (uniform loss, bf16)", target_layer_ids=[1, 2], gamma=None, dtype="bf16"),
    ]


def reference_run(plan: Plan) -> TrainConfig:
    return TrainConfig(name="reference drafter (demo)", target_layer_ids=[1, 2], steps=plan.reference_steps,
                       ckpt_every=plan.reference_steps, block_size=8)


Report = Callable[[str], None]


def build_demo(home: str | Path, *, quick: bool = False, force: bool = False, report: Report = print) -> dict:
    """Build the demo store under `home` (cached: returns the manifest at once when present)."""
    home = Path(home).resolve()
    root = home / "demo"
    manifest_path = root / MANIFEST
    tracker = Tracker(f"sqlite:///{home / 'draftboard.db'}")
    if manifest_path.is_file() and not force:
        manifest = json.loads(manifest_path.read_text())
        report(f"demo store already built in {home} ({manifest['seconds']:.0f} s, "
               f"{len(manifest['train_runs'])} training runs); --force rebuilds it")
        return manifest
    if force:
        _remove_demo(tracker, root)
    plan = QUICK if quick else FULL
    t0 = time.perf_counter()
    stage = _Stages(report, len(runs(plan)) + 5)

    stage("target: a tiny Qwen3.5 hybrid (3 Gated DeltaNet + 1 full-attention layer) on stdlib source")
    target_dir = demo_target.build_target(root / TARGET_NAME, steps=plan.target_steps,
                                          progress=_every(report, plan.target_steps // 4, "  target step"))

    stage(f"data: {plan.train_prompts} prompts and the target's own greedy completions")
    data = prepare_data(target_dir, demo_target.make_prompts(plan.train_prompts, seed=1, length=96,
                                                             split="drafter"), plan.max_new_tokens)
    prompts_file = root / "eval_prompts.jsonl"
    eval_prompts = demo_target.make_prompts(plan.eval_prompts, seed=2, length=96, split="eval")
    prompts_file.write_text("".join(json.dumps({"id": f"stdlib-{i}", "input_ids": p}) + "\n"
                                    for i, p in enumerate(eval_prompts)))

    train_runs = {}
    for cfg in runs(plan):
        stage(f"train: {cfg.name}, {cfg.steps} steps")
        train_runs[cfg.name] = train(cfg, target_dir, data, _Tagged(tracker), root / "runs" / _slug(cfg.name),
                                     progress=_every(report, cfg.steps // 2, "  step"))

    stage(f"evals of every checkpoint ({plan.eval_prompts} held-out prompts x {plan.max_new_tokens} tokens, fp32)")
    settings = EvalSettings(target=str(target_dir), drafter="", prompts=str(prompts_file),
                            max_new_tokens=plan.max_new_tokens, budgets=(4, 8, 16, 32), device="cpu",
                            dtype="fp32", cache_dir=str(home / "cache"))
    for name, run_id in train_runs.items():
        for ckpt in tracker.checkpoints(run_id):
            s = replace(settings, drafter=ckpt.path)
            results = evaluate(s)
            log_eval(tracker, results, s, train_run_id=run_id, checkpoint_step=ckpt.step,
                     name=f"eval {name} @ step {ckpt.step}", tags={DEMO_TAG: "1"})
            report(f"  {name} @ step {ckpt.step}: tau {results['tau']:.2f}, "
                   f"ddtree_tau_b8 {results['ddtree']['8']['tau']:.2f}")

    ref_cfg = reference_run(plan)
    stage(f"reference: the v2 recipe trained {ref_cfg.steps} steps, evaluated as {REFERENCE_NAME!r}")
    ref_train = train(ref_cfg, target_dir, data, _Tagged(tracker), root / "runs" / "reference")
    ref_ckpt = tracker.checkpoints(ref_train)[-1]
    s = replace(settings, drafter=ref_ckpt.path)
    results = evaluate(s)
    reference = log_eval(tracker, results, s, train_run_id=ref_train, checkpoint_step=ref_ckpt.step,
                         reference=REFERENCE_NAME, name=REFERENCE_NAME, tags={DEMO_TAG: "1"})
    report(f"  {REFERENCE_NAME}: tau {results['tau']:.2f}")

    stage("published: z-lab's DFlash numbers (other targets, other environments)")
    published = import_published(tracker, tags={DEMO_TAG: "1"})

    manifest = {"home": str(home), "quick": quick, "plan": asdict(plan), "target": str(target_dir),
                "prompts": str(prompts_file), "train_runs": train_runs, "reference_train_run": ref_train,
                "reference": reference, "published": published, "seconds": time.perf_counter() - t0}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    report(f"demo store ready in {manifest['seconds']:.0f} s: {tracker.uri}")
    return manifest


class _Tagged:
    """The tracker, with every training run tagged as demo data (so --force can remove it)."""

    def __init__(self, tracker: Tracker):
        self._tracker = tracker

    def training_run(self, name, params, target, *, tags=None, fingerprint=None):
        return self._tracker.training_run(name, params, target, tags={**(tags or {}), DEMO_TAG: "1"},
                                          fingerprint=fingerprint)


def _remove_demo(tracker: Tracker, root: Path) -> None:
    """Delete the demo's runs (only those: a shared store keeps everything else) and files."""
    for run in tracker.find_runs(filter=f"tags.`{DEMO_TAG}` = '1'"):
        tracker.client.delete_run(run.info.run_id)
    shutil.rmtree(root, ignore_errors=True)


class _Stages:
    def __init__(self, report: Report, total: int):
        self.report, self.total, self.n, self.t = report, total, 0, time.perf_counter()

    def __call__(self, text: str) -> None:
        self.n += 1
        self.report(f"[{self.n}/{self.total}] {text}  (+{time.perf_counter() - self.t:.0f} s)")


def _every(report: Report, k: int, label: str):
    def progress(step, steps, loss):
        if step % max(k, 1) == 0 or step == steps:
            report(f"{label} {step}/{steps}: loss {loss:.3f}")

    return progress


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")
