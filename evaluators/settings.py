"""What an eval is asked: `EvalSettings`, checked when made, so a bad flag fails before anything is read.

The harness (evaluators.harness), the engines' evals (evaluators.engines.run), pooling (evaluators.pooling) and the
shard processes (evaluators.shards) all take it.
"""

from __future__ import annotations

from dataclasses import dataclass

from evaluators.sampling import Sampling
from tracker.config import (
    DEFAULT_BUDGETS,
    EVAL_SCORINGS,
    LAST_BLOCK_RULES,
    MAX_BUDGET,
    MAX_CONTEXT_EDGE,
    sampling_problem,
)
from tracker.errors import DraftboardError
from tracker.measurement import context


@dataclass
class EvalSettings:
    target: str
    drafter: str
    prompts: str
    completions: str | None = None
    max_new_tokens: int = 256
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    device: str | None = None
    dtype: str = "fp32"
    drafter_precision: str | None = None  # config.DRAFTER_PRECISIONS; None: the drafter cast to `dtype`
    linear_attn: str = "auto"
    enable_thinking: bool | None = None
    cache_dir: str | None = None
    batch_size: int | None = None  # prompts per target batch; None: from free device memory (evaluators.sizing)
    anchor_chunk: int | None = None  # anchors per drafter call; None: from free device memory
    last_block: str = LAST_BLOCK_RULES[0]
    scoring: str = EVAL_SCORINGS[0]
    limit_per_dataset: int | None = None
    prompt_tokens: int | None = None  # a long-context set's prompts made this many text tokens long
    temperature: float = 0.0  # z-lab's sampling parameters; T = 0 is greedy
    top_p: float = 1.0
    top_k: int = 0
    samples: int = 1  # T > 0: continuations drawn per prompt (the offline expectation's draws)
    seeds: int = 1  # T > 0, --scoring online: runs of the sampled loop per prompt
    seed: int = 0
    context_buckets: tuple[int, ...] = ()  # tau_by_context's edges; (): octaves of the prompts' contexts
    gpus: int | None = None  # on cuda, > 1: the target spread over this many GPUs (evaluators.sizing's plan)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise DraftboardError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if not self.budgets or any(b < 1 for b in self.budgets):
            raise DraftboardError(f"--budgets must be positive integers, got {list(self.budgets)}")
        if max(self.budgets) > MAX_BUDGET:
            raise DraftboardError(f"--budgets: {max(self.budgets)} is above the limit of {MAX_BUDGET} nodes per "
                                  "block (a DDTree search costs O(B log B) per block)")
        self.budgets = tuple(sorted(set(self.budgets)))
        if self.last_block not in LAST_BLOCK_RULES:
            raise DraftboardError(f"--last-block must be one of {', '.join(LAST_BLOCK_RULES)}, got {self.last_block!r}")
        if self.scoring not in EVAL_SCORINGS:
            raise DraftboardError(f"--scoring must be one of {', '.join(EVAL_SCORINGS)}, got {self.scoring!r}")
        if self.prompt_tokens is not None and not 1 <= self.prompt_tokens <= MAX_CONTEXT_EDGE:
            raise DraftboardError(f"--prompt-tokens must be from 1 to {MAX_CONTEXT_EDGE}, got {self.prompt_tokens}")
        for name in ("batch_size", "anchor_chunk"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise DraftboardError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.scoring == "online" and self.completions:
            raise DraftboardError("--scoring online generates its own completions; drop --completions")
        problem = sampling_problem(self.temperature, self.top_p, self.top_k, self.samples, self.seeds)
        if problem:
            raise DraftboardError(problem)
        if self.seed < 0:
            raise DraftboardError(f"--seed must be >= 0, got {self.seed}")
        if not self.sampling.greedy and self.completions:
            raise DraftboardError("a sampled eval (--temperature > 0) draws its own continuations; drop --completions")
        try:
            self.context_buckets = context.check_edges(self.context_buckets) if self.context_buckets else ()
        except ValueError as exc:
            raise DraftboardError(f"--context-buckets: {exc}") from None
        if self.seeds > 1 and self.scoring != "online":
            raise DraftboardError("--seeds counts runs of the online loop (--scoring online); offline, --samples "
                                  "sets the continuations drawn per prompt")

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k)
