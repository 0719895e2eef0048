"""bf16 / fp16 encoders: the centering mean stays float32, centering and transport run in float32, and
scores stay within 1e-2 of float32 (measured: within 1e-3 on these pairs), never NaN."""
from __future__ import annotations

import copy

import pytest
import torch

from torchmover import Centering, Scorer, center

HYPS = ["the cat sat on the mat", "a dog ran in the park yesterday evening", "", "the quick brown fox jumps",
        "Prices rose sharply in the third quarter, the ministry said.", "!!!"]
REFS = ["a cat was sitting on the mat", ["yesterday a dog was running in the park", "a dog ran"], "the sun",
        "a fox jumped over a lazy dog", "The ministry said prices had risen steeply in Q3.", "nothing at all"]
CORPUS = [r if isinstance(r, str) else r[0] for r in REFS]


def test_to_bf16_keeps_the_centering_mean_exact(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(CORPUS, progress=False)
    mean = scorer.centering.mean.clone()
    scorer.to(torch.bfloat16)
    assert next(scorer.encoder.parameters()).dtype == torch.bfloat16
    assert scorer.centering.mean.dtype == torch.float32 and torch.equal(scorer.centering.mean, mean)
    scorer.double()  # wider is fine (float64 gradchecks)
    assert scorer.centering.mean.dtype == torch.float64
    assert torch.equal(scorer.centering.mean, mean.double())


@pytest.mark.parametrize("mode", ["fixed", "batch", "sentence"])
def test_half_vectors_are_centered_in_float32(mode):
    torch.manual_seed(0)
    x = (torch.randn(2, 5, 8) + 3.0).bfloat16()  # a large common direction, as in BERT's vectors
    mask = torch.rand(2, 5) > 0.2
    mean = torch.randn(8) / 3 + 3.0 if mode == "fixed" else None
    got = center(x, mask, mode, mean)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, center(x.float(), mask, mode, mean), rtol=0, atol=0)
    module = Centering(mode, dim=8)
    if mode == "fixed":
        module.fit(x.float(), mask)
    assert module(x, mask).dtype == torch.float32


@pytest.fixture(scope="module")
def default_encoder():
    from torchmover.text.encoder import DEFAULT_MODEL, Encoder

    return Encoder.from_pretrained(DEFAULT_MODEL)


@pytest.mark.parametrize("dtype, options", [
    ("bf16", dict(centering="fixed")), ("bf16", dict()), ("bf16", dict(method="trwmd")),
    ("bf16", dict(method="bertscore", direction="f1")),
    ("fp16", dict(centering="fixed")), ("fp16", dict(method="bertscore", direction="f1")),
])
def test_half_precision_encoder_scores_within_1e_2_of_float32(default_encoder, options, dtype):
    """The default model (all-MiniLM-L6-v2) on CPU; fp16 on CPU needs torch's half kernels."""
    def scores(**extra):
        scorer = Scorer(copy.deepcopy(default_encoder), **options, **extra)
        if scorer.config.centering == "fixed":
            scorer.fit_centering(CORPUS, progress=False)
        with torch.no_grad():
            return scorer(HYPS, REFS), scorer

    reference, _ = scores()
    try:
        half, scorer = scores(dtype=dtype)
    except RuntimeError as error:  # e.g. an op without a CPU half kernel in this torch build
        pytest.skip(f"{dtype} on CPU: {error}")
    assert next(scorer.encoder.parameters()).dtype != torch.float32
    assert half.dtype == torch.float32 and not half.isnan().any()
    assert half[2] == 0  # the empty hypothesis
    torch.testing.assert_close(half, reference, rtol=0, atol=1e-2)
