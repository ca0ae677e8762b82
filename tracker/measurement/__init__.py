"""How numbers are measured and related: what makes two numbers comparable besides the environment.

- `protocol`: how an eval was measured (prompts, sampling, block size, scoring, ...) and how two differ;
- `uncertainty`: bootstrap intervals and the paired comparison of two evals;
- `engine_metrics`: the serving engines' metric names and their definitions (mean acceptance length,
  per-position acceptance);
- `reconcile`: a served number against the offline tau of the same prompts, the gap in parts;
- `regression`: whether an eval is worse than its run's previous checkpoint or a reference.
"""
