"""Published DFlash and DFlash2 numbers as reference runs that say where they come from.

The numbers live in `published_zlab.json` beside this module, each table with its source,
hardware, backend, sampling and thinking mode, and who published it (z-lab unless the table says
otherwise: an independent reproduction names its own). Imported runs are `draftboard.kind=reference`
for their own target (never the demo's), and their fingerprint is `published`: it states what
the publication states and nothing else, so every comparison with a local run shows which
fields are unknown. Each run's protocol (`protocol.*` tags) states what the table states: its
datasets (with their prompt counts where printed), temperature, top_p, top_k, thinking, block size
and max new tokens, scoring `published`; every other field reads `unknown`. Each dataset's tau
is its own metric (`names.dataset_metric`), with its interval where one was published, so an
eval on GSM8K meets the table's GSM8K number, not an average; a sampled number is a sampled
reference, never one a greedy eval is compared with.
"""

from __future__ import annotations

import json
from pathlib import Path

from tracker.environment import fingerprint
from tracker.measurement.protocol import UNKNOWN, Protocol
from tracker.store import names

DATA = Path(__file__).with_name("published_zlab.json")


def load_tables(path: str | Path = DATA) -> list[dict]:
    return json.loads(Path(path).read_text())["tables"]


def _fingerprint(table: dict) -> dict:
    source = {k: table.get(k) for k in ("title", "source", "drafter", "backend", "temperature", "thinking",
                                         "block_size")}
    known = {"hardware.gpu_name": table.get("hardware"), "hardware.device": "cuda" if table.get("hardware") else None}
    return fingerprint.published(source, {k: v for k, v in known.items() if v is not None})


def _protocol(table: dict) -> Protocol:
    stated = {"datasets": {row["dataset"]: row.get("n_prompts", UNKNOWN) for row in table["rows"] if row.get("dataset")},
              "temperature": table.get("temperature"), "top_p": table.get("top_p"), "top_k": table.get("top_k"),
              "enable_thinking": table.get("thinking"), "block_size": table.get("block_size"),
              "max_new_tokens": table.get("max_new_tokens")}
    return Protocol(scoring="published", **{k: v for k, v in stated.items() if v is not None and v != {}})


def import_published(tracker, tags: dict[str, str] | None = None, path: str | Path = DATA) -> list[str]:
    """One reference run per published table: `tau_<benchmark>` (and `speedup_<benchmark>`) metrics.

    `tau` itself is logged only where the publication prints an average ("Avg."): an average
    of a table's columns would be a number nobody published.
    """
    run_ids = []
    for table in load_tables(path):
        params = {"table": table["title"], "hardware": table.get("hardware"), "backend": table.get("backend"),
                  "temperature": table.get("temperature"), "top_p": table.get("top_p"), "top_k": table.get("top_k"),
                  "thinking": table.get("thinking"),
                  "block_size": table.get("block_size"), "max_new_tokens": table.get("max_new_tokens"),
                  "source": table["source"].get("url"), "publication": table["source"].get("publication")}
        metrics = {}
        for row in table["rows"]:
            if not row.get("dataset"):  # the average column ("Avg.")
                metrics["tau"] = row["tau"]
                metrics["streak"] = row["tau"] - 1
                continue
            metrics[names.dataset_metric("tau", row["dataset"])] = row["tau"]
            if row.get("ci"):
                low, high = names.ci_metrics(names.dataset_metric("tau", row["dataset"]))
                metrics[low], metrics[high] = row["ci"]
            if row.get("speedup") is not None:
                metrics[names.dataset_metric("speedup", row["dataset"])] = row["speedup"]
        name = f"{table.get('publisher', 'z-lab')} published: {table['title']}"
        family = {names.DRAFTER_FAMILY: table.get("drafter_family", "dflash")}
        # The hub repository a model card's table is of; its revision only where the source states one.
        drafter = {names.DRAFTER_REPO: table.get("drafter_repo"), names.DRAFTER_REVISION: table.get("drafter_revision")}
        family.update({k: v for k, v in drafter.items() if v})
        with tracker.eval_run(name, target=table["target"], params={k: v for k, v in params.items() if v is not None},
                              fingerprint=_fingerprint(table), kind="reference", reference_name=name,
                              tags={**_protocol(table).to_tags(), **family, **(tags or {}), names.PUBLISHED: "1"}) as run:
            run.log_metrics({k: float(v) for k, v in metrics.items()}, step=0)
            run_ids.append(run.run_id)
    return run_ids
