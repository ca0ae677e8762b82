"""`draftboard doctor`: the checks that catch the bugs which cost DFlash teams days, in one run.

Cheap checks first (the checkpoint's tensors and config, the tokens, a serving config), then what
needs the target loaded (this machine's fingerprint against the training run's, and the layer
mapping, which scores the drafter on a few greedy continuations twice). Bad input (an unreadable
serving config, a target folder that is not one) is one `error:` line before anything loads; a
drafter that does not load is a finding (the `architecture` check), and the checks that need it
say they were skipped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evaluators.datasets import load_benchmark
from evaluators.doctor import checkpoint, environment, layers, serving, tokens
from evaluators.doctor.report import INFO, Check, Report
from evaluators.drafter import TargetDims, open_drafter, parse_precision
from evaluators.target import load_target, load_tokenizer, text_config
from tracker.environment import fingerprint
from tracker.errors import DraftboardError

# What the layer check drafts on when no --prompts are given: plain text through the target's
# tokenizer, or random token ids for a target without one.
DEFAULT_TEXTS = (
    "The capital of France is", "def fibonacci(n):\n    ", "Photosynthesis converts light into",
    "In 1905, Albert Einstein published", "To sort a list in Python, you can", "The three laws of motion are",
    "A prime number is a natural number that", "Once upon a time, in a small village,",
)


@dataclass
class DoctorSettings:
    target: str
    drafter: str
    prompts: str | None = None  # as `draftboard eval --prompts`; None: DEFAULT_TEXTS
    prompts_from: str | None = None  # where `prompts` came from, in words (the CLI found them in the store)
    n_prompts: int = 8
    max_new_tokens: int = 64
    device: str | None = None
    dtype: str = "fp32"
    drafter_precision: str | None = None  # config.DRAFTER_PRECISIONS, as `eval --drafter-precision`; None: dtype
    linear_attn: str = "auto"
    enable_thinking: bool | None = None
    serving_config: str | None = None
    trained_fingerprint: dict | None = None  # the training run's (`--run`)
    trained_name: str = "the training run"

    def __post_init__(self):
        for name in ("n_prompts", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise DraftboardError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


def _prompts(s: DoctorSettings, tokenizer, vocab_size: int) -> list[list[int]]:
    if s.prompts:
        return [p.input_ids for p in load_benchmark(s.prompts, tokenizer, vocab_size, s.enable_thinking, None)][
            : s.n_prompts]
    if tokenizer is not None:
        return [tokenizer(text)["input_ids"] for text in DEFAULT_TEXTS[: s.n_prompts]]
    rng = random.Random(0)
    return [[rng.randrange(vocab_size) for _ in range(16)] for _ in range(s.n_prompts)]


def _prompts_from(s: DoctorSettings) -> str:
    if s.prompts_from:
        return s.prompts_from
    return f"--prompts {s.prompts}" if s.prompts else "the doctor's default prompts, not the drafter's domain"


def _skipped(name: str, why: str) -> Check:
    return Check(name, INFO, f"not checked: {why}", "")


def run_doctor(s: DoctorSettings, progress=lambda stage, done, total: None) -> Report:
    served = serving.read_serving_config(s.serving_config) if s.serving_config else None
    cfg = text_config(s.target)
    tokenizer = load_tokenizer(s.target)
    prompts = _prompts(s, tokenizer, cfg.vocab_size)
    device = s.device or fingerprint.default_device()
    progress("doctor: loading the target", 0, 3)
    target = load_target(s.target, device, s.dtype, s.linear_attn)
    precision = parse_precision(s.drafter_precision or s.dtype)
    checks = [checkpoint.architecture(s.drafter, target, target.num_layers),
              tokens.stop_tokens(tokenizer, target.stop_token_ids()),
              tokens.thinking(tokenizer, s.enable_thinking, served.enable_thinking if served else None)]
    try:
        loaded = open_drafter(s.drafter, TargetDims(cfg.hidden_size, target.num_layers, cfg.vocab_size)).load(
            device, precision.weights)
    except DraftboardError as exc:
        loaded, why = None, f"the drafter does not load ({exc})"
    layer_ids = list(loaded.model.target_layer_ids) if loaded else []
    if loaded is None:
        checks += [_skipped(name, why) for name in (layers.NAME, checkpoint.TAPPED_LAYERS, tokens.MASK_TOKEN)]
    else:
        checks += [checkpoint.tapped_layers(layer_ids, getattr(cfg, "layer_types", None)),
                   tokens.mask_token(tokenizer, loaded.model.mask_token_id)]
        if served is not None:
            checks += [serving.speculation_length(served, loaded.config), serving.method(served, loaded.config)]
            if served.engine == "llamacpp":
                checks.append(serving.gguf_target_layers(served, layer_ids))
    if served is not None:
        hybrid = "linear_attention" in (getattr(cfg, "layer_types", None) or [])
        checks += [serving.simulated_acceptance(served), serving.ssm_dtype(served),
                   serving.engine_version(served, hybrid),
                   serving.model_runner(served, loaded.config.family if loaded else None),
                   serving.prefix_cache(served, hybrid)]
        if served.engine == "llamacpp":
            checks += [serving.draft_kv_cache(served), serving.llamacpp_build(served, loaded.config if loaded else None)]
    progress("doctor: fingerprint", 1, 3)
    here = fingerprint.capture(target.model, device, s.dtype, probe_layers=layer_ids or None,
                               drafter_precision=precision.name)
    checks.append(environment.check(here, s.trained_fingerprint, s.trained_name))
    if loaded is not None:
        progress("doctor: layer mapping", 2, 3)
        checks.append(layers.check(target, loaded, prompts, s.max_new_tokens, prompts_from=_prompts_from(s),
                                   precision=precision))
    progress("doctor", 3, 3)
    return Report(checks)
