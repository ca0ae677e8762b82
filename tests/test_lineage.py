"""tracker/dashboard/lineage.py at scale (issue 38): what a page load diffs grows linearly with the
evals, and the re-evaluation each mismatch finds is the one the definition names."""

from __future__ import annotations

from dataclasses import replace

from test_views import fp, run
from tracker.environment import fingerprint
from tracker.measurement import protocol
from tracker.dashboard import envmatrix, lineage, tables
from tracker.dashboard.index import RunIndex

TRAINED = dict(path="fast", dtype="bf16", device="cuda", gpu="H100")  # the training run's environment
# every eval's protocol (greedy, 8 gsm8k prompts), as `draftboard eval` tags it
PROTOCOL = protocol.Protocol(datasets={"gsm8k": 8}, prompt_digest="aaaa", temperature=0.0, block_size=16,
                             max_new_tokens=64, scoring="offline").to_tags()


def _eval(*args, **kwargs):
    ev = run(*args, **kwargs)
    ev.tags.update(PROTOCOL)
    return ev


def _store(n_evals: int) -> RunIndex:
    """One training run and 2 x n_evals evals of its checkpoints. n_evals two per step: the first on a CPU
    box (the torch fallback: critically different), the second a re-evaluation in the training
    environment, every fifth step's on other prompts (not a repeat of the first). And n_evals copies of
    one eval on the CPU box, as a sweep that re-ran it leaves them: nothing answers them."""
    runs = [run("t", "train", fp(**TRAINED))]
    for i in range(n_evals):
        step = 100 * (i // 2)
        prompts = "other.jsonl" if i % 2 and step % 500 == 0 else "p.jsonl"
        runs.append(_eval(f"e{i}", "eval", fp(**TRAINED) if i % 2 else fp(), train="t", step=step, start=i,
                        params={"drafter": f"/ck/{step}", "prompts": prompts, "max_new_tokens": "64"}))
    for i in range(n_evals):
        runs.append(_eval(f"c{i}", "eval", fp(), train="t", step=10**6, start=i,
                        params={"drafter": "/ck/last", "prompts": "p.jsonl", "max_new_tokens": "64"}))
    return RunIndex(runs)


def _resolver_by_definition(index: RunIndex, ev) -> str | None:
    """`resolved_by` as its docstring defines it, by brute force over every eval of the training run."""
    own = lineage.Lineage(ev, index.runs["t"], lambda: lineage.env_diff(ev, index.runs["t"]))
    if not own.critical:
        return None
    for other in reversed(index.evals_of("t")):
        if (other.run_id != ev.run_id and other.checkpoint_step == ev.checkpoint_step
                and (other.start_time or 0) >= (ev.start_time or 0)
                and lineage.same_settings(other, lineage.eval_settings_of(ev))
                and lineage.protocol_tags(other) == lineage.protocol_tags(ev)
                and not lineage.of_severity(lineage.env_diff(other, index.runs["t"]), "critical")):
            return other.run_id
    return None


def test_a_page_loads_lineage_in_linear_work_and_finds_the_same_re_evaluations(monkeypatch):
    calls, keyed = [], []
    real, real_key = fingerprint.diff, lineage.series_key
    monkeypatch.setattr(fingerprint, "diff", lambda a, b: calls.append(1) or real(a, b))
    monkeypatch.setattr(lineage, "series_key", lambda run: keyed.append(1) or real_key(run))
    counted, lines = {}, {}
    for n in (100, 200):
        index = _store(n)
        expected = {ev.run_id: _resolver_by_definition(index, ev) for ev in index.of_kind("eval")}
        calls.clear()
        keyed.clear()
        frame = tables.runs_table(index, list(index.runs.values()))  # the Runs page, then the landing page's count
        open_evals = [ev.run_id for ev in index.of_kind("eval") if lineage.mismatches(index, ev)]
        counted[n], lines[n] = len(calls), len(keyed)
        found = {ev.run_id: getattr(lineage.resolved_by(index, ev), "run_id", None) for ev in index.of_kind("eval")}
        assert found == expected
        assert sorted(open_evals) == sorted(e for e, by in expected.items() if by is None and
                                           (e.startswith("c") or int(e[1:]) % 2 == 0))
        assert len(open_evals) == n + n // 10  # the copies, and the steps re-evaluated on other prompts
        assert frame.set_index("run_id").loc["e2", "env check"] == "🟢 re-evaluated as e3"
    # each eval diffed against its training run once per index; before, every eval against every other
    assert counted[200] <= 2 * counted[100] + 2, counted
    # and each eval's protocol line is keyed a bounded number of times, not once per other eval of its run
    assert lines[200] <= 2 * lines[100] + 2, lines


def test_a_filtered_runs_table_is_the_whole_tables_rows_and_each_caller_owns_its_frame(monkeypatch):
    """The table of every run is derived once per index and shared: a filter's table holds exactly its runs'
    rows in the same order and with the same cells as they have in the whole one, derives no row again, and
    what one visitor's page changes in its frame never reaches the next visitor's."""
    index = _store(100)
    whole = tables.runs_table(index, list(index.runs.values())).copy()
    rows = []
    real = tables._runs_row
    monkeypatch.setattr(tables, "_runs_row", lambda *a: rows.append(1) or real(*a))
    evals = index.of_kind("eval")[::3]
    picked = tables.runs_table(index, evals)
    assert rows == []  # picked from the shared table, none derived again
    assert set(picked["run_id"]) == {ev.run_id for ev in evals} and len(picked) == len(evals)
    expected = whole[whole["run_id"].isin(picked["run_id"])].reset_index(drop=True)
    assert picked.equals(expected)
    for frame in (picked, tables.runs_table(index, list(index.runs.values()))):
        frame.loc[0, "name"] = "changed by one visitor"
        frame["critical"] = 99
    assert tables.runs_table(index, evals).equals(expected)
    assert tables.runs_table(index, list(index.runs.values())).equals(whole)


def test_a_replaced_index_is_freed_when_dropped_without_the_cycle_collector():
    """What a listing derives and keeps in the index (each eval's pair with its training run, the Runs table,
    the open mismatches) holds no cycle back to the index: a store re-read drops the old index whole at once,
    where a pair's diff holding the index left 230,000 objects at 10,000 runs for the cycle collector to find
    (and the dashboard's server keeps its first index out of the collector's sight: it must still be freed)."""
    import gc
    import weakref

    index = _store(50)
    tables.runs_table(index, list(index.runs.values()))
    lineage.open_evals(index)
    assert any(lineage.vs_training(index, ev).rows for ev in index.of_kind("eval"))  # the diffs computed
    gone = weakref.ref(index)
    paused = gc.isenabled()
    gc.disable()
    try:
        del index
        assert gone() is None
    finally:
        if paused:
            gc.enable()


def test_the_next_read_of_the_store_diffs_only_new_runs(monkeypatch):
    """The dashboard re-reads the store every few seconds; fingerprints are logged once, so their diffs
    outlive an index (`RunIndex.lasting`) and the next read diffs only what is new."""
    calls = []
    real = fingerprint.diff
    monkeypatch.setattr(fingerprint, "diff", lambda a, b: calls.append(1) or real(a, b))
    lasting: dict = {}
    first = RunIndex(_store(50).runs.values(), lasting)
    before = tables.runs_table(first, list(first.runs.values()))
    assert calls
    calls.clear()
    grown = [*first.runs.values(), run("new", "eval", fp(), train="t", step=10**7, start=999, params={})]
    again = RunIndex(grown, lasting)
    after = tables.runs_table(again, list(again.runs.values()))
    assert len(calls) == 1  # the new eval against its training run
    evals = before["run_id"] != "t"  # the training run's row counts the new eval's mismatch too
    assert list(after[after["run_id"].isin(before["run_id"][evals])]["env check"]) == list(before[evals]["env check"])


def _as_logged(index: RunIndex, reads: list | None = None) -> RunIndex:
    """`index`'s runs as a listing gets them from a store: the `env.*` tags every draftboard writer logs
    with fingerprint.json (`fingerprint.env_tags`), and the file read only when asked, each read counted
    in `reads` (without `reads`: the files given, as the listing read them all before)."""
    def reader(ev):
        return ev.fingerprint if reads is None else lambda: reads.append(ev.run_id) or ev.fingerprint

    return RunIndex(replace(r, tags={**r.tags, **fingerprint.env_tags(r.fingerprint)}, fingerprint_file=reader(r))
                    for r in index.runs.values())


def test_a_listing_reads_only_the_fingerprints_of_runs_that_differ_critically():
    """Issue 38: against a server each fingerprint.json is a request. The Runs page and the landing count
    decide "differs critically from its training run?" from the `env.critical_key` tags; they read the two
    files only where the keys differ (to say what differs), and show the same cells as from the files."""
    for n in (100, 200):
        reads: list[str] = []
        given = _as_logged(_store(n))
        logged = _as_logged(given, reads)
        expected = tables.runs_table(given, list(given.runs.values()))
        got = tables.runs_table(logged, list(logged.runs.values()))
        assert got.equals(expected)
        assert len(lineage.open_evals(logged)) == n + n // 10
        differing = {ev.run_id for ev in given.of_kind("eval") if lineage.vs_training(given, ev).critical}
        # the evals on the CPU box and their training run; none of the re-evaluations in its environment
        assert set(reads) == differing | {"t"} and len(reads) == len(set(reads)), (n, len(reads))
    matching = RunIndex([run("t", "train", fp(**TRAINED)),
                         *(_eval(f"e{i}", "eval", fp(**TRAINED), train="t", step=100 * i, start=i) for i in range(50))])
    reads = []
    logged = _as_logged(matching, reads)
    tables.runs_table(logged, list(logged.runs.values()))
    assert lineage.open_evals(logged) == [] and reads == []  # a store that matches its training runs: no read


def test_environments_reads_only_the_pairs_that_differ_above_info():
    """Environments lists every (training run, eval) pair with its warnings: a pair whose `env.warning_key`
    tags agree has none (another commit is only `info`), so only the others' files are read."""
    other_gpu = dict(TRAINED, gpu="A100")  # a warning: another GPU model
    index = RunIndex([run("t", "train", fp(**TRAINED)),
                      *(_eval(f"same{i}", "eval", fp(**TRAINED), train="t", step=100 * i, start=i) for i in range(20)),
                      _eval("a100", "eval", fp(**other_gpu), train="t", step=100, start=30),
                      _eval("cpu", "eval", fp(), train="t", step=100, start=31)])
    reads: list[str] = []
    given, logged = _as_logged(index), _as_logged(index, reads)
    assert envmatrix.pairs_frame(logged, lineage.train_eval_pairs(logged)).equals(
        envmatrix.pairs_frame(given, lineage.train_eval_pairs(given)))
    assert sorted(reads) == ["a100", "cpu", "t"]


def test_runs_logged_before_the_key_tags_are_read_and_shown_as_before():
    """A store from before the `env.*` key tags: every fingerprint is read (8 at a time) and the Runs table is
    the one the files give."""
    reads: list[str] = []
    given = _store(20)
    lazy = RunIndex(replace(r, fingerprint_file=lambda r=r: reads.append(r.run_id) or r.fingerprint)
                    for r in given.runs.values())
    assert tables.runs_table(lazy, list(lazy.runs.values())).equals(tables.runs_table(given, list(given.runs.values())))
    assert sorted(reads) == sorted(given.runs)


def test_a_critical_key_written_under_other_rules_is_not_trusted():
    reads: list[str] = []
    logged = _as_logged(RunIndex([run("t", "train", fp(**TRAINED)),
                                  _eval("e", "eval", fp(**TRAINED), train="t", step=1)]), reads)
    old = {r.run_id: replace(r, tags={**r.tags, "env.critical_key": "c0-" + "0" * 16, "env.warning_key": "c0-" + "1" * 16})
           for r in logged.runs.values()}
    index = RunIndex(old.values())
    assert lineage.open_evals(index) == [] and sorted(reads) == ["e", "t"]  # compared by reading both files


def _hub(run_id: str, kind: str, repo: str | None, revision: str | None):
    ev = run(run_id, kind, fp(**TRAINED), ref_name=run_id if kind == "reference" else None)
    ev.tags.update({k: v for k, v in (("draftboard.drafter_repo", repo), ("draftboard.drafter_revision", revision))
                    if v})
    return ev


def test_a_hub_drafter_at_another_revision_is_not_the_same_reference():
    april, retrained = "6c7242c" + "0" * 33, "2274357" + "0" * 33  # z-lab #152's two commits, padded
    ours = _hub("e", "eval", "z-lab/Qwen3.5-122B-A10B-DFlash", april)
    rows = lineage.vs_reference(ours, _hub("r-new", "reference", "z-lab/Qwen3.5-122B-A10B-DFlash", retrained))
    assert rows[0] == fingerprint.DiffRow("draftboard.drafter_revision", april, retrained, "critical")
    assert lineage.field_name(rows[0].field) == "drafter revision"
    unstated = lineage.vs_reference(ours, _hub("r-card", "reference", "z-lab/Qwen3.5-122B-A10B-DFlash", None))
    assert unstated[0] == fingerprint.DiffRow("draftboard.drafter_revision", april, None, "warning")
    same = _hub("r-same", "reference", "z-lab/Qwen3.5-122B-A10B-DFlash", april)
    other_repo = _hub("r-other", "reference", "z-lab/Qwen3-8B-DFlash-b16", retrained)
    trained_here = _hub("t-ours", "eval", None, None)  # a local checkpoint: its digest identifies it
    for a, ref in ((ours, same), (ours, other_repo), (trained_here, same)):
        assert not [r for r in lineage.vs_reference(a, ref) if r.field == "draftboard.drafter_revision"]


def test_fingerprints_a_page_asks_for_at_once_are_read_side_by_side():
    """Against a server each read is a round trip: `RunIndex.read_fingerprints` overlaps them (a lock shared by
    every RunInfo, as functools.cached_property held before Python 3.12, would queue them one by one)."""
    import threading

    active, most, lock = [0], [0], threading.Lock()
    both_in = threading.Barrier(2, timeout=10)

    def reader(r):
        def read():
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            both_in.wait()  # returns only once two reads are in flight together
            with lock:
                active[0] -= 1
            return r.fingerprint
        return read

    index = _store(4)
    lazy = RunIndex(replace(r, fingerprint_file=reader(r)) for r in list(index.runs.values())[:2])
    lazy.read_fingerprints(lazy.runs.values())
    assert most[0] == 2 and all(r.fingerprint_read and r.fingerprint is not None for r in lazy.runs.values())
