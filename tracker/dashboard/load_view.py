"""A load sweep as the dashboard shows it (`draftboard eval --engine vllm --concurrency 1,4,8`,
evaluators/engines/load.py): Run detail's `load` section as one row per level, each column named with its
definition, and its flags as sentences (prompt ids are user text: the page escapes them); Compare's curves
of served acceptance, speedup and step cost against concurrency, one line per eval, from the logged
`load_c{C}_{field}` metrics (no results file is read)."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from tracker.dashboard.compare import eval_series
from tracker.dashboard.compare_deltas import scoring_note
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.store import names

# Column -> what it is (the page's column help; the definitions are the results' own, DESIGN.md "Load sweeps").
COLUMNS = {
    "requests in flight": "concurrency: the same prompts with this many requests in flight on one server",
    "mean acceptance length": "1 + accepted draft tokens / verify steps, pooled over the level's requests, from "
                              "each request's own counts",
    "tok/s, drafter": "the median over the level's rounds of completion tokens / the round's wall time (first "
                      "request sent to last reply)",
    "tok/s, target alone": "the same for the same prompts at the same level on the same server settings without "
                           "the drafter, its rounds interleaved with the drafter's",
    "speedup": "tok/s with the drafter / tok/s of the target alone (the ratio of the two medians), both measured "
               "in this eval",
    "speedup 95% interval": "percentile bootstrap over the level's rounds (a round's two arms drawn together): as "
                            "wide as the rounds moved",
    "rounds": "timed rounds per arm, and how many ran while other programs took at least half a core (busy: "
              "their numbers are in the median and the interval, and said here)",
    "step cost": "mean acceptance length / speedup: a speculative step's time over a plain decode step's, as the "
                 "two arms' wall clocks imply; speedup = acceptance length / step cost, so a lost speedup shows "
                 "here as lost acceptance or a dearer step",
    "counts checked": "the engine's counters moved by exactly the sum of the requests' own counts",
    "server deaths": "times a managed server died at this level (llama.cpp's get_sub_batch abort with parallel "
                     "slots): started again and the level measured from its warm-up, never hidden by a lower level",
    "prefix cache hits": "prompt tokens the engine found in its prefix cache / prompt tokens it looked up over the "
                         "level, from its own counters, with the drafter / the target alone (– where it counts none)",
    "flags": "requests whose completion or counts moved against concurrency 1 or the target alone, or whose "
             "acceptance collapsed",
    "load average": "the box's highest 1-minute load average over the level's rounds (drafter / target alone); "
                    "the engine's own threads count in it",
}

NUMBERS = ("requests in flight", "mean acceptance length", "tok/s, drafter", "tok/s, target alone", "speedup",
           "step cost")  # the columns drawn as numbers


def levels_frame(results: dict | None) -> pd.DataFrame | None:
    """One row per level, or None when the eval ran no load sweep."""
    levels = (results or {}).get("load")
    if not isinstance(levels, list) or not levels:
        return None

    def interval(ci) -> str:
        if not (isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci)):
            return "–"
        return f"{ci[0]:.2f}–{ci[1]:.2f}"

    def rounds(level: dict) -> str:
        done = level.get("rounds")
        if not isinstance(done, list):
            return "1"  # a sweep from before rounds: one pass per arm
        busy = level.get("busy_rounds")
        return f"{len(done)}" + (f" ({busy} busy)" if isinstance(busy, int) and busy else "")

    def load_average(level: dict) -> str:
        pair = (level.get("load_average_1m"), level.get("load_average_1m_target_alone"))
        return " / ".join("–" if v is None else f"{v:.1f}" for v in pair)

    return pd.DataFrame([{
        "requests in flight": level.get("concurrency"),
        "mean acceptance length": level.get("engine_mean_acceptance_length"),
        "tok/s, drafter": level.get("tokens_per_s"),
        "tok/s, target alone": level.get("tokens_per_s_target_alone"),
        "speedup": level.get("speedup"),
        "speedup 95% interval": interval(level.get("speedup_ci")),
        "rounds": rounds(level),
        "step cost": level.get("step_cost"),
        "counts checked": "yes" if level.get("counters_checked") else "no (attached server)",
        "server deaths": len(level.get("aborts") or ()) if isinstance(level.get("aborts") or [], list) else 0,
        "prefix cache hits": " / ".join(f"{v:.0%}" if isinstance(v, (int, float)) else "–" for v in (
            level.get("prefix_cache_hit_rate"), level.get("prefix_cache_hit_rate_target_alone"))),
        "flags": len(level.get("flags") or ()),
        "load average": load_average(level),
    } for level in levels if isinstance(level, dict)], columns=list(COLUMNS))


def break_even_line(results: dict | None) -> str | None:
    """Where the drafter stops paying, if inside the measured levels."""
    crossing = (results or {}).get("load_break_even_concurrency")
    if not isinstance(crossing, (int, float)) or isinstance(crossing, bool):
        return None
    return (f"Break-even: speedup crosses 1 at about {crossing:.1f} requests in flight (linear between the two "
            "measured levels around it); above it, serving this checkpoint's drafter costs more than it buys.")


def flag_lines(results: dict | None) -> list[str]:
    """Each flag as a sentence: the level, the prompt, what moved."""
    lines = []
    for level in (results or {}).get("load") or ():
        for flag in level.get("flags") or () if isinstance(level, dict) else ():
            if not isinstance(flag, dict):
                continue
            collapsed = flag.get("flag") == "acceptance collapse"
            detail = (f" from token {flag['first_difference']}" if "first_difference" in flag else
                      f" over {flag['steps']} steps" if collapsed and flag.get("steps") is not None else
                      f" over {flag.get('draft_tokens')} drafted tokens" if collapsed else "")
            lines.append(f"concurrency {level.get('concurrency')}: prompt {flag.get('id')}: {flag.get('flag')}{detail}")
    return lines


def load_curves(index: RunIndex, chosen: list[RunInfo]) -> pd.DataFrame:
    """One row per (eval, level) of every load sweep among the chosen runs' evals (a training run's: each
    checkpoint's): the eval's label (its engine named) as the series, its run as the owner of its colour. One
    line per eval: two sweeps that would read alike (the same checkpoint measured twice) are told apart by their
    run ids, never joined into one line."""
    found, seen = [], set()
    for run in chosen:
        for label, evals in eval_series(index, run):
            for ev in evals:
                levels = names.load_levels(ev.metrics)
                if not levels or ev.run_id in seen:
                    continue
                seen.add(ev.run_id)
                found.append((index.eval_label(ev) + scoring_note(ev) if run.kind == "train" else label, run, ev,
                              levels))
    alike = Counter(series for series, *_ in found)
    rows = [{"series": series + (f" · run {ev.run_id[:8]}" if alike[series] > 1 else ""), "owner": run.run_id,
             "concurrency": c, **values}
            for series, run, ev, levels in found for c, values in levels.items()]
    return pd.DataFrame(rows, columns=["series", "owner", "concurrency", *names.LOAD_FIELDS, *names.LOAD_CI_FIELDS])
