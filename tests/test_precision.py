"""bf16 / fp16 encoders: the centering mean stays float32, centering and transport run in float32, and
scores stay within 2e-3 (bf16) / 3e-4 (fp16) of float32, never NaN. Measured on these pairs with the
default model on CPU (``python -m pytest tests/test_precision.py``): at most 8.0e-4 (bf16) and 9.9e-5
(fp16) over the configurations below."""
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


TOLERANCE = {"bf16": 2e-3, "fp16": 3e-4}
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_runs_transformer_ops_in(dtype: torch.dtype) -> bool:
    """Whether this torch build has the CPU kernels of a transformer layer in ``dtype``."""
    x = torch.ones(2, 3, 4, dtype=dtype)
    try:
        torch.nn.functional.layer_norm(torch.nn.functional.linear(x, torch.ones(4, 4, dtype=dtype)), (4,))
        torch.softmax(x @ x.transpose(1, 2), -1)
        torch.nn.functional.gelu(x)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("dtype, options", [
    ("bf16", dict(centering="fixed")), ("bf16", dict()), ("bf16", dict(method="trwmd")),
    ("bf16", dict(method="bertscore", direction="f1")),
    ("fp16", dict(centering="fixed")), ("fp16", dict()), ("fp16", dict(method="trwmd")),
    ("fp16", dict(method="bertscore", direction="f1")),
])
def test_half_precision_encoder_scores_close_to_float32(default_encoder, options, dtype):
    """The default model (all-MiniLM-L6-v2) on CPU; skipped only where torch has no CPU kernels for the
    dtype (an error anywhere else fails)."""
    if not cpu_runs_transformer_ops_in(HALF[dtype]):
        pytest.skip(f"this torch build has no CPU {dtype} kernels for a transformer layer")

    def scores(**extra):
        scorer = Scorer(copy.deepcopy(default_encoder), **options, **extra)
        if scorer.config.centering == "fixed":
            scorer.fit_centering(CORPUS, progress=False)
        with torch.no_grad():
            return scorer(HYPS, REFS), scorer

    reference, _ = scores()
    half, scorer = scores(dtype=dtype)
    assert next(scorer.encoder.parameters()).dtype == HALF[dtype]
    assert half.dtype == torch.float32 and not half.isnan().any()
    assert half[2] == 0  # the empty hypothesis
    torch.testing.assert_close(half, reference, rtol=0, atol=TOLERANCE[dtype])


def test_the_signature_names_an_encoder_dtype_other_than_float32(tiny_model_dir, tmp_path, monkeypatch):
    """A bf16 encoder moves scores by ~1e-3, so its signature says ``dtype:bfloat16`` (float32's says
    nothing, as before), the signature rebuilds it, and a run of ``score_files`` begun in float32 is
    not resumed in bf16 (its chunks would mix the two)."""
    import torchmover.evaluation.corpus as job
    from torchmover.evaluation.corpus import Column, RunError, score_files

    full, half = Scorer(str(tiny_model_dir), layer=2), Scorer(str(tiny_model_dir), layer=2, dtype="bf16")
    assert "dtype:" not in full.signature
    assert half.signature.split("|")[2:4] == ["layer:2", "dtype:bfloat16"]
    assert Scorer.from_signature(half.signature, model=str(tiny_model_dir)).signature == half.signature
    assert Scorer.from_signature(full.signature, model=str(tiny_model_dir)).signature == full.signature
    (tmp_path / "hyps.txt").write_text("".join(h + "\n" for h in HYPS), encoding="utf-8")
    (tmp_path / "refs.txt").write_text("".join((r if isinstance(r, str) else r[0]) + "\n" for r in REFS),
                                       encoding="utf-8")
    columns = Column(str(tmp_path / "hyps.txt")), [Column(str(tmp_path / "refs.txt"))]
    score_chunk, calls = job.score_chunk, []

    def stopping_in_the_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return score_chunk(*args, **kwargs)
    with monkeypatch.context() as patch:  # the float32 run stops in its second chunk
        patch.setattr(job, "score_chunk", stopping_in_the_second_chunk)
        with pytest.raises(KeyboardInterrupt):
            score_files(full, *columns, tmp_path / "scores.txt", chunk_pairs=2, progress=False)
    with pytest.raises(RunError, match="dtype"):
        score_files(half, *columns, tmp_path / "scores.txt", chunk_pairs=2, progress=False)
