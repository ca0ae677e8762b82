"""Model folders that try to run their own code (issue 48, S1), for the tests that prove none runs.

`plant_code` leaves a folder loadable and adds what names code: a `.py` that writes a marker file when
imported, and `auto_map` entries (config.json and tokenizer_config.json) pointing at it, the way z-lab's
drafters carry one for transformers' AutoModel. Whatever loads the folder must not import it.

`hostile_drafter` builds the audit's exploit on top: a drafter draftboard reads as DFlash (its config's
top level and `model.safetensors`), whose `text_config` names `DreamModel` and whose index names other
weight files (a tiny Qwen2's, which Dream's tensor map takes). llama.cpp's converter prefers
`text_config.architectures` and the index, so it converts the folder as Dream, whose vocabulary reader
calls `AutoTokenizer.from_pretrained(dir, trust_remote_code=True)`: without tokenizer.model that imports
the folder's tokenizer code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

EVIL = "evil_code"


def _code(marker: Path) -> str:
    return (f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
            "from transformers import PreTrainedTokenizerFast\n\n\n"
            "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")


def _update(path: Path, **entries) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update(entries)
    path.write_text(json.dumps(data, indent=1))


def plant_code(folder: Path, marker: Path) -> None:
    """Add a `.py` writing `marker` on import and `auto_map` entries naming it; the folder stays valid."""
    (folder / f"{EVIL}.py").write_text(_code(marker))
    _update(folder / "config.json", auto_map={"AutoConfig": f"{EVIL}.EvilConfig", "AutoModel": f"{EVIL}.EvilModel",
                                              "AutoModelForCausalLM": f"{EVIL}.EvilModel",
                                              "AutoTokenizer": [None, f"{EVIL}.EvilTokenizer"]})
    if (folder / "tokenizer_config.json").is_file():
        _update(folder / "tokenizer_config.json", auto_map={"AutoTokenizer": [None, f"{EVIL}.EvilTokenizer"]})


def copy_folder(source: Path, dest: Path) -> Path:
    shutil.copytree(source.resolve(), dest)
    return dest


def hostile_drafter(drafter: Path, target: Path, dest: Path, marker: Path) -> Path:
    """`drafter` copied to `dest` with the exploit: text_config -> DreamModel, an index naming a Qwen2's
    weights, the target's tokenizer.json beside a tokenizer_config.json whose class is the folder's code."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = copy_folder(drafter, dest)
    other = Qwen2Config(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    torch.manual_seed(0)
    staged = dest.parent / f"{dest.name}-qwen2"
    Qwen2ForCausalLM(other).save_pretrained(staged)
    shard = "model-00001-of-00001.safetensors"
    shutil.copy(staged / "model.safetensors", folder / shard)
    names = json.loads((staged / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (staged / "model.safetensors").read_bytes()[:8], "little")])
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: shard for name in names if name != "__metadata__"}}))
    shutil.rmtree(staged)
    _update(folder / "config.json", text_config={**other.to_dict(), "architectures": ["DreamModel"]})
    shutil.copy(target / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "EvilTokenizer"}))
    plant_code(folder, marker)
    (folder / "tokenizer.model").unlink(missing_ok=True)
    return folder
