"""Sentence movers: the splitter, document encoding, and SMS / S+WMS / WMS against references
(LP solver on explicitly built unit sets, a naive NumPy Sinkhorn loop, closed forms)."""
import warnings

import numpy as np
import ot
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder
from torchmover.functional.sentences import VARIANTS, sentence_movers
from torchmover.text.documents import _chunks, _sentence_spans, encode_documents, split_sentences

# --- splitter -------------------------------------------------------------------------------------

SPLITS = [
    ("", []),
    ("   \n\t  ", []),
    ("Mr. Smith went to Washington. He arrived at 3.5 p.m. today.",
     ["Mr. Smith went to Washington.", "He arrived at 3.5 p.m. today."]),
    ("The price was $3.50. It rose.", ["The price was $3.50.", "It rose."]),
    ("Wait... What happened?! Nothing.", ["Wait...", "What happened?!", "Nothing."]),
    ("It ended… Then silence.", ["It ended…", "Then silence."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ('Really? "Yes," she said.', ["Really?", '"Yes," she said.']),
    ("She left (finally). 2 days later she returned.", ["She left (finally).", "2 days later she returned."]),
    ("Is it? (Maybe.) [Surely.] «Oui.»", ["Is it?", "(Maybe.)", "[Surely.]", "«Oui.»"]),
    ("Dr. Jones met Prof. Lee at St. Mary's church. Mrs. Lee and Jr. Sr. Inc. Ltd. were there.",
     ["Dr. Jones met Prof. Lee at St. Mary's church.", "Mrs. Lee and Jr. Sr. Inc. Ltd. were there."]),
    ("J. R. R. Tolkien wrote it. Then he died.", ["J. R. R. Tolkien wrote it.", "Then he died."]),
    ("Fruit, e.g. Apples, i.e. Red ones, etc. Are fine vs. Others.",
     ["Fruit, e.g. Apples, i.e. Red ones, etc. Are fine vs. Others."]),
    ("The U.S. Army and the U.K. Navy met.", ["The U.S. Army and the U.K. Navy met."]),
    ("Room No. 5 is here. He said no. Then left.", ["Room No. 5 is here.", "He said no.", "Then left."]),
    ("lower case. after a period does not split", ["lower case. after a period does not split"]),
    ("Version 2.0 is out! Get it.", ["Version 2.0 is out!", "Get it."]),
    ("First line\nsecond line without punctuation\r\n\n  Third. Fourth",
     ["First line", "second line without punctuation", "Third.", "Fourth"]),
    ("Élan vital. École fermée.", ["Élan vital.", "École fermée."]),
    ("See Fig. 3 and Eq. 2 for details.", ["See Fig. 3 and Eq. 2 for details."]),
]


@pytest.mark.parametrize("text,expected", SPLITS)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


@pytest.mark.parametrize("text", [t for t, _ in SPLITS])
def test_split_sentences_returns_stripped_substrings_in_order(text):
    sentences = split_sentences(text)
    assert _sentence_spans(text, sentences) is not None
    assert all(s == s.strip() and s for s in sentences)
    assert "".join("".join(s.split()) for s in sentences) == "".join(text.split())  # only whitespace is lost


def test_split_sentences_rejects_non_strings():
    with pytest.raises(ValueError, match="text"):
        split_sentences(None)


# --- encoding -------------------------------------------------------------------------------------

def encoder(max_length=None):
    return Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", max_length=max_length)


def piece_ids(text):
    return tiny_tokenizer()(text, add_special_tokens=False)["input_ids"]


def expected_layout(sentences):
    """Token ids and sentence ids of a document, built sentence by sentence."""
    ids = [piece_ids(s) for s in sentences]
    return sum(ids, []), sum(([k] * len(i) for k, i in enumerate(ids)), [])


TEXTS = ["The cat sat on the mat. A dog barked!\nThe sun is red.", "", "the quick brown fox"]


def test_whole_window_path_matches_the_encoder_and_labels_sentences():
    enc = encoder()
    docs = encode_documents(enc, TEXTS)
    plain = enc(TEXTS)
    for n, text in enumerate(TEXTS):
        ids, sentence_ids = expected_layout(split_sentences(text))
        real = docs.mask[n]
        assert docs.input_ids[n, real].tolist() == ids
        assert docs.sentence_ids[n, real].tolist() == sentence_ids
        assert (docs.sentence_ids[n, ~real] == -1).all()
        torch.testing.assert_close(docs.embeddings[n, real], plain.embeddings[n, plain.mask[n]])
        assert (docs.embeddings[n, ~real] == 0).all()


def test_per_sentence_path_encodes_each_sentence_alone_and_keeps_every_token():
    enc = encoder(max_length=12)
    text = "The cat sat on the mat. A dog barked on the road!\nThe sun is red."
    sentences = split_sentences(text)
    assert len(piece_ids(text)) + 2 > 12 and all(len(piece_ids(s)) + 2 <= 12 for s in sentences)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no truncation warning
        docs = encode_documents(enc, [text, "the dog"])
    ids, sentence_ids = expected_layout(sentences)
    assert docs.mask[0].sum() == len(ids) and docs.input_ids[0, :len(ids)].tolist() == ids
    assert docs.sentence_ids[0, :len(ids)].tolist() == sentence_ids
    for k, sentence in enumerate(sentences):  # each sentence: exactly the encoder on that sentence
        alone = enc([sentence])
        torch.testing.assert_close(docs.embeddings[0][docs.sentence_ids[0] == k], alone.embeddings[0, alone.mask[0]])
    alone = enc(["the dog"])  # a short text in the same batch still goes through in one window
    torch.testing.assert_close(docs.embeddings[1, docs.mask[1]], alone.embeddings[0, alone.mask[0]])


def test_both_paths_give_the_same_token_layout():
    text = "The cat sat on the mat. A dog barked on the road!\nThe sun is red. It was a good day."
    whole, split = encode_documents(encoder(), [text]), encode_documents(encoder(max_length=12), [text])
    assert torch.equal(whole.input_ids, split.input_ids) and torch.equal(whole.sentence_ids, split.sentence_ids)
    assert torch.equal(whole.mask, split.mask)


def test_a_text_longer_than_the_window_is_never_truncated():
    enc = encoder()  # max_length 64
    words = "the cat sat on the mat and the dog ran over the road".split()
    sentence = " ".join(words * 8)  # one sentence of 104 word tokens: chunked
    text = sentence + ". " + "A zebraic quokka ate food. " * 6  # plus sentences with unknown words
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        docs = encode_documents(enc, [text, sentence])
    for n, t in enumerate([text, sentence]):
        ids, sentence_ids = expected_layout(split_sentences(t))
        assert len(ids) > 64
        assert docs.mask[n].sum() == len(ids) and docs.input_ids[n, :len(ids)].tolist() == ids
        assert docs.sentence_ids[n, :len(ids)].tolist() == sentence_ids
    assert torch.isfinite(docs.embeddings).all()


def test_chunks_are_whole_words_within_the_window():
    tokenizer, enc = tiny_tokenizer(), encoder(max_length=8)
    sentence = "the zebra ran over the quokka road and a cat sat on a mat by the red car"
    chunks = _chunks(enc, sentence)
    assert len(chunks) > 2 and " ".join(chunks) == sentence  # cut between words only
    assert all(len(tokenizer(c)["input_ids"]) <= 8 for c in chunks)
    assert sum((piece_ids(c) for c in chunks), []) == piece_ids(sentence)
    assert _chunks(enc, "the cat") == ["the cat"]
    long_word = "x" * 20  # 20 word pieces, more than a window: cut inside the word, no character lost
    chunks = _chunks(enc, f"the {long_word} sat")
    assert chunks == ["the", "xxxxxx", "xxxxxx", "xxxxxx", "xx sat"]
    assert all(len(tokenizer(c)["input_ids"]) <= 8 for c in chunks)


def test_pluggable_splitter_and_a_splitter_that_rewrites_text():
    enc = encoder()
    text = "the cat sat; the dog ran ; a fox"
    semicolons = lambda t: [s.strip() for s in t.split(";") if s.strip()]  # noqa: E731
    docs = encode_documents(enc, [text], splitter=semicolons)
    assert docs.sentence_ids[0, docs.mask[0]].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    rewritten = encode_documents(enc, [text], splitter=lambda t: [s.upper() for s in semicolons(t)])
    assert torch.equal(rewritten.sentence_ids, docs.sentence_ids)  # located nowhere: per sentence
    assert torch.equal(rewritten.input_ids, docs.input_ids)  # (the tokenizer lower-cases)
    dropped = encode_documents(enc, ["the cat sat; the dog"], splitter=lambda t: ["the cat sat"])
    assert dropped.sentence_ids[0, dropped.mask[0]].tolist() == [0, 0, 0]  # text outside sentences left out
    with pytest.raises(ValueError, match="splitter"):
        encode_documents(enc, [text], splitter=lambda t: t)


def test_empty_texts():
    enc = encoder()
    docs = encode_documents(enc, ["", "  \n "])
    assert docs.embeddings.shape == (2, 0, enc.hidden_size) and docs.mask.shape == (2, 0)
    docs = encode_documents(enc, ["", "the cat"])
    assert docs.mask.tolist() == [[False, False], [True, True]]
    with pytest.raises(ValueError, match="texts"):
        encode_documents(enc, "the cat")


@pytest.mark.parametrize("max_length", [64, 8])
def test_encoding_is_differentiable_on_both_paths(max_length):
    enc = encoder(max_length)
    docs = encode_documents(enc, TEXTS)
    score = sentence_movers(docs.embeddings[[0]], docs.embeddings[[2]], docs.mask[[0]], docs.mask[[2]],
                            docs.sentence_ids[[0]], docs.sentence_ids[[2]], variant="s+wms")
    score.sum().backward()
    grads = [p.grad for p in enc.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_a_document_is_identical_to_itself():
    docs = encode_documents(encoder(max_length=12), ["The cat sat on the mat. A dog barked on the road! It ran."])
    for variant in VARIANTS:
        score = sentence_movers(docs.embeddings, docs.embeddings, docs.mask, docs.mask,
                                docs.sentence_ids, docs.sentence_ids, variant=variant)
        torch.testing.assert_close(score, torch.ones(1), atol=2e-3, rtol=0)


# --- similarity: references -----------------------------------------------------------------------

def reference_units(x, mask, ids, variant):
    """The unit set of one document, built explicitly: word vectors, sentence means, masses."""
    real = [i for i in range(len(x)) if mask[i] and ids[i] >= 0]
    words = {i: x[i] / np.linalg.norm(x[i]) for i in real}
    groups: dict = {}
    for i in real:
        groups.setdefault(int(ids[i]), []).append(words[i])
    size = len(real)
    word_units = [(v, 1 / size) for v in words.values()]
    sentence_units = [(np.mean(g, axis=0), len(g) / size) for g in groups.values()]
    units = {"wms": word_units, "sms": sentence_units,
             "s+wms": [(v, m / 2) for v, m in word_units + sentence_units]}[variant]
    return np.array([v for v, _ in units]), np.array([m for _, m in units])


def reference_cost(hyp, ref, hm, rm, hi, ri, variant):
    y, b = reference_units(hyp, hm, hi, variant)
    x, a = reference_units(ref, rm, ri, variant)
    return np.linalg.norm(x[:, None] - y[None], axis=-1), a, b


def lp_score(*args):
    cost, a, b = reference_cost(*args)
    return np.exp(-ot.emd2(a, b, cost))


def naive_sinkhorn_score(*args, temperature, n_iter):
    cost, a, b = reference_cost(*args)
    plan = np.exp(-cost / temperature)
    for _ in range(n_iter):
        plan *= b[None] / plan.sum(0, keepdims=True)  # columns
        plan *= a[:, None] / plan.sum(1, keepdims=True)  # rows
    return np.exp(-(plan * cost).sum())


def random_batch(seed, batch=3, dim=6, dtype=torch.float64):
    """Padded documents with 1–4 sentences of 1–5 tokens; padding holds garbage vectors and ids."""
    g = torch.Generator().manual_seed(seed)
    sides = []
    for _ in range(2):
        randint = lambda low, high: int(torch.randint(low, high, (1,), generator=g))  # noqa: E731
        lengths = [[randint(1, 6) for _ in range(randint(1, 5))] for _ in range(batch)]
        width = max(sum(s) for s in lengths) + 2
        x = 50 * torch.randn(batch, width, dim, generator=g, dtype=dtype)
        mask = torch.zeros(batch, width, dtype=torch.bool)
        ids = torch.randint(-3, 9, (batch, width), generator=g)
        for n, sizes in enumerate(lengths):
            x[n, :sum(sizes)] = torch.randn(sum(sizes), dim, generator=g, dtype=dtype)
            mask[n, :sum(sizes)] = True
            ids[n, :sum(sizes)] = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        sides.append((x, mask, ids))
    (hyp, hm, hi), (ref, rm, ri) = sides
    return hyp, ref, hm, rm, hi, ri


def numpy_args(batch, n):
    hyp, ref, hm, rm, hi, ri = batch
    return hyp[n].numpy(), ref[n].numpy(), hm[n].numpy(), rm[n].numpy(), hi[n].numpy(), ri[n].numpy()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_variants_agree_with_the_lp(variant, seed):
    batch = random_batch(seed)
    got = sentence_movers(*batch, variant=variant)
    expected = [lp_score(*numpy_args(batch, n), variant) for n in range(3)]
    np.testing.assert_allclose(got.numpy(), expected, atol=5e-4)  # the LP figure of test_functional.py::test_wmd_matches_lp_solver


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("temperature,n_iter", [(0.5, 1), (0.1, 4)])
def test_tempered_variants_agree_with_a_naive_sinkhorn_loop(variant, temperature, n_iter):
    batch = random_batch(2)
    got = sentence_movers(*batch, variant=variant, temperature=temperature, n_iter=n_iter)
    expected = [naive_sinkhorn_score(*numpy_args(batch, n), variant, temperature=temperature, n_iter=n_iter)
                for n in range(3)]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10)


@pytest.mark.parametrize("temperature", [None, 0.3])
def test_single_sentence_sms_is_the_distance_of_the_means(temperature):
    hyp, ref = torch.randn(2, 4, 5, dtype=torch.float64), torch.randn(2, 7, 5, dtype=torch.float64)
    unit = torch.nn.functional.normalize
    expected = torch.exp(-(unit(hyp, dim=-1).mean(1) - unit(ref, dim=-1).mean(1)).norm(dim=-1))
    torch.testing.assert_close(sentence_movers(hyp, ref, temperature=temperature), expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_invariance(variant):
    hyp, ref, hm, rm, hi, ri = random_batch(3)
    pad = lambda t, value: torch.cat([t, torch.full_like(t[:, :3], value)], 1)  # noqa: E731
    padded = (pad(hyp, 1e3), pad(ref, -7.0), pad(hm, False), pad(rm, False), pad(hi, 40), pad(ri, 2))
    for kw in ({}, {"temperature": 0.2, "n_iter": 3}):
        torch.testing.assert_close(sentence_movers(*padded, variant=variant, **kw),
                                   sentence_movers(hyp, ref, hm, rm, hi, ri, variant=variant, **kw),
                                   atol=1e-12 if kw else 1e-3, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_batch_order_equivariance(variant):
    batch = random_batch(4)
    order = torch.tensor([2, 0, 1])
    for kw in ({}, {"temperature": 0.2, "n_iter": 3}):
        torch.testing.assert_close(sentence_movers(*(t[order] for t in batch), variant=variant, **kw),
                                   sentence_movers(*batch, variant=variant, **kw)[order],
                                   atol=1e-12 if kw else 1e-3, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_similarity_of_a_text_with_itself_is_one(variant):
    hyp, _, hm, _, hi, _ = random_batch(5)
    score = sentence_movers(hyp, hyp, hm, hm, hi, hi, variant=variant)
    torch.testing.assert_close(score, torch.ones(3, dtype=torch.float64), atol=2e-3, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("temperature", [None, 0.2])
def test_empty_text_scores_zero_with_finite_gradients(variant, temperature):
    hyp, ref, hm, rm, hi, ri = random_batch(6)
    hm, rm = hm.clone(), rm.clone()
    hm[0], rm[1], hm[2], rm[2] = False, False, False, False  # empty hyp, empty ref, both
    hyp, ref = hyp.clone().requires_grad_(), ref.clone().requires_grad_()
    score = sentence_movers(hyp, ref, hm, rm, hi, ri, variant=variant, temperature=temperature)
    assert score.tolist() == [0.0, 0.0, 0.0]
    score.sum().backward()
    assert torch.isfinite(hyp.grad).all() and torch.isfinite(ref.grad).all()
    empty = sentence_movers(torch.zeros(2, 0, 4), torch.randn(2, 3, 4), variant=variant, temperature=temperature)
    assert empty.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("temperature", [None, 0.2])
def test_a_text_without_a_direction_scores_zero_like_an_empty_one(variant, temperature):
    """A text whose every real word vector is 0 (one token centered on its own mean) has no direction:
    its pairs score 0, against a text of zeros too (whose units cost nothing to move: it scored 1)."""
    hyp, ref, hm, rm, hi, ri = random_batch(6)
    hyp, ref = hyp.clone(), ref.clone()
    hyp[0, hm[0]], ref[1, rm[1]], hyp[2, hm[2]], ref[2, rm[2]] = 0.0, 0.0, 0.0, 0.0
    hyp, ref = hyp.requires_grad_(), ref.requires_grad_()
    score = sentence_movers(hyp, ref, hm, rm, hi, ri, variant=variant, temperature=temperature)
    assert score.tolist() == [0.0, 0.0, 0.0]
    score.sum().backward()
    assert torch.isfinite(hyp.grad[hm]).all() and torch.isfinite(ref.grad[rm]).all()
    zeros = torch.zeros(2, 3, 4, dtype=torch.float64)
    assert sentence_movers(zeros, zeros, variant=variant, temperature=temperature).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("temperature,n_iter", [(None, 1), (1e-3, 5)])
def test_float32_at_small_temperature_has_finite_nonzero_gradients(variant, temperature, n_iter):
    hyp, ref, hm, rm, hi, ri = random_batch(7, dtype=torch.float32)
    hyp, ref = hyp.requires_grad_(), ref.requires_grad_()
    score = sentence_movers(hyp, ref, hm, rm, hi, ri, variant=variant, temperature=temperature, n_iter=n_iter)
    assert score.dtype == torch.float32 and torch.isfinite(score).all() and ((score > 0) & (score <= 1)).all()
    score.sum().backward()
    for grad, mask in ((hyp.grad, hm), (ref.grad, rm)):
        assert torch.isfinite(grad).all() and grad[mask].abs().sum() > 0 and (grad[~mask] == 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_tempered_gradient_is_exact(variant):
    hyp, ref, hm, rm, hi, ri = (t[:1, :6] for t in random_batch(8, dim=3))
    hyp, ref = hyp.clone().requires_grad_(), ref.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda h, r: sentence_movers(h, r, hm, rm, hi, ri, variant=variant, temperature=0.3, n_iter=2), (hyp, ref))


def test_exact_gradient_is_the_envelope_gradient():
    """∂ exp(−WMD)/∂y = −exp(−WMD) Σ_i π*_ij ∂C_ij/∂y: check against central differences of the LP."""
    hyp, ref, hm, rm, hi, ri = (t[:1] for t in random_batch(9))
    hyp = hyp.clone().requires_grad_()
    sentence_movers(hyp, ref, hm, rm, hi, ri, variant="sms").sum().backward()
    h, eps = hyp.detach().numpy().copy(), 1e-5
    rest = (ref[0].numpy(), hm[0].numpy(), rm[0].numpy(), hi[0].numpy(), ri[0].numpy(), "sms")
    args = lambda h: (h[0], *rest)  # noqa: E731
    for l, d in [(0, 0), (1, 2), (2, 5)]:
        up, down = h.copy(), h.copy()
        up[0, l, d] += eps
        down[0, l, d] -= eps
        numeric = (lp_score(*args(up)) - lp_score(*args(down))) / (2 * eps)
        assert abs(hyp.grad[0, l, d].item() - numeric) < 5e-3


def test_sentence_ids_none_is_one_sentence_and_wms_ignores_ids():
    hyp, ref, hm, rm, hi, ri = random_batch(10)
    torch.testing.assert_close(sentence_movers(hyp, ref, hm, rm, variant="wms", temperature=0.2),
                               sentence_movers(hyp, ref, hm, rm, hi, ri, variant="wms", temperature=0.2))
    one = torch.zeros_like(hi), torch.zeros_like(ri)
    torch.testing.assert_close(sentence_movers(hyp, ref, hm, rm, variant="sms"),
                               sentence_movers(hyp, ref, hm, rm, *one, variant="sms"))


@pytest.mark.parametrize("kw,match", [
    ({"variant": "smd"}, "variant"), ({"temperature": 0.0}, "temperature"), ({"temperature": -1.0}, "temperature"),
    ({"temperature": 0.1, "n_iter": 0}, "n_iter"),
])
def test_invalid_arguments_are_rejected(kw, match):
    x = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match=match):
        sentence_movers(x, x, **kw)


def test_bad_sentence_ids_are_rejected():
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="hyp_sentence_ids"):
        sentence_movers(x, x, hyp_sentence_ids=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="ref_sentence_ids"):
        sentence_movers(x, x, ref_sentence_ids=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="ref_sentence_ids"):
        sentence_movers(x, x, ref_sentence_ids=[[0, 0, 0]] * 2)


# --- encoding: the encoder's own tokenization -----------------------------------------------------

def _tiny_bert_for(tokenizer, seed: int = 0):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    return BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64)).eval()


def _assert_same_documents(got, expected):
    for name in ("mask", "sentence_ids", "input_ids"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    torch.testing.assert_close(got.embeddings, expected.embeddings)


@pytest.mark.parametrize("max_length", [None, 12])  # whole texts; sentence by sentence
@pytest.mark.parametrize("tokenizer", ["padding on the left", "no pad token"])
def test_documents_are_padded_as_the_encoder_pads_whatever_the_tokenizer(tokenizer, max_length):
    """The encoder pads on the right whatever the tokenizer's padding side, with id 0 where it has no
    pad token: so do the documents, to the same vectors as a tokenizer padding on the right."""
    texts = ["The cat sat on the mat. A dog barked on the road!\nThe sun is red.", "a man eats", "",
             "The quick brown fox. It ran."]
    if tokenizer == "padding on the left":
        tok = tiny_tokenizer()
        tok.padding_side = "left"
    else:
        tok = tiny_tokenizer(pad_token=None)
    with torch.no_grad():
        expected = encode_documents(encoder(max_length), texts)
        got = encode_documents(Encoder(tiny_model(), tok, layer=2, name="tiny-bert", max_length=max_length), texts)
    _assert_same_documents(got, expected)


def test_chunks_of_a_byte_level_bpe_sentence_are_the_encoders_windows():
    """A byte-level BPE tokenizer reads a leading space as a token: each chunk is encoded as the encoder
    encodes it alone (stripped), and the chunks hold the whole sentence."""
    from conftest import chat_tokenizer

    tok = chat_tokenizer()
    enc = Encoder(_tiny_bert_for(tok), tok, layer=2, name="tiny-bpe", max_length=8)
    sentence = "the cat sat on the mat and the dog barked all day long while we ate food"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # no truncation warning
        docs = encode_documents(enc, [sentence])
        chunks = _chunks(enc, sentence)
        alone = enc(chunks)
    assert len(chunks) > 2 and " ".join(chunks) == sentence and all(enc.fits(chunks))
    assert docs.input_ids[0, docs.mask[0]].tolist() == alone.input_ids[alone.mask].tolist()
    torch.testing.assert_close(docs.embeddings[0, docs.mask[0]], alone.embeddings[alone.mask])


def _wordpiece_with_long_pieces():
    """A WordPiece tokenizer whose vocabulary has the pieces ``gi ##raf ##fe ##s`` of "giraffes" but not
    ``raf`` or ``fe`` as words: alone, a piece is spelled out letter by letter."""
    import string

    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    letters = list(string.ascii_lowercase)
    vocab = {t: i for i, t in enumerate(specials + ["gi", "##raf", "##fe"] + letters + ["##" + c for c in letters])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", model_max_length=64)


def test_a_piece_longer_than_the_window_alone_is_cut_between_characters():
    """Nothing is truncated: a one-token chunk that takes more tokens alone (``##raf`` alone is
    ``r ##a ##f``) is cut further, between characters, so every letter is encoded."""
    tok = _wordpiece_with_long_pieces()
    assert tok.tokenize("giraffes") == ["gi", "##raf", "##fe", "##s"]
    enc = Encoder(_tiny_bert_for(tok), tok, layer=2, name="tiny", max_length=3)  # one token of text a window
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # no truncation warning
        docs = encode_documents(enc, ["giraffes run", "fe"])
    spelled = [tok.convert_ids_to_tokens(docs.input_ids[n, docs.mask[n]].tolist()) for n in range(2)]
    assert spelled == [["gi", "r", "a", "f", "f", "e", "s", "r", "u", "n"], ["f", "e"]]
    assert docs.sentence_ids[0, docs.mask[0]].tolist() == [0] * 10


def test_a_character_longer_than_the_window_is_refused_by_name():
    from conftest import chat_tokenizer

    tok = chat_tokenizer()
    assert len(tok("é")["input_ids"]) == 2  # two bytes, not merged
    enc = Encoder(_tiny_bert_for(tok), tok, layer=2, name="tiny-bpe", max_length=1)
    with pytest.raises(ValueError, match="character 'é' takes more tokens alone than encoder.max_length=1"):
        encode_documents(enc, ["the café"])
