"""Upper bounds on model sizes, checked before anything is allocated.

A config is data a user wrote: `num_hidden_layers` 10**9 or `intermediate_size` 10**9 must be a
one-line refusal, not a MemoryError minutes later. The bounds sit well above every released
model (Llama 3.1 405B: hidden 16384, intermediate 53248, 126 layers, vocab 128256; Qwen3.6 27B:
64 layers; Llama 4 Scout: a 10M-token context) so that no real checkpoint is refused. Drafter
and target configs are both checked here.
"""

from __future__ import annotations

from collections.abc import Mapping

from tracker.errors import DraftboardError

SIZE_LIMITS = {
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 512,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 1024,
    "vocab_size": 1 << 21,
    "max_position_embeddings": 1 << 24,
    "block_size": 1024,
    "num_target_layers": 512,
}


def check_sizes(values: Mapping, where: str) -> None:
    """Refuse any integer size in `values` above its bound (non-integers are the parser's business)."""
    for name, limit in SIZE_LIMITS.items():
        value = values.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
            raise DraftboardError(
                f"{where}: {name} {value} is above the limit of {limit}; the config is broken "
                "(no released model comes close)"
            )
