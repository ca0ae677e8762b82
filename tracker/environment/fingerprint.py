"""Environment fingerprints: what produced a number, and whether two numbers are comparable.

A fingerprint is a plain JSON-able dict with the fixed top-level keys `software`, `hardware`,
`numerics`, `code` and optional `probe` (DESIGN.md). It records what actually runs (which
implementation transformers resolved for the linear-attention layers), not what is installed.
`diff` compares two fingerprints field by field with a severity; `env_hash` is a short stable
hash over the fields that can change the numbers, so equal hashes mean comparable numbers.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from tracker import config
from tracker.environment import linear_attn
from tracker.environment.evidence.decide import Decision
from tracker.errors import DraftboardError
from tracker.store import checkpoints, names

SCHEMA = "draftboard.fingerprint/1"
PACKAGES = {  # fingerprint key -> distribution name
    "torch": "torch",
    "transformers": "transformers",
    "flash-linear-attention": "flash-linear-attention",
    "fla-core": "fla-core",
    "causal-conv1d": "causal-conv1d",
    "triton": "triton",
    "kernels": "kernels",
    "flash-attn": "flash-attn",
    "draftboard": "draftboard",
}
PROBE_SEED, PROBE_LEN = 1234, 64
PROBE_RTOL = 1e-3  # relative difference of probe statistics above which numbers differ


# --------------------------------------------------------------------------- capture


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str | None], ...]:
    """Versions of PACKAGES, read once per process: what this process imported does not change
    when someone upgrades a package under it (and reading dist metadata costs tens of ms)."""
    return tuple((key, _version(dist)) for key, dist in PACKAGES.items())


def _software() -> dict:
    import torch

    sw = {"python": platform.python_version()}
    sw.update(dict(_installed()))
    sw["cuda"] = torch.version.cuda
    sw["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return sw


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    parts = text.split("Kernel Module")
    return parts[1].split()[0] if len(parts) > 1 and parts[1].split() else text.splitlines()[0]


def _hardware(device: str) -> dict:
    import torch

    hw = {"device": device.split(":")[0], "gpu_name": None, "gpu_count": 0, "capability": None,
          "driver": _driver(), "cpu": _cpu_name(), "gpus": [],
          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if torch.cuda.is_available():
        index = (torch.device(device).index or 0) if device.startswith("cuda") else 0
        hw["gpu_count"] = torch.cuda.device_count()
        hw["gpu_name"] = torch.cuda.get_device_name(index)
        hw["capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
        # which devices it ran on (a worker gives each job its own: tracker/jobs/gpus.py); the UUID where the
        # driver gives one
        hw["gpus"] = [{"index": i, "name": torch.cuda.get_device_name(i),
                       "uuid": str(getattr(torch.cuda.get_device_properties(i), "uuid", "") or "") or None}
                      for i in range(hw["gpu_count"])]
    return hw


def _numerics(dtype: str, drafter_precision: str, resolution: linear_attn.Resolution | None,
              attn_implementation: str | None) -> dict:
    import torch

    cuda = torch.backends.cuda
    numerics = {
        "dtype": dtype,  # the target's: its hidden states (the drafter's features) and the probe
        "drafter_precision": drafter_precision,  # config.DRAFTER_PRECISIONS: cast vs autocast, and its dtype
        "tf32_matmul": bool(cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "sdpa_backends": {
            "flash": cuda.flash_sdp_enabled(),
            "mem_efficient": cuda.mem_efficient_sdp_enabled(),
            "math": cuda.math_sdp_enabled(),
            "cudnn": cuda.cudnn_sdp_enabled(),
        },
        "attn_implementation": attn_implementation,
        "linear_attention": None if resolution is None else resolution.to_dict(),
        "linear_attention_path": None if resolution is None else resolution.path,
    }
    return numerics if resolution is not None else {k: v for k, v in numerics.items() if k not in TARGET_NUMERICS}


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _code(code_dir: str | os.PathLike | None) -> dict:
    cwd = Path(code_dir or os.getcwd())
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return {"repo": str(cwd), "git_commit": None, "dirty": None, "diff_digest": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd) or ""
    diff = _git(["diff", "HEAD"], cwd) or ""
    return {
        "repo": str(cwd),
        "git_commit": commit.strip(),
        "dirty": bool(status.strip()),
        "diff_digest": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None,
    }


def probe(model, layers: list[int] | None = None, device: str | None = None) -> dict:
    """Run a fixed, seeded token sequence through `model` and summarise its hidden states.

    `layers` are decoder-layer indices (the output of layer i is hidden_states[i + 1]); default
    all. The digest is exact (bitwise); the statistics let `diff` judge how far apart two
    environments are when the digests differ.
    """
    import torch

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    gen = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(0, cfg.vocab_size, (1, PROBE_LEN), generator=gen)
    device = device or str(next(model.parameters()).device)
    with torch.no_grad():
        out = model(input_ids=ids.to(device), output_hidden_states=True, use_cache=False)
    n_layers = len(out.hidden_states) - 1
    layers = list(range(n_layers)) if layers is None else list(layers)
    digest = hashlib.sha256()
    stats = {}
    for i in layers:
        h = out.hidden_states[i + 1].float().cpu()
        digest.update(h.numpy().tobytes())
        stats[str(i)] = {"mean": h.mean().item(), "std": h.std().item(), "absmax": h.abs().max().item()}
    return {"seed": PROBE_SEED, "length": PROBE_LEN, "digest": digest.hexdigest()[:16], "layers": stats}


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# What only a loaded target tells: numerics fields read off its modeling module (plus the probe).
TARGET_NUMERICS = ("linear_attention", "linear_attention_path", "attn_implementation")


def target_part(fp: dict) -> dict:
    """The part of a captured fingerprint that needed the loaded target (its probe included)."""
    return {"numerics": {k: fp["numerics"][k] for k in TARGET_NUMERICS}, "probe": fp.get("probe")}


def with_target_part(fp: dict, part: dict) -> dict:
    """A fingerprint captured without the target, completed by a `target_part` taken earlier for
    the same target in the same environment (the eval cache keys it so): what `capture` with the
    loaded target would give, without loading it."""
    out = {**fp, "numerics": {**fp["numerics"], **part["numerics"]}}
    out.pop("probe", None)
    return out if part.get("probe") is None else {**out, "probe": part["probe"]}


def capture(target=None, device: str | None = None, dtype: str | None = None, *,
            probe_layers: list[int] | None = None, with_probe: bool = True,
            code_dir: str | os.PathLike | None = None, drafter_precision: str | None = None,
            with_kernels: bool = True) -> dict:
    """Fingerprint this process's environment, optionally with a loaded target model.

    With a target, its own modeling module is resolved (a non-hybrid target reports `n/a`) and a
    numerical probe of its hidden states is added. Without one, the Qwen3.5 module is resolved:
    what a hybrid target would run here. Capturing only reads: the kernel path is whatever the
    caller put in place (`tracker.environment.linear_attn.apply`, done by whoever loads the model), so
    recording an environment never changes it.

    `dtype` is the target's (what its features and the probe were computed in); the probe runs
    the target as loaded, so load it in that dtype. `drafter_precision` says how the drafter
    computed (config.DRAFTER_PRECISIONS; default: its weights cast to `dtype`, as an eval does).
    `with_kernels=False` (no target) leaves the target's numerics (TARGET_NUMERICS) out, for a
    caller that completes them with a cached `target_part`: resolving the Qwen3.5 module imports
    transformers' modeling code, which such a caller would pay for nothing.
    """
    device = device or default_device()
    dtype = dtype or "fp32"
    if dtype not in config.DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(config.DTYPES)}")
    drafter_precision = drafter_precision or dtype
    module = linear_attn.module_of(target) if target is not None else linear_attn.DEFAULT_MODULE
    probed = probe(target, probe_layers, device) if target is not None and with_probe else None
    # Resolved after the probe: transformers logs its fallback warnings at the first forward.
    resolution = linear_attn.resolve(module) if with_kernels or target is not None else None
    attn_impl = getattr(getattr(target, "config", None), "_attn_implementation", None)
    fp = {
        "schema": SCHEMA,
        "source": {"kind": "captured"},
        "software": _software(),
        "hardware": _hardware(device),
        "numerics": _numerics(dtype, drafter_precision, resolution, attn_impl),
        "code": _code(code_dir),
    }
    if probed is not None:
        fp["probe"] = probed
    return fp


def imported(source_path: str | os.PathLike, fmt: str, known: Mapping[str, object] | None = None,
             evidence: Decision | None = None) -> dict:
    """Fingerprint of a run imported from a file: where it came from, what the file states (`known`:
    dotted fields such as `software.torch`, `engine.version`), every other field unknown. `evidence`
    (tracker.environment.evidence.decide) adds the fields the run's own files state, the `evidence` map
    citing each, and under `source.contradictions` where those files disagree."""
    path = Path(source_path)
    digest = checkpoints.digest(path)[1][:16] if path.is_file() else None  # streamed: logs can be large
    source = {"kind": "imported", "file": str(path.resolve()), "format": fmt, "sha256": digest}
    fp = _stated(_unknown(source), {**(evidence.known if evidence else {}), **(known or {})})
    if evidence is not None:
        fp["evidence"] = evidence.evidence
        if evidence.contradictions:
            source["contradictions"] = list(evidence.contradictions)
    return fp


def evidence_may_replace(fp: dict | None) -> bool:
    """Whether a fingerprint read from a run's files may be stored over `fp`: none yet, or one that was itself
    read from files. A fingerprint draftboard captured in the run's own environment is a measurement; a console
    never replaces it."""
    source = (fp or {}).get("source")
    return fp is None or (isinstance(source, dict) and source.get("kind") == "imported")


def _evidence(fp: dict) -> dict:
    return fp.get("evidence") if isinstance(fp.get("evidence"), dict) else {}


def citations(fp: dict, field: str) -> list[dict]:
    """The evidence a fingerprint cites for one dotted field ([] for a captured one, or a field no file stated)."""
    out = _evidence(fp).get(field)
    return [c for c in out if isinstance(c, dict)] if isinstance(out, list) else []


def cited(fp: dict) -> list[tuple[str, Any, dict]]:
    """(field, its value in `fp`, one citation) for every citation of a fingerprint read from files, fields in
    order: what env-diff prints and Environments shows. [] for a fingerprint captured live."""
    evidence = _evidence(fp)
    flat = flatten({k: v for k, v in fp.items() if k not in ("probe", "evidence")}) if evidence else {}
    return [(field, flat.get(field), cite) for field in sorted(evidence) for cite in citations(fp, field)]


def contradictions(fp: dict) -> list[str]:
    """Where a fingerprint's files disagree (`source.contradictions`), one line each."""
    source = fp.get("source") if isinstance(fp.get("source"), dict) else {}
    said = source.get("contradictions")
    return [str(text) for text in said] if isinstance(said, list) else []


def published(source: dict, known: dict | None = None) -> dict:
    """Fingerprint of published numbers: only what the publication states, the rest unknown."""
    return _stated(_unknown({"kind": "published", **source}), known)


def _stated(fp: dict, known: Mapping[str, object] | None) -> dict:
    """`fp` with the dotted fields a source states (`software.torch`: "2.13.0", `engine.name`: "vllm")."""
    for dotted, value in (known or {}).items():
        section, key = dotted.split(".", 1)
        fp.setdefault(section, {})[key] = value
    return fp


# What an engine's own Python reports of itself (`engine`): run there with `python -c`, so it
# imports only the standard library and what it measures; prints one JSON object.
ENGINE_WHEELS = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "xllamacpp"}  # engine -> the package serving it
ENGINE_PACKAGES = {**PACKAGES, **{wheel: wheel for wheel in ENGINE_WHEELS.values()}}
ENGINE_PROBE = """
import importlib.metadata as md, json, platform
def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None
out = {"python": platform.python_version(), "packages": {k: version(d) for k, d in %r.items()}}
try:
    import torch
    out["cuda"] = torch.version.cuda
    out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if torch.cuda.is_available():
        out["gpu_name"], out["gpu_count"] = torch.cuda.get_device_name(0), torch.cuda.device_count()
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
except Exception as exc:
    out["torch_error"] = repr(exc)[:300]
print(json.dumps(out))
""" % (ENGINE_PACKAGES,)


def engine(report: dict | None, source: dict, dtype: str, linear_attention_path: str,
           linear_attention: dict | None = None) -> dict:
    """Fingerprint of a serving engine's environment: what its own Python reported (`ENGINE_PROBE`,
    None for an attached server on another box: then only what the server says), plus the engine's
    name and version under `engine`, so `env-diff` compares a training run with a serving box.
    `linear_attention` (a hybrid target: evaluators.engines.gdn's record) puts the engine's own code
    for each Gated DeltaNet piece under the names offline fingerprints use, so the diff and
    `linear_attn.side_by_side` compare serving with training and the offline eval per piece; the
    engine settings that change GDN results go under `engine.settings`."""
    fp = _unknown({"kind": "engine", **source})
    report = report or {}
    packages = report.get("packages") or {}
    fp["software"].update({"python": report.get("python"), **{k: packages.get(k) for k in PACKAGES},
                           "cuda": report.get("cuda"), "cudnn": report.get("cudnn")})
    gpu = report.get("gpu_name")
    fp["hardware"].update({"device": ("cuda" if gpu else "cpu") if report else None, "gpu_name": gpu,
                           "gpu_count": report.get("gpu_count", 0 if report else None),
                           "capability": report.get("capability"), "cpu": _cpu_name() if report else None})
    fp["numerics"].update({"dtype": dtype, "drafter_precision": dtype, "linear_attention_path": linear_attention_path})
    # The server's own version, else the version of the package serving it (llama.cpp's wheels state no build)
    name = source.get("engine")
    wheel = ENGINE_WHEELS.get(name)
    packaged = packages.get(wheel)
    fp["engine"] = {"name": name, "version": source.get("version") or (
        f"{wheel} {packaged}" if packaged and wheel != name else packaged)}
    if source.get("model_runner"):  # vLLM's V1 / V2: which algorithm a DFlash2 checkpoint ran (issue 51)
        fp["engine"]["model_runner"] = source["model_runner"]
    served_by = {k: v for k, v in packages.items() if k not in PACKAGES and isinstance(v, str)}
    if served_by:  # the engine's own packages
        fp["engine"]["packages"] = served_by
    if linear_attention is not None:
        fp["numerics"]["linear_attention"] = {k: linear_attention.get(k) for k in ("functions", "summary", "platform")}
        fp["engine"]["settings"] = dict(linear_attention.get("settings") or {})
    return fp


def _unknown(source: dict) -> dict:
    return {
        "schema": SCHEMA,
        "source": source,
        "software": {"python": None, **{key: None for key in PACKAGES}, "cuda": None, "cudnn": None},
        "hardware": {k: None for k in ("device", "gpu_name", "gpu_count", "capability", "driver", "cpu")},
        "numerics": {"dtype": None, "drafter_precision": None, "attn_implementation": None,
                     "linear_attention_path": None},
        "code": {"repo": None, "git_commit": None, "dirty": None, "diff_digest": None},
    }


# --------------------------------------------------------------------------- compare

SECTIONS = ("software", "hardware", "numerics", "code")


def check(fp: object, where: str) -> None:
    """DraftboardError unless `fp` has the shape `diff` reads (a damaged file, someone's other JSON)."""
    if not isinstance(fp, dict) or "software" not in fp:
        raise DraftboardError(f"{where}: not a fingerprint (a JSON object with a 'software' section)")
    for section in (*SECTIONS, "probe"):
        if fp.get(section) is not None and not isinstance(fp[section], dict):
            raise DraftboardError(f"{where}: fingerprint section {section!r} is not a JSON object")
    layers = (fp.get("probe") or {}).get("layers", {})
    if not isinstance(layers, dict) or not all(
        isinstance(stats, dict) and all(isinstance(stats.get(k), (int, float)) for k in ("mean", "std", "absmax"))
        for stats in layers.values()
    ):
        raise DraftboardError(f"{where}: fingerprint probe layers must map to numeric mean/std/absmax")



def flatten(fp: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"section.key.sub": value}; lists are kept whole."""
    flat = {}
    for key, value in fp.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _minor(version: str | None) -> str | None:
    return None if version is None else ".".join(version.split("+")[0].split(".")[:2])


# Fields whose change can alter the numbers (DESIGN.md); versions compare at major.minor.
CRITICAL_FIELDS = (
    "numerics.linear_attention_path",
    "numerics.dtype",
    "numerics.drafter_precision",
    "hardware.device",
    "numerics.attn_implementation",
    "numerics.tf32_matmul",
    "numerics.tf32_cudnn",
    "numerics.float32_matmul_precision",
)
CRITICAL_PREFIXES = ("numerics.linear_attention.functions.",)
VERSIONED = ("software.torch", "software.transformers", "software.flash-linear-attention", "software.fla-core")
WARNING_FIELDS = ("hardware.gpu_name", "software.cuda", "software.cudnn", "software.causal-conv1d",
                  "software.triton", "software.kernels", "software.flash-attn", "hardware.capability")
IGNORED_FIELDS = ("source", "schema", "evidence", "numerics.linear_attention.reason",
                  "numerics.linear_attention.fallback_warnings", "numerics.linear_attention.evidence_kind",
                  # which of the box's GPUs: where an eval ran, not what ran (the GPU's kind is gpu_name)
                  "hardware.gpus", "hardware.cuda_visible_devices")
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


class DiffRow(NamedTuple):
    field: str
    a_value: Any
    b_value: Any
    severity: str  # critical | warning | info


def _severity(field: str, a: Any, b: Any) -> str:
    unknown = a is None or b is None
    if field in VERSIONED:
        if unknown:
            return "warning"
        return "critical" if _minor(a) != _minor(b) else "warning"
    if field in CRITICAL_FIELDS or field.startswith(CRITICAL_PREFIXES):
        # An unknown value cannot prove a mismatch, but it cannot prove comparability either.
        return "warning" if unknown else "critical"
    if field in WARNING_FIELDS:
        return "warning"
    return "info"


def probe_gap(a: dict | None, b: dict | None) -> tuple[float, str] | None:
    """(largest relative difference of a per-layer statistic, its layer) between two probes, over
    the layers both probed; None when there is nothing to compare."""
    la, lb = (a or {}).get("layers") or {}, (b or {}).get("layers") or {}
    gaps = [(abs(la[k][stat] - lb[k][stat]) / max(abs(la[k][stat]), abs(lb[k][stat]), 1e-6), k)
            for k in set(la) & set(lb) for stat in ("mean", "std", "absmax")]
    return max(gaps) if gaps else None


def _probe_row(a: dict | None, b: dict | None) -> DiffRow | None:
    if a is None or b is None or a.get("digest") == b.get("digest"):
        return None
    gap = probe_gap(a, b)
    if a.get("seed") != b.get("seed") or a.get("length") != b.get("length") or gap is None:
        return DiffRow("probe.digest", a.get("digest"), b.get("digest"), "warning")
    worst = gap[0]
    # Equal statistics under other digests: the hidden states differ below what the statistics resolve (issue 65 LOW:
    # env-diff warned of a difference of 0.00e+00)
    severity = "critical" if worst > PROBE_RTOL else "warning" if worst > 0 else "info"
    return DiffRow("probe.max_rel_diff", a["digest"], f"{b['digest']} (max rel. diff {worst:.2e})", severity)


def diff(a: dict, b: dict) -> list[DiffRow]:
    """Rows (field, a_value, b_value, severity) for every differing field, most severe first."""
    fa, fb = flatten({k: v for k, v in a.items() if k != "probe"}), flatten({k: v for k, v in b.items() if k != "probe"})
    rows = []
    for field in sorted(set(fa) | set(fb)):
        if field.startswith(IGNORED_FIELDS):
            continue
        x, y = fa.get(field), fb.get(field)
        if x != y:
            rows.append(DiffRow(field, x, y, _severity(field, x, y)))
    probe_row = _probe_row(a.get("probe"), b.get("probe"))
    if probe_row:
        rows.append(probe_row)
    rows.sort(key=lambda r: (SEVERITY_ORDER[r.severity], r.field))
    return rows


def has_critical(rows: list[DiffRow]) -> bool:
    return any(r.severity == "critical" for r in rows)


# --------------------------------------------------------------------------- identity


def numbers_relevant(fp: dict) -> dict:
    """The part of a fingerprint that can change the numbers; the input of env_hash."""
    flat = flatten(fp)
    keep = {f: flat.get(f) for f in CRITICAL_FIELDS}
    keep.update({f: _minor(flat.get(f)) for f in VERSIONED})
    keep.update({f: v for f, v in flat.items() if f.startswith(CRITICAL_PREFIXES)})
    return keep


def environment(fp: dict) -> dict:
    """numbers_relevant without what comes from the target or the drafter: what a fingerprint
    taken without the target can tell about this environment (the eval cache's key for the rest)."""
    return {f: v for f, v in numbers_relevant(fp).items()
            if f.split(".")[1] not in (*TARGET_NUMERICS, "drafter_precision")}


def env_hash(fp: dict) -> str:
    blob = json.dumps(numbers_relevant(fp), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# Bumped whenever how `diff` rates a field changes: a key written under older rules never matches.
CRITICAL_KEY_VERSION = "c1"
NO_PROBE = "none"  # `env.probe_digest` of a fingerprint without a probe: `diff` has no probe row against it


def _key(parts: dict) -> str:
    """`c1-` + 16 hex of sha256 over `parts`."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return f"{CRITICAL_KEY_VERSION}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def critical_key(fp: dict) -> str:
    """Two fingerprints with equal keys and agreeing probes (`probes_agree`) have no critical `diff` row:
    every critical field, versioned package's minor version and kernel function is in `numbers_relevant`.
    So a listing answers "does this eval differ critically from its training run?" from tags, and reads
    the two files only when they disagree (to say what differs) or a run has none."""
    return _key({"numbers": numbers_relevant(fp)})


def warning_key(fp: dict) -> str:
    """`critical_key` for critical and warning rows alike: over every field `diff` rates above `info`
    (its value as logged), so equal keys and agreeing probes mean `diff` has only `info` rows."""
    flat = flatten({k: v for k, v in fp.items() if k != "probe"})
    return _key({"rated": {f: v for f, v in flat.items() if f in VERSIONED or f in CRITICAL_FIELDS
                           or f in WARNING_FIELDS or f.startswith(CRITICAL_PREFIXES)}})


def probe_digest(fp: dict) -> str:
    """The probe's digest as the `env.probe_digest` tag holds it: NO_PROBE without a probe, else `digest:`
    and the digest as JSON (`digest:"3fa2c1d0e5b6a7f8"`, `digest:null` for a probe without one), so equal
    tags are equal digests whatever an imported file holds; past 64 characters, their sha256 instead (a tag
    has a length limit; a hash is never quoted, so it equals no JSON text)."""
    probe = fp.get("probe")
    if probe is None:
        return NO_PROBE
    text = json.dumps(probe.get("digest"), sort_keys=True, default=str)
    return "digest:" + (text if len(text) <= 64 else "sha256:" + hashlib.sha256(text.encode()).hexdigest())


def probes_agree(a: str, b: str) -> bool:
    """Whether two `probe_digest`s give no probe row in `diff`: either side has no probe, or the digests
    are equal (`_probe_row`)."""
    return NO_PROBE in (a, b) or a == b


def env_tags(fp: dict) -> dict[str, str]:
    """The fixed `env.*` MLflow tags (DESIGN.md) for a fingerprint; unknown values read 'unknown'."""
    sw, hw, num = fp.get("software", {}), fp.get("hardware", {}), fp.get("numerics", {})

    def text(value):
        return "unknown" if value is None else str(value)

    tags = {
        names.ENV_HASH: env_hash(fp),
        names.ENV_LINEAR_ATTN: text(num.get("linear_attention_path")),
        names.ENV_DEVICE: text(hw.get("device")),
        names.ENV_DTYPE: text(num.get("dtype")),
        names.ENV_TORCH: text(sw.get("torch")),
        names.ENV_TRANSFORMERS: text(sw.get("transformers")),
        names.ENV_GPU: "none" if hw.get("device") == "cpu" else text(hw.get("gpu_name")),
        names.ENV_CRITICAL_KEY: critical_key(fp),
        names.ENV_WARNING_KEY: warning_key(fp),
        names.ENV_PROBE_DIGEST: probe_digest(fp),
        names.ENV_DRAFTER_PRECISION: text(num.get("drafter_precision")),
        names.ENV_SOURCE: text((fp.get("source") or {}).get("kind") if isinstance(fp.get("source"), dict) else None),
    }
    if "evidence" in fp:
        tags[names.ENV_EVIDENCE_CONFLICTS] = str(len(contradictions(fp)))
    return tags
