"""A byte-level tokenizer for the demo target: token id = byte value.

Ids 0..255 are the bytes of the UTF-8 text, then three special tokens: BOS=256, EOS=257,
MASK=258 (the DFlash mask token); the vocabulary has 259 entries and padding uses EOS.

Two faces of the same mapping:
- `encode` / `decode`: plain Python, used by training (no tokenizer object in the hot loop).
- `hf_tokenizer()`: a real `tokenizers.Tokenizer` wrapped in `PreTrainedTokenizerFast`, saved
  with the target so `AutoTokenizer.from_pretrained(target_dir)` works like for any Hub model.
  It is GPT-2's byte-level scheme without merges: the ByteLevel pre-tokenizer maps every byte
  to one printable stand-in character (no regex splitting, no prefix space), a BPE model with
  an empty merge list maps each stand-in to its byte's id, and the ByteLevel decoder turns the
  stand-ins back into bytes, then UTF-8.
"""

from __future__ import annotations

from pathlib import Path

BOS, EOS, MASK = 256, 257, 258
VOCAB_SIZE = 259
PAD = EOS
SPECIAL_TOKENS = {"<|bos|>": BOS, "<|eos|>": EOS, "<|mask|>": MASK}


def encode(text: str) -> list[int]:
    """UTF-8 bytes of `text` as token ids (no BOS / EOS added)."""
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Token ids back to text; special tokens are dropped, broken UTF-8 becomes U+FFFD."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def hf_tokenizer():
    """The same mapping as a `PreTrainedTokenizerFast` (bos / eos / mask / pad set)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in enumerate(_stand_ins())}
    assert set(vocab) == set(ByteLevel.alphabet())  # the characters the pre-tokenizer emits
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    names = sorted(SPECIAL_TOKENS, key=SPECIAL_TOKENS.get)
    tok.add_special_tokens(names)
    assert [tok.token_to_id(n) for n in names] == sorted(SPECIAL_TOKENS.values())
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        mask_token="<|mask|>",
        pad_token="<|eos|>",
        clean_up_tokenization_spaces=False,
    )


def _stand_ins() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest map to 256+."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    out, shifted = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + shifted))
            shifted += 1
    return out


def save(out_dir: str | Path) -> None:
    """Write tokenizer.json + tokenizer_config.json into `out_dir`."""
    hf_tokenizer().save_pretrained(str(out_dir))
