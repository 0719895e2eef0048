import pytest
import torch

import torchmover.functional as F


@pytest.mark.parametrize("member", [F.tempered_wmd, F.tempered_rwmd, F.sbert, F.cka])
def test_scores_are_float32_under_autocast_and_half_inputs(member):
    torch.manual_seed(0)
    hyp, ref = torch.randn(3, 7, 16), torch.randn(3, 5, 16)
    expected = member(hyp, ref)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = member(hyp, ref)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected)
    half = member(hyp.bfloat16(), ref.bfloat16())
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, member(hyp.bfloat16().float(), ref.bfloat16().float()))


@pytest.mark.parametrize("member", [F.tempered_wmd, F.tempered_rwmd, F.wmd, F.sbert, F.cka])
def test_an_empty_batch_gives_an_empty_result(member):
    assert member(torch.zeros(0, 3, 8), torch.zeros(0, 4, 8)).shape == (0,)


HYPS = ["the cat sat on the mat", "a dog barked at night", "the cat sat on the mat"]
REFS = ["a cat was sitting on a mat", "dogs bark at night", "the mat had a cat"]
BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


def test_score_reward_and_metric_run_the_encoder_without_the_callers_autocast(tiny_encoder):
    """The reported scores are those the signature describes: a caller's autocast (a training loop's
    mixed precision) reaches neither ``Scorer.score``, nor the rewards, nor ``MoverMetric``, nor the
    fit of a centering mean — while it does reach ``forward`` (the control: the tiny model's scores
    move under it)."""
    from torchmover import MoverMetric, MoverReward, Scorer

    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(HYPS + REFS, progress=False)
    mean = scorer.centering.mean.clone()
    expected = {"score": scorer.score(HYPS, REFS, progress=False), "forward": scorer(HYPS, REFS),
                "reward": MoverReward(scorer)(HYPS, REFS)}
    metric = MoverMetric(scorer, return_per_sample=True)
    metric.update(HYPS, REFS)
    expected["metric"] = metric.compute()["per_sample"]
    with torch.autocast(**BF16):
        got = {"score": scorer.score(HYPS, REFS, progress=False), "forward": scorer(HYPS, REFS),
               "reward": MoverReward(scorer)(HYPS, REFS)}
        metric.reset()
        metric.update(HYPS, REFS)
        got["metric"] = metric.compute()["per_sample"]
        scorer.fit_centering(HYPS + REFS, progress=False)
    assert torch.equal(scorer.centering.mean, mean)
    for name in ("score", "reward", "metric"):
        assert torch.equal(got[name], expected[name]), name
    assert not torch.equal(got["forward"], expected["forward"])  # forward follows the caller's autocast


@pytest.mark.parametrize("centering", ["batch", "none"])  # fits a corpus mean; only fills the cache
def test_a_reward_fitted_under_autocast_gives_the_rewards_of_one_fitted_without(tiny_encoder, centering):
    from torchmover import MoverReward, Scorer

    scorer = Scorer(tiny_encoder, centering=centering)
    expected = MoverReward(scorer).fit(REFS)(HYPS, REFS)
    reward = MoverReward(scorer)
    with torch.autocast(**BF16):
        reward.fit(REFS)
    assert torch.equal(reward(HYPS, REFS), expected)


def test_a_metric_that_trains_its_scorer_follows_the_callers_autocast(tiny_encoder):
    from torchmover import MoverMetric, Scorer

    metric = MoverMetric(Scorer(tiny_encoder, centering="none"), return_per_sample=True, train_scorer=True)
    metric.update(HYPS, REFS)
    plain = metric.compute()["per_sample"]
    metric.reset()
    with torch.autocast(**BF16):
        metric.update(HYPS, REFS)
    assert not torch.equal(metric.compute()["per_sample"], plain)
