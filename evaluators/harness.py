"""`draftboard eval`: teacher-forced block evaluation of a DFlash drafter against a target.

The drafter's output at anchor p depends only on the target's features at positions < p and
the token at p, so one target pass (greedy continuation + tapped features, both cached) gives
everything the online speculative loop would see at temperature 0. The drafter then scores
every anchor of every completion in a few large batched calls (evaluators.scoring); the walks
(chain and one per DDTree budget) are read off the per-anchor acceptance lengths, under the
end-of-generation rule `last_block` (metrics.walk_end). Results equal a lossless online loop's,
block for block (tests/test_online_equivalence.py).

At temperature > 0 the target draws `samples` continuations per prompt (seeded per prompt and
draw, cached with the probability of each token, shared by every checkpoint of the same target
and protocol); the drafter's pass over each gives the acceptance ratio at every anchor, and the
walk's expectation follows exactly (evaluators.sampling). `--scoring online --seeds N` runs the
lossless sampled loop N times per prompt beside it: the Monte Carlo check.

The harness never imports Streamlit; progress goes to a callback (the CLI binds it to tqdm and
to the job queue's event lines).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from evaluators import metrics, sizing
from evaluators.cache import EvalCache, FeatureWriter, LayerFile
from evaluators.drafter import LoadedDrafter, Precision, TargetDims, open_drafter, parse_precision
from evaluators.datasets import load_benchmark
from evaluators.pooling import Share, monte_carlo, prompt_fields, pool
from evaluators.settings import EvalSettings
from evaluators.online import lossless_row, online_generate, target_alone_generate
from evaluators.prompts import Prompt, attach_completions, template_thinking
from evaluators.sampling import ONLINE, draw_seed
from evaluators.scoring import (Walked, completion_bounds, sample_totals, score_anchors, score_ratios,
                                score_short_blocks, score_short_ratios, tree_budgets)
from evaluators.target import (CheckedTarget, Target, cache_key, check_target, content_digest,
                               deferred_tokenizer, greedy_continuations, held_heads, layer_hidden_states_batch,
                               load_target, sampled_continuations)
from tracker.environment import fingerprint, linear_attn
from tracker.config import DTYPES
from tracker.measurement.protocol import GENERATED, UNKNOWN, Protocol, file_digest, text_digest
from tracker.errors import DraftboardError

Progress = Callable[[str, int, int], None]  # (stage, done, total)


def quiet(stage: str, done: int, total: int) -> None:
    pass


def _continuations(target: "_OnDemand", prompts: list[Prompt], s: EvalSettings, block: int, cache: EvalCache,
                   env: dict, digest: str, progress: Progress, batch: int) -> list[list[int]]:
    """Greedy tokens after each prompt, reaching block-1 tokens past the last anchor."""
    fixed = [p for p in prompts if p.completion_ids is not None]
    key = cache_key("continuations", digest, env, s.max_new_tokens, block,
                    [(p.input_ids, p.completion_ids) for p in prompts])
    cached = cache.get_continuations(key)
    if cached is not None:
        progress("target: continuations (cached)", len(prompts), len(prompts))
        return cached
    step = lambda n: progress("target: continuations", n, len(prompts))  # noqa: E731
    if fixed:  # reuse the given completions; only the lookahead past their end is generated
        if len(fixed) != len(prompts):
            raise DraftboardError("either every prompt has a completion or none has")
        tails = greedy_continuations(target(), [p.input_ids + p.completion_ids for p in prompts], block - 1,
                                     block - 1, batch, _counter(step))
        out = [p.completion_ids + t for p, t in zip(prompts, tails)]
    else:
        out = greedy_continuations(target(), [p.input_ids for p in prompts], s.max_new_tokens + block - 1,
                                   block - 1, batch, _counter(step))
    cache.put_continuations(key, out, target=digest)
    return out


def _samples(target: "_OnDemand", prompts: list[Prompt], s: EvalSettings, block: int, cache: EvalCache,
             env: dict, digest: str, progress: Progress, batch: int) -> list[tuple[int, list[int], list[float]]]:
    """`samples` continuations per prompt drawn from the target, prompt-major: (seed, tokens, p of
    each token). Cached by everything that decides a draw, so every checkpoint scored against the
    same target, prompts and protocol meets the same continuations."""
    seeds = [draw_seed(s.seed, p.input_ids, k) for p in prompts for k in range(s.samples)]
    key = cache_key("samples", digest, env, s.max_new_tokens, block, [p.input_ids for p in prompts],
                    asdict(s.sampling), seeds)
    drawn = cache.get_samples(key)
    if drawn is None or len(drawn) != len(seeds):
        step = lambda n: progress("target: sampled continuations", n, len(seeds))  # noqa: E731
        out = sampled_continuations(target(), [p.input_ids for p in prompts for _ in range(s.samples)], seeds,
                                    s.max_new_tokens + block - 1, block - 1, s.sampling, batch, _counter(step))
        drawn = [(d.tokens, d.probs) for d in out]
        cache.put_samples(key, drawn, target=digest)
    else:
        progress("target: sampled continuations (cached)", len(seeds), len(seeds))
    return [(seed, tokens, probs) for seed, (tokens, probs) in zip(seeds, drawn)]


def _counter(step: Callable[[int], None]) -> Callable[[int], None]:
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        step(done)

    return advance


class Contexts:
    """Per prompt, the cat of the tapped features over its context positions: [T_i, n_tapped*H].

    Read from the cache one prompt at a time (`contexts[i]`), so an eval holds one prompt's
    features, never all of them."""

    def __init__(self, layer_files: list[LayerFile]):
        self.layer_files = layer_files

    def __len__(self) -> int:
        return len(self.layer_files[0])

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.cat([f.read(i) for f in self.layer_files], dim=-1)

    def close(self) -> None:
        for f in self.layer_files:
            f.close()


def _features(target: "_OnDemand", walked: list[Walked], layers: list[int], cache: EvalCache, env: dict,
              digest: str, progress: Progress, batch_size: int, hidden: int) -> Contexts:
    """The tapped features of every prompt: computed once (streamed to the cache), then read back."""
    seqs = [w.input_ids + w.completion_ids[: w.n_anchors] for w in walked]
    key = cache_key("features", digest, env, seqs)
    opened = {i: cache.open_features(key, i, len(seqs)) for i in layers}
    missing = [i for i in layers if opened[i] is None]
    if missing:
        _target_features(target(), walked, seqs, missing, cache.feature_writer(key, list(map(len, seqs)), hidden,
                                                                                missing, target=digest),
                         batch_size, progress)
        opened.update({i: cache.open_features(key, i, len(seqs)) for i in missing})
        if any(opened[i] is None for i in missing):  # another process's prune removed it a moment ago
            raise DraftboardError(f"the target features just written to {cache.root} are gone: "
                                  "is another process pruning the cache? rerun")
    else:
        progress("target: features (cached)", len(seqs), len(seqs))
    return Contexts([opened[i] for i in layers])


def _target_features(target: Target, walked: list[Walked], seqs: list[list[int]], layers: list[int],
                     writer: FeatureWriter, batch_size: int, progress: Progress) -> None:
    """One target pass over every sequence, `batch_size` similar lengths at a time (right-padded),
    each prompt's features going to the cache as soon as its batch is done."""
    order = sorted(range(len(seqs)), key=lambda n: len(seqs[n]))
    done = 0
    with writer:
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            for n, feats in zip(batch, layer_hidden_states_batch(target, [seqs[n] for n in batch], layers)):
                for i in layers:
                    if not torch.isfinite(feats[i]).all():
                        pos = int((~torch.isfinite(feats[i])).any(-1).nonzero()[0])
                        raise DraftboardError(f"non-finite target features for prompt {walked[n].id!r} "
                                              f"at layer {i}, position {pos}: the target's numbers are broken here")
                writer.write(n, feats)
            done += len(batch)
            progress("target: features", done, len(seqs))


def _score_online(results: dict, target: Target, loaded: LoadedDrafter, walked: list[Walked], last_block: str,
                  stops: set[int], block: int, progress: Progress) -> None:
    """`--scoring online`: the chain numbers become z-lab's cached loop's (evaluators.online).

    The loop's own completions and per-block acceptance replace the walks; the offline numbers
    stay beside them (`offline`, per prompt `offline_acceptance_lengths`) so the gap shows.
    DDTree and tau_all_anchors stay offline statistics (the loop has no tree, nor every anchor).
    """
    # z-lab's benchmark.py: both loops warmed on the first prompt (64 tokens), then per prompt the target
    # alone (block size 1) and the drafter's loop, each timed from its first token (decoding_speedup).
    warm = walked[0]
    target_alone_generate(target, warm.input_ids, min(64, warm.limit), stops)
    online_generate(target, loaded, warm.input_ids, min(64, warm.limit), stops, last_block)
    runs, alone = [], []
    for i, w in enumerate(walked, 1):
        alone.append(target_alone_generate(target, w.input_ids, w.limit, stops))
        runs.append(online_generate(target, loaded, w.input_ids, w.limit, stops, last_block))
        progress("drafter: online loop", i, len(walked))
    results["decoding"] = metrics.decoding_speedup([t for _, t in alone], [r.time_per_output_token for r in runs])
    results["decoding"]["target_alone_equal"] = sum(a == r.completion_ids for (a, _), r in zip(alone, runs))
    results["decoding_speedup"] = results["decoding"]["speedup"]
    online = metrics.summarize_walks([r.acceptance_lengths for r in runs], block)
    results["offline"] = {"tau": results["tau"], "tau_pooled": results["tau_pooled"]}
    results.update(tau=online.tau, tau_pooled=online.tau_pooled, streak=online.streak, n_blocks=online.n_blocks,
                   accept_rate_by_position=online.accept_rate_by_position,
                   accept_len_histogram=online.accept_len_histogram)
    for row, run in zip(results["prompts"], runs):
        row["offline_acceptance_lengths"] = row["acceptance_lengths"]
        row["acceptance_lengths"], row["completion_ids"] = run.acceptance_lengths, run.completion_ids


def _score_online_sampled(results: dict, target: Target, loaded: LoadedDrafter, walked: list[Walked],
                          s: EvalSettings, stops: set[int], block: int, progress: Progress) -> None:
    """`--scoring online` at T > 0: `seeds` runs of the lossless sampled loop per prompt replace the
    offline expectation as the headline numbers (a Monte Carlo estimate of the same quantity); the
    expectation stays beside them (`offline`, per prompt `offline_samples`), so a test or a user can
    see whether it lies inside the runs' interval (`monte_carlo`)."""
    firsts = walked[::s.samples]  # one Walked per prompt: its prompt and limit
    groups = []
    for i, w in enumerate(firsts, 1):
        runs = []
        for k in range(s.seeds):
            seed = draw_seed(s.seed, w.input_ids, k, ONLINE)
            generator = torch.Generator(device=target.device).manual_seed(seed)
            run = online_generate(target, loaded, w.input_ids, w.limit, stops, s.last_block, sampling=s.sampling,
                                  generator=generator)
            lengths = run.acceptance_lengths
            runs.append({"seed": seed, "completion_ids": run.completion_ids, "acceptance_lengths": lengths,
                         "tau": sum(lengths) / len(lengths) if lengths else None, "tokens": float(sum(lengths)),
                         "blocks": float(len(lengths)),
                         "histogram": [float(lengths.count(n)) for n in range(1, block + 1)]})
        groups.append(runs)
        progress("drafter: online loop", i, len(firsts))
    results["offline"] = {"tau": results["tau"], "tau_pooled": results["tau_pooled"],
                          "monte_carlo": results["monte_carlo"]}
    results.update(sample_totals(groups, block))
    for row, runs in zip(results["prompts"], groups):
        row["offline_samples"] = row["samples"]
        row["samples"], row["completion_ids"] = runs, runs[0]["completion_ids"]
    results["monte_carlo"] = monte_carlo(results["prompts"], s.seeds)


def eval_protocol(s: EvalSettings, prompts: list[Prompt], tokenizer, block: int, stops: list[int],
                  target_digest: str, scoring: str | None = None) -> Protocol:
    """What this eval asked of the target and drafter (tracker.measurement.protocol; DESIGN.md); scoring: the
    settings' unless the eval scores another way (an engine's)."""
    templated = any(p.chat_template for p in prompts)
    thinking = template_thinking(tokenizer, s.enable_thinking) if templated else None
    return Protocol(
        **prompt_fields(prompts),
        completions=file_digest(s.completions) if s.completions else GENERATED,
        max_new_tokens=s.max_new_tokens,
        enable_thinking=UNKNOWN if thinking is None else thinking,
        chat_template_digest=text_digest(tokenizer.chat_template) if templated else UNKNOWN,
        block_size=block, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
        samples=s.seeds if s.scoring == "online" and not s.sampling.greedy else s.samples, seed=s.seed,
        stop_token_ids=sorted(stops), last_block=s.last_block, scoring=scoring or s.scoring,
        target_digest=target_digest)


def _check_context(prompts: list[Prompt], max_new_tokens: int, block: int, limit: int | None) -> None:
    if limit is None:
        return
    for p in prompts:
        need = len(p.input_ids) + (len(p.completion_ids) if p.completion_ids else max_new_tokens) + block - 1
        if need > limit:
            raise DraftboardError(f"prompt {p.id!r}: {len(p.input_ids)} prompt tokens + completion + "
                                  f"block lookahead = {need} exceeds the target's context of {limit}")


@dataclass
class _Pair:
    """What an eval loads up front: its prompts, the target's checked config, heads and stop tokens,
    the drafter, and the target's content digest with the cache that holds its work."""

    prompts: list[Prompt]
    tokenizer: object | None
    target: CheckedTarget  # heads None: no safetensors files, so a warm eval loads the whole target
    loaded: LoadedDrafter
    precision: Precision
    digest: str
    cache: EvalCache

    @property
    def config(self):  # the target's text config
        return self.target.config


def load_pair(s: EvalSettings, device: str, progress: Progress) -> _Pair:
    # Cheap checks first: bad prompts, a target or drafter whose config does not match its
    # weight files fail before any weights are read or anything is sized from a config.
    digest, cache = content_digest(s.target), EvalCache(s.cache_dir)
    tokenizer = deferred_tokenizer(s.target)
    prompts: list[Prompt] = []

    def read_prompts(cfg) -> None:
        prompts.extend(load_benchmark(s.prompts, tokenizer, cfg.vocab_size, s.enable_thinking, s.limit_per_dataset,
                                      s.prompt_tokens))
        if s.completions:
            prompts[:] = attach_completions(prompts, s.completions, cfg.vocab_size)

    target = check_target(s.target, cache, digest, between=read_prompts)
    cfg = target.config
    checked = open_drafter(s.drafter, TargetDims(cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size))

    progress("load", 0, 2)
    precision = parse_precision(s.drafter_precision or s.dtype)
    loaded = checked.load(device, precision.weights)
    _check_context(prompts, s.max_new_tokens, loaded.model.block_size, getattr(cfg, "max_position_embeddings", None))
    target.remember(cache, s.target, digest)
    progress("load", 1, 2)
    return _Pair(prompts, tokenizer, target, loaded, precision, digest, cache)


class _OnDemand:
    """The target, loaded the first time some work needs it: a warm eval never does."""

    def __init__(self, s: EvalSettings, device: str):
        self.s, self.device = s, device
        self.target: Target | None = None
        self.seconds = 0.0  # spent loading it

    def __call__(self) -> Target:
        if self.target is None:
            t0 = time.perf_counter()
            self.target = load_target(self.s.target, self.device, self.s.dtype, self.s.linear_attn, self.s.gpus)
            self.seconds = time.perf_counter() - t0
        return self.target


def check_lossless(s: EvalSettings, progress: Progress = quiet) -> dict:
    """`draftboard check-lossless`: z-lab's cached online loop against plain greedy, per prompt.

    -> {"prompts": [LosslessRow as a dict], "timing": {"total_s"}, "last_block", "n_diverged"}.
    Greedy runs one prompt at a time with the target's cache, which is exact for greedy decoding
    (every token it caches is kept); the online loop's cache is cropped after rejected drafts.
    """
    t0 = time.perf_counter()
    linear_attn.FALLBACK_WARNINGS.start()
    device = s.device or fingerprint.default_device()
    pair = load_pair(s, device, progress)
    target = _OnDemand(s, device)()
    stops = set(target.stop_token_ids())
    rows = []
    for i, p in enumerate(pair.prompts, 1):
        greedy = greedy_continuations(target, [p.input_ids], s.max_new_tokens, 0, 1)[0]
        greedy, _ = completion_bounds(greedy, s.max_new_tokens, stops)
        run = online_generate(target, pair.loaded, p.input_ids, s.max_new_tokens, stops, s.last_block,
                              measure=True)
        rows.append(asdict(lossless_row(p.id, run, greedy)))
        progress("check-lossless", i, len(pair.prompts))
    return {"last_block": s.last_block, "n_diverged": sum(not r["equals_greedy"] for r in rows),
            "prompts": rows, "timing": {"total_s": time.perf_counter() - t0}}


@dataclass
class _TargetFacts:
    """What only the loaded target can tell (the probe, which kernels its layers resolved to, the
    fallback warnings they logged), cached under `key`: (target digest, environment, kernel mode,
    device, probed layers)."""

    key: str
    part: dict  # fingerprint.target_part
    resolution: dict  # linear_attn.Resolution.to_dict()

    def note_warnings(self, logged: list[str]) -> bool:
        """Add the fallback warnings the process logged while the target ran (transformers warns once
        per function, at its first call: decoding's recurrent rule after the probe's prefill); True
        when that added any."""
        known = self.resolution["fallback_warnings"]
        new = [w for w in logged if w not in known]
        if not new or self.resolution.get("linear_attention_path") == "n/a":
            return False
        self.resolution = {**self.resolution, "fallback_warnings": known + new}
        numerics = self.part["numerics"]
        numerics["linear_attention"] = {**numerics["linear_attention"], "fallback_warnings": known + new}
        return True


def _fingerprint(target: _OnDemand, s: EvalSettings, device: str, layers: list[int], precision: Precision,
                 digest: str, cache: EvalCache) -> tuple[dict, _TargetFacts]:
    """(this process's environment without the target's part, what the target tells).

    The rest of the fingerprint is captured afresh every time, so a changed library or flag is
    a miss of the cached target facts."""
    here = fingerprint.capture(None, device, s.dtype, with_probe=False, drafter_precision=precision.name,
                               with_kernels=False)
    key = cache_key("fingerprint", digest, fingerprint.environment(here), s.linear_attn, device, layers)
    known = cache.get_fingerprint(key)
    if known is None or not {"part", "resolution"} <= set(known):
        model = target()  # load_target applied the mode
        fp = fingerprint.capture(model.model, device, s.dtype, probe_layers=layers, drafter_precision=precision.name)
        known = {"part": fingerprint.target_part(fp), "resolution": model.resolution.to_dict()}
        cache.put_fingerprint(key, known, target=digest)
    return here, _TargetFacts(key, known["part"], known["resolution"])


@dataclass
class _Live:
    """What a one-process eval keeps in memory after scoring, for `--scoring online`'s loop."""

    target: _OnDemand
    loaded: LoadedDrafter
    stops: set[int]
    facts: _TargetFacts
    here: dict
    cache: EvalCache
    digest: str


def evaluate(s: EvalSettings, progress: Progress = quiet) -> dict:
    """Run one eval and return the results JSON (DESIGN.md, schema draftboard.eval/1).

    The target is loaded only when some of its work is missing from the cache (and always for
    `--scoring online`, whose loop runs it); otherwise only its embedding and lm_head are read.
    `timing` splits the eval into load (inputs, drafter, target weights), target, fingerprint
    and drafter seconds; `timing.loaded` says what of the target was read ("model" or "heads").
    """
    t0 = time.perf_counter()
    share, live = score_share(s, progress)
    online = None
    if s.scoring == "online":
        def online(results: dict) -> None:
            t_online = time.perf_counter()
            walked, target, block = share.walked, live.target(), share.block
            if s.sampling.greedy:
                _score_online(results, target, live.loaded, walked, s.last_block, live.stops, block, progress)
            else:
                _score_online_sampled(results, target, live.loaded, walked, s, live.stops, block, progress)
            share.timing["drafter_s"] += time.perf_counter() - t_online
            _note_warnings(share, live)
    results = pool(s, [share], online)
    results["timing"]["total_s"] = time.perf_counter() - t0
    return results


def _note_warnings(share: Share, live: _Live) -> None:
    """The fallback warnings the target logged while it ran, into the share's fingerprint (and the cached facts)."""
    if live.target.target is not None and live.facts.note_warnings(linear_attn.FALLBACK_WARNINGS.messages):
        live.cache.put_fingerprint(live.facts.key, {"part": live.facts.part, "resolution": live.facts.resolution},
                                   target=live.digest)
        share.fingerprint = fingerprint.with_target_part(live.here, live.facts.part)
        share.resolution = live.facts.resolution


def score_share(s: EvalSettings, progress: Progress = quiet, shard: int = 0, of: int = 1) -> tuple[Share, _Live]:
    """Score this process's share of the prompts: all of them, or shard `shard` of `of`, which takes the prompts
    `shard, shard + of, ...` as z-lab's benchmark.py gives rank r of a world of `of` its prompts."""
    t0 = time.perf_counter()
    linear_attn.FALLBACK_WARNINGS.start()
    device = s.device or fingerprint.default_device()
    pair = load_pair(s, device, progress)
    prompts, tokenizer, loaded, precision = pair.prompts[shard::of], pair.tokenizer, pair.loaded, pair.precision
    if not prompts:
        raise DraftboardError(f"--shards {of}: only {len(pair.prompts)} prompt(s) to split; use at most "
                              f"{len(pair.prompts)} shards")
    block, layers = loaded.model.block_size, list(loaded.model.target_layer_ids)
    sampling = s.sampling
    budgets, ddtree_skipped = tree_budgets(loaded, s.budgets, sampling)
    target = _OnDemand(s, device)
    if pair.target.heads is None or s.scoring == "online":
        target()
    digest, cache = pair.digest, pair.cache
    load_s = time.perf_counter() - t0 - target.seconds

    def timed(work):  # (result, seconds spent outside loading the target)
        start, loading = time.perf_counter(), target.seconds
        out = work()
        return out, time.perf_counter() - start - (target.seconds - loading)

    (here, facts), fingerprint_s = timed(lambda: _fingerprint(target, s, device, layers, precision, digest, cache))
    fp = fingerprint.with_target_part(here, facts.part)
    progress("load", 2, 2)

    # The target's work does not depend on how the drafter computes: evals differing only there share it.
    env = {k: v for k, v in fingerprint.numbers_relevant(fp).items() if k != "numerics.drafter_precision"}
    longest = max(len(p.input_ids) + (len(p.completion_ids) if p.completion_ids else s.max_new_tokens)
                  for p in prompts) + block
    elem = getattr(torch, DTYPES[s.dtype]).itemsize
    batch = s.batch_size or sizing.target_batch(device, pair.config, longest, elem)
    dcfg = loaded.model.cfg
    chunk = s.anchor_chunk or sizing.anchor_chunk(device, block, pair.config.vocab_size, dcfg.hidden_size,
                                                  dcfg.num_attention_heads, longest)
    stops = set(pair.target.stop_ids)
    if sampling.greedy:
        conts, target_s = timed(lambda: _continuations(target, prompts, s, block, cache, env, digest, progress,
                                                       batch))
        sources = [(p, None, None) for p in prompts]
    else:  # `samples` draws per prompt, prompt-major
        samples, target_s = timed(lambda: _samples(target, prompts, s, block, cache, env, digest, progress, batch))
        conts = [tokens for _, tokens, _ in samples]
        sources = [(p, seed, probs) for p, (seed, _, probs) in zip((p for p in prompts for _ in range(s.samples)),
                                                                   samples)]
    walked = []
    for (p, seed, probs), cont in zip(sources, conts):
        max_new = s.max_new_tokens if p.completion_ids is None else min(s.max_new_tokens, len(p.completion_ids))
        completion, n_anchors = completion_bounds(cont, max_new, stops)
        end = metrics.walk_end(len(completion), n_anchors, n_anchors < len(completion), s.last_block)
        walked.append(Walked(p, completion, n_anchors, max_new, end, seed=seed, probs=probs))
    contexts, features_s = timed(lambda: _features(target, walked, layers, cache, env, digest, progress,
                                                   batch, pair.config.hidden_size))
    target_s += features_s
    # With the target loaded for its work, its heads are at hand; else read them alone (or still held).
    start, held = time.perf_counter(), False
    heads = target.target
    if heads is None:
        heads, held = held_heads(s.target, digest, pair.target.heads, pair.config, sorted(stops), device, s.dtype)
    load_s += time.perf_counter() - start

    t_drafter = time.perf_counter()
    try:
        for i, (w, cont) in enumerate(zip(walked, conts), 1):
            ctx = contexts[i - 1]
            if sampling.greedy:
                score_anchors(loaded, heads, w, ctx, cont, budgets, chunk, precision)
                if s.last_block == "cut":
                    score_short_blocks(loaded, heads, w, ctx, cont, budgets, precision)
            else:
                score_ratios(loaded, heads, w, ctx, cont, sampling, chunk, precision)
                if s.last_block == "cut":
                    score_short_ratios(loaded, heads, w, ctx, cont, sampling, precision)
            progress("drafter", i, len(walked))
    finally:
        contexts.close()
    drafter_s = time.perf_counter() - t_drafter
    share = Share(
        shard=shard, of=of, walked=walked,
        protocol=eval_protocol(s, prompts, tokenizer, block, sorted(stops), digest).to_dict(),
        fingerprint=fp, resolution=facts.resolution,
        timing={"load_s": load_s + target.seconds, "target_s": target_s, "fingerprint_s": fingerprint_s,
                "drafter_s": drafter_s, "total_s": time.perf_counter() - t0,
                "loaded": "model" if target.target is not None else "heads", "heads_held": held},
        sized={"batch_size": batch, "anchor_chunk": chunk}, budgets=list(budgets), ddtree_skipped=ddtree_skipped,
        block=block, target={"path": str(Path(s.target).resolve()), "content_digest": digest,
                             "num_layers": pair.config.num_hidden_layers},
        drafter={"path": str(Path(s.drafter).resolve()), "source": loaded.source, "target_layer_ids": layers,
                 "mask_token_id": loaded.model.mask_token_id, "family": loaded.model.family},
        node=socket.gethostname())
    live = _Live(target, loaded, stops, facts, here, cache, digest)
    _note_warnings(share, live)
    return share, live
