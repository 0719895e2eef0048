"""``Scorer.score`` centers and normalises each encoded unit once per chunk, in its arena
(:func:`torchmover.scorer.corpus.unit_vectors_once`), where each unit's centered unit vector depends on
nothing but itself; the pair batches then gather unit vectors. The scores are those of centering and
normalising every pair batch as it is read, to the bit, with every option that changes what is moved."""
import pytest
import torch

import torchmover.scorer.corpus as corpus
from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder, Scorer

HYPS = ["the cat sat on the mat", "a dog ran", "", "the quick brown fox jumps over the lazy dog", "a dog ran",
        "green house", "the cat sat on the mat"]
REFS = [["a cat sat on a mat", "the cat sat"], ["the dog ran"], ["blue sky"], ["a quick fox jumped over a dog"],
        ["a dog ran"], [""], ["green house", "a dog ran"]]

CONFIGS = [
    dict(centering="none"),
    dict(centering="batch"),
    dict(centering="fixed"),
    dict(centering="running"),
    dict(centering="batch", idf=True),
    dict(centering="none", method="bertscore", special_tokens="target"),
    dict(centering="batch", stopwords=("the", "a")),
    dict(centering="none", subwords="mean"),
    dict(centering="none", method="moverscore"),
    dict(centering="fixed", method="sbert"),
    dict(centering="none", method="cka"),
    dict(centering="batch", method="trwmd", direction="f1"),
    dict(centering="batch", multi_ref="mean"),
]


@pytest.mark.parametrize("return_all", [False, True])
@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_units_normalised_once_score_what_each_batch_normalised_scores(tiny_encoder, monkeypatch, options, return_all):
    if "special_tokens" in options:
        tiny_encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert",
                               special_tokens=options["special_tokens"])
    scorer = Scorer(tiny_encoder, **options)
    if options.get("idf"):
        scorer.fit_idf([r for g in REFS for r in g], HYPS)
    if options["centering"] in ("fixed", "running"):
        scorer.fit_centering(HYPS + [r for g in REFS for r in g], progress=False)
    calls = []
    once = corpus.unit_vectors_once
    monkeypatch.setattr(corpus, "unit_vectors_once", lambda *args: calls.append(once(*args)) or calls[-1])
    got = scorer.score(HYPS, REFS, batch_size=3, progress=False, return_all=return_all)
    assert calls and all(calls)  # every chunk took the path
    monkeypatch.setattr(corpus, "unit_vectors_once", lambda *args: False)
    expected = scorer.score(HYPS, REFS, batch_size=3, progress=False, return_all=return_all)
    for a, b in zip(*(s if return_all else [s] for s in (got, expected))):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options", [dict(center_scope="separate", centering="batch"),
                                     dict(center_scope="pairs", centering="batch"), dict(centering="sentence"),
                                     dict(centering="dimension"), dict(ngram=2), dict(method="sms")],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_what_depends_on_more_than_the_unit_is_centered_and_normalised_per_batch(tiny_encoder, options):
    """A text of both sides centered on each side's mean, a text's own mean, n-grams (normalised after
    pooling) and the sentence movers: the arena is left as it is."""
    scorer = Scorer(tiny_encoder, **options)
    with torch.no_grad():
        arena = corpus.embed_distinct(scorer, HYPS[:2], 8)
    written = arena.fields[0][:arena.written]  # the rows past them are never read: left uninitialised
    before = written.clone()
    means = (torch.zeros(scorer.encoder.hidden_size),) * 2 if options.get("centering") == "batch" else None
    assert not corpus.unit_vectors_once(scorer, arena, means)
    assert torch.equal(written, before)


def test_the_references_after_the_hypotheses_are_read_as_a_slice_and_the_pairs_as_they_lie():
    from torchmover.scorer.plan import call_plan

    plan = call_plan(["a", "b"], [["c"], ["d"]], ["a", "b", "c", "d"])
    assert plan.ref_rows == slice(2, 4) and plan.index == (None, None, None)
    shared = call_plan(["a", "b"], [["b"], ["c"]], ["a", "b", "c"])  # a reference that is also a hypothesis
    assert shared.ref_rows == [1, 2] and shared.index == (None, None, None)
    repeated = call_plan(["a", "a"], [["c"], ["d", "c"]], ["a", "c", "d"])
    assert repeated.ref_rows == slice(1, 3) and repeated.index == ([0, 0, 0], [0, 1, 0], [0, 1, 1])
