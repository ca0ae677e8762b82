"""Which implementation runs the Gated DeltaNet (linear-attention) layers, and control over it.

transformers decides this once, when a hybrid modeling module (Qwen3.5, Qwen3-Next) is imported:
each of four module-level functions is wrapped by `use_kernel_func_from_hub_with_fallback`,
whose closure holds the chosen `implementation` (hub kernel, else fla / causal-conv1d, else the
torch reference kept as `__wrapped__`). There is no device check, so with triton installed on a
CPU-only box fla is chosen and the forward crashes; and a box without causal-conv1d silently runs
the slow, numerically different torch path. This module reads the choice from the code that will
actually run and can force it, in one place used by both the fingerprint and the eval harness.

Forcing works by swapping the module globals the layers call (they look them up at call time),
so it is reversible and independent of import order.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import sys
from dataclasses import dataclass, field

from tracker.errors import DraftboardError

# Functions the Gated DeltaNet forward calls; names as in transformers' modeling modules.
LINEAR_ATTN_FUNCTIONS = (
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
)
# Where each function's fast kernel comes from (package, import path), for the reason we report.
KERNEL_SOURCES = {
    "causal_conv1d_fn": ("causal-conv1d", "causal_conv1d"),
    "causal_conv1d_update": ("causal-conv1d", "causal_conv1d"),
    "torch_chunk_gated_delta_rule": ("flash-linear-attention", "fla.ops.gated_delta_rule"),
    "torch_recurrent_gated_delta_rule": ("flash-linear-attention", "fla.ops.gated_delta_rule"),
}
GATED_NORM = "gated_norm"  # the Gated DeltaNet output norm: fla's FusedRMSNormGated, or torch
SPEC_DECODE = "spec_decode"  # a serving engine's verify step over the draft (state kept per draft position)
TORCH_ONLY = "torch (no kernel in this transformers)"  # a piece transformers runs in torch whatever is installed
# What a reader calls each piece, in the order the layer runs them (the summary's words).
ROLES = (("conv", ("causal_conv1d_fn", "causal_conv1d_update")), ("chunk rule", ("torch_chunk_gated_delta_rule",)),
         ("recurrent rule", ("torch_recurrent_gated_delta_rule",)), ("gated norm", (GATED_NORM,)))
HYBRID_MODULES = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.qwen3_next.modeling_qwen3_next",
)
DEFAULT_MODULE = HYBRID_MODULES[0]
MODES = ("auto", "fast", "fallback")
# Every GDN piece a reader compares across training, offline eval and serving, with the function
# name each side records it under (an engine records its own code under the same names).
PIECES = (("conv prefill", "causal_conv1d_fn"), ("conv decode", "causal_conv1d_update"),
          ("chunk rule (prefill)", "torch_chunk_gated_delta_rule"),
          ("recurrent rule (decode)", "torch_recurrent_gated_delta_rule"),
          ("spec-decode path", SPEC_DECODE), ("gated norm", GATED_NORM))
NOT_RUN = "not run"  # a piece this side never runs (offline scoring is teacher-forced: no spec-decode step)

# The module-level functions as transformers resolved them, kept so a forced fallback can be undone.
_ORIGINALS: dict[tuple[str, str], object] = {}


class _FallbackWarnings(logging.Handler):
    """Keeps the 'falling back to the torch implementation' warnings transformers logs.

    They are logged once per process (warning_once), at the first forward, so they must be
    recorded when they happen rather than searched for later.
    """

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def start(self) -> None:
        """A new eval in this process (a warm host runs one job after another): what earlier evals logged
        is not this one's, and transformers' `warning_once` (an lru_cache for the process) forgets what
        it said, so this eval's own fallbacks warn again and are recorded as its own."""
        self.messages.clear()
        once = getattr(logging.Logger, "warning_once", None)
        if hasattr(once, "cache_clear"):
            once.cache_clear()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        lowered = message.lower()
        if ("falling back" in lowered or "fast path is not available" in lowered) and message not in self.messages:
            self.messages.append(message)


FALLBACK_WARNINGS = _FallbackWarnings()
logging.getLogger("transformers").addHandler(FALLBACK_WARNINGS)


@dataclass(frozen=True)
class Resolution:
    """What runs the linear-attention layers of one modeling module."""

    module: str
    functions: dict[str, str]  # function name -> "pkg.module.qualname" of what runs, or "torch"
    path: str  # fast | partial | fallback | n/a (over the four kernel functions; the gated norm is reported beside)
    reason: str
    forced: bool = False  # draftboard swapped in the torch reference
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "module": self.module,
            "functions": dict(self.functions),
            "linear_attention_path": self.path,
            "summary": summary(self.functions),
            "reason": self.reason,
            "forced_by_draftboard": self.forced,
            "fallback_warnings": list(self.warnings),
        }


def summary(functions: dict[str, str]) -> str:
    """What ran each piece of a Gated DeltaNet layer, in words, a mixed state flagged:
    `mixed: conv torch fallback, chunk rule fla kernel, ...`, `all kernels: ...` or `all torch: ...`.
    A piece transformers only has in torch (`TORCH_ONLY`) is named but never makes a state mixed."""
    parts, kinds = [], set()
    for role, names in ROLES:
        present = [functions[n] for n in names if n in functions]
        if not present:
            continue
        if present == [TORCH_ONLY]:
            parts.append(f"{role} torch (the only implementation)")
            continue
        packages = sorted({q.split(".")[0] for q in present})
        torch_ran = packages == ["torch"]
        kinds.add(torch_ran)
        parts.append(f"{role} {'torch fallback' if torch_ran else '/'.join(packages) + ' kernel'}")
    if not parts:
        return "no linear-attention layers"
    head = "mixed" if len(kinds) > 1 else ("all torch" if True in kinds else "all kernels")
    return f"{head}: {', '.join(parts)}"


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _implementation(module, name: str) -> tuple[str, bool]:
    """(what runs, is_torch) for one wrapped function, read from the wrapper itself."""
    fn = getattr(module, name)
    if getattr(fn, "_draftboard_forced", False):
        return "torch", True
    closure = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    if "implementation" in closure:
        impl, torch_fn = closure["implementation"], closure.get("torch_function", getattr(fn, "__wrapped__", None))
        return ("torch", True) if impl is torch_fn else (_qualname(impl), False)
    # transformers before the hub-kernel wrappers: the function is either fla / causal-conv1d's
    # own (imported at module top) or the module's torch reference.
    is_torch = getattr(fn, "__module__", "") == module.__name__
    return ("torch", True) if is_torch else (_qualname(fn), False)


def _gated_norm(module) -> str | None:
    """What runs the Gated DeltaNet output norm: fla's FusedRMSNormGated where the module imported it
    (transformers of the Qwen3-Next era use it when fla is importable), else the module's own torch
    RMSNormGated (transformers 5.24's Qwen3.5); None for a module without one."""
    if hasattr(module, "FusedRMSNormGated"):  # the module chose at import: fla's fused norm, or None
        fused = module.FusedRMSNormGated
        return "torch" if fused is None else _qualname(fused)
    has_norm = any(n.endswith("RMSNormGated") and isinstance(getattr(module, n), type) for n in dir(module))
    return TORCH_ONLY if has_norm else None


def _legacy_flags(module) -> str | None:
    """Older transformers (4.5x) expose the decision as module flags instead of wrappers."""
    if not hasattr(module, "is_fast_path_available"):
        return None
    return "fast" if module.is_fast_path_available else "fallback"


def _why_not_fast(names) -> str:
    """One line naming the missing kernel packages and why they failed to import."""
    reasons = []
    for package, import_path in sorted({KERNEL_SOURCES[n] for n in names}):
        if sys.modules.get(import_path.split(".")[0], True) is None:
            reasons.append(f"{package} blocked in sys.modules")
            continue
        try:
            importlib.import_module(import_path)
        except Exception as exc:  # any import failure means transformers fell back too
            reasons.append(f"{package} unusable ({import_path}: {type(exc).__name__}: {exc})")
        else:
            reasons.append(f"{package} importable, but not chosen by transformers")
    return "; ".join(reasons)


def resolve(module_name: str = DEFAULT_MODULE) -> Resolution:
    """Read which implementation each linear-attention function of `module_name` runs."""
    if module_name not in HYBRID_MODULES and not module_name.startswith("transformers.models."):
        return Resolution(module_name, {}, "n/a", "model has no linear-attention layers")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return Resolution(module_name, {}, "n/a", f"{module_name} not importable: {exc}")
    present = [n for n in LINEAR_ATTN_FUNCTIONS if callable(getattr(module, n, None))]
    if not present:
        legacy = _legacy_flags(module)
        if legacy is None:
            return Resolution(module_name, {}, "n/a", "model has no linear-attention layers")
        return Resolution(module_name, {}, legacy, f"is_fast_path_available={legacy == 'fast'}",
                          warnings=list(FALLBACK_WARNINGS.messages))
    functions, torch_names, forced = {}, [], False
    for name in present:
        impl, is_torch = _implementation(module, name)
        functions[name] = impl
        if is_torch:
            torch_names.append(name)
            forced = forced or getattr(getattr(module, name), "_draftboard_forced", False)
    norm = _gated_norm(module)
    if norm is not None:
        functions[GATED_NORM] = norm
    path = path_of(functions)
    if not torch_names:
        reason = "all linear-attention functions use kernels"
    else:
        why = "forced by draftboard" if forced else _why_not_fast(torch_names)
        reason = f"torch reference for {', '.join(torch_names)}: {why}"
    return Resolution(module_name, functions, path, reason, forced, list(FALLBACK_WARNINGS.messages))


def path_of(functions: dict[str, str]) -> str:
    """`fast`, `partial` or `fallback` over the kernel functions (LINEAR_ATTN_FUNCTIONS) `functions` names,
    "torch" for one that ran the reference: the one rule a live resolution and imported evidence share."""
    ran = [functions[n] for n in LINEAR_ATTN_FUNCTIONS if n in functions]
    on_torch = sum(value == "torch" for value in ran)
    return "fast" if on_torch == 0 else "fallback" if on_torch == len(ran) else "partial"


def _torch_only(wrapper):
    """A stand-in for a kernel wrapper that always calls its torch reference."""
    torch_fn = wrapper.__wrapped__
    params = inspect.signature(torch_fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    @functools.wraps(torch_fn)
    def forced(*args, **kwargs):
        # Like transformers' wrapper: drop kernel-only kwargs the reference does not accept.
        if not takes_any:
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        return torch_fn(*args, **kwargs)

    forced._draftboard_forced = True
    return forced


def _force_fallback(module) -> None:
    for name in LINEAR_ATTN_FUNCTIONS:
        fn = getattr(module, name, None)
        if fn is None or getattr(fn, "_draftboard_forced", False) or not hasattr(fn, "__wrapped__"):
            continue
        _ORIGINALS[(module.__name__, name)] = fn
        setattr(module, name, _torch_only(fn))


def _restore(module) -> None:
    for name in LINEAR_ATTN_FUNCTIONS:
        original = _ORIGINALS.pop((module.__name__, name), None)
        if original is not None:
            setattr(module, name, original)


def fast_kernels_can_run(device: str) -> tuple[bool, str]:
    """Whether fla/causal-conv1d kernels could execute here: they need triton and a CUDA device."""
    import torch

    if not device.startswith("cuda"):
        return False, f"device is {device}; the fla and causal-conv1d kernels need CUDA"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    return True, "CUDA device and triton present"


def apply(mode: str = "auto", device: str = "cpu", module_name: str = DEFAULT_MODULE) -> Resolution:
    """Put the linear-attention layers of `module_name` on the path `mode` asks for.

    auto:     keep what transformers chose, except where kernels were chosen but cannot run
              here (no CUDA device or no triton): force the torch reference there.
    fast:     require kernels for every function; DraftboardError naming what is missing.
    fallback: force the torch reference for every function.
    """
    if mode not in MODES:
        raise DraftboardError(f"unknown linear-attention mode {mode!r}; use one of {', '.join(MODES)}")
    if module_name not in HYBRID_MODULES:
        return resolve(module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return resolve(module_name)
    _restore(module)
    if mode == "fallback":
        _force_fallback(module)
        res = resolve(module_name)
        return _with_reason(res, "forced by --linear-attn fallback")
    if mode == "fast":
        res = resolve(module_name)
        if res.path != "fast":
            raise DraftboardError(f"--linear-attn fast: transformers resolved {res.path} ({res.reason})")
        ok, why = fast_kernels_can_run(device)
        if not ok:
            raise DraftboardError(f"--linear-attn fast: kernels are installed but cannot run: {why}")
        return res
    res = resolve(module_name)
    ok, why = fast_kernels_can_run(device)
    if res.path in ("fast", "partial") and not ok:
        _force_fallback(module)
        return _with_reason(resolve(module_name), f"auto: kernels were chosen but cannot run ({why})")
    return res


def _with_reason(res: Resolution, reason: str) -> Resolution:
    return Resolution(res.module, res.functions, res.path, reason, res.forced, res.warnings)


@dataclass(frozen=True)
class PieceRow:
    piece: str
    values: tuple  # one per side; None: unknown
    severity: str  # critical | warning | ok


def pieces(fp: dict) -> dict[str, str | None]:
    """What ran each GDN piece (PIECES) in one fingerprint; None where it does not say, NOT_RUN where
    it ran Gated DeltaNet layers without that piece, {} for a target without them."""
    numerics = fp.get("numerics") or {}
    la = numerics.get("linear_attention") or {}
    functions = la.get("functions") if isinstance(la, dict) and isinstance(la.get("functions"), dict) else {}
    if numerics.get("linear_attention_path") == "n/a":
        return {}
    # Read from a run's files (`evidence_kind`), a piece no file names is unknown, not absent; a
    # training run never runs the spec-decode step.
    read = isinstance(la, dict) and la.get("evidence_kind") is not None
    return {label: (str(functions[name]) if name in functions else
                    NOT_RUN if functions and (not read or name == SPEC_DECODE) else None)
            for label, name in PIECES}


def side_by_side(fps: list[dict]) -> list[PieceRow]:
    """One row per GDN piece, one value per fingerprint: `critical` where two sides ran different
    code, `warning` where a side does not say, `ok` where all agree (a piece a side never runs
    compares with nothing)."""
    per_side = [pieces(fp) for fp in fps]
    if all(v is None for side in per_side for v in side.values()):  # no side says it ran GDN layers
        return []
    rows = []
    for label, _ in PIECES:
        values = tuple(side.get(label) for side in per_side)
        ran = {v for v in values if v not in (None, NOT_RUN)}
        severity = "critical" if len(ran) > 1 else "warning" if None in values else "ok"
        rows.append(PieceRow(label, values, severity))
    return rows


def module_of(model) -> str:
    """The modeling module whose functions run `model`'s linear-attention layers."""
    return type(model).__module__
