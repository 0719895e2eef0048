"""Many references per hypothesis in bounded memory (torchmover.scorer.references): a call cut into
pieces scores as the whole call (max / mean combined across pieces), and one hypothesis with 100,000
references never puts more than a bounded number of texts in an encoder batch or pairs in a transport
batch."""
import pytest
import torch

import torchmover.scorer.module
import torchmover.scorer.references as references
from torchmover import MoverReward, Scorer

HYPS = ["the cat sat on the mat", "a dog barked", "the quick brown fox jumps"]
GROUPS = [["a cat was on the mat", "the dog sat", "a red car", "the cat sat", "night and day", "he runs"],
          ["the dog barked", "a dog"],
          ["a fox jumps over the dog", "the brown fox", "we ran", "the sun is big", "water", "old man", "a tree"]]


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of at most 2 references, calls of at most 3."""
    monkeypatch.setattr(references, "REFERENCE_CHUNK", 2)
    monkeypatch.setattr(references, "CALL_REFERENCES", 3)


def whole(monkeypatch, fn):
    """``fn()`` with pieces switched off (the call scored as one group)."""
    with monkeypatch.context() as m:
        m.setattr(references, "REFERENCE_CHUNK", 10**9)
        m.setattr(references, "CALL_REFERENCES", 10**9)
        return fn()


def test_split_and_calls_cover_every_reference_once(small_pieces):
    pieces = references.split_references(HYPS, GROUPS)
    assert all(len(g) <= 2 for g in pieces.groups)
    for i, group in enumerate(GROUPS):
        assert [r for g, o in zip(pieces.groups, pieces.owner) if o == i for r in g] == group
    calls = references.piece_calls(pieces)
    assert [k for run in calls for k in range(len(pieces.groups))[run]] == list(range(len(pieces.groups)))
    assert all(sum(len(g) for g in pieces.groups[run]) <= 3 for run in calls)


@pytest.mark.parametrize("multi_ref", ["max", "mean"])
@pytest.mark.parametrize("centering", ["batch", "none"])
def test_pieces_score_as_the_whole_call(tiny_encoder, monkeypatch, small_pieces, multi_ref, centering):
    scorer = Scorer(tiny_encoder, multi_ref=multi_ref, centering=centering, direction="f1", device="cpu")
    with torch.no_grad():
        expected = whole(monkeypatch, lambda: scorer(HYPS, GROUPS))
        expected_all = whole(monkeypatch, lambda: scorer(HYPS, GROUPS, return_all=True))
        torch.testing.assert_close(scorer(HYPS, GROUPS), expected)
        for got, want in zip(scorer(HYPS, GROUPS, return_all=True), expected_all):
            torch.testing.assert_close(got, want)
    torch.testing.assert_close(scorer.score(HYPS, GROUPS, batch_size=2), expected)
    for got, want in zip(scorer.score(HYPS, GROUPS, batch_size=2, return_all=True), expected_all):
        torch.testing.assert_close(got, want)
    if centering == "none":
        reward = MoverReward(scorer, cache_size=4)
        torch.testing.assert_close(reward(HYPS, GROUPS), whole(monkeypatch, lambda: MoverReward(scorer)(HYPS, GROUPS)))


@pytest.mark.parametrize("centering", ["batch", "none"])
def test_pieces_keep_the_gradient(tiny_encoder, monkeypatch, small_pieces, centering):
    """With a graph, pieces give the whole call's scores and gradients; a batch mean that takes part
    in the gradient is not cut (its call is scored whole)."""
    scorer = Scorer(tiny_encoder, centering=centering, device="cpu")
    weight = scorer.encoder.model.embeddings.word_embeddings.weight

    def scores_and_grad():
        scorer.zero_grad()
        scores = scorer(HYPS, GROUPS)
        scores.sum().backward()
        return scores.detach(), weight.grad.clone()

    got, got_grad = scores_and_grad()
    want, want_grad = whole(monkeypatch, scores_and_grad)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_one_hypothesis_with_100k_references_is_scored_in_bounded_batches(tiny_encoder, monkeypatch):
    """Before, a hypothesis's references were one transport batch (``Scorer.score``: 100,000 pairs) and,
    in ``forward`` and a reward, one encoder batch too (24 GB on the server's model); now no batch
    holds more than a piece call's texts or a batch of pieces' pairs (``Scorer.score``: as many pieces
    as its token budget allows). ``forward`` and the reward are
    checked on 3,000 references (1,200 distinct), the corpus path on 100,000 (200 distinct)."""
    scorer = Scorer(tiny_encoder, centering="none", device="cpu")
    words = ("cat", "dog", "sun", "moon", "tree", "car", "road", "city", "man", "woman")
    distinct = [f"the {a} {b} {c} {d}" for a in words for b in words for c in ("sat", "ran", "was", "eats")
                for d in ("on the mat", "in the city", "with food", "to the house", "over the road")]
    texts_per_encoder_call, pairs_per_transport = [], []
    embed = scorer.embed_with_spans

    def counting_embed(texts, tokenized=None):
        texts_per_encoder_call.append(len(texts))
        return embed(texts, tokenized)

    transport = torchmover.scorer.module.pair_similarities

    def counting_transport(*args, **kwargs):
        out = transport(*args, **kwargs)
        pairs_per_transport.append(max(map(len, out.values())))
        return out

    monkeypatch.setattr(scorer, "embed_with_spans", counting_embed)
    monkeypatch.setattr(torchmover.scorer.module, "pair_similarities", counting_transport)
    hyp = ["the cat sat on the mat"]
    for name, n, n_distinct, call in [("score", 100_000, 200, lambda refs: scorer.score(hyp, [refs], batch_size=64)),
                                      ("forward", 3_000, 1200, lambda refs: scorer(hyp, [refs])),
                                      ("reward", 3_000, 1200, lambda refs: MoverReward(scorer)(hyp, [refs]))]:
        texts = distinct[:n_distinct]
        refs = (texts * (n // len(texts) + 1))[:n]
        best = scorer.score(hyp * len(texts), texts).max()  # one pair each: the best reference's
        texts_per_encoder_call.clear(), pairs_per_transport.clear()
        with torch.no_grad():
            got = call(refs)
        assert got.shape == (1,) and got.item() == pytest.approx(best.item(), abs=1e-5), name
        assert max(texts_per_encoder_call) <= 1024 + 1, name  # references.CALL_REFERENCES and the hypothesis
        # pieces of REFERENCE_CHUNK references, batched by a token budget: twice batch_size pieces of the median
        # length (these pieces' longest texts are all of about one length)
        assert max(pairs_per_transport) <= 2 * 64 * references.REFERENCE_CHUNK, name
        texts_per_encoder_call.clear(), pairs_per_transport.clear()
