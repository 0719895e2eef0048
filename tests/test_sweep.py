"""AllLayers: encoders at every layer of one model, from one forward pass per batch."""
import pytest
import torch

from conftest import WORDS
from torchmover import Encoder, Scorer
from torchmover.evaluation.sweep import AllLayers


def texts(n, seed):
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 9))) for _ in range(n)]


HYPS, REFS = texts(20, 0), texts(20, 1)


@pytest.fixture(scope="module")
def all_layers(tiny_model_dir):
    return AllLayers(str(tiny_model_dir), keep=range(4))


@pytest.mark.parametrize("special_tokens", ["drop", "cls", "keep"])
@pytest.mark.parametrize("layer", [0, 1, 2, 3])
def test_a_scorer_on_a_layer_of_all_scores_as_on_an_encoder_cut_there(all_layers, tiny_model_dir, layer, special_tokens):
    options = dict(centering="batch", method="twmd", direction="f1", device="cpu")
    cut = Scorer(Encoder.from_pretrained(str(tiny_model_dir), layer=layer, special_tokens=special_tokens), **options)
    shared = Scorer(all_layers.encoder(layer, special_tokens), **options)
    assert shared.signature == cut.signature
    torch.testing.assert_close(shared.score(HYPS, REFS, batch_size=8), cut.score(HYPS, REFS, batch_size=8),
                               rtol=0, atol=1e-6)
    with torch.no_grad():  # forward, one call: the memo by the call's model inputs
        torch.testing.assert_close(shared(HYPS[:5], REFS[:5]), cut(HYPS[:5], REFS[:5]), rtol=0, atol=1e-6)


def test_the_model_runs_once_per_batch_for_every_layer_and_policy(tiny_model_dir):
    layers = AllLayers(str(tiny_model_dir), keep=[1, 3])
    calls = []
    layers._full.model.register_forward_hook(lambda *_: calls.append(1))
    for layer in (1, 3):
        for policy in ("drop", "keep"):
            Scorer(layers.encoder(layer, policy), centering="none", device="cpu").score(HYPS, REFS, batch_size=8)
    assert len(calls) == layers.batches > 0  # every batch encoded once, whatever the layer and the policy
    layers.clear()
    assert layers.batches == 0
    with pytest.raises(ValueError, match="not among the layers kept"):
        layers.encoder(2)
    with pytest.raises(ValueError, match="keep must name layers"):
        AllLayers(str(tiny_model_dir), keep=[7])
    assert AllLayers(str(tiny_model_dir)).keep == (1, 2, 3)  # the blocks' outputs, not the embeddings


def test_with_grad_the_model_runs_and_the_gradient_reaches_it(tiny_model_dir):
    layers = AllLayers(str(tiny_model_dir))
    scorer = Scorer(layers.encoder(2), centering="none", device="cpu")
    scorer(HYPS[:3], REFS[:3]).sum().backward()
    assert layers.batches == 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in layers._full.model.parameters())
