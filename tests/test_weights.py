import math

import pytest
import torch

from torchmover.text.weights import IDF, _is_punctuation, keep_mask, ngrams, pool_subwords


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


def test_idf_rejects_an_empty_corpus(tiny_encoder):
    with pytest.raises(ValueError, match="non-empty"):
        IDF.fit([], tiny_encoder.tokenizer)


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
