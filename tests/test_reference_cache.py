"""ReferenceCache on its own: LRU bookkeeping (plan), what it gathers and stores, invalidation,
undoing a failed call, and pickling — with fake units, no encoder."""
from __future__ import annotations

import pickle

import pytest
import torch

from torchmover.functional.family import token_cloud
from torchmover.reward.cache import ReferenceCache
from torchmover.scorer.plan import PairIndex
from torchmover.scorer.units import Units

DIM = 4


def fake_units(texts: list[str]) -> tuple[Units, list[tuple[int, int]]]:
    """Units whose vectors are a function of the text alone (one token per character, at most 5), padded."""
    width = max(min(len(t), 5) for t in texts)
    vectors = torch.zeros(len(texts), width, DIM)
    mask = torch.zeros(len(texts), width, dtype=torch.bool)
    for i, t in enumerate(texts):
        for j, c in enumerate(t[:5]):
            vectors[i, j] = torch.tensor([ord(c), j, len(t), 1.0])
            mask[i, j] = True
    return Units(vectors, mask), [(0, min(len(t), 5)) for t in texts]


class Encoder:
    """Counts the texts it encodes."""

    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, texts):
        self.seen += texts
        return fake_units(texts)


def fetch(cache: ReferenceCache, texts: list[str], encode) -> Units:
    """The units of the distinct ``texts`` through the cache, as a reward fetches them."""
    plan = cache.plan(texts)
    call = cache.units_call(plan, PairIndex(None, None, None))
    sent = call.to_device("cpu")
    with cache.undo_on_error(plan):
        units, _ = cache.gather_units(plan, sent.rows, call.where, encode)
    order = [plan.texts.index(t) for t in texts]
    return units.select(torch.tensor(order))


def test_plan_counts_hits_and_misses_and_evicts_the_least_recently_used():
    cache, encode = ReferenceCache(2), Encoder()
    fetch(cache, ["a", "bb"], encode)
    fetch(cache, ["a"], encode)  # "a" is now the most recent
    plan = cache.plan(["ccc"])
    assert (plan.cached, plan.missing, plan.evicted) == ([], ["ccc"], ["bb"])
    assert list(cache.lru) == ["a", "ccc"] and sorted(cache.lru.values()) == [0, 1]  # the freed slot reused
    info = cache.info()
    assert (info.hits, info.misses, info.maxsize, info.currsize) == (1, 3, 2, 2)


def test_gathered_units_equal_the_encoded_ones_and_are_encoded_once():
    cache, encode = ReferenceCache(8), Encoder()
    texts = ["a cat", "dog", "a cat sat on"]
    first = fetch(cache, texts, encode)
    again = fetch(cache, texts[::-1], encode)
    assert encode.seen == texts  # the second call gathered everything
    expected, _ = fake_units(texts)
    for got in (first, again.select(torch.tensor([2, 1, 0]))):
        assert torch.equal(got.vectors[got.mask], expected.vectors[expected.mask])


def test_size_zero_keeps_nothing():
    cache, encode = ReferenceCache(0), Encoder()
    fetch(cache, ["a", "b"], encode)
    fetch(cache, ["a", "b"], encode)
    assert encode.seen == ["a", "b", "a", "b"] and cache.info().currsize == 0


def test_a_failed_call_leaves_the_cache_as_before():
    cache, encode = ReferenceCache(2), Encoder()
    fetch(cache, ["a", "b"], encode)

    def fail(texts):
        raise MemoryError("out of memory in the encoder")
    with pytest.raises(MemoryError):
        fetch(cache, ["c"], fail)
    assert "c" not in cache.lru and "a" not in cache.lru and "b" in cache.lru  # "a" was evicted for "c"
    assert torch.equal(fetch(cache, ["b"], encode).vectors, fake_units(["b"])[0].vectors)
    assert encode.seen == ["a", "b"]  # "b" is still cached, intact


def test_check_empties_the_cache_on_a_new_fingerprint_and_counts_it():
    cache, encode = ReferenceCache(4), Encoder()
    cache.check(("weights", 1))
    fetch(cache, ["a"], encode)
    cache.check(("weights", 1))
    assert cache.info().currsize == 1 and cache.info().invalidations == 0
    cache.check(("weights", 2))
    assert cache.info().currsize == 0 and cache.info().invalidations == 1


def test_self_terms_are_computed_once_and_dropped_with_the_centering():
    cache, encode = ReferenceCache(4), Encoder()
    computed: list[int] = []

    def compute(units):
        computed.append(units.mask.shape[0])
        return units.vectors[..., 0].sum(-1)

    def self_terms(texts):
        plan = cache.plan(texts)
        call = cache.units_call(plan, PairIndex(None, None, None))
        sent = call.to_device("cpu")
        units, _ = cache.gather_units(plan, sent.rows, call.where, encode)
        return cache.self_terms(plan.texts, units, sent.self_terms, compute), plan.texts

    cache.check_centering(("mean", 0))
    first, texts = self_terms(["ab", "c"])
    second, texts2 = self_terms(["c", "ab", "d"])
    assert computed == [2, 1]  # only "d" was new
    expected = {t: v for t, v in zip(texts, first.tolist())}
    assert [expected.get(t) for t in texts2[:2]] == second.tolist()[:2]
    cache.check_centering(("mean", 1))  # a new mean: every self-term again
    self_terms(["ab"])
    assert computed == [2, 1, 1]


def test_clouds_stored_then_gathered_per_pair():
    cache, encode = ReferenceCache(4), Encoder()
    texts = ["abc", "de"]
    plan = cache.plan(texts)
    call = cache.units_call(plan, PairIndex(None, None, None))
    sent = call.to_device("cpu")
    units, spans = cache.gather_units(plan, sent.rows, call.where, encode)
    clouds = token_cloud(units.vectors, units.mask, nonempty=True, finite_padding=True)
    cache.store_clouds(plan.texts, clouds, call.keep, sent.keep, spans)
    assert cache.has_clouds(texts) and not cache.has_clouds(texts + ["new"])
    pairs = PairIndex(None, [1, 0, 1], None)  # three pairs: their references
    gathered, self_terms = cache.gather_clouds(cache.cloud_call(plan.texts, pairs).to_device("cpu"))
    assert self_terms is None  # no self-term was stored
    for p, row in enumerate([1, 0, 1]):
        n = int(clouds.mask[row].sum())
        assert torch.equal(gathered.vectors[p, :n], clouds.vectors[row, :n])
        assert torch.equal(gathered.mass[p, :n], clouds.mass[row, :n]) and not gathered.mask[p, n:].any()


def test_pickles_as_its_size_and_counters():
    cache, encode = ReferenceCache(3), Encoder()
    fetch(cache, ["a", "b"], encode)
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.info() == cache.info()._replace(currsize=0) and len(copy.units) == 0
    fetch(copy, ["a"], encode)
    assert copy.info().misses == 3
