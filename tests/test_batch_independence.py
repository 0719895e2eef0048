"""A pair's score does not depend on the other pairs of its batch, for the members solved to convergence.

The converged solver stops, warm-starts and over-relaxes every item on its own, so a pair scored alone
and inside a batch of 64 pairs of mixed lengths agree to float rounding (1e-6), through the functional
API and through :meth:`Scorer.score`. (The one-iteration members have no batch-level decision at all:
``test_functional.py::test_padding_and_batch_partners_do_not_matter``.)
"""
from __future__ import annotations

import random
import warnings

import pytest
import torch

import torchmover.functional as F
from torchmover import Scorer
from torchmover.functional import transport
from torchmover.scorer import references

BATCH = 64
ALONE = range(0, BATCH, 7)  # the pairs also scored alone: every length class, in a few seconds
FUNCTIONAL = {
    "wmd": lambda h, r, hm, rm, hi, ri: F.wmd(h, r, hm, rm),
    "moverscore": lambda h, r, hm, rm, hi, ri: F.moverscore(h, r, hm, rm),
    "twmd-converged": lambda h, r, hm, rm, hi, ri: F.tempered_wmd(h, r, hm, rm, temperature=0.1, n_iter=None),
    **{variant: (lambda v: lambda h, r, hm, rm, hi, ri: F.sentence_movers(h, r, hm, rm, hi, ri, variant=v))(variant)
       for variant in ("sms", "s+wms", "wms")},
}


def mixed_batch(seed: int, dim: int = 16):
    """64 pairs of 1 to 40 tokens (float32, padding holds garbage), with 1 to 4 sentences per text."""
    g = torch.Generator().manual_seed(seed)
    l1, l2 = torch.randint(1, 41, (BATCH,), generator=g), torch.randint(1, 41, (BATCH,), generator=g)
    l1[0], l2[1] = 40, 40
    ref, hyp = torch.randn(BATCH, 40, dim, generator=g), torch.randn(BATCH, 40, dim, generator=g)
    rm, hm = torch.arange(40) < l1[:, None], torch.arange(40) < l2[:, None]
    ref[~rm], hyp[~hm] = 7.0, -3.0

    def sentences(lengths):
        cuts = torch.randint(0, 4, (BATCH,), generator=g)
        return (torch.arange(40)[None, :] * (cuts[:, None] + 1) // lengths.clamp_min(1)[:, None]).clamp_max(3)
    return hyp, ref, hm, rm, sentences(l2), sentences(l1)


def alone(k: int, hyp, ref, hm, rm, hi, ri):
    """Pair ``k`` as a batch of its own, cut to its own lengths."""
    n2, n1 = int(hm[k].sum()), int(rm[k].sum())
    return hyp[k:k + 1, :n2], ref[k:k + 1, :n1], hm[k:k + 1, :n2], rm[k:k + 1, :n1], hi[k:k + 1, :n2], ri[k:k + 1, :n1]


@pytest.mark.parametrize("name", FUNCTIONAL)
def test_functional_score_does_not_depend_on_batch_mates(name):
    fn = FUNCTIONAL[name]
    batch = mixed_batch(0)
    together = fn(*batch)
    assert together.shape == (BATCH,) and torch.isfinite(together).all()
    for k in ALONE:
        torch.testing.assert_close(fn(*alone(k, *batch))[0], together[k], atol=1e-6, rtol=0, msg=f"pair {k}")


WORDS = ("the cat sat on a mat dog barked at man sun fox jumps over lazy quick brown red blue "
         "green house tree river stone runs sleeps eats big small old new").split()


def texts(seed: int, n: int) -> list[str]:
    """``n`` texts of 1 to 30 words in 1 to 3 sentences."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 30))]
        for cut in sorted(rng.sample(range(1, len(words)), min(2, len(words) - 1))):
            words[cut - 1] += " ."
        out.append(" ".join(words))
    return out


@pytest.mark.parametrize("method", ["wmd", "moverscore", "sms", "s+wms", "wms"])
def test_scorer_score_does_not_depend_on_batch_mates(tiny_encoder, method):
    scorer = Scorer(tiny_encoder, method=method, centering="none")
    hyps, refs = texts(1, BATCH), texts(2, BATCH)
    together = scorer.score(hyps, refs, batch_size=BATCH)
    for k in ALONE:
        torch.testing.assert_close(scorer.score([hyps[k]], [refs[k]])[0], together[k], atol=1e-6, rtol=0,
                                   msg=f"pair {k}")


# --- non-convergence is never silent ---------------------------------------------------------------

def test_converged_solver_reports_each_item_and_stops_each_on_its_own():
    """An item that converges stops changing: with a cap on the iterations, the easy item converges and
    keeps the plan it has alone; the hard one is reported as not converged."""
    g = torch.Generator().manual_seed(3)
    x = torch.nn.functional.normalize(torch.randn(2, 30, 8, generator=g, dtype=torch.float64), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(2, 30, 8, generator=g, dtype=torch.float64), dim=-1)
    x[0, 1:], y[0, 1:] = 0.0, 0.0  # item 0: one token on each side, the trivial plan
    rows = torch.ones(2, 30, dtype=torch.bool)
    rows[0, 1:] = False
    a = rows.double() / rows.sum(-1, keepdim=True)
    sim = x @ y.transpose(-1, -2)
    log_a = torch.where(rows, a, 1.0).log()
    both = transport.converged_sinkhorn(sim, rows, rows, log_a, log_a, 1e-3, max_iter=100)
    first = transport.converged_sinkhorn(sim[:1, :1, :1], rows[:1, :1], rows[:1, :1], log_a[:1, :1], log_a[:1, :1], 1e-3,
                                         max_iter=100)
    assert both.converged.tolist() == [True, False]
    assert both.n_iter[0] < both.n_iter[1] == 100
    torch.testing.assert_close(both.log_plan[0, :1, :1], first.log_plan[0, :1, :1], atol=0, rtol=0)
    torch.testing.assert_close(both.value[0], first.value[0], atol=0, rtol=0)


def test_functional_plan_carries_the_per_item_flag():
    hyp, ref, hm, rm, hi, ri = mixed_batch(4)
    result = F.wmd(hyp[:5], ref[:5], hm[:5], rm[:5], return_plan=True)
    assert result.plan.converged.shape == (5,) and result.plan.converged.dtype == torch.bool
    assert bool(result.plan.converged.all())


@pytest.mark.parametrize("method", ["wmd", "moverscore", "sms"])
def test_scorer_warns_once_with_the_count_of_items_that_did_not_converge(tiny_encoder, method, monkeypatch):
    scorer = Scorer(tiny_encoder, method=method, centering="none")
    hyps, refs = texts(5, 6), texts(6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # converged: no warning
        scorer.score(hyps, refs)
    monkeypatch.setattr(transport, "MAX_ITER", 1)  # nothing converges in one iteration
    with pytest.warns(RuntimeWarning, match=r"did not converge") as seen:
        scorer.score(hyps, refs, batch_size=2)  # three batches, one warning
    assert len(seen) == 1 and "items" in str(seen[0].message)


def test_reward_warns_once_when_the_solver_does_not_converge(tiny_encoder, monkeypatch):
    from torchmover.reward.rewards import MoverReward

    reward = MoverReward(Scorer(tiny_encoder, method="wmd", centering="none"))
    hyps, refs = texts(7, 4), texts(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reward(hyps, refs)
    monkeypatch.setattr(transport, "MAX_ITER", 1)
    reward.clear_cache()
    with pytest.warns(RuntimeWarning, match=r"did not converge") as seen:
        reward(hyps, refs)
    assert len(seen) == 1


def test_a_pair_with_an_empty_text_is_a_balanced_problem_that_converges():
    """A sentence-mover pair with one empty text scores 0 from one placeholder unit a side, of equal
    masses: the solver converges on it at once (unbalanced masses never converge: it used to run to
    ``max_iter``, silently, and now would warn)."""
    hyp, ref, hm, rm, hi, ri = mixed_batch(5)
    hm[3], rm[4] = False, False
    with transport.warn_if_not_converged() as tally, warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = F.sentence_movers(hyp[:6], ref[:6], hm[:6], rm[:6], hi[:6], ri[:6], variant="s+wms")
    assert tally.items == 6 and tally.not_converged == 0
    assert scores[3] == 0 and scores[4] == 0 and (scores[[0, 1, 2, 5]] > 0).all()


def test_a_text_whose_one_ngram_spans_its_own_centered_tokens_scores_zero_with_any_batch_mates():
    """``centering="sentence"`` (each text minus its own mean), uniform weights, ``ngram=2``: a text of
    at most 2 tokens ("a" with its [CLS]: ``special_tokens="cls"``) has one unit, the sum of all its
    centered tokens, which is 0 in exact arithmetic. Float rounding leaves a tiny vector whose direction
    is noise, so the pair scores what the noise gives, and differently beside other pairs (another
    padding, another rounding): found by ``test_a_corpus_score_is_each_pairs_own_on_random_texts``
    (``test_properties.py``) under the thorough profile. Its defined score is that of a text centered
    to 0: exactly 0."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder

    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens="cls"),
                    centering="sentence", ngram=2)
    with torch.no_grad():
        alone = scorer(["a"], ["the"])[0]
        beside_another = scorer(["a", "the cat sat on the mat"], ["the", "a dog"])[0]
        units = scorer.center(scorer.embed(["a"]))
        own = scorer.self_similarities(units, balanced=True), scorer.self_similarities(units)
    assert alone.item() == 0 and beside_another.item() == 0
    assert own[0].item() == 0 and own[1].item() > 0.5  # its normaliser: of the zero unit, or of the noise


@pytest.mark.parametrize("subwords", ["all", "mean"])
@pytest.mark.parametrize("scope", ["joint", "separate", "pairs"])
def test_a_side_whose_batch_mean_is_one_texts_own_gives_its_one_ngram_no_direction(scope, subwords, monkeypatch):
    """``batch`` centering, ``ngram=2``: where the only text with a token in the set a mean is taken over
    is "a dog" (2 tokens, 2 words), that mean is its own, its one unit the sum of its centered tokens:
    0, and its pairs score 0 — through ``forward``, its pieces, and ``Scorer.score`` (which takes the
    means over the whole call first, counting the texts with a unit: pooled words give an empty text
    encoded beside others a row of masked units). Beside another text the mean is no text's own, and
    the unit is the plain sum."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder

    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), centering="batch",
                    center_scope=scope, ngram=2, subwords=subwords)
    with torch.no_grad():
        if scope == "joint":  # one text in the call: against itself, and against an empty reference
            hyps, refs = ["a dog", "a dog", " "], [["a dog", " "], ["a dog"], ["a dog"]]
        else:  # one hypothesis with a token on its side: against references with many
            hyps, refs = ["a dog", ""], [["the cat sat on the mat", "a cat"], ["a cat"]]
        assert (scorer(hyps, refs) == 0).all()
        assert (scorer.score(hyps, refs, batch_size=4, progress=False) == 0).all()
        with monkeypatch.context() as m:  # forward in pieces of one reference, on the means of the whole call
            m.setattr(references, "REFERENCE_CHUNK", 1)
            m.setattr(references, "CALL_REFERENCES", 1)
            assert (scorer(hyps, refs) == 0).all()
        beside = scorer(["a dog", "the dog barked"], [["a cat"], ["the cat sat"]])
        if scope == "joint":  # one hypothesis, but two texts in the call
            beside = torch.cat([beside, scorer(["a dog"], ["the cat sat"])])
    assert (beside != 0).all() and torch.isfinite(beside).all()


def test_outer_whitespace_makes_no_other_text(tmp_path):
    """Texts are stripped where they enter, as the encoder tokenizes them: "the cat sat" and "the cat
    sat " are one distinct text — encoded once, counted once in a batch mean — so no score depends on
    the outer whitespace of another pair's texts (under ``batch`` centering it moved them by ~1e-2), and
    a text beside its own spaced copy is still the only text of its mean (its one bigram: 0)."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder
    from torchmover.evaluation.corpus import Column, score_files

    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert")
    hyps, refs = ["a dog", "the cat sat", "the cat sat"], ["the sun", "a cat", "a cat"]
    spaced_hyps, spaced_refs = ["a dog", "the cat sat ", "\tthe cat sat"], ["the sun", "a cat\u3000", " a cat"]
    scorer = Scorer(encoder, centering="batch")
    with torch.no_grad():
        assert torch.equal(scorer(spaced_hyps, spaced_refs), scorer(hyps, refs))
    assert torch.equal(scorer.score(spaced_hyps, spaced_refs, progress=False), scorer.score(hyps, refs, progress=False))
    scored = []
    for name, (h, r) in {"plain": (hyps, refs), "spaced": (spaced_hyps, spaced_refs)}.items():
        for side, texts in (("hyps", h), ("refs", r)):
            (tmp_path / f"{name}-{side}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        score_files(scorer, Column(str(tmp_path / f"{name}-hyps.txt")), [Column(str(tmp_path / f"{name}-refs.txt"))],
                    tmp_path / f"{name}.txt", progress=False)
        scored.append((tmp_path / f"{name}.txt").read_text())
    assert scored[0] == scored[1]
    with torch.no_grad():
        assert Scorer(encoder, centering="batch", ngram=2)(["cat dog"], ["cat dog "]).tolist() == [0.0]
