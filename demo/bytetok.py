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
- `sentencepiece_model()`: the same ids as a SentencePiece model (`tokenizer.model`): 256 byte
  pieces `<0x00>`..`<0xFF>`, then the special tokens. llama.cpp's GGUF converter reads a Qwen2/3
  target's vocabulary from `tokenizer.model` when there is one (`Qwen2Model.set_vocab`), and only
  otherwise from tokenizer.json, where a byte-level BPE without merges has no pre-tokenizer it
  knows; so the demo target converts with the stock converter, unpatched.
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


def sentencepiece_model() -> bytes:
    """The byte tokenizer as a serialized SentencePiece ModelProto (same ids as `encode`).

    SentencePiece needs exactly one unknown piece and the byte vocabulary has no unknown token, so
    the mask token plays it: the mask is the drafter's input filler, which no text ever encodes to,
    and a DFlash GGUF names its mask token on its own (`tokenizer.ggml.mask_token_id`)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    piece = pb.ModelProto.SentencePiece
    model = pb.ModelProto()
    model.trainer_spec.model_type = pb.TrainerSpec.BPE
    model.trainer_spec.vocab_size = VOCAB_SIZE
    model.trainer_spec.byte_fallback = True
    model.trainer_spec.bos_id, model.trainer_spec.eos_id, model.trainer_spec.unk_id = BOS, EOS, MASK
    model.trainer_spec.bos_piece, model.trainer_spec.eos_piece = "<|bos|>", "<|eos|>"
    model.trainer_spec.unk_piece = "<|mask|>"
    model.trainer_spec.pad_id = -1  # padding uses EOS (PAD), which SentencePiece cannot name twice
    model.normalizer_spec.name = "identity"  # bytes as they are: no NFKC, no added or merged spaces,
    model.normalizer_spec.add_dummy_prefix = False  # and a space stays a space (not U+2581)
    model.normalizer_spec.remove_extra_whitespaces = False
    model.normalizer_spec.escape_whitespaces = False
    for b in range(256):
        model.pieces.add(piece=f"<0x{b:02X}>", score=0.0, type=piece.BYTE)
    for name, token_id in sorted(SPECIAL_TOKENS.items(), key=lambda kv: kv[1]):
        model.pieces.add(piece=name, score=0.0, type=piece.UNKNOWN if token_id == MASK else piece.CONTROL)
    return model.SerializeToString()


def save(out_dir: str | Path) -> None:
    """Write tokenizer.json + tokenizer_config.json, and the same ids as `tokenizer.model`, into `out_dir`."""
    hf_tokenizer().save_pretrained(str(out_dir))
    (Path(out_dir) / "tokenizer.model").write_bytes(sentencepiece_model())
