"""DDTree's `benchmark.py --save-path FILE` results (liranringel/ddtree), one eval per file.

The file is `torch.save` of
`{"responses": [{"baseline": r, "dflash": r, "ddtree_tb16": r, ...}, ...], "block_size": B,
"draft_attn_implementation": ..., "target_attn_implementation": ..., "args": vars(args)}`, one
response per turn, each `r` a `types.SimpleNamespace` from `dflash_generate` / `ddtree_generate`
(`acceptance_lengths` per decode round, `time_per_output_token`, `output_ids`, ...). It is read
with `weights_only=True`, allowing `SimpleNamespace` and nothing else, so a file that smuggles in
code is refused.

Metrics, as draftboard defines them (DESIGN.md): `tau` = mean over responses of each response's
mean acceptance length (z-lab's macro average), `tau_pooled`, `streak`, `accept_rate_pos{k}` and
the per-length histogram from the `dflash` rounds; `ddtree_tau_b{B}` / `dds{B}` from each
`ddtree_tb{B}` method. DDTree runs the online loop, which at temperature 0 is draftboard's walk.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from tracker.errors import DraftboardError
from tracker.store import names
from tracker.store.importers.results import ImportedEval, finite

FORMAT = "ddtree"
_TREE = re.compile(r"^ddtree_tb(\d+)$")
_REFUSED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")  # torch's two wordings
_STATED_ARGS = {"dataset": "dataset", "temperature": "temperature", "max_new_tokens": "max_new_tokens",
                "max_samples": "max_samples", "model_name_or_path": "target", "draft_name_or_path": "drafter"}


def load_results(path: str | Path) -> dict:
    """The saved dict, loaded without running any code from the file."""
    import torch

    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such file")
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
    if not isinstance(block_size, int) or block_size < 2:
        raise DraftboardError(f"{where}: block_size must be an integer >= 2, got {block_size!r}")
    if not isinstance(responses, list) or not responses or not isinstance(args, dict):
        raise DraftboardError(f"{where}: no responses to import")
    chain = _lengths(responses, "dflash", block_size, where)
    blocks = [n for w in chain for n in w]
    tau = _macro(chain)
    counts = [blocks.count(length) for length in range(1, block_size + 1)]
    metrics = {"tau": tau, "streak": tau - 1, "tau_pooled": sum(blocks) / len(blocks)}
    metrics.update({names.accept_rate_metric(k): sum(counts[k:]) / len(blocks) for k in range(1, block_size)})
    budgets = sorted(int(m.group(1)) for m in map(_TREE.match, responses[0]) if m)
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
