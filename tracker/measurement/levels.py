"""A load sweep's level read as an engine eval of its own (results `load`, docs/DESIGN.md "Load sweeps"):
the same results with that level's requests as `prompts` (each step's acceptance length from its ordered
per-step counts) and that level's pooled number, so what reads an engine eval (reconcile, the AIPerf
export) reads one level the same way. Results come from the store: untrusted, checked as they are read."""

from __future__ import annotations

from tracker.errors import DraftboardError


def level_results(results: dict, concurrency: int) -> dict:
    """`results` as measured at `concurrency` requests in flight; DraftboardError when the eval did not
    measure that level, or its replies there listed no per-step counts (llama.cpp's do not)."""
    load = results.get("load") if isinstance(results, dict) else None
    levels = {level.get("concurrency"): level for level in load or () if isinstance(level, dict)}
    if concurrency not in levels:
        measured = sorted(c for c in levels if isinstance(c, int))
        raise DraftboardError(f"--concurrency {concurrency}: the eval measured "
                              + (f"levels {', '.join(map(str, measured))}" if measured else "no load sweep"))
    level = levels[concurrency]
    rows = level.get("prompts")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("engine_accepted_per_step"), list)
                                             for r in rows):
        raise DraftboardError(f"--concurrency {concurrency}: the engine's replies at that level listed no per-step "
                              "counts (vLLM's detailed per-request metrics do; llama.cpp's replies do not)")
    prompts = [{**r, "acceptance_lengths": [a + 1 if isinstance(a, int) else a for a in r["engine_accepted_per_step"]],
                "engine_steps_ordered": True} for r in rows]
    return {**results, "prompts": prompts, "load": None,
            "engine_mean_acceptance_length": level.get("engine_mean_acceptance_length")}
