"""The tokens a drafter and its target agree on: the mask token, the stop tokens, thinking.

z-lab's drafters fill every drafted slot with a dedicated mask token, a special token added to
the target's tokenizer; an ordinary vocabulary token there is a word the drafter also has to
predict. Generation stops at the generation config's EOS ids (draftboard and vLLM read
`generation_config.json`); a tokenizer EOS that is not among them ends text that serving never
ends. Whether thinking is on is what the chat template renders, not the flag's default
(z-lab #133: eval and serving differed there).
"""

from __future__ import annotations

from evaluators.doctor.report import CRITICAL, INFO, OK, WARNING, Check
from evaluators.prompts import template_thinking

MASK_TOKEN, STOP_TOKENS, THINKING = "mask_token", "stop_tokens", "thinking"


def mask_token(tokenizer, mask_token_id: int) -> Check:
    if tokenizer is None:
        return Check(MASK_TOKEN, INFO, "the target has no tokenizer files: the mask token cannot be checked",
                     f"mask_token_id {mask_token_id}")
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    shown = repr(tokenizer.convert_ids_to_tokens(mask_token_id))
    if mask_token_id in special:
        return Check(MASK_TOKEN, OK, "the mask token is a special token of the target's tokenizer",
                     f"mask_token_id {mask_token_id} = {shown}")
    return Check(MASK_TOKEN, CRITICAL, "the mask token is an ordinary vocabulary token: every drafted slot is filled "
                 "with a word the drafter also has to predict", f"mask_token_id {mask_token_id} = {shown}, not among "
                 f"the tokenizer's {len(special)} special and added tokens",
                 "add a dedicated mask token to the tokenizer (z-lab adds one, e.g. <|MASK|>) and retrain with it")


def stop_tokens(tokenizer, stop_ids: list[int]) -> Check:
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    evidence = f"generation config EOS {sorted(stop_ids)}; tokenizer EOS {eos!r}"
    if not stop_ids:
        return Check(STOP_TOKENS, WARNING, "the target names no stop token: every completion runs to max_new_tokens",
                     evidence, "set eos_token_id in generation_config.json as the model's release does")
    if eos is not None and eos not in stop_ids:
        return Check(STOP_TOKENS, WARNING, "the tokenizer's EOS is not a stop token of the generation config: text "
                     "past it is generated and scored offline, while a chat server may stop there", evidence,
                     "add it to generation_config.json's eos_token_id")
    return Check(STOP_TOKENS, OK, "the stop tokens are the generation config's and include the tokenizer's EOS",
                 evidence)


def thinking(tokenizer, flag: bool | None, served: bool | None) -> Check:
    """flag: what the eval passes (--enable-thinking, None: the template's default); served: what the
    serving config's chat_template_kwargs say (None: not given)."""
    rendered = template_thinking(tokenizer, flag) if tokenizer is not None else None
    if rendered is None:
        return Check(THINKING, INFO, "the chat template has no thinking switch (or the target has no template)",
                     "renderings with enable_thinking on and off are the same")
    words = "on" if rendered else "off"
    evidence = (f"the template renders thinking {words} "
                f"{'by default' if flag is None else f'with --enable-thinking={flag}'}")
    if served is not None and served != rendered:
        return Check(THINKING, CRITICAL, f"thinking is {words} offline but {'on' if served else 'off'} where it is "
                     "served: the continuations differ, and so does acceptance (z-lab #133)",
                     f"{evidence}; the serving config's chat_template_kwargs enable_thinking={served}",
                     f"evaluate with --{'' if served else 'no-'}enable-thinking, or serve as evaluated")
    return Check(THINKING, OK, f"thinking is {words}" + (", as served" if served is not None else ""), evidence)
