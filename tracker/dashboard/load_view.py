"""Run detail's load sweep: a served eval's `load` section (`draftboard eval --engine vllm --concurrency
1,4,8`, evaluators/engines/load.py) as one row per level, each column named with its definition, and its
flags as sentences (prompt ids are user text: the page escapes them)."""

from __future__ import annotations

import pandas as pd

# Column -> what it is (the page's column help; the definitions are the results' own, DESIGN.md "Load sweeps").
COLUMNS = {
    "requests in flight": "concurrency: the same prompts with this many requests in flight on one server",
    "mean acceptance length": "1 + accepted draft tokens / verify steps, pooled over the level's requests, from "
                              "each request's own counts",
    "tok/s, drafter": "completion tokens / the level's wall time (first request sent to last reply)",
    "tok/s, target alone": "the same prompts at the same level on the same server settings without the drafter",
    "speedup": "tok/s with the drafter / tok/s of the target alone, both measured in this eval",
    "counts checked": "the engine's counters moved by exactly the sum of the requests' own counts",
    "flags": "requests whose completion or counts moved against concurrency 1 or the target alone, or whose "
             "acceptance collapsed",
    "load average": "the box's 1-minute load average when each arm started (drafter / target alone): a busy box "
                    "moves both numbers",
}


def levels_frame(results: dict | None) -> pd.DataFrame | None:
    """One row per level, or None when the eval ran no load sweep."""
    levels = (results or {}).get("load")
    if not isinstance(levels, list) or not levels:
        return None

    def load_average(level: dict) -> str:
        pair = (level.get("load_average_1m"), level.get("load_average_1m_target_alone"))
        return " / ".join("–" if v is None else f"{v:.1f}" for v in pair)

    return pd.DataFrame([{
        "requests in flight": level.get("concurrency"),
        "mean acceptance length": level.get("engine_mean_acceptance_length"),
        "tok/s, drafter": level.get("tokens_per_s"),
        "tok/s, target alone": level.get("tokens_per_s_target_alone"),
        "speedup": level.get("speedup"),
        "counts checked": "yes" if level.get("counters_checked") else "no (attached server)",
        "flags": len(level.get("flags") or ()),
        "load average": load_average(level),
    } for level in levels if isinstance(level, dict)], columns=list(COLUMNS))


def flag_lines(results: dict | None) -> list[str]:
    """Each flag as a sentence: the level, the prompt, what moved."""
    lines = []
    for level in (results or {}).get("load") or ():
        for flag in level.get("flags") or () if isinstance(level, dict) else ():
            if not isinstance(flag, dict):
                continue
            detail = (f" from token {flag['first_difference']}" if "first_difference" in flag else
                      f" over {flag['steps']} steps" if flag.get("flag") == "acceptance collapse" else "")
            lines.append(f"concurrency {level.get('concurrency')}: prompt {flag.get('id')}: {flag.get('flag')}{detail}")
    return lines
