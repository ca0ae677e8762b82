"""evaluators/engines/gguf_fields.py: a GGUF's metadata read within bounds (issue 48, S3 and S4), on files
written by llama.cpp's own gguf-py writer."""

from __future__ import annotations

import dataclasses
import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from evaluators.doctor import serving
from evaluators.doctor.report import WARNING
from evaluators.engines import gguf_fields, llamacpp
from evaluators.engines.base import EngineError
from tracker.errors import DraftboardError


def write_gguf(path: Path, fields: dict, endian=gguf.GGUFEndian.LITTLE, junk: int = 0) -> Path:
    """A drafter-like GGUF: `general.architecture` dflash, the target's vocabulary, `fields`, one tensor;
    `junk` uint8 items in one more array."""
    writer = gguf.GGUFWriter(path, "dflash", endianess=endian)
    writer.add_token_list([f"tok{i}" for i in range(300)])
    if junk:
        writer.add_key_value("junk", [0] * junk, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8)
    for key, value in fields.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tensor("fc.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_the_fields_read_equal_gguf_own_readers(tmp_path, endian):
    path = write_gguf(tmp_path / "d.gguf", {"dflash.target_layers": [2, 5, 9], "dflash.block_size": 16}, endian)
    mine = gguf_fields.read_fields(path, lambda key: True)
    theirs = gguf.GGUFReader(path)
    for key in ("general.architecture", "dflash.target_layers", "dflash.block_size", "tokenizer.ggml.tokens"):
        value = theirs.get_field(key).contents()
        assert mine[key] == ([int(v) if not isinstance(v, str) else v for v in value] if isinstance(value, list)
                             else value), key
    assert llamacpp.drafter_target_layers(path) == [2, 5, 9]


def test_a_huge_array_is_skipped_without_building_it(tmp_path):
    """The audit's file: 2 MB, one 2M-element array; gguf's reader took 50 s and 1.6 GB building a numpy view
    per element. Skipped here by its byte length: nothing is allocated per element."""
    path = write_gguf(tmp_path / "d.gguf", {"dflash.target_layers": [1, 3]}, junk=2_000_000)
    tracemalloc.start()
    try:
        assert llamacpp.drafter_target_layers(path) == [1, 3]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * path.stat().st_size  # the file's bytes, once (gguf's reader: ~800x)


def _raw(path: Path, head: bytes, body: bytes = b"") -> Path:
    path.write_bytes(head + body)
    return path


def test_every_count_is_bounded_before_it_is_used(tmp_path):
    def refused(path: Path, match: str) -> None:
        with pytest.raises(DraftboardError, match=match):
            gguf_fields.read_fields(path, lambda key: key != "junk")

    # big-endian version bytes: read little-endian the counts were 2^56 fields; gguf's rule reads the
    # file big-endian, and its counts are bounded
    big = struct.pack(">I", 3) + struct.pack("<QQ", 1, 1)  # 1 and 1 little-endian: 2^56 and 2^56 as gguf reads
    refused(_raw(tmp_path / "be.gguf", b"GGUF" + big), "72057594037927936 tensors")
    refused(_raw(tmp_path / "le.gguf", b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1)), "tensors")
    # an array claiming 2^60 strings: walked only as far as the bytes go
    key = struct.pack("<Q", 4) + b"junk" + struct.pack("<IIQ", gguf_fields.ARRAY, gguf_fields.STRING, 1 << 60)
    refused(_raw(tmp_path / "arr.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1), key + struct.pack("<Q", 0) * 1000),
            "truncated GGUF metadata")
    # a key of 2^40 bytes, a string value past the end, an unknown type, nesting
    refused(_raw(tmp_path / "key.gguf", b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 40)), "GGUF string of")
    nested = struct.pack("<Q", 1) + b"k" + struct.pack("<I", gguf_fields.ARRAY) + struct.pack(
        "<IQ", gguf_fields.ARRAY, 1) * 4
    refused(_raw(tmp_path / "nest.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1), nested), "a flat list of numbers or strings")
    # Issue 64, F7: a kept field (dflash.target_layers) of nested arrays is refused before anything is built: the
    # audit's 64 MB of them took 53.5 s and 912 MB when each item was bounded but not the field.
    key = b"dflash.target_layers"
    deep = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", gguf_fields.ARRAY, gguf_fields.ARRAY, 1 << 20)
    deep += struct.pack("<IQI", 4, 1, 7) * (1 << 16)  # each item a 1-number array: 4 MiB of them
    started = time.perf_counter()
    refused(_raw(tmp_path / "deep.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1), deep),
            "a flat list of numbers or strings")
    assert time.perf_counter() - started < 1.0
    odd = struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99)
    refused(_raw(tmp_path / "type.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1), odd), "unknown GGUF value type 99")
    refused(_raw(tmp_path / "v9.gguf", b"GGUF" + struct.pack("<IQQ", 9, 0, 0)), "GGUF version 9")
    refused(_raw(tmp_path / "no.gguf", b"NOPE" + bytes(20)), "not a GGUF file")


@pytest.mark.parametrize("value", ["[1, 2]", 7])
def test_target_layers_that_are_not_a_list_are_one_warning(tmp_path, value):
    """S4: a string or a scalar `dflash.target_layers` crashed doctor with a traceback."""
    path = write_gguf(tmp_path / "d.gguf", {"dflash.target_layers": value})
    with pytest.raises(EngineError, match="dflash.target_layers is .*not a list of layer numbers"):
        llamacpp.drafter_target_layers(path)
    config = serving.ServingConfig(engine="llamacpp", method="draft-dflash", draft_tokens=7, mamba_ssm_dtype=None,
                                   enable_thinking=None)
    check = serving.gguf_target_layers(dataclasses.replace(config, drafter_gguf=str(path)), [0, 2])
    assert check.severity == WARNING and "not a list of layer numbers" in check.verdict
