"""Texts as NumPy arrays (``str`` or ``object`` dtype) wherever texts are taken: the same scores as lists."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchmover import Scorer
from torchmover.reward.batching import BatchedReward
from torchmover.integrations.trl import as_trl_reward
from torchmover.reward.rewards import GroupReward, MoverReward, SelfCriticalReward

REFS = ["the cat sat on the mat", "a dog barked in the house", "the quick brown fox", "she eats good food"]
HYPS = ["the cat sat", "a dog ran in the city", "the brown fox", "he eats bad food"]
ATOL = 1e-6


def arrays(texts):
    return [np.array(texts), np.array(texts, dtype=object)]


@pytest.fixture
def reward(tiny_encoder):
    return MoverReward(Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False))


@pytest.mark.parametrize("kind", ["str", "object"])
def test_scorer_takes_arrays(tiny_scorer, kind):
    hyps, refs = np.array(HYPS, dtype=kind), np.array(REFS, dtype=kind)
    want = tiny_scorer(HYPS, REFS)
    torch.testing.assert_close(tiny_scorer(hyps, refs), want)
    torch.testing.assert_close(tiny_scorer.score(hyps, refs, progress=False), tiny_scorer.score(HYPS, REFS, progress=False))
    groups = [[r, REFS[0]] for r in REFS]
    torch.testing.assert_close(tiny_scorer(hyps, np.array(groups, dtype=kind)), tiny_scorer(HYPS, groups))  # 2-D: a row per hyp
    ragged = np.empty(len(HYPS), dtype=object)
    ragged[:] = [np.array(REFS[:1 + i % 2]) for i in range(len(HYPS))]  # object array of arrays (verl's ground truths)
    torch.testing.assert_close(tiny_scorer(hyps, ragged), tiny_scorer(HYPS, [REFS[:1 + i % 2] for i in range(len(HYPS))]))


def test_fits_take_arrays(tiny_encoder):
    a = Scorer(tiny_encoder, centering="fixed", idf=True).fit_idf(np.array(REFS), np.array(HYPS, dtype=object))
    a.fit_centering(np.array(REFS), progress=False)
    b = Scorer(tiny_encoder, centering="fixed", idf=True).fit_idf(REFS, HYPS).fit_centering(REFS, progress=False)
    assert a.signature == b.signature


def test_array_errors_name_the_argument(tiny_scorer):
    with pytest.raises(ValueError, match=r"hyps must be a 1-D array of strings, got shape \(2, 2\)"):
        tiny_scorer(np.array([HYPS[:2], HYPS[2:]]), REFS[:2])
    with pytest.raises(ValueError, match="refs must be a 1-D to 2-D array"):
        tiny_scorer(HYPS[:1], np.array(REFS[:1]).reshape(1, 1, 1))
    with pytest.raises(TypeError, match=r"hyps\[0\] must be a str, got int"):
        tiny_scorer(np.array([1, 2]), REFS[:2])
    with pytest.raises(TypeError, match="hyps must be a list of strings, got Tensor"):
        tiny_scorer(torch.zeros(2), REFS[:2])


def test_rewards_take_arrays(reward, tiny_encoder):
    for hyps in arrays(HYPS):
        torch.testing.assert_close(reward.score(hyps, np.array(REFS, dtype=object)), reward.score(HYPS, REFS), atol=ATOL, rtol=0)
    sc = SelfCriticalReward(reward.scorer)
    out, want = sc(np.array(HYPS), np.array(REFS), np.array(REFS)), sc(HYPS, REFS, REFS)
    torch.testing.assert_close(out.advantage, want.advantage, atol=ATOL, rtol=0)
    group = GroupReward(reward.scorer)
    completions = [HYPS[:2], HYPS[2:]]
    torch.testing.assert_close(group(np.array(completions), np.array(REFS[:2])).rewards,  # [N, G] array
                               group(completions, REFS[:2]).rewards, atol=ATOL, rtol=0)
    with BatchedReward(reward) as batched:
        torch.testing.assert_close(batched.score(np.array(HYPS), np.array(REFS)), reward.score(HYPS, REFS), atol=ATOL, rtol=0)
        assert batched.score_one(HYPS[0], np.array(REFS[:2])) == pytest.approx(
            float(reward.score(HYPS[:1], [REFS[:2]])[0]), abs=ATOL)


def test_trl_reward_takes_array_columns(reward):
    trl = as_trl_reward(reward)
    column = np.empty(3, dtype=object)
    column[:] = [np.array(REFS[:2]), None, REFS[2]]
    got = trl(prompts=None, completions=np.array(HYPS[:3]), reference=column)
    want = trl(prompts=None, completions=HYPS[:3], reference=[REFS[:2], None, REFS[2]])
    assert got[1] is None and got == pytest.approx(want, abs=ATOL)


def test_metric_takes_arrays(tiny_scorer):
    pytest.importorskip("torchmetrics")
    from torchmover.evaluation.metric import MoverMetric

    metric = MoverMetric(tiny_scorer)
    metric.update(np.array(HYPS), np.array(REFS, dtype=object))
    torch.testing.assert_close(metric.compute(), tiny_scorer(HYPS, REFS).mean())


def test_texts_that_are_not_valid_unicode_are_errors_in_every_api(reward, tiny_encoder):
    """A lone surrogate (e.g. from a JSON "\\ud800" escape) is a ValueError naming the argument, the
    index and the position, not a tokenizer TypeError from deep inside."""
    bad = "a\ud800b"
    scorer = reward.scorer
    calls = {
        r"hyps\[1\] is not valid Unicode: lone surrogate '\\ud800' at position 1": [
            lambda: scorer(["a", bad], ["a", "b"]), lambda: scorer.score(["a", bad], ["a", "b"], progress=False),
            lambda: reward.score(["a", bad], ["a", "b"]), lambda: BatchedReward(reward).submit(["a", bad], ["a", "b"])],
        r"refs\[1\] is not valid Unicode": [lambda: scorer(["a", "b"], ["a", bad]), lambda: reward.score(["a", "b"], ["a", bad]),
                                           lambda: reward.score(["a", "b"], [["a"], bad])],
        r"refs\[1\]\[1\] is not valid Unicode": [lambda: scorer(["a", "b"], [["a"], ["b", bad]])],
        r"texts\[0\] is not valid Unicode": [lambda: reward.fit([bad]), lambda: scorer.fit_centering([bad], progress=False)],
        r"sampled\[0\] is not valid Unicode": [lambda: SelfCriticalReward(scorer)([bad], ["a"], ["a"])],
        r"completions\[0\]\[1\] is not valid Unicode": [lambda: GroupReward(scorer)([["a", bad]], ["a"])],
    }
    for message, raising in calls.items():
        for call in raising:
            with pytest.raises(ValueError, match=message):
                call()
    assert reward.score(["a\U0001F600b"], ["a"]).shape == (1,)  # an astral character (a valid surrogate pair in UTF-16) is fine
