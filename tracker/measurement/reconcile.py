"""`draftboard reconcile ENGINE OFFLINE`: the gap between an engine's number and an offline one, in parts.

Both evals walk the same prompts in blocks: the engine's steps (accepted draft tokens + 1) and the
offline walk (acceptance lengths). The gap between the engine's own number (1 + accepted / drafts,
pooled over steps) and the offline tau (a per-prompt mean) is taken apart by turning the offline
walks into the engine's one cause at a time:

1. `pooling` (definition): the offline walks pooled over blocks instead of averaged per prompt;
2. `end_of_generation` (definition): the offline walks counted as the engine counts them, from the
   offline eval's own blocks, by the engine's rule (its protocol's `last_block`): `full` (vLLM,
   SGLang: `acceptance_lengths_as_engine`, metrics.engine_walk: the last step drafts a whole block
   and what it accepted past --max-new-tokens still counts) or `cut` (llama.cpp: the offline `cut`
   walk, less a last block that had no room to draft, where llama.cpp takes no step). Together with
   pooling this gives `offline_as_engine`;
3. `acceptance`: equal completions whose blocks still differ from the engine's (the drafter saw
   other features: layer mapping, kernels, cache state);
4. `numerics`: completions that differ (the target decoded another token somewhere);
5. `unexplained`: what is left once every offline walk has become the engine's (0.0 when the engine
   reports its steps: each part then is exact, never forced).

Each part is the change of the pooled mean that its swap causes, so the parts add up to the gap.
`first_differences` compares the engine's walk with the offline walk as it was measured.

On a hybrid target (Gated DeltaNet layers) `hybrid` names the causes that matter there, where the
data shows them: the two sides' GDN code per piece, the dtype each ran (an fp32 offline eval against
a bf16 engine is said in one line: not the same protocol), the engine counting its last step whole,
state rollback after a rejection (the offline walk is teacher-forced and has none; an online offline
eval through a cached loop does it wrong), and prefix caching.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tracker import config
from tracker.environment import fingerprint, linear_attn
from tracker.measurement import context, protocol
from tracker.measurement import engine_metrics as em
from tracker.errors import DraftboardError
from tracker.measurement.uncertainty import NO_DIFFERENCE

EXACT = 1e-9


@dataclass
class PromptReconciled:
    id: str
    completions_equal: bool
    first_token_difference: int | None  # index into the completions, where they differ
    engine_blocks: int
    offline_blocks: int
    first_block_difference: int | None  # 0-based block where the accepted counts differ
    engine_accepted: int | None  # at that block
    offline_accepted: int | None
    anchor: int | None  # that block's anchor, completion-relative (the tokens the walks produced before it)
    cause: str | None  # None: every block agrees


def _pooled(walks: list[list[int]]) -> float:
    blocks = sum(len(w) for w in walks)
    return sum(sum(w) for w in walks) / blocks if blocks else 0.0


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _ints(value, least: int) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= least
                                           for v in value)


def _check(results: dict, what: str, number: str) -> None:
    """DraftboardError naming the first field of a results JSON (untrusted: any file) reconcile cannot use."""
    if not isinstance(results, dict) or not isinstance(results.get("prompts"), list):
        raise DraftboardError(f"{what}: not an eval's results (no 'prompts' list)")
    value = results.get(number)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise DraftboardError(f"{what}: '{number}' must be a number, got {value!r:.40}")
    for p in results["prompts"]:
        if not isinstance(p, dict) or "id" not in p:
            raise DraftboardError(f"{what}: each prompt needs an id")
        if not _ints(p.get("acceptance_lengths"), 1) or not _ints(p.get("completion_ids"), 0):
            raise DraftboardError(f"{what}: prompt {str(p['id'])[:40]!r} needs completion_ids and acceptance_lengths "
                                  "as lists of non-negative integers")
        walk = p.get("acceptance_lengths_as_engine")
        if walk is not None and not _ints(walk, 1):
            raise DraftboardError(f"{what}: prompt {str(p['id'])[:40]!r}: acceptance_lengths_as_engine must be a "
                                  "list of positive integers")
    if number == "engine_mean_acceptance_length":  # a summary its own steps contradict is not believed
        own = _pooled([p["acceptance_lengths"] for p in results["prompts"]])
        if abs(own - value) > 1e-9 * max(1.0, abs(value)):
            raise DraftboardError(f"{what}: engine_mean_acceptance_length {value:.6g} is not what its own steps give "
                                  f"({own:.6g}: 1 + accepted / steps over its prompts' acceptance_lengths); refused")


def _roomless_end_dropped(walk: list[int], n_completion: int) -> list[int]:
    """A `cut` walk as llama.cpp counts it: it drafts at most the tokens still to come less one and
    takes no step where that is none, so a walk run to the limit (its blocks sum to N - 1) loses a
    last block anchored at N - 2 (a block of 1 with no draft position)."""
    walk = list(walk)
    if walk and sum(walk) == n_completion - 1 and sum(walk[:-1]) == n_completion - 2:
        return walk[:-1]
    return walk


def reconcile(engine: dict, offline: dict) -> dict:
    """The report `draftboard reconcile --json` prints (DESIGN.md, fixed keys)."""
    if not isinstance(engine, dict) or not isinstance(offline, dict):
        raise DraftboardError("reconcile needs two eval results (JSON objects)")
    if (engine.get("protocol") or {}).get("scoring") != "engine":
        raise DraftboardError("the first eval is not an engine eval (protocol.scoring is not 'engine'); "
                              "give the engine eval first, the offline one second")
    if (offline.get("protocol") or {}).get("scoring") == "engine":
        raise DraftboardError("the second eval is an engine eval too; reconcile compares one with an offline eval")
    for what, results in (("the engine eval", engine), ("the offline eval", offline)):
        temperature = (results.get("protocol") or {}).get("temperature")
        if temperature not in (0, None, "unknown"):
            raise DraftboardError(f"{what} is sampled (temperature {temperature!r:.20}): reconcile follows two greedy "
                                  "walks block by block; compare sampled evals with `draftboard compare`")
    _check(engine, "the engine eval", "engine_mean_acceptance_length")
    _check(offline, "the offline eval", "tau")
    eng = {str(p["id"]): p for p in engine["prompts"]}
    off = {str(p["id"]): p for p in offline["prompts"]}
    if set(eng) != set(off):
        only_e, only_o = sorted(set(eng) - set(off)), sorted(set(off) - set(eng))
        raise DraftboardError(f"the two evals ran different prompts (only in the engine eval: {only_e[:5]}, only "
                              f"offline: {only_o[:5]}); reconcile needs the same prompts")
    ids = [str(p["id"]) for p in engine["prompts"]]
    ordered = all(eng[i].get("engine_steps_ordered", True) for i in ids)

    # The offline walks under the engine's definition, from the offline eval's own blocks (older
    # results and online-scored ones have none: then the measured walk stands in, and it says so).
    scored_offline = (offline.get("protocol") or {}).get("scoring") in (None, "offline")
    engine_rule = (engine.get("protocol") or {}).get("last_block")
    offline_cut = (offline.get("protocol") or {}).get("last_block") == "cut"
    exact, as_engine = scored_offline, {}
    for i in ids:
        if engine_rule == "cut":
            walk = _roomless_end_dropped(off[i]["acceptance_lengths"], len(off[i]["completion_ids"])) \
                if scored_offline and offline_cut else None
        else:
            walk = off[i].get("acceptance_lengths_as_engine") if scored_offline else None
        exact = exact and isinstance(walk, list)
        as_engine[i] = list(walk) if isinstance(walk, list) else list(off[i]["acceptance_lengths"])

    rows, cause_of = [], {}
    for i in ids:
        e, o = eng[i], off[i]
        ew, ow = list(e["acceptance_lengths"]), list(o["acceptance_lengths"])
        equal = e["completion_ids"] == o["completion_ids"]
        block = _first_difference(ew, ow) if ordered else (None if sorted(ew) == sorted(ow) else -1)
        agrees_as_engine = ew == as_engine[i] if ordered else sorted(ew) == sorted(as_engine[i])
        if not equal:
            cause = "numerics"
        elif agrees_as_engine:
            cause = None if block is None else "end_of_generation"
        else:
            cause = "acceptance"
        cause_of[i] = cause
        at = block if block is not None and block >= 0 else None
        rows.append(PromptReconciled(
            id=i, completions_equal=equal,
            first_token_difference=None if equal else _first_difference(e["completion_ids"], o["completion_ids"]),
            engine_blocks=len(ew), offline_blocks=len(ow), first_block_difference=at,
            engine_accepted=ew[at] - 1 if at is not None and at < len(ew) else None,
            offline_accepted=ow[at] - 1 if at is not None and at < len(ow) else None,
            anchor=sum(ow[:at]) if at is not None else None, cause=cause))

    offline_tau = float(offline["tau"])
    measured = _pooled([off[i]["acceptance_lengths"] for i in ids])
    offline_as_engine = _pooled(list(as_engine.values()))
    parts = {"pooling": measured - offline_tau, "end_of_generation": offline_as_engine - measured}
    # Then swap the walks for the engine's, one cause at a time; each part is the change it makes.
    walks, before = dict(as_engine), offline_as_engine
    for cause in ("acceptance", "numerics"):
        for i in ids:
            if cause_of[i] == cause:
                walks[i] = list(eng[i]["acceptance_lengths"])
        after = _pooled(list(walks.values()))
        parts[cause] = after - before
        before = after
    engine_mean = float(engine["engine_mean_acceptance_length"])
    unexplained = engine_mean - before
    gap = engine_mean - offline_tau
    parts = {k: (0.0 if abs(v) < EXACT else v) for k, v in parts.items()}
    unexplained = 0.0 if abs(unexplained) < EXACT else unexplained

    differs = [r for r in rows if r.cause is not None]
    report = {
        "engine_mean_acceptance_length": engine_mean,
        "offline_tau": offline_tau,
        "offline_tau_pooled": measured,
        "offline_as_engine": offline_as_engine,
        "offline_as_engine_exact": exact,
        "gap": gap,
        "parts": parts,
        "unexplained": unexplained,
        "n_prompts": len(ids),
        "completions_equal": sum(r.completions_equal for r in rows),
        "blocks_agree": sum(r.cause is None for r in rows),
        "end_of_generation": sum(r.cause == "end_of_generation" for r in rows),
        # equal completions whose blocks differ from the engine's, as measured (end of generation included)
        "acceptance_differs": sum(r.completions_equal and r.cause is not None for r in rows),
        "acceptance_differs_as_engine": sum(r.cause == "acceptance" for r in rows),
        "steps_ordered": ordered,
        "first_differences": [{"id": r.id, "block": r.first_block_difference, "engine": r.engine_accepted,
                               "offline": r.offline_accepted, "anchor": r.anchor, "cause": r.cause}
                              for r in differs],
        "prompts": [asdict(r) for r in rows],
        "protocol_diff": [row._asdict() for row in protocol.diff(protocol.Protocol.from_results(engine),
                                                                 protocol.Protocol.from_results(offline))],
        "environment_diff": [row._asdict() for row in fingerprint.diff(engine.get("fingerprint") or {},
                                                                      offline.get("fingerprint") or {})]
        if engine.get("fingerprint") and offline.get("fingerprint") else [],
    }
    report["by_context"] = by_context(engine, offline, [eng[i] for i in ids], [as_engine[i] for i in ids]) \
        if ordered else None
    report["hybrid"] = hybrid(engine, offline, report)
    report["verdict"] = verdict(report)
    return report


def by_context(engine: dict, offline: dict, engine_rows: list[dict], offline_walks: list[list[int]]) -> list[dict] | None:
    """The engine's ordered steps (B) against the offline walks counted as the engine counts (A), bucket by
    bucket (context.paired_by_walks), by the engine eval's edges (else the offline eval's, else octaves); None
    where a prompt has no token ids."""
    if not all(_ints(row.get("input_ids"), 0) for row in engine_rows):
        return None
    edges = context.results_edges(engine) or context.results_edges(offline)
    return context.paired_by_walks([(len(row["input_ids"]), walk) for row, walk in zip(engine_rows, offline_walks)],
                                   [(len(row["input_ids"]), row["acceptance_lengths"]) for row in engine_rows],
                                   edges)[1]


def parting(r: dict) -> list[str]:
    """The buckets where the served curve parts from the offline one: `[from, to) engine X vs offline Y`."""
    return [f"{context.bucket_text(row)} engine {row['tau_b']:.3f} vs offline {row['tau_a']:.3f}"
            for row in r.get("by_context") or () if row["verdict"] not in (None, NO_DIFFERENCE)]


def _dtype(results: dict) -> str | None:
    value = ((results.get("fingerprint") or {}).get("numerics") or {}).get("dtype")
    return {torch_name: flag for flag, torch_name in config.DTYPES.items()}.get(value, value)


def hybrid(engine: dict, offline: dict, r: dict) -> dict | None:
    """The hybrid target's causes, named where the data shows them (None: no Gated DeltaNet layers)."""
    fps = [engine.get("fingerprint") or {}, offline.get("fingerprint") or {}]
    rows = linear_attn.side_by_side(fps)
    record = (engine.get("engine") or {}).get("linear_attention")
    if not rows and not isinstance(record, dict):
        return None
    settings = record.get("settings") if isinstance(record, dict) and isinstance(record.get("settings"), dict) else {}
    notes = []
    dtypes = [_dtype(engine), _dtype(offline)]
    if None not in dtypes and dtypes[0] != dtypes[1]:
        notes.append(f"dtype: the engine ran the target in {dtypes[0]}, the offline eval in {dtypes[1]}: not the same "
                     f"protocol; evaluate offline with --dtype {dtypes[0]} to compare kernels alone")
    differ = [row for row in rows if row.severity == "critical"]
    if differ:
        notes.append("Gated DeltaNet code differs: " + "; ".join(
            f"{row.piece}: engine {row.values[0]}, offline {row.values[1]}" for row in differ))
    if r["parts"].get("numerics"):
        notes.append(f"numerics: {r['n_prompts'] - r['completions_equal']} completion(s) differ, so the target "
                     f"decoded another token: {dtypes[0] or 'the same dtype'} arithmetic through "
                     f"{'different' if differ else 'the same'} GDN code")
    if r["parts"].get("end_of_generation"):
        notes.append("end of generation: the engine counts its last step whole")
    scoring = (offline.get("protocol") or {}).get("scoring")
    if r["acceptance_differs_as_engine"]:
        if scoring == "online":
            cause = ("the offline walk came from a cached loop, which does not roll the GDN recurrent state back "
                     "after a rejection (transformers #49036): it is not lossless on a hybrid")
        else:
            cause = ("the offline walk is teacher-forced (each block from the true prefix: no state to roll back), "
                     "the engine rolls its GDN state back after each rejection; with equal completions the "
                     "difference is in the drafter's features (kernels, dtype)")
        notes.append(f"acceptance: {r['acceptance_differs_as_engine']} prompt(s) with equal completions; {cause}")
    if em.prefix_cache(settings):
        notes.append("prefix caching was on: a cached prefix resumes another request's recurrent state")
    return {"gdn": [{"piece": row.piece, "engine": row.values[0], "offline": row.values[1],
                     "severity": row.severity} for row in rows],
            "dtypes": {"engine": dtypes[0], "offline": dtypes[1]}, "engine_settings": settings, "notes": notes}


def verdict(r: dict) -> str:
    """One line: the gap, what explains it, and what is left."""
    named = {k: v for k, v in r["parts"].items() if v}
    explained = ", ".join(f"{k.replace('_', ' ')} {v:+.3f}" for k, v in named.items()) or "nothing to explain"
    head = (f"engine {r['engine_mean_acceptance_length']:.3f} vs offline tau {r['offline_tau']:.3f} "
            f"(gap {r['gap']:+.3f}): {explained}")
    if r["acceptance_differs_as_engine"] == 0 and r["completions_equal"] == r["n_prompts"]:
        tail = ("every block agrees" if r["end_of_generation"] == 0 else
                f"every block agrees, counted as the engine counts ({r['end_of_generation']} prompt(s) differ "
                "only where the offline walk stops at the limit)")
    else:
        tail = (f"{r['acceptance_differs_as_engine']} prompt(s) with equal completions accept differently "
                f"(first at block {next(d['block'] for d in r['first_differences'] if d['cause'] == 'acceptance')})"
                if r["acceptance_differs_as_engine"] else "")
        if r["completions_equal"] < r["n_prompts"]:
            tail += ("; " if tail else "") + f"{r['n_prompts'] - r['completions_equal']} completion(s) differ"
    if not r["offline_as_engine_exact"]:
        tail += ("; " if tail else "") + ("the offline eval has no walk counted as the engine counts (an older or "
                                          "online eval): end of generation is not told apart")
    if parts := parting(r):
        tail += ("; " if tail else "") + "by context the curves part at " + ", ".join(parts)
    left = "nothing unexplained" if r["unexplained"] == 0.0 else f"{r['unexplained']:+.3f} unexplained"
    dtypes = (r.get("hybrid") or {}).get("dtypes") or {}
    same = len(set(dtypes.values())) <= 1 or None in dtypes.values()
    return f"{head}; {tail}; {left}" + ("" if same else f"; not the same protocol: the engine ran "
                                        f"{dtypes['engine']}, the offline eval {dtypes['offline']}")


# --------------------------------------------------------------------------- two engines

# What an engine eval records of its serving settings that can move its number, as `engine` keys.
ENGINE_SETTINGS = ("version", "num_speculative_tokens", "dtype", "spec_draft_p_min", "cache_type_k_draft",
                   "mamba_ssm_cache_dtype", "gguf_type")
ENGINE_PARTS = ("end_of_generation", "acceptance", "numerics")


def _engine_settings(results: dict) -> dict:
    engine = results.get("engine") or {}
    out = {k: engine.get(k) for k in ENGINE_SETTINGS if engine.get(k) is not None}
    out["last_block"] = (results.get("protocol") or {}).get("last_block")
    if em.prefix_cache(engine) is not None:
        out["prefix_cache"] = em.prefix_cache(engine)
    gdn = engine.get("linear_attention")
    if isinstance(gdn, dict) and gdn.get("summary"):
        out["linear_attention"] = gdn["summary"]
    return out


def reconcile_engines(a: dict, b: dict, offline: dict | None = None) -> dict:
    """Two engine evals of the same prompts (`draftboard reconcile A B [--offline C]`): the settings and
    definitions that differ, and, given the offline eval of the same prompts, the gap in parts. Each
    engine is reconciled with that offline eval; both are measured against the same offline walks, so
    pooling cancels and the gap between the engines is the difference of their parts, exactly:
    A - B = (A - O) - (B - O), part by part, and unexplained = what either left unexplained."""
    for what, results in (("the first eval", a), ("the second eval", b)):
        if not isinstance(results, dict) or (results.get("protocol") or {}).get("scoring") != "engine":
            raise DraftboardError(f"{what} is not an engine eval (protocol.scoring is not 'engine')")
        _check(results, what, "engine_mean_acceptance_length")
    ids_a, ids_b = ({str(p["id"]) for p in r["prompts"]} for r in (a, b))
    if ids_a != ids_b:
        raise DraftboardError("the two engine evals ran different prompts; reconcile needs the same prompts")
    name = [str((r.get("engine") or {}).get("name") or "engine") for r in (a, b)]
    mean = [float(r["engine_mean_acceptance_length"]) for r in (a, b)]
    steps = {str(p["id"]): sorted(p["acceptance_lengths"]) for p in b["prompts"]}
    tokens = {str(p["id"]): p["completion_ids"] for p in b["prompts"]}
    sa, sb = _engine_settings(a), _engine_settings(b)
    report = {
        "a": {"engine": name[0], "engine_mean_acceptance_length": mean[0]},
        "b": {"engine": name[1], "engine_mean_acceptance_length": mean[1]},
        "gap": mean[0] - mean[1], "n_prompts": len(ids_a),
        "completions_equal": sum(p["completion_ids"] == tokens[str(p["id"])] for p in a["prompts"]),
        "steps_agree": sum(sorted(p["acceptance_lengths"]) == steps[str(p["id"])] for p in a["prompts"]),
        "settings_diff": [{"field": k, "a_value": sa.get(k), "b_value": sb.get(k)}
                          for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)],
        "via_offline": offline is not None, "parts": {}, "unexplained": None,
    }
    if offline is not None:
        ra, rb = reconcile(a, offline), reconcile(b, offline)
        parts = {k: ra["parts"][k] - rb["parts"][k] for k in ENGINE_PARTS}
        report["parts"] = {k: 0.0 if abs(v) < EXACT else v for k, v in parts.items()}
        unexplained = ra["unexplained"] - rb["unexplained"]
        report["unexplained"] = 0.0 if abs(unexplained) < EXACT else unexplained
        report["offline_exact"] = ra["offline_as_engine_exact"] and rb["offline_as_engine_exact"]
    report["verdict"] = engines_verdict(report)
    return report


def engines_verdict(r: dict) -> str:
    a, b = r["a"], r["b"]
    head = (f"{a['engine']} {a['engine_mean_acceptance_length']:.3f} vs {b['engine']} "
            f"{b['engine_mean_acceptance_length']:.3f} (gap {r['gap']:+.3f})")
    # what both engines state and set differently (one engine's own switches are in the table)
    settings = "; ".join(f"{d['field']} {d['a_value']} vs {d['b_value']}" for d in r["settings_diff"]
                         if d["a_value"] is not None and d["b_value"] is not None) or "same settings"
    if not r["via_offline"]:
        return (f"{head}; {r['completions_equal']}/{r['n_prompts']} completions equal, {r['steps_agree']} with the same "
                f"steps; differs: {settings}; give the offline eval of the same prompts (--offline) to take the gap apart")
    named = ", ".join(f"{k.replace('_', ' ')} {v:+.3f}" for k, v in r["parts"].items() if v) or "nothing to explain"
    left = "nothing unexplained" if r["unexplained"] == 0.0 else f"{r['unexplained']:+.3f} unexplained"
    return f"{head}: {named}; differs: {settings}; {left}"
