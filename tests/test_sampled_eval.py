"""Sampled evals (T > 0) end to end: continuations drawn once and shared, the exact offline expectation,
the online Monte Carlo check, paired compare_deltas on the same draws, and the flags' limits.

On a tiny Qwen3 target (pure attention: z-lab's cached loop is lossless there) with a fitted DFlash
drafter and a DFlash2 drafter built on it (tests/tiny.py).
"""

import dataclasses
import json

import numpy as np
import pytest
import torch
from transformers import Qwen3ForCausalLM

from evaluators import metrics, pooling, scoring
from evaluators.drafter import open_drafter, save_zlab
from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from evaluators.prompts import Prompt
from evaluators.sampling import Sampling, draft_probability, expected_walk, sampling_probs
from evaluators.target import greedy_continuations, layer_hidden_states, load_target
from tiny import dflash2_from, fit_drafter, greedy_sequences, qwen3_config, save_target
from tracker.measurement import protocol
from tracker.cli import main
from tracker.errors import DraftboardError
from tracker.measurement.uncertainty import paired_comparison, prompt_score
from zlab import zlab_model

MAX_NEW = 24
CARD = dict(temperature=1.0, top_p=0.95, top_k=20)  # the DFlash2 model card's sampling


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen3 target whose EOS fires now and then, a DFlash drafter fitted to its greedy text and
    a DFlash2 drafter built on it, and 5 token-id prompts."""
    root = tmp_path_factory.mktemp("sampled")
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(qwen3_config(eos_token_id=None)).eval()
    fitted, dcfg = fit_drafter(target, greedy_sequences(target, 8, 6, 48, seed=1), layer_ids=[1, 3], block_size=4,
                               steps=120)
    dflash2, cfg2 = dflash2_from(fitted, dcfg)
    prompts = torch.randint(2, 60, (5, 7), generator=torch.Generator().manual_seed(7)).tolist()
    target.config.eos_token_id = int(greedy_sequences(target, 5, 7, 40, seed=7)[0, 19])
    save_target(target, root / "target")
    save_zlab(fitted, dcfg, root / "dflash")
    save_zlab(dflash2, cfg2, root / "dflash2")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root


def settings(root, family, cache, **kw):
    return EvalSettings(str(root / "target"), str(root / family), str(root / "prompts.jsonl"), max_new_tokens=MAX_NEW,
                        device="cpu", cache_dir=str(cache), budgets=(4,), **kw)


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
@pytest.mark.parametrize("last_block", ["cut", "full"])
def test_at_temperature_zero_the_sampled_scoring_is_the_greedy_eval_bit_for_bit(pair, family, last_block):
    """The sampled machinery at T = 0 (one-hot p and q, so every r is 0 or 1, one continuation drawn with
    probability 1) gives the greedy walk's tau, pooled tau, histogram, per-position rates and block count
    exactly, with the drafter's short blocks near the limit and a stop token included."""
    target = load_target(pair / "target")
    loaded = open_drafter(pair / family).load()
    prompts = [json.loads(line)["input_ids"] for line in (pair / "prompts.jsonl").read_text().splitlines()]
    block, layers = loaded.model.block_size, list(loaded.model.target_layer_ids)
    stops = set(target.stop_token_ids())
    greedy, sampled = [], []
    for i, (p, cont) in enumerate(zip(prompts, greedy_continuations(target, prompts, MAX_NEW + block - 1,
                                                                     block - 1))):
        completion, n = scoring.completion_bounds(cont, MAX_NEW, stops)
        end = metrics.walk_end(len(completion), n, n < len(completion), last_block)
        feats = layer_hidden_states(target, p + completion[:n], layers)
        ctx = torch.cat([feats[k] for k in layers], dim=-1)
        g = scoring.Walked(Prompt(f"p{i}", p), completion, n, MAX_NEW, end)
        s = scoring.Walked(Prompt(f"p{i}", p), completion, n, MAX_NEW, end, seed=0, probs=[1.0] * len(cont))
        scoring.score_anchors(loaded, target, g, ctx, cont, ())
        scoring.score_ratios(loaded, target, s, ctx, cont, Sampling(0.0))
        if last_block == "cut":
            scoring.score_short_blocks(loaded, target, g, ctx, cont, ())
            scoring.score_short_ratios(loaded, target, s, ctx, cont, Sampling(0.0))
        assert {r for row in s.walk_ratios() for r in row} <= {0.0, 1.0}
        greedy.append(g)
        sampled.append(s)
    a = scoring.summarize(greedy, block, (), last_block)
    b = scoring.summarize_sampled(sampled, 1, block, last_block)
    for key in ("tau", "tau_pooled", "tau_all_anchors", "streak", "accept_rate_by_position", "n_blocks"):
        assert a[key] == b[key], key
    assert a["accept_len_histogram"] == b["accept_len_histogram"]
    assert sum(a["accept_len_histogram"][1:]) > 0  # drafts were accepted: the equality covers real blocks
    # Issue 50: the curves by context in expectation are the greedy ones, bucket by bucket, intervals included.
    curves = pooling._by_context(greedy, a["prompts"], ())
    assert len(curves["tau_by_context"]) > 1 and pooling._by_context_sampled(sampled, 1, ()) == curves
    assert any(p["completion_ids"][-1] in stops for p in a["prompts"])  # and a stop token


@pytest.fixture(scope="module")
def trained(serving_pair, tmp_path_factory):
    """The trained serving pair (a text-trained Qwen3 target, a block-8 DFlash drafter: their sampled
    acceptance ratios are mostly strictly between 0 and 1) and a DFlash2 drafter built on its drafter."""
    root = tmp_path_factory.mktemp("trained")
    loaded = open_drafter(serving_pair / "drafter").load()
    save_zlab(*dflash2_from(loaded.model, loaded.model.cfg), root / "dflash2")
    (root / "dflash").symlink_to((serving_pair / "drafter").resolve())
    for name in ("target", "prompts.jsonl"):
        (root / name).symlink_to(serving_pair / name)
    return root


TRAINED_NEW = 32  # tokens per prompt in the Monte Carlo tests (8 prompts)


def expected_given(target, loaded, prompt: list[int], completion: list[int], sampling: Sampling,
                   last_block: str) -> float | None:
    """E[tau | the output is `completion`] under the sampled loop, from one drafter pass: the offline
    expectation of one given continuation, with p from a full forward of the target. None when the
    completion has no block (it stopped at once)."""
    block, cut = loaded.model.block_size, last_block == "cut"
    # The last anchors' blocks reach block-1 tokens past the completion: padding, which no walk counts
    # (`cut` walks short blocks there and clips a block at a stop token; `full` draws past the limit,
    # and the completion holds those drafts' fate: a run that went on would have more tokens).
    cont = completion + [0] * (block - 1)
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt + cont])).logits[0, len(prompt) - 1:-1]
    probs = sampling_probs(logits, sampling).gather(-1, torch.tensor(cont)[:, None])[:, 0].double().tolist()
    stops = set(target.stop_token_ids())
    bounded, n = scoring.completion_bounds(cont, TRAINED_NEW, stops)
    assert bounded == completion
    end = metrics.walk_end(len(completion), n, n < len(completion), last_block)
    feats = layer_hidden_states(target, prompt + completion[:n], list(loaded.model.target_layer_ids))
    ctx = torch.cat([feats[k] for k in loaded.model.target_layer_ids], dim=-1)
    w = scoring.Walked(Prompt("given", prompt), completion, n, TRAINED_NEW, end, probs=probs)
    scoring.score_ratios(loaded, target, w, ctx, cont, sampling)
    if cut:
        scoring.score_short_ratios(loaded, target, w, ctx, cont, sampling)
    walk = expected_walk(w.walk_ratios(), end, cut, block)
    return walk.tau if walk.blocks else None


def assert_centred(differences: list[float]) -> None:
    """Each difference (a run's tau minus E[tau | its own output]) has mean 0 when the offline expectation
    is right: only the acceptance draws vary, so 3 standard errors bound its mean."""
    d = np.asarray(differences)
    se = d.std(ddof=1) / np.sqrt(len(d))
    assert len(d) >= 30 and 0 < se < 0.05 and abs(d.mean()) < 3 * se, (d.mean(), se)


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_offline_expectation_lies_inside_the_online_monte_carlo_interval(trained, tmp_path, family):
    """At the DFlash2 model card's sampling (T=1, top_p 0.95, top_k 20), the exact expectation over 96
    drawn continuations per prompt lies inside the 95% Monte Carlo interval of 12 runs per prompt of
    the lossless sampled loop (`--scoring online --seeds`), the prompts held fixed: both estimate
    z-lab's sampled tau. (`full`: every block drafted whole, so many draws cost little.)"""
    res = evaluate(EvalSettings(str(trained / "target"), str(trained / family), str(trained / "prompts.jsonl"),
                                max_new_tokens=TRAINED_NEW, device="cpu", cache_dir=str(tmp_path), **CARD,
                                samples=96, seeds=12, scoring="online", last_block="full", batch_size=96))
    low, high = res["monte_carlo"]["tau_ci_given_prompts"]
    assert res["protocol"]["samples"] == 12 and res["offline"]["monte_carlo"]["draws_per_prompt"] == 96
    assert low <= res["offline"]["tau"] <= high, (res["offline"]["tau"], low, high)
    assert 1.3 < res["tau"] < 4.0 and high - low > 0.05  # drafts are accepted, not all, and runs vary
    assert all(len(p["samples"]) == 12 and len(p["offline_samples"]) == 96 for p in res["prompts"])


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_each_run_is_its_own_outputs_expectation_in_our_loop_and_in_zlabs(trained, tmp_path, family):
    """The sharp check, per run: E[tau | that run's own output], computed offline from one drafter pass,
    is what the run's tau is in expectation, for draftboard's online loop and for z-lab's own
    `dflash_generate` at T = 1 (its code as written, `cut`). The continuations' noise cancels here, so a
    wrong q, p or residual, which moves P(accept | output), shows at a few dozen runs."""
    zlab = zlab_model()
    sampling = Sampling(**CARD)
    res = evaluate(EvalSettings(str(trained / "target"), str(trained / family), str(trained / "prompts.jsonl"),
                                max_new_tokens=TRAINED_NEW, device="cpu", cache_dir=str(tmp_path), **CARD,
                                seeds=5, scoring="online"))
    target, loaded = load_target(trained / "target"), open_drafter(trained / family).load()
    ours = []
    for row in res["prompts"]:
        for run in row["samples"]:
            given = expected_given(target, loaded, row["input_ids"], run["completion_ids"], sampling, "cut")
            assert (given is None) == (run["tau"] is None)
            ours += [run["tau"] - given] if given is not None else []
    assert_centred(ours)

    model = (zlab.DFlash2DraftModel if family == "dflash2" else zlab.DFlashDraftModel).from_pretrained(
        str(trained / family)).eval()
    theirs = []
    for row in res["prompts"]:
        for seed in range(5):
            torch.manual_seed(seed)
            out = zlab.dflash_generate(model, target.model, torch.tensor([row["input_ids"]]), TRAINED_NEW,
                                       target.stop_token_ids(), return_stats=True, **CARD)
            completion = out.output_ids[0, len(row["input_ids"]):].tolist()
            given = expected_given(target, loaded, row["input_ids"], completion, sampling, "cut")
            if given is not None:
                theirs.append(sum(out.acceptance_lengths) / len(out.acceptance_lengths) - given)
    assert_centred(theirs)


@pytest.mark.parametrize("cut", [dict(top_p=0.95, top_k=20), dict(top_p=0.5, top_k=0), dict(top_p=1.0, top_k=3)])
def test_a_dflash_drafts_probability_is_zlabs_draft_distribution(pair, cut):
    """q of a DFlash draft is z-lab's `draft_probs` at the drafted token: `_sampling_probs` of the drafter's
    logits with the protocol's temperature, top_p and top_k (DFlash2's, the selector's: test_dflash2.py)."""
    zlab = zlab_model()
    model = open_drafter(pair / "dflash").load().model
    torch.manual_seed(4)
    hidden = torch.randn(32, model.block_size, model.cfg.hidden_size)
    logits = model.logits(hidden, torch.randn(model.cfg.vocab_size, model.cfg.hidden_size))
    tokens = torch.randint(0, model.cfg.vocab_size, (32, model.block_size - 1))
    s = Sampling(0.7, **cut)
    theirs = zlab._sampling_probs(logits, 0.7, **cut).gather(-1, tokens[..., None])[..., 0]
    q = draft_probability(model, hidden, logits, tokens, tokens, s)
    assert torch.equal(q, theirs) and (q == 0).any()  # each cut removes tokens: q really is cut


def test_continuations_are_drawn_once_and_shared_by_every_checkpoint(pair, tmp_path):
    """A second checkpoint scored with the same target, prompts, sampling and seed meets the same
    continuations from the cache (no target loaded: only its heads are read); another seed draws others."""
    first = evaluate(settings(pair, "dflash", tmp_path, **CARD, samples=4))
    second = evaluate(settings(pair, "dflash2", tmp_path, **CARD, samples=4))
    reseeded = evaluate(settings(pair, "dflash2", tmp_path, **CARD, samples=4, seed=1))
    assert (first["timing"]["loaded"], second["timing"]["loaded"], reseeded["timing"]["loaded"]) == (
        "model", "heads", "model")

    def draws(res):
        return [[d["completion_ids"] for d in p["samples"]] for p in res["prompts"]]

    assert draws(first) == draws(second) != draws(reseeded)
    assert len({tuple(c) for p in draws(first) for c in p}) > 15  # 20 draws, nearly all different
    proto = protocol.Protocol.from_results(second)
    assert (proto.temperature, proto.top_p, proto.top_k, proto.samples, proto.seed) == (1.0, 0.95, 20, 4, 0)
    rows = [r for r in first["tau_by_context"] if r["blocks"]]  # in expectation: its blocks and tokens, bucketed
    assert sum(r["blocks"] for r in rows) == pytest.approx(first["n_blocks"], abs=1e-3 * len(rows))
    assert sum(r["blocks"] * r["tau"] for r in rows) / sum(r["blocks"] for r in rows) == pytest.approx(
        first["tau_pooled"], rel=1e-4)
    assert second["ddtree"] == {} and "DFlash2" in second["ddtree_skipped"]
    assert first["ddtree"] == {} and "temperature > 0" in first["ddtree_skipped"]
    greedy = protocol.Protocol.from_results(evaluate(settings(pair, "dflash", tmp_path)))
    assert {r.field: r.severity for r in protocol.diff(greedy, proto)}["protocol.temperature"] == "critical"


def test_a_paired_comparison_on_the_same_draws_is_narrower_than_on_independent_ones(pair, tmp_path):
    """Two checkpoints scored on the same continuations share the draws' noise, which cancels in Δτ;
    on independently drawn continuations it does not. Same prompts, same number of draws."""
    a = evaluate(settings(pair, "dflash", tmp_path, **CARD, samples=8))
    b_same = evaluate(settings(pair, "dflash2", tmp_path, **CARD, samples=8))
    b_other = evaluate(settings(pair, "dflash2", tmp_path, **CARD, samples=8, seed=1))

    def scores(res):
        return {p["id"]: prompt_score(p) for p in res["prompts"]}

    same, other = paired_comparison(scores(a), scores(b_same)), paired_comparison(scores(a), scores(b_other))
    width = lambda c: c.delta.high - c.delta.low  # noqa: E731
    assert width(same) < 0.75 * width(other), (width(same), width(other))


def test_compare_pairs_sampled_evals_and_says_whether_they_share_their_draws(pair, tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    base = ["eval", "--target", str(pair / "target"), "--prompts", str(pair / "prompts.jsonl"), "--max-new-tokens",
            str(MAX_NEW), "--device", "cpu", "--cache-dir", str(tmp_path / "cache"), "--tracking-uri", store,
            "--temperature", "1", "--top-p", "0.95", "--top-k", "20", "--samples", "3"]
    ids = []
    for family in ("dflash", "dflash2"):
        assert main([*base, "--drafter", str(pair / family)]) == 0
        ids.append(capsys.readouterr().out.split("run: ")[-1].split()[0])
    assert main(["compare", *ids, "--tracking-uri", store]) == 0
    out = capsys.readouterr().out
    assert "T=1 top_p=0.95 top_k=20 x3" in out and "both scored on the same sampled continuations" in out


@pytest.mark.parametrize("flags, needle", [
    (["--samples", "4"], "need --temperature > 0"),
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0"),
    (["--temperature", "1", "--top-p", "0"], "--top-p must lie in (0, 1]"),
    (["--temperature", "1", "--samples", "5000"], "--samples must lie in 1..1024"),
    (["--temperature", "1", "--seeds", "4"], "--seeds counts runs of the online loop"),
    (["--temperature", "1", "--completions", "x.jsonl"], "draws its own continuations"),
])
def test_bad_sampling_flags_are_one_error_line_before_anything_runs(pair, tmp_path, capsys, flags, needle):
    args = ["eval", "--target", str(pair / "target"), "--drafter", str(pair / "dflash"), "--prompts",
            str(pair / "prompts.jsonl"), "--no-log", "--cache-dir", str(tmp_path), *flags]
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own refusal of a value its type rejects
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "error: " in err[-1] and needle in err[-1], err
    assert len([line for line in err if "error: " in line]) == 1
    assert not any(tmp_path.iterdir())  # nothing drawn, nothing cached


def test_a_sampled_eval_is_refused_by_reconcile(pair, tmp_path):
    from tracker.measurement.reconcile import reconcile

    res = evaluate(settings(pair, "dflash", tmp_path, **CARD, samples=2))
    engine = {**res, "protocol": {**res["protocol"], "scoring": "engine"}, "engine_mean_acceptance_length": 1.5}
    with pytest.raises(DraftboardError, match="is sampled .*draftboard compare"):
        reconcile(engine, res)


def test_sampling_settings_reach_the_worker_as_a_job_says_them():
    from tracker.jobs import eval_job

    params = {"target": "/t", "drafter": "/d", "prompts": "/p.jsonl", **CARD, "samples": 16, "seed": 3}
    argv = eval_job.cli_args(params)
    assert argv[argv.index("--temperature") + 1] == "1.0" and argv[argv.index("--top-k") + 1] == "20"
    # The queue's rule in a job's own words: its param names, not the CLI's flags.
    for bad, said in (({"temperature": 0.0, "samples": 4}, "eval params: samples and seeds draw sampled "
                       "continuations: they need temperature > 0 (at T = 0 there is one continuation, the greedy one)"),
                      ({"top_p": 1.5}, "eval params: top_p must lie in (0, 1], got 1.5"),
                      ({"samples": 2000}, "eval params: samples must lie in 1..1024, got 2000")):
        with pytest.raises(DraftboardError) as caught:
            eval_job.validate({**params, **bad})
        assert str(caught.value) == said
    assert dataclasses.asdict(Sampling(**CARD)) == CARD
