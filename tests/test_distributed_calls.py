"""Calls inside an initialised process group (2 gloo processes, with deadlines: a hang fails the test).

- ``torchmover.score`` is a collective only with ``distributed=True``: otherwise its statistics are
  fitted on this process alone, so a call on one rank, or on each rank's own lists, waits for nobody.
- Training-mode batch centering over ranks counts each rank's distinct texts: a text on several ranks
  counts once per rank, so W processes equal one process on the whole batch when no text is on two
  ranks, and otherwise equal one process centered on the mean of every rank's distinct texts.
"""
import functools

import torch
import torch.distributed as dist

import _ddp

HYPS = ["the cat sat on the mat", "a dog barked", "the sun is red", "they ran to the city"]
REFS = ["a cat was on the mat", "the dog barked all night", "the moon is blue", "we ran to the old house"]
SHARED = "the dog barked in the old house on the red road"
SHARED_REFS = [SHARED] * len(HYPS)  # one reference of every hypothesis: on both ranks
FITTED = dict(idf=True, centering="fixed")  # both statistics fitted on the call's texts


@functools.cache
def tiny_encoder():
    """The tiny encoder, one per process (so that ``torchmover.score`` caches one scorer for it)."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder

    return Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert")


def one_call(hyps, refs, **kwargs):
    """``torchmover.score`` of the tiny encoder with IDF and a fixed centering fitted on the call."""
    import torchmover

    return torchmover.score(hyps, refs, model=tiny_encoder(), progress=False, **FITTED, **kwargs)


def score_calls_worker(rank: int, world_size: int) -> dict:
    """``torchmover.score`` on rank 0 alone, on each rank's own lists, as a collective, and as a
    collective on different lists."""
    out = {}
    if rank == 0:
        out["rank0_alone"] = one_call(HYPS, REFS)
    dist.barrier()  # rank 1 waits here: a collective inside rank 0's call would never be matched
    out["own_lists"] = one_call(HYPS[rank::world_size], REFS[rank::world_size])
    out["collective"] = one_call(HYPS, REFS, distributed=True)
    try:
        one_call(HYPS[rank:], REFS[rank:], distributed=True)
    except ValueError as error:
        out["mismatch"] = str(error)
    return out


def test_score_is_a_collective_only_with_distributed(tmp_path):
    ranks = _ddp.run(score_calls_worker, 2, tmp_path, timeout=120)
    single = one_call(HYPS, REFS)
    torch.testing.assert_close(ranks[0]["rank0_alone"], single, atol=1e-6, rtol=0)
    for rank, result in enumerate(ranks):
        torch.testing.assert_close(result["own_lists"], one_call(HYPS[rank::2], REFS[rank::2]), atol=1e-6, rtol=0)
        torch.testing.assert_close(result["collective"], single, atol=1e-6, rtol=0)
        assert "different lists" in result["mismatch"] and "distributed=False" in result["mismatch"]


def training_step_worker(rank: int, world_size: int) -> dict:
    """Training-mode batch-centered scores of this rank's slice, references distinct or shared."""
    out = {}
    for name, refs in (("distinct", REFS), ("shared", SHARED_REFS)):
        with torch.no_grad():
            out[name] = _ddp.tiny_scorer("batch")(HYPS[rank::world_size], refs[rank::world_size])
    return out


def test_batch_centering_over_ranks_counts_a_text_once_per_rank_it_is_on(tmp_path):
    ranks = _ddp.run(training_step_worker, 2, tmp_path, timeout=120)
    with torch.no_grad():
        distinct = _ddp.tiny_scorer("batch")(HYPS, REFS)
        shared = _ddp.tiny_scorer("batch")(HYPS, SHARED_REFS)
    # every rank's distinct texts, concatenated: SHARED twice, once for each rank it is on
    per_rank = [t for r in range(2) for t in dict.fromkeys(HYPS[r::2] + SHARED_REFS[r::2])]
    counted_per_rank = _ddp.tiny_scorer("fixed").eval().fit_centering(per_rank, progress=False)
    for rank, result in enumerate(ranks):
        torch.testing.assert_close(result["distinct"], distinct[rank::2], atol=1e-6, rtol=0)
        with torch.no_grad():
            expected = counted_per_rank(HYPS[rank::2], SHARED_REFS[rank::2])
        torch.testing.assert_close(result["shared"], expected, atol=1e-6, rtol=0)
    # one process counts SHARED once: its scores differ (by 1.4e-2 here)
    difference = (torch.cat([ranks[0]["shared"], ranks[1]["shared"]]) - torch.cat([shared[0::2], shared[1::2]]))
    assert difference.abs().max() > 1e-3
