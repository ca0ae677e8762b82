"""`draftboard eval --engine vllm|sglang`: the offline eval's prompts and protocol, measured by a
serving engine, into the same results JSON (protocol.scoring = "engine").

Each prompt is one request at concurrency 1 (the protocol's greedy or sampled settings, the target's
stop tokens), so the engine's per-request counts are that prompt's alone. A step of the engine is a
block: it accepted `a` draft tokens and added the target's own, so its acceptance length is a + 1,
and draftboard's tau (per-prompt mean) and tau_pooled come from the same per-step counts as the
engine's own `engine_mean_acceptance_length` = 1 + sum(accepted) / sum(drafts) (vLLM's definition,
which pools every step; docs/DESIGN.md, "Engine evals").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from evaluators import metrics
from evaluators.datasets import load_benchmark
from evaluators.drafter import TargetDims, open_drafter
from evaluators.engines import gdn, llamacpp, load, sglang, staging, vllm
from evaluators.engines.base import EngineClient, EngineError, EngineInfo, EngineReply, EngineRequest
from evaluators.engines.server import (ManagedServer, check_python, finish_probe, simulated_acceptance_problem,
                                      start_probe)
from evaluators.harness import Progress, eval_protocol, quiet
from evaluators.settings import EvalSettings
from evaluators.pooling import SCHEMA
from evaluators.scoring import completion_bounds
from evaluators.target import content_digest, load_tokenizer, stop_token_ids, text_config
from tracker import config, lifecycle
from tracker.environment import fingerprint
from tracker.measurement import context, known_bad
from tracker.measurement import engine_metrics as em
from tracker.measurement.uncertainty import results_uncertainty

# Each engine's module: its client class, and what its managed server loads (`prepare`) and runs.
ENGINES = {vllm.NAME: vllm, sglang.NAME: sglang, llamacpp.NAME: llamacpp}
TENSOR_PARALLEL = (vllm.NAME, sglang.NAME)  # engines a managed eval starts split over the job's GPUs
CLIENTS: dict[str, type[EngineClient]] = {vllm.NAME: vllm.VLLMClient, sglang.NAME: sglang.SGLangClient,
                                          llamacpp.NAME: llamacpp.LlamaCppClient}


@dataclass(frozen=True)
class EngineSettings:
    name: str  # config.ENGINES
    python: str | None = None  # managed: the engine's own interpreter
    url: str | None = None  # attached: a running server
    port: int | None = None  # managed: listen here instead of a free port
    num_speculative_tokens: int | None = None  # default: block_size - 1
    concurrency: tuple[int, ...] = ()  # a load sweep's levels (evaluators.engines.load); () for none
    repeats: int | None = None  # a load sweep's rounds per level (None: config.DEFAULT_REPEATS)
    prefix_caching: bool = False  # managed vLLM: serve with its prefix cache on (a load sweep's cache dimension)
    tensor_parallel: int = 1  # managed vLLM / SGLang on cuda: the target split over this many GPUs (the job's)

    def __post_init__(self):
        if self.name not in config.ENGINES:
            raise EngineError(f"--engine must be one of {', '.join(config.ENGINES)}, got {self.name!r}")
        if self.url and self.python:
            raise EngineError("--engine-url attaches to a running server; --engine-python starts one: give one")
        if not all(isinstance(c, int) and 1 <= c <= config.MAX_CONCURRENCY for c in self.concurrency):
            raise EngineError(f"--concurrency: each level must be an integer from 1 to {config.MAX_CONCURRENCY}, "
                              f"got {list(self.concurrency)}")
        problem = config.load_problem(self.name, self.concurrency, attached=bool(self.url))
        if problem:
            raise EngineError(f"--concurrency: {problem}")
        problem = config.repeats_problem(self.repeats, self.concurrency)
        if problem:
            raise EngineError(problem)
        if self.prefix_caching and self.name not in config.PREFIX_CACHE_ENGINES:
            raise EngineError(f"--prefix-caching: draftboard starts {', '.join(config.PREFIX_CACHE_ENGINES)} with its "
                              f"prefix cache on; {self.name}'s cache switch is not offered yet")
        if self.tensor_parallel > 1 and (self.url or self.name not in TENSOR_PARALLEL):
            raise EngineError(f"--gpus {self.tensor_parallel} with --engine {self.name}: " + (
                "an attached server keeps its own parallelism (the results record what it reports)" if self.url else
                f"draftboard starts {', '.join(TENSOR_PARALLEL)} with tensor parallelism; {self.name}'s is not offered"))
        if self.prefix_caching and self.url:
            raise EngineError("--prefix-caching starts a server with its prefix cache on; an attached server keeps its "
                              "own setting (the results record it): drop --prefix-caching")

    @property
    def server_options(self) -> dict:
        """What the managed server is started with beyond the eval's own settings (checked above: the prefix cache
        on vLLM only, tensor parallelism on vLLM and SGLang)."""
        return {**({"prefix_caching": True} if self.prefix_caching else {}),
                **({"tensor_parallel": self.tensor_parallel} if self.tensor_parallel > 1 else {})}

    @property
    def rounds(self) -> int:
        """A load sweep's rounds per level."""
        return self.repeats or config.DEFAULT_REPEATS

    @property
    def slots(self) -> int:
        """Requests a managed server takes at once: the sweep's largest level, else 1."""
        return max(self.concurrency, default=1)

    @property
    def managed(self) -> bool:
        return not self.url


def check_url(url: str) -> str:
    """An attached server's URL: http(s), and one of DRAFTBOARD_ENGINE_URLS once the deployment sets any
    (a queued job may use no other: tracker.jobs.worker)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise EngineError(f"--engine-url {url!r}: expected http(s)://HOST:PORT, without a user or password")
    problem = config.engine_url_problem(url, job=False)
    if problem:
        raise EngineError(f"--engine-url {problem}")
    return url.rstrip("/")


def check_settings(s: EvalSettings, e: EngineSettings) -> None:
    """What an engine eval cannot do, refused before anything starts."""
    if s.completions:
        raise EngineError("--engine generates its own completions; drop --completions")
    if s.scoring != config.EVAL_SCORINGS[0]:
        raise EngineError(f"--engine is its own scoring ({config.ENGINE_SCORING}); drop --scoring {s.scoring}")
    if s.drafter_precision:
        raise EngineError("--drafter-precision is an offline setting; the engine runs the drafter in --dtype")
    if s.samples > 1 or s.seeds > 1:
        raise EngineError("--samples and --seeds are offline settings; an engine eval sends each prompt once "
                          "(at --temperature > 0, one sampled run per prompt)")


def _check_serves(info: EngineInfo, target: str, drafter: str, n_spec: int) -> None:
    """Refuse a server that serves another target or drafter than it was given (a managed server: what
    `prepare` made of them, e.g. GGUF files), or drafts another number of tokens."""
    def same(served: str | None, wanted: str) -> bool:
        return served is None or Path(served).name == Path(wanted).name or \
            Path(served).expanduser().resolve() == Path(wanted).resolve()

    if not same(info.model, target):
        raise EngineError(f"{info.name} at {info.url} serves {info.model}, not the target {target}")
    if not same(info.draft_model, drafter):
        raise EngineError(f"{info.name} at {info.url} drafts with {info.draft_model}, not {drafter}")
    if info.num_speculative_tokens is not None and info.num_speculative_tokens != n_spec:
        raise EngineError(f"{info.name} at {info.url} drafts {info.num_speculative_tokens} tokens per step; "
                          f"this eval asks for {n_spec} (--num-speculative-tokens)")


def evaluate_engine(s: EvalSettings, e: EngineSettings, progress: Progress = quiet, log_dir: Path | None = None) -> dict:
    """Run the prompts through the engine; the results JSON (DESIGN.md), with `engine` and per-prompt
    `engine_*` counts. Managed: the server is started here and stopped on every exit path."""
    t0 = time.perf_counter()
    check_settings(s, e)
    problem = simulated_acceptance_problem(os.environ) if e.managed else None
    if problem:
        raise EngineError(problem)
    url = None if e.managed else check_url(e.url)
    python = check_python(e.python or config.engine_python(e.name), e.name) if e.managed else None
    cfg = text_config(s.target)
    tokenizer = load_tokenizer(s.target)
    prompts = load_benchmark(s.prompts, tokenizer, cfg.vocab_size, s.enable_thinking, s.limit_per_dataset,
                             s.prompt_tokens)
    checked = open_drafter(s.drafter, TargetDims(cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size))
    drafter = checked.config
    block = drafter.block_size
    n_spec = e.num_speculative_tokens or block - 1
    if not 1 <= n_spec <= block - 1:
        raise EngineError(f"--num-speculative-tokens must be 1..{block - 1} (block size {block} - 1), got {n_spec}")
    if e.managed and not (Path(s.drafter).is_dir() and (Path(s.drafter) / "config.json").is_file()):
        raise EngineError(f"--drafter {s.drafter}: an engine loads a drafter folder (config.json + safetensors), "
                          "not a single checkpoint file")
    hybrid = "linear_attention" in (getattr(cfg, "layer_types", None) or [])
    device = s.device or fingerprint.default_device()
    engine = ENGINES[e.name]
    problem = config.engine_hybrid_problem(e.name, device, s.dtype) if e.managed and hybrid else None
    if problem:
        raise EngineError(problem)
    if hybrid and e.prefix_caching:
        raise EngineError("--prefix-caching on a hybrid (Gated DeltaNet) target: a cached prefix resumes another "
                          "request's recurrent state (vLLM #53912: spec decode with it corrupts output), so draftboard "
                          "serves hybrids with the prefix cache off")
    stops = sorted(stop_token_ids(s.target, cfg))
    request = EngineRequest.of(s.sampling, s.max_new_tokens, stops)
    longest = max(len(p.input_ids) for p in prompts) + s.max_new_tokens + block
    max_model_len = min(getattr(cfg, "max_position_embeddings", longest) or longest, max(longest, 256))
    if longest > max_model_len:
        raise EngineError(f"the longest prompt + --max-new-tokens + a block ({longest} tokens) exceeds the target's "
                          f"context of {max_model_len}")
    if e.managed and max_model_len * e.slots > config.MAX_SERVED_CONTEXT:  # before a server is asked to allocate it
        raise EngineError(f"a context of {max_model_len} tokens for each of {e.slots} slots is more than a managed "
                          f"server is asked to hold ({config.MAX_SERVED_CONTEXT} tokens): fewer concurrency levels' "
                          "slots, or shorter prompts")
    progress("load", 1, 1)

    server, alone, probes, prepared, served = None, None, {}, {}, (s.target, s.drafter)
    # A managed sweep serves the target alone beside the drafter's server: each takes its share of the device.
    options = {**e.server_options, **(engine.shared_device_options(device, 2) if e.concurrency and e.managed else {})}
    with contextlib.ExitStack() as stack:
        if e.managed:
            # What the server loads: the folders as draftboard checked them (staging: no code, no other
            # weight files, the architectures it decided), converted to GGUF for llama.cpp; then the
            # server; the engine's own Python reports its versions and, for a hybrid, its GDN code.
            cache = Path(s.cache_dir) if s.cache_dir else config.cache_dir()
            stack.enter_context(lifecycle.sigterm_exits())  # a cancel while converting still cleans up
            folders = stack.enter_context(staging.staged(s.target, s.drafter, checked, cache))
            *served, prepared = engine.prepare(python, folders, s.dtype, cache, progress)
            probes = {"report": start_probe(python, fingerprint.ENGINE_PROBE),
                      "gdn": start_probe(python, engine.GDN_PROBE) if hybrid and engine.GDN_PROBE else None}
            server = _managed(e, s, python, served, n_spec, max_model_len, device, log_dir, options, progress,
                              port=e.port)
            if e.concurrency:  # a sweep's target alone: the same settings without the drafter, up beside the
                # drafter's server, so on a free port of its own (--engine-port is the drafter's)
                alone = _managed(e, s, python, (served[0], None), n_spec, max_model_len, device, log_dir, options,
                                 progress, port=None, arm="-alone")
                stack.callback(alone.stop)
        start = time.perf_counter()
        try:
            # On CPU the two servers start at once; on a GPU the second once the first is up (vLLM sizes its memory
            # from what is free when it starts).
            if alone and device == "cpu":
                alone.launch()
            with server or contextlib.nullcontext():
                info, replies, logged, started_s, requests_s, client = _serve(
                    server, url, e, s, prompts, request, engine, tuple(served), hybrid, n_spec, device, options,
                    progress, start)
                if alone and alone.proc is None:
                    alone.launch()
                levels = _sweep(e, client, server, alone.ready() if alone else None,
                                load.requests_of(prompts, replies), request, progress) if e.concurrency else []
            report, gdn_probe = (finish_probe(probes.get(k)) for k in ("report", "gdn"))
        finally:
            for proc in probes.values():  # an eval that failed early leaves no probe behind
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    linear_attention = gdn.record(e.name, gdn_probe, logged, engine.gdn_functions_from_log(logged),
                                  info.settings).to_dict() if hybrid else None

    results = _results(prompts, replies, block, stops, s)
    # The model runner decides which algorithm ran (DFlash2's selector runs on vLLM's V2 only): what the start log
    # said, never a guess from the version's default (None: not logged, an attached server's own log).
    results["engine"] = {**info.to_dict(), **prepared, "managed": e.managed, "linear_attention": linear_attention,
                         "model_runner": logged.get("model_runner")}
    results["engine"]["known_bad"] = _known_bad(results["engine"], hybrid, drafter.family)
    if levels:
        results["load"] = _load(e, s, prompts, replies, levels, info.settings,
                                tuple(results["context_buckets"]))
        results["load_break_even_concurrency"] = load.break_even(results["load"])
        results["definitions"].update(load.DEFINITIONS)
    # The engine's own end-of-generation rule (vLLM and SGLang count their last step whole, as `full`
    # does; llama.cpp drafts no further than `cut`): an offline eval under the other rule differs
    # there, and the protocol says so rather than claiming the eval's own rule.
    protocol = eval_protocol(s, prompts, tokenizer, block, stops, content_digest(s.target),
                             scoring=config.ENGINE_SCORING)
    results["protocol"] = dataclasses.replace(protocol, last_block=engine.LAST_BLOCK).to_dict()
    results.update({
        "fingerprint": fingerprint.engine(report, {"engine": e.name, "version": info.version, "url": info.url,
                                                   "python": python, "model_runner": logged.get("model_runner")},
                                          s.dtype,
                                          f"{e.name}-native" if hybrid else "n/a", linear_attention),
        "timing": {"engine_start_s": started_s, "requests_s": requests_s, "total_s": time.perf_counter() - t0},
        "settings": {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(s).items()},
                     "engine": e.name, "engine_url": info.url, "num_speculative_tokens": n_spec},
        "target": {"path": str(Path(s.target).resolve()), "num_layers": cfg.num_hidden_layers},
        "drafter": {"path": str(Path(s.drafter).resolve()), "target_layer_ids": list(drafter.target_layer_ids),
                    "mask_token_id": drafter.mask_token_id, "family": drafter.family},
    })
    return results


def _known_bad(engine_record: dict, hybrid: bool, family: str) -> list[dict]:
    """The rows of the known-bad table that hold for the box this eval measured (tracker/measurement/known_bad.py),
    each said on stderr as it is found: a number from such a box is not the drafter's."""
    from evaluators.doctor.serving import from_engine_eval

    rows = known_bad.matches(from_engine_eval(engine_record).record(hybrid, family))
    for row in rows:
        print(f"warning: known-bad serving box: {row.id}: {row.text}; {row.fix}", file=sys.stderr)
    return [{"id": row.id, "severity": row.severity, "effect": row.effect, "source": row.source, "fix": row.fix}
            for row in rows]


def _serve(server: ManagedServer | None, url: str | None, e: EngineSettings, s: EvalSettings, prompts,
           request: EngineRequest, engine, served: tuple[str, str], hybrid: bool, n_spec: int, device: str,
           options: dict, progress: Progress, start: float):
    """Inside the server's life: what it serves (checked against `served`: target, drafter), then one
    request per prompt; and the client, for the sweep."""
    client = CLIENTS[e.name](server.url if server else url)
    client.cross_check = server is not None  # managed: no other client moves its counters
    info = client.info()
    started_s = time.perf_counter() - start
    logged: dict = {}
    if server:
        log = server.log.read_text(errors="replace")
        info.aux_layers = engine.aux_layers_from_log(log)
        logged = engine.settings_from_log(log)
        info.draft_model = info.draft_model or served[1]
        info.method = info.method or "dflash"
        info.settings = {**engine.managed_settings(device, config.DTYPES[s.dtype], e.slots, **options),
                         **info.settings}
    _check_serves(info, *served, n_spec)
    if hybrid and em.prefix_cache(info.settings):
        raise EngineError(f"{e.name} at {info.url} caches prefixes on a hybrid target: a cached prefix resumes "
                          "another request's Gated DeltaNet state, so one prompt's acceptance would depend on the one "
                          f"before; restart it with {engine.PREFIX_CACHE_OFF}")
    info.num_speculative_tokens = info.num_speculative_tokens or n_spec
    replies: list[EngineReply] = []
    t_requests = time.perf_counter()
    for i, p in enumerate(prompts, 1):
        with _death_told([server] if server else [], e.name, f"prompt {p.id!r}"):
            replies.append(client.generate(p.input_ids, request))
        progress(f"{e.name}: requests", i, len(prompts))
    requests_s = time.perf_counter() - t_requests
    return info, replies, logged, started_s, requests_s, client


class ServerDied(EngineError):
    """A managed server died under a request (`server`: which)."""

    def __init__(self, message: str, server: ManagedServer):
        super().__init__(message)
        self.server = server


@contextlib.contextmanager
def _death_told(servers: list[ManagedServer], name: str, where: str):
    """A request that failed because a managed server died says so, with the last lines of its log (a reset
    connection is often a server's last word: llama.cpp's DFlash aborts in `get_sub_batch` with parallel slots)."""
    try:
        yield
    except EngineError:
        for server in servers:
            if server.exited(within_s=3.0):
                raise ServerDied(f"{name} server died mid-run ({where}, exit code {server.proc.returncode}); its log "
                                 f"({server.log}) ends: {server.log_tail()}", server) from None
        raise


def _managed(e: EngineSettings, s: EvalSettings, python: str, served: Sequence[str | None], n_spec: int,
             max_model_len: int, device: str, log_dir: Path | None, options: dict, progress: Progress, *,
             port: int | None, arm: str = "") -> ManagedServer:
    """A managed server of `served` (target, drafter; no drafter: the target alone) on the eval's settings,
    listening on `port` (None: a free one)."""
    engine = ENGINES[e.name]
    log = (log_dir or config.logs_dir()) / f"engine-{e.name}{arm}-{time.strftime('%Y%m%d-%H%M%S')}-{id(s):x}.log"
    return ManagedServer(
        e.name, lambda port: engine.server_argv(python, *served, port, n_spec, config.DTYPES[s.dtype],
                                                max_model_len, device, e.slots, **options),
        log, port=port, env=engine.server_env(device), start_s=config.engine_start_s(), progress=progress)


def _sweep(e: EngineSettings, client: EngineClient, server: ManagedServer | None, alone: ManagedServer | None,
           sweep: list[load.Request], request: EngineRequest, progress: Progress) -> list[load.Level]:
    """The load sweep's levels (evaluators.engines.load). Managed: the target alone on its own server (`alone`),
    up beside the drafter's for the whole sweep so that their rounds interleave, both checked by the counters;
    attached: the drafter's rounds alone."""
    client.cross_check = False  # at concurrency > 1 the counters move for several requests: checked per round
    servers = [x for x in (server, alone) if x]
    other = CLIENTS[e.name](alone.url) if alone else None
    levels = []
    for c in e.concurrency:
        aborts: list[dict] = []
        while True:
            groups = {"drafter": server.pgid, **({"alone": alone.pgid} if alone else {})} if server else None
            try:
                with _death_told(servers, e.name, f"concurrency {c}"):
                    level = load.rounds_at(sweep, c, e.rounds, request, client, other, server is not None, groups,
                                           lambda what, i, c=c: progress(f"{e.name}: concurrency {c}, {what}", i,
                                                                         len(sweep)))
                break
            except ServerDied as died:
                # Counted at the level it happened, never hidden by lowering the level: the server is started
                # again (same settings, same port) and the level measured from its warm-up (issue 66).
                if len(aborts) >= config.MAX_SERVER_DEATHS:
                    raise EngineError(f"{died} ({len(aborts) + 1} deaths at concurrency {c}: given up)") from None
                aborts.append({"server": "drafter" if died.server is server else "target alone",
                               "exit_code": died.server.proc.returncode, "log_tail": died.server.log_tail()[:2000]})
                print(f"warning: {died}; starting it again", file=sys.stderr)
                died.server.stop()
                died.server.launch().ready()
        level.aborts = aborts
        levels.append(level)
    return levels


def _results(prompts, replies: list[EngineReply], block: int, stops: list[int], s: EvalSettings) -> dict:
    rows, walks = [], []
    for p, r in zip(prompts, replies):
        steps = r.steps_multiset
        if steps is None:
            raise EngineError(f"prompt {p.id!r}: the engine reported no per-step acceptance ({r.source}); "
                              "draftboard's tau needs at least its histogram")
        completion, _ = completion_bounds(r.completion_ids, s.max_new_tokens, set(stops))
        walks.append([a + 1 for a in steps])
        rows.append({
            "id": p.id, "dataset": p.dataset, "category": p.category, "input_ids": p.input_ids,
            "completion_ids": completion, "acceptance_lengths": walks[-1],
            "engine_drafts": r.drafts, "engine_draft_tokens": r.draft_tokens, "engine_accepted": r.accepted,
            "engine_accepted_by_position": r.accepted_by_position,
            "engine_accepted_per_step": r.accepted_per_step, "engine_steps_ordered": r.accepted_per_step is not None,
            "engine_reported_mean": r.reported_mean, "engine_source": r.source,
        })
    summary = metrics.summarize_walks(walks, block)
    drafts, accepted = sum(r.drafts for r in replies), sum(r.accepted for r in replies)
    results = {
        "schema": SCHEMA, "block_size": block, "tau": summary.tau, "tau_pooled": summary.tau_pooled,
        "tau_all_anchors": None,  # an offline statistic: an engine drafts only where its walk goes
        "streak": summary.streak, "accept_rate_by_position": summary.accept_rate_by_position,
        "accept_len_histogram": summary.accept_len_histogram, "n_blocks": summary.n_blocks, "ddtree": {},
        "engine_mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "definitions": {
            "engine_tau_by_context": context.DEFINITION + "; blocks are the engine's steps, in the order it reported "
                                     "them (null where it reported none in order)",
            "tau": "per-prompt mean of the engine's per-step acceptance lengths (accepted drafts + 1), averaged "
                   "over prompts",
            "tau_pooled": "every step of every prompt weighted equally",
            "engine_mean_acceptance_length": "1 + sum(accepted draft tokens) / sum(drafts): vLLM's definition "
                                             "(it equals tau_pooled when every step is counted)",
        },
        "prompts": rows,
    }
    results.update(results_uncertainty(rows))
    results["context_buckets"], results["engine_tau_by_context"] = _engine_by_context(
        [(len(p.input_ids), r.accepted_per_step) for p, r in zip(prompts, replies)], s.context_buckets)
    if results["engine_tau_by_context"] is None:  # said, never silently absent (issue 65 M5)
        unordered = sum(r.accepted_per_step is None for r in replies)
        results["engine_tau_by_context_unavailable"] = (
            f"{unordered} of {len(replies)} replies give no per-step acceptance in order ({replies[0].source}: "
            "drafted and accepted tokens per request, or counts by draft position), so no step has a known context")
    return results


def _engine_by_context(steps: list[tuple[int, list[int] | None]], edges: tuple[int, ...]) -> tuple[list[int], list | None]:
    """The edges and `engine_tau_by_context` from each request's (prompt length, ordered accepted per step):
    None where the engine did not report its steps in order (llama.cpp: counts per position only)."""
    if any(accepted is None for _, accepted in steps):
        return list(edges), None
    edges, rows = context.by_walks([(n, [a + 1 for a in accepted]) for n, accepted in steps], edges)
    return list(edges), rows


def _load(e: EngineSettings, s: EvalSettings, prompts, replies, levels: list[load.Level], cache: dict,
          edges: tuple[int, ...]) -> list[dict]:
    """The results' `load` list: one record per level, flags against concurrency 1, the target alone and the
    level's first round."""
    sweep = load.requests_of(prompts, replies)
    greedy = s.temperature == 0
    records = []
    for level in levels:
        first, alone = level.drafted[0], level.alone[0] if level.alone else None
        found = load.flags(sweep, level.concurrency, first, alone, greedy, cache) + \
            load.between_rounds(sweep, level.drafted, greedy)
        record = load.level_record(level, found, checked=e.managed)
        _, record["engine_tau_by_context"] = _engine_by_context(
            [(len(p.input_ids), served.counts.accepted_per_step) for p, served in zip(prompts, first.served)], edges)
        records.append(record)
    return records
