"""Sharded scoring: ``Scorer.score(distributed=True)`` on 2 gloo processes is one process's scores, in
input order, every member and direction, ``batch`` centering included; each rank encodes a share."""
import pytest
import torch

import _ddp
from torchmover.scorer.corpus import balanced_bounds

# Lengths vary tenfold, long pairs first, and texts repeat across pairs (a repeated text counts once
# in the batch mean, whichever rank scores its pairs).
HYPS = ["the quick brown fox jumps over the lazy dog and the cat sat on the old mat in the house",
        "a small child eats good food with water in the big city on a new day",
        "the cat sat", "a dog barked", "the sun is red", "the cat sat", "they ran", "she eats food",
        "the moon is blue", "a man"]
REFS = ["a quick fox jumps over the dog while a cat sat on the mat in a house",
        ["the child eats food in the city", "a small child eats"], "the cat sat",
        "the dog barked", ["the sun is big", "a red sun"], "a cat was on the mat", "we ran", "she eats good food",
        "the moon is blue", "a woman"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _ddp.run(_ddp.sharded_score_worker, 2, tmp_path_factory.mktemp("sharded"), HYPS, REFS, 4, timeout=240)


# The members solved to convergence (exact WMD, MoverScore, the exact sentence movers) iterate a batch
# until its worst pair meets the solver's tolerance, from a warm start made for the whole batch: a
# pair's score moves with its batch-mates within that tolerance, in one process too (here up to 5e-5
# between batch sizes 1, 2, 3 and 10). Sharding changes the batches, so they agree to that tolerance.
TOLERANCE = {method: 1e-4 for method in ("wmd", "moverscore", "sms", "s+wms", "wms")}


@pytest.mark.parametrize("name", [name for name, _ in _ddp.SHARDED_CASES])
def test_two_ranks_return_one_process_scores_in_order(two_ranks, name):
    options = dict(_ddp.SHARDED_CASES)[name]
    single = torch.stack(list(_ddp.sharded_scorer(options).score(HYPS, REFS, batch_size=3, return_all=True,
                                                                 progress=False)))
    for out in two_ranks:  # every rank returns the whole list
        torch.testing.assert_close(out[name], single, rtol=0, atol=TOLERANCE.get(name, 1e-6))


def test_the_batch_mean_is_the_whole_calls(two_ranks):
    """The control: centered on one rank's share alone, the scores differ."""
    options = dict(_ddp.SHARDED_CASES)["twmd"]
    first_half = _ddp.sharded_scorer(options).score(HYPS[:3], REFS[:3], progress=False)
    assert not torch.allclose(first_half, two_ranks[0]["twmd"][1, :3], atol=1e-4)


def test_each_rank_encodes_a_share(two_ranks):
    distinct = len(set(HYPS) | {r for g in REFS for r in ([g] if isinstance(g, str) else g)})
    encoded = [out["twmd-none:encoded"] for out in two_ranks]  # one pass (no batch mean), three chunks
    assert all(0 < n < distinct for n in encoded) and distinct <= sum(encoded) <= distinct + 2


def test_ranks_passing_different_lists_are_told(two_ranks):
    for out in two_ranks:
        assert "every rank must pass the same hyps and refs" in out["mismatch"]


def test_shares_are_balanced_by_cost_not_count():
    costs = [100, 100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10]  # 400 in all
    bounds = balanced_bounds(costs, 2)
    assert bounds == [(0, 2), (2, 20)]  # 200 and 200: two long pairs against eighteen short ones
    assert balanced_bounds([5, 1, 1], 4) == [(0, 0), (0, 1), (1, 1), (1, 3)]  # a rank may get none
    assert balanced_bounds([], 2) == [(0, 0), (0, 0)]
    for parts in (1, 3, 7):
        cuts = balanced_bounds(costs, parts)
        assert cuts[0][0] == 0 and cuts[-1][1] == len(costs)
        assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))


def test_a_mean_over_ranks_is_one_texts_own_only_if_no_rank_has_another(tmp_path):
    """Bigrams, each side on its own batch mean: where "a dog" is the only hypothesis with tokens on any
    rank, the hypotheses' mean is its own and its pairs score 0; where the other rank holds another,
    the mean is neither's, and the scores are one process's on the whole list — sharded
    (``distributed=True``) or each rank on its own list (``centering_group``, where "a dog" on both
    ranks is one text, as in one process)."""
    ranks = _ddp.run(_ddp.lone_score_worker, 2, tmp_path, timeout=120)
    scorer = _ddp.sharded_scorer(dict(centering="batch", center_scope="separate", ngram=2))
    for name, (hyps, refs) in _ddp.LONE_CALLS.items():
        single = scorer.score(hyps, refs, batch_size=2, progress=False)
        assert (single == 0).all() if name.startswith("lone") else (single[[0, 2]] != 0).all()
        for rank, out in enumerate(ranks):
            torch.testing.assert_close(out[name], single, rtol=0, atol=1e-6)
            torch.testing.assert_close(out[name + ":group"], single[2 * rank:2 * rank + 2], rtol=0, atol=1e-6)


# Calls whose ranks differ in something their scores depend on: (name, rank 0's, rank 1's) options, each
# {"scorer": Scorer options, "call": score options, "fit": a corpus the fixed mean is fitted on}.
TWMD_BATCH = {"method": "twmd", "centering": "batch"}
MISMATCHED_CALLS = [
    ("method", {"scorer": TWMD_BATCH}, {"scorer": {**TWMD_BATCH, "method": "bertscore"}}),
    ("return_all", {"scorer": TWMD_BATCH, "call": {"return_all": True}}, {"scorer": TWMD_BATCH}),
    ("centering", {"scorer": TWMD_BATCH}, {"scorer": {**TWMD_BATCH, "centering": "none"}}),
    ("center_scope", {"scorer": TWMD_BATCH}, {"scorer": {**TWMD_BATCH, "center_scope": "separate"}}),
    ("multi_ref", {"scorer": TWMD_BATCH}, {"scorer": {**TWMD_BATCH, "multi_ref": "mean"}}),
    ("fitted mean", {"scorer": {"centering": "fixed"}, "fit": HYPS},
     {"scorer": {"centering": "fixed"}, "fit": REFS[2:]}),
]
EXPECTED_DIFFERENCE = {"method": "method: twmd on rank 0, bertscore on rank 1", "return_all": "return_all",
                       "centering": "center: batch on rank 0, none on rank 1",
                       "center_scope": "center: batch on rank 0, batch-separate on rank 1",
                       "multi_ref": "refs: max on rank 0, mean on rank 1", "fitted mean": "center: fixed-"}


def flat_refs(refs) -> list[str]:
    return [r for g in refs for r in ([g] if isinstance(g, str) else g)]


def mismatched_calls_worker(rank: int, world_size: int) -> dict:
    """Each call of ``MISMATCHED_CALLS`` with this rank's options (its error, or its scores), then one
    whose ranks differ in ``batch_size`` only (its scores)."""
    out = {}
    for name, *options in MISMATCHED_CALLS:
        mine = options[rank]
        scorer = _ddp.sharded_scorer(mine["scorer"])
        if "fit" in mine:
            scorer.fit_centering(flat_refs(mine["fit"]), distributed=False, progress=False)
        try:
            out[name] = scorer.score(HYPS, REFS, distributed=True, **mine.get("call", {}))
        except ValueError as error:
            out[name] = str(error)
    out["batch_size"] = _ddp.sharded_scorer(TWMD_BATCH).score(HYPS, REFS, batch_size=1 + 3 * rank, distributed=True)
    return out


def test_ranks_whose_calls_differ_in_what_a_score_depends_on_are_told_what(tmp_path):
    """Every rank raises the same ``ValueError``, naming what differs (a signature by its fields), instead of
    returning scores mixed from two scorers, zeros for the other rank's share, or hanging; a different
    ``batch_size``, which no score depends on, is allowed."""
    ranks = _ddp.run(mismatched_calls_worker, 2, tmp_path, timeout=120)
    for name, _, _ in MISMATCHED_CALLS:
        assert isinstance(ranks[0][name], str) and ranks[0][name] == ranks[1][name], name
        assert "every rank must pass the same hyps and refs" in ranks[0][name]
        assert EXPECTED_DIFFERENCE[name] in ranks[0][name], ranks[0][name]
    single = _ddp.sharded_scorer(TWMD_BATCH).score(HYPS, REFS, progress=False)
    for out in ranks:
        torch.testing.assert_close(out["batch_size"], single, rtol=0, atol=1e-6)
