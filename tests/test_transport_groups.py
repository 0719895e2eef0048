"""A reward call's pairs moved in batches of similar length on the CPU (``torchmover.scorer.plan``):
the layout planned on the host, and scores equal to those of one batch on every reward path."""
from __future__ import annotations

import pytest
import torch

import torchmover.functional.family as family
import torchmover.scorer.plan as plan
from torchmover import Scorer
from torchmover.reward.rewards import GroupReward, MoverReward, SelfCriticalReward
from torchmover.scorer.plan import PairGroup, PairIndex, pair_groups, pairs_by_group, transport_groups

SHORT = ["a cat", "the dog barked", "a man", "", "the sun", "a cat"]  # an empty one, a repeated one
LONG = ["the quick brown fox jumps over the lazy dog and the cat sat on the mat all day long " * 2,
        "a man plays a guitar on stage while the dog barked at the sun and we ate food all day long"]
REFS = ["a cat sat on the mat", "the dog barked at the man", "the sun", "the fox jumps over the dog"]


def test_transport_groups_cut_the_hypotheses_by_their_squared_lengths():
    lengths = [3, 40, 4, 41, 3, 39]
    groups = transport_groups(lengths, 1000)
    assert [[lengths[i] for i in g] for g in groups] == [[3, 3, 4], [39, 40, 41]]  # shortest group first, sorted
    assert transport_groups(lengths, 10 ** 9) is None  # a batch costs more than all the padding
    assert transport_groups([5, 5, 5], 0) is None  # equal lengths: nothing to cut


def test_pairs_by_group_lays_out_each_groups_pairs_together():
    """Pairs ordered by hypothesis row (stable), each keeping its reference and owner."""
    index = PairIndex(hyp=[2, 2, 0, 1, 1], ref=[0, 1, 2, 3, 4], owner=[0, 0, 1, 2, 2])
    grouped, slices = pairs_by_group(index, n_hyps=3, hyp_bounds=[0, 1, 3])
    assert grouped == PairIndex([0, 1, 1, 2, 2], [2, 3, 4, 0, 1], [1, 2, 2, 0, 0])
    assert slices == [(slice(0, 1), slice(0, 1)), (slice(1, 3), slice(1, 5))]
    # aligned pairs (None: pair p is row p everywhere) become explicit: the owners put the scores back
    grouped, slices = pairs_by_group(PairIndex(None, None, None), n_hyps=3, hyp_bounds=[0, 3])
    assert grouped == PairIndex([0, 1, 2], [0, 1, 2], [0, 1, 2]) and slices == [(slice(0, 3), slice(0, 3))]


def test_pair_groups_take_each_groups_widest_text():
    slices = [(slice(0, 2), slice(0, 3)), (slice(2, 3), slice(3, 4))]
    groups = pair_groups(slices, hyp_stops=[2, 5, 0], pair_ref_stops=[4, 1, 3, 7])
    assert groups == [PairGroup(slice(0, 2), slice(0, 3), 5, 4), PairGroup(slice(2, 3), slice(3, 4), 1, 7)]  # >= 1


def scores(reward, call):
    return [s.clone() for s in (call(reward), call(reward))]  # references encoded, then their clouds cached


CALLS = {
    "one reference": lambda r: r(SHORT + LONG, (REFS * 2)[:len(SHORT + LONG)]),
    "several references": lambda r: r(
        LONG + SHORT, [REFS[:2], REFS] + [[REFS[i % 4]] for i in range(len(SHORT))]),
}
OPTIONS = {"default": {}, "f1": {"direction": "f1"}, "idf": {"idf": True}, "stopwords": {"stopwords": "english"},
           "subwords-mean": {"subwords": "mean"}, "bigrams": {"ngram": 2}, "trwmd": {"method": "trwmd"},
           "bertscore": {"method": "bertscore"}, "sbert": {"method": "sbert"}, "cka": {"method": "cka"},
           "mean of references": {"multi_ref": "mean"}}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_grouped_rewards_equal_one_batchs(tiny_encoder, monkeypatch, options, call):
    """A group per distinct length (batch cost 0) against one batch (no cost: as on a GPU), with the
    references' clouds built now and then read from the cache, and without a cache."""
    scorer = Scorer(tiny_encoder, **options)
    if scorer.config.idf:
        scorer.fit_idf(REFS, SHORT + LONG)
    results = {}
    for cost in (None, 0):
        monkeypatch.setitem(plan.TRANSPORT_BATCH_COST, "cpu", cost)
        uncached = MoverReward(scorer, cache_size=0).fit(REFS)
        results[cost] = scores(MoverReward(scorer).fit(REFS), call) + [call(uncached)]
    for one_batch, grouped in zip(results[None], results[0]):
        torch.testing.assert_close(grouped, one_batch, rtol=0, atol=1e-6)
        assert grouped[SHORT.index("") if call is CALLS["one reference"] else len(LONG) + SHORT.index("")] == 0


def test_self_critical_and_group_rewards_are_grouped_alike(tiny_scorer, monkeypatch):
    groups = [SHORT[:3] + LONG[:1], SHORT[3:] + LONG[1:]]
    results = {}
    for cost in (None, 0):
        monkeypatch.setitem(plan.TRANSPORT_BATCH_COST, "cpu", cost)
        results[cost] = (SelfCriticalReward(tiny_scorer).fit(REFS)(SHORT + LONG, LONG + SHORT, REFS * 2).advantage,
                         GroupReward(tiny_scorer).fit(REFS)(groups, REFS[:2]).rewards)
    for one_batch, grouped in zip(results[None], results[0]):
        torch.testing.assert_close(grouped, one_batch, rtol=0, atol=1e-6)


def test_the_cpu_moves_a_call_of_mixed_lengths_in_smaller_problems(tiny_scorer, monkeypatch):
    """With the CPU's default batch cost a call of many short completions and two long ones is cut in
    two batches, whose transport problems hold a fraction of the cells of one padded batch."""
    words = ["cat", "dog", "man", "sun", "fox", "mat", "guitar", "stage"]
    hyps = [f"the {a} {b}" for a in words for b in words] + LONG  # 64 distinct short ones
    refs = (REFS * 17)[:len(hyps)]
    default = plan.TRANSPORT_BATCH_COST["cpu"]
    cells, results = {}, {}
    for cost in (None, default):
        monkeypatch.setitem(plan.TRANSPORT_BATCH_COST, "cpu", cost)
        reward = MoverReward(tiny_scorer).fit(REFS)
        reward(hyps, refs)
        cells[cost] = []
        cross = family._cross

        def recorded(term, x, y):
            cells[cost].append(x.mask.shape[0] * x.mask.shape[1] * y.mask.shape[1])
            return cross(term, x, y)
        monkeypatch.setattr(family, "_cross", recorded)
        results[cost] = reward(hyps, refs)
        monkeypatch.setattr(family, "_cross", cross)
    assert len(cells[default]) == 2 * len(cells[None])  # a cross term and a self-term per batch
    assert sum(cells[default]) < sum(cells[None]) / 4
    torch.testing.assert_close(results[default], results[None], rtol=0, atol=1e-6)
