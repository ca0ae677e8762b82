"""The target cache: what it stores, its size, LRU eviction under the cap, and what it never touches."""

import json
import os

import pytest
import torch

from evaluators.cache import CONTINUATIONS, FEATURES, EvalCache
from evaluators.target import cache_key
from tracker import config
from tracker.errors import DraftboardError

KEY_A, KEY_B, KEY_C, KEY_D = (cache_key("test", name) for name in "abcd")


def feats(n: int = 3, t: int = 5, h: int = 4) -> list[torch.Tensor]:
    return [torch.arange(t * h, dtype=torch.float32).reshape(t, h) + i for i in range(n)]


def read(cache: EvalCache, key: str, layer: int, n: int) -> list[torch.Tensor] | None:
    f = cache.open_features(key, layer, n)
    if f is None:
        return None
    try:
        return [f.read(i) for i in range(n)]
    finally:
        f.close()


def age(cache: EvalCache, kind: str, key: str, when: float) -> None:
    """Set an entry's last use to `when` (unix seconds) without reading it."""
    for entry in cache.entries():
        if (entry.kind, entry.key) == (kind, key):
            for path in entry.files:
                os.utime(path, (when, when))


def test_entries_report_what_was_written_and_its_size(tmp_path):
    cache = EvalCache(tmp_path, max_bytes=10**9)
    cache.put_continuations(KEY_A, [[1, 2, 3], [4]], target="digest-a")
    cache.put_features(KEY_B, 2, feats(), target="digest-b")
    cache.put_features(KEY_B, 0, feats())  # a later layer without a digest keeps the recorded one
    entries = {e.kind: e for e in cache.entries()}
    assert set(entries) == {CONTINUATIONS, FEATURES}
    cont, feat = entries[CONTINUATIONS], entries[FEATURES]
    assert (cont.key, cont.target, cont.layers) == (KEY_A, "digest-a", ())
    assert (feat.key, feat.target, feat.layers) == (KEY_B, "digest-b", (0, 2))
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert cache.size() == cont.size + feat.size == on_disk
    # 3 fp32 tensors of 5x4 are 240 bytes of data per layer file, plus the safetensors header
    layer = tmp_path / "features" / KEY_B / "layer_2.safetensors"
    assert layer.stat().st_size > 240 and layer in feat.files
    assert cache.get_continuations(KEY_A) == [[1, 2, 3], [4]]
    assert all(torch.equal(a, b) for a, b in zip(read(cache, KEY_B, 0, 3), feats()))
    assert read(cache, KEY_B, 1, 3) is None and cache.get_continuations(KEY_C) is None


def test_reading_an_entry_makes_it_recently_used(tmp_path):
    cache = EvalCache(tmp_path, max_bytes=10**9)
    cache.put_features(KEY_A, 1, feats())
    age(cache, FEATURES, KEY_A, 1_000_000)
    assert cache.entries()[0].last_used == 1_000_000
    read(cache, KEY_A, 1, 3)
    assert cache.entries()[0].last_used > 1_000_000


def test_the_cap_evicts_the_least_recently_used_entry(tmp_path):
    probe = EvalCache(tmp_path / "probe", max_bytes=10**9)
    probe.put_features(KEY_A, 1, feats())
    one = probe.size()  # every entry below has the same size
    cache = EvalCache(tmp_path / "cache", max_bytes=2 * one + one // 2)  # room for two entries
    cache.put_features(KEY_A, 1, feats())
    cache.put_features(KEY_B, 1, feats())
    age(cache, FEATURES, KEY_A, 1_000_000)
    age(cache, FEATURES, KEY_B, 2_000_000)
    assert read(cache, KEY_A, 1, 3) is not None  # A is now the newest: B is the least recently used
    cache.put_features(KEY_C, 1, feats())
    assert sorted(e.key for e in cache.entries()) == sorted([KEY_A, KEY_C])
    assert read(cache, KEY_B, 1, 3) is None  # an evicted entry is a plain miss
    assert not (tmp_path / "cache" / "features" / KEY_B).exists()
    assert cache.size() <= cache.max_bytes


def test_an_entry_larger_than_the_cap_stays_until_the_next_write(tmp_path):
    cache = EvalCache(tmp_path, max_bytes=100)  # smaller than any feature file
    cache.put_features(KEY_A, 1, feats())
    assert [e.key for e in cache.entries()] == [KEY_A]  # its eval is about to read it
    cache.put_continuations(KEY_B, [[1]])
    assert [e.key for e in cache.entries()] == [KEY_B]


def test_prune_removes_only_what_draftboard_wrote(tmp_path):
    cache = EvalCache(tmp_path, max_bytes=10**9)
    cache.put_continuations(KEY_A, [[1]], target="d")
    cache.put_features(KEY_B, 1, feats(), target="d")
    cache.put_features(KEY_C, 0, feats())
    foreign = [tmp_path / "notes.txt", tmp_path / "continuations" / "mine.json",
               tmp_path / "continuations" / f"{KEY_D}.json.bak", tmp_path / "features" / KEY_C / "README",
               tmp_path / "features" / "checkpoints" / "layer_0.safetensors", tmp_path / "other" / "x.bin"]
    for path in foreign:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not the cache's")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.safetensors"
    outside.write_text("kept")
    (tmp_path / "features" / KEY_D).mkdir()
    (tmp_path / "features" / KEY_D / "layer_0.safetensors").symlink_to(outside)
    assert {e.key for e in cache.entries()} == {KEY_A, KEY_B, KEY_C}
    removed = cache.prune(0)
    assert {e.key for e in removed} == {KEY_A, KEY_B, KEY_C} and cache.entries() == []
    assert all(p.read_text() == "not the cache's" for p in foreign)
    assert outside.read_text() == "kept" and (tmp_path / "features" / KEY_D / "layer_0.safetensors").is_symlink()
    assert (tmp_path / "features" / KEY_C).is_dir()  # it still holds the README
    assert not (tmp_path / "features" / KEY_B).exists() and not (tmp_path / "continuations" / f"{KEY_A}.json").exists()


def test_prune_to_a_size_keeps_the_most_recent(tmp_path):
    cache = EvalCache(tmp_path, max_bytes=10**9)
    for i, key in enumerate((KEY_A, KEY_B, KEY_C)):
        cache.put_features(key, 0, feats())
        age(cache, FEATURES, key, 1_000_000 + i)
    newest = next(e.size for e in cache.entries() if e.key == KEY_C)  # entries' sizes differ by a few bytes
    removed = cache.prune(newest)
    assert [e.key for e in removed] == [KEY_A, KEY_B]
    assert [e.key for e in cache.entries()] == [KEY_C]
    assert json.loads((tmp_path / "features" / KEY_C / "meta.json").read_text())["kind"] == FEATURES


@pytest.mark.parametrize("value, expected", [(None, 50 * 10**9), ("1.5", 1_500_000_000), (" 0.001 ", 10**6)])
def test_cap_from_the_environment(value, expected, tmp_path):
    env = {} if value is None else {config.CACHE_MAX_VAR: value}
    assert config.cache_max_bytes(env) == expected


@pytest.mark.parametrize("value", ["0", "-1", "lots", "nan", "inf"])
def test_a_bad_cap_is_refused(value):
    with pytest.raises(DraftboardError, match=f"{config.CACHE_MAX_VAR} must be a positive number of GB"):
        config.cache_max_bytes({config.CACHE_MAX_VAR: value})


def test_streamed_features_are_plain_safetensors_written_in_any_order(tmp_path):
    from safetensors.torch import load_file

    cache = EvalCache(tmp_path, max_bytes=10**9)
    parts = {1: feats(4, t=3), 2: [f.to(torch.bfloat16) for f in feats(4, t=6)]}
    lengths = [3, 6, 3, 6]
    seqs = [{1: parts[1][n][: lengths[n]] if lengths[n] <= 3 else torch.ones(6, 4), 2: parts[2][n][: lengths[n]]}
            for n in range(4)]
    with cache.feature_writer(KEY_A, lengths, 4, [1, 2], target="d") as writer:
        for n in (2, 0, 3, 1):  # a batched pass finishes prompts out of order
            writer.write(n, seqs[n])
            assert cache.open_features(KEY_A, 1, 4) is None  # nothing is published before close
    for layer, dtype in ((1, torch.float32), (2, torch.bfloat16)):  # each layer keeps its own dtype
        on_disk = load_file(tmp_path / FEATURES / KEY_A / f"layer_{layer}.safetensors")
        assert all(torch.equal(on_disk[f"s{n}"], seqs[n][layer]) and on_disk[f"s{n}"].dtype == dtype
                   for n in range(4))
        assert all(torch.equal(a, s[layer]) for a, s in zip(read(cache, KEY_A, layer, 4), seqs))
    assert read(cache, KEY_A, 1, 5) is None  # another prompt count is another entry's business


def test_a_failed_pass_publishes_nothing(tmp_path):
    cache = EvalCache(tmp_path, max_bytes=10**9)
    with pytest.raises(RuntimeError):
        with cache.feature_writer(KEY_A, [5, 5], 4, [0]) as writer:
            writer.write(0, {0: feats(1)[0]})
            raise RuntimeError("the target pass failed")
    assert read(cache, KEY_A, 0, 2) is None and list((tmp_path / FEATURES / KEY_A).glob("*.safetensors*")) == []
    with cache.feature_writer(KEY_B, [5, 5], 4, [0]) as writer:
        writer.write(0, {0: feats(1)[0]})  # closed with a prompt missing: incomplete, not published
    assert read(cache, KEY_B, 0, 2) is None


def test_fingerprint_entries_are_listed_and_evicted_like_the_rest(tmp_path):
    from evaluators.cache import FINGERPRINTS

    cache = EvalCache(tmp_path, max_bytes=10**9)
    cache.put_fingerprint(KEY_A, {"part": {"probe": None}}, target="d")
    (tmp_path / FINGERPRINTS / f"{KEY_B}.json").write_text("{damaged")
    assert cache.get_fingerprint(KEY_A) == {"part": {"probe": None}} and cache.get_fingerprint(KEY_B) is None
    assert {(e.kind, e.key, e.target) for e in cache.entries()} >= {(FINGERPRINTS, KEY_A, "d")}
    cache.prune(0)
    assert cache.get_fingerprint(KEY_A) is None
