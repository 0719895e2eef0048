import math
import warnings

import pytest
import torch

from torchmover import functional as F
from torchmover import Encoder, Scorer
from torchmover.evaluation.corpus import fit_to_corpus
from torchmover.text.weights import (IDF, _is_punctuation, frequency_counts, idf_of_counts, keep_mask, ngrams,
                                     pool_subwords)


def test_idf_formula_and_unseen_tokens(tiny_encoder):
    tok = tiny_encoder.tokenizer
    corpus = ["the cat sat", "the dog", "a cat"]
    idf = IDF.fit(corpus, tok)
    the, cat, dog, moon = (tok.convert_tokens_to_ids(w) for w in ("the", "cat", "dog", "moon"))
    assert idf.value(the) == pytest.approx(math.log(4 / 3))
    assert idf.value(dog) == pytest.approx(math.log(4 / 2))
    assert idf.value(moon) == pytest.approx(math.log(4))
    assert idf.value(tok.cls_token_id) == 0.0  # in every document
    ids = torch.tensor([[the, cat, moon]])
    torch.testing.assert_close(idf(ids), torch.tensor([[math.log(4 / 3), math.log(4 / 3), math.log(4)]]))
    assert IDF.from_dict(idf.to_dict()).digest() == idf.digest() != IDF.fit(corpus[:2], tok).digest()


LONG = "the cat sat on the mat with the dog"  # 9 words: an encoder of max_length=6 keeps [CLS] + 4 + [SEP]


def cut_encoder(max_length: int = 6) -> Encoder:
    from conftest import tiny_model, tiny_tokenizer

    return Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", max_length=max_length)


def kept_text(encoder, text):
    """``text`` as far as the encoder reads it."""
    with pytest.warns(UserWarning, match="truncated"):
        return encoder.tokenizer.decode(encoder.tokenize([text])["input_ids"][0], skip_special_tokens=True)


def test_idf_counts_only_the_tokens_the_encoder_keeps():
    encoder = cut_encoder()
    tok = encoder.tokenizer
    assert kept_text(encoder, LONG) == "the cat sat on"
    corpus = [LONG, "dog", "a mat"]
    as_read = IDF.fit(["the cat sat on", "dog", "a mat"], tok)
    fitted = IDF.fit(corpus, tok, encoder.max_length)
    counted = idf_of_counts(frequency_counts(corpus, tok, encoder.max_length))  # the distributed / streamed path
    assert fitted.document_frequency == counted.document_frequency == as_read.document_frequency
    dog, mat = tok.convert_tokens_to_ids("dog"), tok.convert_tokens_to_ids("mat")
    assert fitted.value(dog) == pytest.approx(math.log(4 / 2))  # only "dog" itself holds a dog the encoder sees
    assert fitted.value(mat) == pytest.approx(math.log(4 / 2))
    with pytest.raises(ValueError, match="max_length"):
        IDF.fit(corpus, tok, 0)


def test_idf_fitted_on_a_corpus_stream_counts_only_the_tokens_the_encoder_keeps():
    scorer = Scorer(cut_encoder(), idf=True, centering="none")
    fit_to_corpus(scorer, lambda: iter([(["a mat", "dog"], [[LONG], ["dog"]])]))
    tok = scorer.encoder.tokenizer
    assert scorer.idf["ref"].document_frequency == IDF.fit(["the cat sat on", "dog"], tok).document_frequency
    assert scorer.idf["hyp"].document_frequency == IDF.fit(["a mat", "dog"], tok).document_frequency


def test_fit_idf_counts_only_the_tokens_the_encoder_keeps():
    scorer = Scorer(cut_encoder(), idf=True, centering="none").fit_idf([LONG, "dog"], ["a mat", "dog"])
    tokenizer = scorer.encoder.tokenizer
    assert scorer.idf["ref"].document_frequency == IDF.fit(["the cat sat on", "dog"], tokenizer).document_frequency
    assert scorer.idf["hyp"].document_frequency == IDF.fit(["a mat", "dog"], tokenizer).document_frequency


@pytest.mark.parametrize("stopwords", [["cat the"], [" the"], ["the", "new\tline"]])
def test_a_stopword_with_whitespace_is_refused(stopwords):
    """A stopword is matched against whole words: one holding whitespace could never match."""
    with pytest.raises(ValueError, match="a stopword is one word"):
        Scorer("/no/such/model", stopwords=stopwords)


def test_idf_rejects_an_empty_corpus(tiny_encoder):
    with pytest.raises(ValueError, match="non-empty"):
        IDF.fit([], tiny_encoder.tokenizer)


def test_a_dictionary_whose_every_token_is_in_every_document_weighs_nothing(tiny_encoder):
    tok = tiny_encoder.tokenizer
    assert IDF.fit(["the cat sat"], tok).weightless
    assert IDF.fit(["the cat sat", "sat the cat"], tok).weightless  # the same tokens: weight 0 again
    assert not IDF.fit(["the cat sat", "the cat"], tok).weightless


def test_a_weightless_idf_warns_naming_its_side(tiny_encoder):
    """One hypothesis in a call fits its side's dictionary on one document: every token weighs 0 and
    the pair scores exactly 0 (MoverScore v2's rule), said by one warning naming the side."""
    import torchmover

    hyp, refs = "the cat sat on the mat", ["the cat sat on the mat", "a dog barked"]
    with pytest.warns(UserWarning, match=r"dictionary of the hypotheses \(fitted on 1 document\) gives every token"
                                         r".* weight 0.*fit_idf") as caught:
        scores = torchmover.score([hyp, hyp], refs, model=tiny_encoder, idf=True, progress=False)
    assert len([w for w in caught if "IDF" in str(w.message)]) == 1
    assert scores.tolist() == [0.0, 0.0]
    with pytest.warns(UserWarning, match=r"dictionary of the references \(fitted on 1 document\)"):
        Scorer(tiny_encoder, idf=True).fit_idf(refs[:1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Scorer(tiny_encoder, idf=True).fit_idf(refs, ["the cat sat", "a dog"])
    with pytest.warns(UserWarning, match=r"dictionary of the hypotheses \(fitted on 1 document\)"):  # a file run
        fit_to_corpus(Scorer(tiny_encoder, idf=True), lambda: iter([([hyp, hyp], [[r] for r in refs])]))


def tokens(encoder, texts):
    t = encoder(texts)
    return t.mask, t.input_ids, t.word_ids


def kept_words(encoder, texts, **policy):
    mask, ids, wids = tokens(encoder, texts)
    keep = keep_mask(mask, ids, wids, encoder.tokenizer, **policy)
    return [encoder.tokenizer.convert_ids_to_tokens(ids[n][keep[n]].tolist()) for n in range(len(texts))]


def test_subword_policies(tiny_encoder):
    assert kept_words(tiny_encoder, ["the xyz cat"], subwords="all") == [["the", "x", "##y", "##z", "cat"]]
    assert kept_words(tiny_encoder, ["the xyz cat"], subwords="first") == [["the", "x", "cat"]]
    with pytest.raises(ValueError, match="subwords"):
        kept_words(tiny_encoder, ["the"], subwords="last")


def test_stopwords_match_whole_words_and_punctuation(tiny_encoder):
    got = kept_words(tiny_encoder, ["The cat, xyz sat!", "of the"], stopwords=["the", "xyz", "of"], punctuation="drop")
    assert got == [["cat", "sat"], []]
    assert kept_words(tiny_encoder, ["the cat!"], punctuation="keep") == [["the", "cat", "!"]]


def test_ascii_punctuation_is_moverscores_rule():
    assert _is_punctuation("!", ascii_only=True) and _is_punctuation("...", ascii_only=True)
    assert not _is_punctuation("’", ascii_only=True) and _is_punctuation("’", ascii_only=False)
    assert not _is_punctuation("cat", ascii_only=False) and not _is_punctuation("", ascii_only=False)


def test_pool_subwords_is_the_mean_of_each_words_pieces(tiny_encoder):
    t = tiny_encoder(["the xyz cat", "dog"])
    weights = torch.rand(t.mask.shape)
    pooled, mask, w = pool_subwords(t.embeddings, t.mask, t.word_ids, weights)
    assert len(pool_subwords(t.embeddings, t.mask, t.word_ids)) == 2
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    torch.testing.assert_close(pooled[0, 1], t.embeddings[0, 2:5].mean(0))
    torch.testing.assert_close(pooled[0, 2], t.embeddings[0, 5])
    torch.testing.assert_close(w[0, 1], weights[0, 2:5].mean())


def test_ngrams_against_a_naive_loop():
    torch.manual_seed(0)
    x = torch.randn(3, 6, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    w = torch.rand(3, 6, dtype=torch.float64)
    assert ngrams(x, mask, w, 1)[0] is x  # unigrams are the token vectors themselves
    for n in (2, 3):
        vectors, unit_mask, masses = ngrams(x, mask, w, n)
        for b in range(3):
            real = mask[b].nonzero().flatten().tolist()
            windows = [real[k:k + n] for k in range(len(real) - n + 1)] or ([real] if real else [])
            assert unit_mask[b].sum() == len(windows)
            for k, win in enumerate(windows):
                torch.testing.assert_close(vectors[b, k], (x[b, win] * w[b, win, None]).sum(0))
                torch.testing.assert_close(masses[b, k], w[b, win].sum())


@pytest.mark.parametrize("n", [2, 3])
def test_balanced_ngrams_write_a_text_spanned_by_its_one_unit_as_exactly_zero(n):
    """``balanced``: every text's tokens sum to 0 (centered on its own mean). A text whose one unit spans
    all of its (at most ``n``) real tokens, each of one weight, has the unit ``w Σ x = 0``: written as
    exactly 0 (float leaves rounding noise there). Every other unit — more than ``n`` tokens, or weights
    that differ — and every mass are those of the naive loop, bit for bit as without ``balanced``."""
    torch.manual_seed(n)
    x = torch.randn(6, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 0],  # 2 tokens, uniform weights: zeroed
                         [0, 1, 0, 1, 0],  # 2 tokens, padding between: zeroed
                         [1, 1, 0, 0, 0],  # 2 tokens, weights that differ: kept
                         [1, 1, 1, 0, 0],  # 3 tokens: zeroed for n = 3 only
                         [1, 0, 0, 0, 0],  # 1 token: zeroed
                         [0, 0, 0, 0, 0]], dtype=torch.bool)  # no token: no unit
    x = F.center(x, mask, "sentence")  # each text minus its own mean: Σ x = 0 up to rounding
    w = torch.full((6, 5), 0.5, dtype=torch.float64)
    w[2, 1] = 0.25
    w[:, 4] = 7.0  # off the mask (rows 0-5): a weight the rule must not read
    plain = ngrams(x, mask, w, n)
    vectors, unit_mask, masses = ngrams(x, mask, w, n, balanced=True)
    zeroed = [0, 1, 4] + ([3] if n == 3 else [])
    for b in range(6):
        if b in zeroed:
            assert unit_mask[b, 0] and (vectors[b, 0] == 0).all()
            assert plain[0][b, 0].abs().max() < 1e-12  # what it replaces: 0 up to rounding
        else:
            assert torch.equal(vectors[b], plain[0][b])
    assert torch.equal(unit_mask, plain[1]) and torch.equal(masses, plain[2])
    on_device = ngrams(x, mask, w, n, balanced=torch.tensor(True))  # a flag computed on the device
    assert all(torch.equal(a, b) for a, b in zip(on_device, (vectors, unit_mask, masses)))
    assert all(torch.equal(a, b) for a, b in zip(ngrams(x, mask, w, n, balanced=torch.tensor(False)), plain))
    empty = ngrams(x[:, :0], mask[:, :0], w[:, :0], n, balanced=True)  # a batch of texts without units
    assert empty[0].shape == (6, 1, 4) and not empty[1].any()
