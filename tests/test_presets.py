import warnings

import numpy as np
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder, Scorer
from torchmover.scorer.presets import PRESETS, preset_options, signature_options
from torchmover.scorer.signature import parse_signature, signature_diff

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
