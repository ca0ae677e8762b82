"""DDTree's `benchmark.py --save-path FILE` results (liranringel/ddtree), one eval per file.

The file is `torch.save` of
`{"responses": [{"baseline": r, "dflash": r, "ddtree_tb16": r, ...}, ...], "block_size": B,
"draft_attn_implementation": ..., "target_attn_implementation": ..., "args": vars(args)}`, one
response per turn, each `r` a `types.SimpleNamespace` from `dflash_generate` / `ddtree_generate`
(`acceptance_lengths` per decode round, `time_per_output_token`, `output_ids`, ...). It is read
with `weights_only=True`, allowing `SimpleNamespace` and nothing else, so a file that smuggles in
code is refused. Before torch reads it, the file is checked as a `torch.save` archive should be: a
zip of stored (never deflated) records of bounded size, its pickle's opcodes counted and each string
in it bounded, so no record inflates to gigabytes and no allowlisted call gets a huge argument; after
it, the rounds to walk are counted (a pickle can share one list a million times) before any is.

Metrics, as draftboard defines them (DESIGN.md): `tau` = mean over responses of each response's
mean acceptance length (z-lab's macro average), `tau_pooled`, `streak`, `accept_rate_pos{k}` and
the per-length histogram from the `dflash` rounds; `ddtree_tau_b{B}` / `dds{B}` from each
`ddtree_tb{B}` method. DDTree runs the online loop, which at temperature 0 is draftboard's walk.
"""

from __future__ import annotations

import codecs
import pickletools
import re
import zipfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from tracker.errors import DraftboardError
from tracker.store import names
from tracker.store.importers.results import ImportedEval, finite

FORMAT = "ddtree"
_TREE = re.compile(r"^ddtree_tb(\d+)$")
_REFUSED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")  # torch's two wordings
MAX_FILE_BYTES = 2 << 30  # responses with their output ids: megabytes, not gigabytes
MAX_PICKLE_OPS = 20_000_000
MAX_PICKLED_TEXT = 1 << 20  # a string inside the pickle (method names, args); a tensor's bytes are records
MAX_ROUNDS = 20_000_000  # decode rounds over every response and method, a shared list counted each time
MAX_BLOCK_SIZE = 4096
_TEXT_OPS = {"BINUNICODE", "BINUNICODE8", "SHORT_BINUNICODE", "UNICODE", "BINBYTES", "BINBYTES8", "SHORT_BINBYTES",
             "BYTEARRAY8", "STRING", "BINSTRING", "SHORT_BINSTRING"}
_STATED_ARGS = {"dataset": "dataset", "temperature": "temperature", "max_new_tokens": "max_new_tokens",
                "max_samples": "max_samples", "model_name_or_path": "target", "draft_name_or_path": "drafter"}


def load_results(path: str | Path) -> dict:
    """The saved dict, loaded without running any code from the file."""
    import torch

    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such file")
    _check_archive(file)
    try:
        with torch.serialization.safe_globals([SimpleNamespace]):
            data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and weights-only refusals all mean: not a file we can read safely
        refused = _REFUSED_GLOBAL.search(str(exc))
        if refused:  # torch's own text invites loading the file unrestricted: never repeat it
            raise DraftboardError(f"{file}: refused: it names {refused.group(1)}, and a DDTree results file holds only "
                                  "SimpleNamespace, tensors and plain values (loaded with weights_only=True, nothing "
                                  "in it was run)") from None
        text = str(exc).strip()
        why = ("it holds something other than SimpleNamespace, tensors and plain values"
               if "Weights only load failed" in text else f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")
        raise DraftboardError(f"{file}: not a DDTree results file readable with weights_only=True ({why})") from None
    missing = {"responses", "block_size", "args"} - set(data) if isinstance(data, dict) else {"a dict"}
    if missing:
        raise DraftboardError(f"{file}: not a DDTree results file: missing {', '.join(sorted(missing))}")
    return data


def _codec(name: str) -> str | None:
    """The codec `name` names (codecs' canonical name), None where it names none."""
    try:
        return codecs.lookup(name).name
    except (LookupError, ValueError):
        return None


def _check_archive(file: Path) -> None:
    """The limits above, on the archive and its pickle, before torch allocates anything from them."""
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:
        raise DraftboardError(f"{file}: {size >> 20} MiB is more than a DDTree results file holds "
                              f"({MAX_FILE_BYTES >> 20} MiB at most)")
    try:
        with zipfile.ZipFile(file) as archive:
            members = archive.infolist()
            packed = [m.filename for m in members if m.compress_type != zipfile.ZIP_STORED]
            if packed:
                raise DraftboardError(f"{file}: refused: record {packed[0]!r} is compressed; torch.save stores its "
                                      "records uncompressed")
            if sum(m.file_size for m in members) > MAX_FILE_BYTES:
                raise DraftboardError(f"{file}: refused: its records claim more than {MAX_FILE_BYTES >> 20} MiB")
            pickles = [m for m in members if m.filename.endswith("/data.pkl") or m.filename == "data.pkl"]
            if len(pickles) != 1:
                raise DraftboardError(f"{file}: not a torch.save archive (no single data.pkl record)")
            pickled = archive.read(pickles[0])
    except (zipfile.BadZipFile, OSError) as exc:
        raise DraftboardError(f"{file}: not a torch.save zip archive ({exc})") from None
    codecs_named, encodings = False, set()
    try:
        for n, (op, arg, _) in enumerate(pickletools.genops(pickled)):
            if n >= MAX_PICKLE_OPS:
                raise DraftboardError(f"{file}: refused: more than {MAX_PICKLE_OPS} pickle operations")
            if op.name in _TEXT_OPS and len(arg) > MAX_PICKLED_TEXT:
                raise DraftboardError(f"{file}: refused: a string of {len(arg) >> 10} KiB in its pickle (a DDTree "
                                      f"results file holds names and arguments, at most {MAX_PICKLED_TEXT >> 10} KiB)")
            codecs_named = codecs_named or arg in ("_codecs", "_codecs encode")
            if op.name in _TEXT_OPS and isinstance(arg, str) and len(arg) <= 32:
                encodings.add(arg)
    except ValueError as exc:
        raise DraftboardError(f"{file}: not a readable pickle ({exc})") from None
    # torch.save's protocol 2 writes bytes as _codecs.encode(text, "latin1"), which weights_only allows with any
    # codec: punycode's encoder is quadratic (60,000 characters: minutes of CPU). Only torch's own is let through.
    foreign = sorted(e for e in encodings if _codec(e) not in (None, "latin-1", "iso8859-1")) if codecs_named else []
    if foreign:
        raise DraftboardError(f"{file}: refused: its pickle names the codec {foreign[0][:32]!r} (torch.save writes "
                              "bytes with latin1 only)")


def _rounds(responses: list, methods: list[str], where: str) -> None:
    """Refuse a file whose rounds (shared lists counted each time they are referenced) exceed MAX_ROUNDS."""
    total = 0
    for response in responses:
        for method in methods:
            lengths = getattr(response.get(method) if isinstance(response, dict) else None, "acceptance_lengths", None)
            total += len(lengths) if isinstance(lengths, list) else 0
        if total > MAX_ROUNDS:
            raise DraftboardError(f"{where}: refused: more than {MAX_ROUNDS} decode rounds to read (a list shared "
                                  "across responses counts once per response)")


def _lengths(responses: list, method: str, block_size: int, where: str) -> list[list[int]]:
    out = []
    for index, response in enumerate(responses):
        result = response.get(method) if isinstance(response, dict) else None
        lengths = getattr(result, "acceptance_lengths", None)
        if not isinstance(lengths, list):
            raise DraftboardError(f"{where}: response {index} has no acceptance_lengths for {method!r}")
        if any(not isinstance(n, int) or not 1 <= n <= block_size for n in lengths):
            raise DraftboardError(f"{where}: response {index} {method}: acceptance lengths must be whole numbers "
                                  f"in 1..{block_size}")
        out.append(lengths)
    return out


def _macro(per_response: list[list[int]]) -> float:
    means = [sum(w) / len(w) for w in per_response if w]
    if not means:
        raise DraftboardError("no decode rounds in any response")
    return sum(means) / len(means)


def parse_ddtree_results(path: str | Path) -> list[ImportedEval]:
    """The file's one record (a DDTree benchmark run covers one dataset)."""
    where = str(path)
    data = load_results(path)
    responses, block_size, args = data["responses"], data["block_size"], data["args"]
    if not isinstance(block_size, int) or not 2 <= block_size <= MAX_BLOCK_SIZE:
        raise DraftboardError(f"{where}: block_size must be an integer in 2..{MAX_BLOCK_SIZE}, got {block_size!r}")
    if not isinstance(responses, list) or not responses or not isinstance(responses[0], dict) \
            or not isinstance(args, dict):
        raise DraftboardError(f"{where}: no responses to import")
    budgets = sorted(int(m.group(1)) for m in map(_TREE.match, responses[0]) if m)
    _rounds(responses, ["dflash", *(f"ddtree_tb{b}" for b in budgets)], where)
    chain = _lengths(responses, "dflash", block_size, where)
    blocks = [n for w in chain for n in w]
    tau = _macro(chain)
    by_length = Counter(blocks)
    counts = [by_length[length] for length in range(1, block_size + 1)]
    metrics = {"tau": tau, "streak": tau - 1, "tau_pooled": sum(blocks) / len(blocks)}
    metrics.update({names.accept_rate_metric(k): sum(counts[k:]) / len(blocks) for k in range(1, block_size)})
    for budget in budgets:
        tree_tau = _macro(_lengths(responses, f"ddtree_tb{budget}", block_size, where))
        metrics[names.ddtree_tau_metric(budget)] = tree_tau
        metrics[names.dds_metric(budget)] = tree_tau - 1
    protocol = {ours: str(args[theirs]) for theirs, ours in _STATED_ARGS.items() if args.get(theirs) is not None}
    protocol["block_size"] = str(block_size)
    protocol["target_attn_implementation"] = str(data.get("target_attn_implementation"))
    details = {"accept_len_histogram": counts, "n_blocks": len(blocks), "responses": len(responses),
               "speedup_vs_baseline": _speedups(responses, ["dflash", *(f"ddtree_tb{b}" for b in budgets)], where)}
    return [ImportedEval(protocol.get("dataset", Path(path).stem), metrics, protocol, details)]


def _speedups(responses: list, methods: list[str], where: str) -> dict[str, float]:
    """Mean baseline time per token / mean method time per token, as DDTree and z-lab report it."""
    def mean_tpot(method: str) -> float:
        values = [finite(getattr(r[method], "time_per_output_token", None), f"{where} {method} time_per_output_token")
                  for r in responses]
        return sum(values) / len(values)

    if "baseline" not in responses[0]:
        return {}
    baseline = mean_tpot("baseline")
    return {m: baseline / t for m in methods if (t := mean_tpot(m)) > 0}
