"""The micro-batcher: coalesced concurrent calls, each caller's own rewards, errors, shutdown, pickling."""
from __future__ import annotations

import asyncio
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from torchmover import Scorer
from torchmover.reward.batching import BatchedReward
from torchmover.reward.rewards import MoverReward

REFS = ["the cat sat on the mat", "a dog barked in the house", "the quick brown fox jumps over the lazy dog",
        "she eats good food", "the sun is big and red", "they ran on the road"]
HYPS = ["the cat sat", "a dog ran in the city", "the brown fox", "he eats bad food", "the moon is small",
        "we ran", "the red car", "a big tree", "the woman eats", "it was night"]
PAIRS = [(h, r) for h in HYPS for r in REFS]  # 60 distinct pairs
ATOL = 1e-6


@pytest.fixture
def reward(tiny_encoder):
    return MoverReward(Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False))


def expected(reward, pairs):
    return reward.score([h for h, _ in pairs], [r for _, r in pairs])


def test_each_caller_gets_its_own_reward(reward):
    want = expected(reward, PAIRS)
    start = threading.Barrier(16)
    with BatchedReward(reward, max_batch_size=32, max_wait_ms=20) as batched:
        def call(i):
            if i < 16:
                start.wait()  # 16 calls queued at once: they must be coalesced
            return batched.score_one(*PAIRS[i])

        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(call, range(len(PAIRS))))
        stats = batched.stats()
    torch.testing.assert_close(torch.tensor(got), want, atol=ATOL, rtol=0)
    assert stats["pairs"] == len(PAIRS) and stats["batches"] < len(PAIRS)
    assert stats["mean_batch_size"] > 1


def test_calls_of_several_pairs_and_references(reward):
    calls = [(HYPS[i:i + k], [REFS[(i + j) % len(REFS)] if j % 2 else REFS[:2] for j in range(k)])
             for i, k in [(0, 1), (1, 3), (2, 5), (4, 2), (0, 9), (5, 1)]]
    sizes, score = [], reward.score
    with BatchedReward(reward, max_batch_size=4, max_wait_ms=20) as batched:  # the 5- and 9-pair calls exceed it
        batched.reward.score = lambda hyps, refs: (sizes.append(len(hyps)), score(hyps, refs))[1]
        with ThreadPoolExecutor(len(calls)) as pool:
            got = list(pool.map(lambda c: batched.score(*c), calls))
    assert sorted(sizes)[-2:] == [5, 9] and max(sorted(sizes)[:-2]) <= 4  # a large call alone, never split
    assert sum(sizes) == sum(len(h) for h, _ in calls)
    for (hyps, refs), g in zip(calls, got):
        assert g.shape == (len(hyps),)
        torch.testing.assert_close(g, reward.score(hyps, refs), atol=ATOL, rtol=0)


def test_waits_max_wait_ms_for_more_calls(reward):
    with BatchedReward(reward, max_wait_ms=500) as batched:
        futures = []
        for h, r in PAIRS[:3]:
            futures.append(batched.submit([h], [r]))
            time.sleep(0.05)
        torch.testing.assert_close(torch.cat([f.result() for f in futures]), expected(reward, PAIRS[:3]),
                                   atol=ATOL, rtol=0)
        assert batched.stats()["batches"] == 1


def test_asyncio_callers(reward):
    batched = BatchedReward(reward, max_wait_ms=20)

    async def main():
        return await asyncio.gather(*(batched.ascore([h], [r]) for h, r in PAIRS[:12]))

    got = torch.cat(asyncio.run(main()))
    batched.close()
    torch.testing.assert_close(got, expected(reward, PAIRS[:12]), atol=ATOL, rtol=0)
    assert batched.stats()["batches"] < 12


def test_bad_calls_raise_in_the_caller_before_queueing(reward):
    with BatchedReward(reward) as batched:
        with pytest.raises(TypeError, match=r"hyps\[0\] must be a str"):
            batched.score([3], ["the cat"])
        with pytest.raises(ValueError, match="same length"):
            batched.submit(["a", "b"], ["the cat"])
        with pytest.raises(TypeError, match="hyp must be a str"):
            batched.score_one(["a cat"], "the cat")
        assert batched.score([], []).shape == (0,)
        assert batched.score_one("the cat sat", "the cat sat on the mat") == pytest.approx(
            float(reward.score(["the cat sat"], ["the cat sat on the mat"])[0]), abs=ATOL)
        assert batched.stats()["pairs"] == 1  # nothing of the bad calls reached a batch


def test_a_failing_call_does_not_poison_its_batch(reward):
    def shaping(hyps, scores):
        if "boom" in hyps:
            raise RuntimeError("shaping failed on boom")
        return scores

    reward.shaping = shaping
    texts = ["boom"] + HYPS[:7]
    start = threading.Barrier(len(texts))
    with BatchedReward(reward, max_wait_ms=50) as batched:
        def call(text):
            start.wait()
            future = batched.submit([text], [REFS[0]])
            try:
                return future.result()
            except RuntimeError as error:
                return error

        with ThreadPoolExecutor(len(texts)) as pool:
            got = list(pool.map(call, texts))
    assert isinstance(got[0], RuntimeError) and "boom" in str(got[0])
    torch.testing.assert_close(torch.cat(got[1:]), reward.score(HYPS[:7], [REFS[0]] * 7), atol=ATOL, rtol=0)


def test_unfitted_batch_centering_raises_at_submit(tiny_scorer):
    with BatchedReward(MoverReward(tiny_scorer)) as batched:
        with pytest.raises(RuntimeError, match="reward.fit"):
            batched.score_one("a cat", "the cat")


def test_close_scores_queued_calls_then_refuses(reward):
    batched = BatchedReward(reward, max_batch_size=2, max_wait_ms=1)
    futures = [batched.submit([h], [r]) for h, r in PAIRS[:9]]
    batched.close()
    torch.testing.assert_close(torch.cat([f.result(timeout=0) for f in futures]), expected(reward, PAIRS[:9]),
                               atol=ATOL, rtol=0)
    assert not batched._worker.is_alive() and batched.closed
    with pytest.raises(RuntimeError, match="closed"):
        batched.score_one(*PAIRS[0])
    batched.close()  # idempotent


def test_validates_settings(reward):
    with pytest.raises(TypeError, match="reward must be"):
        BatchedReward(reward.scorer)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_batch_size"):
            BatchedReward(reward, max_batch_size=bad)
    for bad in (-1, float("nan"), float("inf"), "5"):
        with pytest.raises(ValueError, match="max_wait_ms"):
            BatchedReward(reward, max_wait_ms=bad)


def test_pickles_as_its_reward_and_settings(reward):
    with BatchedReward(reward, max_batch_size=7, max_wait_ms=3) as batched:
        before = batched.score(HYPS[:4], REFS[:4])
        copy = pickle.loads(pickle.dumps(batched))
        with copy:
            assert (copy.max_batch_size, copy.max_wait_ms) == (7, 3.0)
            assert copy._worker is not batched._worker and copy._worker.is_alive()
            torch.testing.assert_close(copy.score(HYPS[:4], REFS[:4]), before, atol=ATOL, rtol=0)
        torch.testing.assert_close(batched.score(HYPS[:4], REFS[:4]), before, atol=ATOL, rtol=0)  # original still runs
