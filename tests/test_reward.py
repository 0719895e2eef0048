"""Rewards: self-critical and group baselines, batch independence, the reference cache, edge cases."""
from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder, Scorer
from torchmover.reward.rewards import GroupReward, MoverReward, SelfCriticalReward, group_advantages

REFS = ["the cat sat on the mat", "a dog barked in the house", "the quick brown fox jumps over the lazy dog",
        "she eats good food", "the sun is big and red"]
HYPS = ["the cat sat", "a dog ran in the city", "the brown fox", "he eats bad food", "the moon is small"]
ATOL = 1e-6


@pytest.fixture
def fixed_scorer(tiny_encoder):
    """A scorer centered on a fixed corpus mean (fitted on REFS)."""
    return Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)


@pytest.fixture
def reward(fixed_scorer):
    return MoverReward(fixed_scorer)


def record_encoded(scorer) -> list[str]:
    """Texts passed to the scorer's encoder from now on (patched on the instance)."""
    seen, forward = [], scorer.encoder.forward

    def spy(texts, **kwargs):
        seen.extend(texts)
        return forward(texts, **kwargs)

    scorer.encoder.forward = spy
    return seen


# --- the reward is the scorer's score ---------------------------------------------------------------

def test_reward_equals_scorer(fixed_scorer, reward):
    with torch.no_grad():
        expected = fixed_scorer(HYPS, REFS)
    torch.testing.assert_close(reward(HYPS, REFS), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("policy", [
    dict(idf=True, ngram=2),
    dict(subwords="first", stopwords="english", punctuation="drop", method="wmd"),
    dict(subwords="mean", idf=True, method="bertscore", direction="f1"),
])
def test_reward_equals_scorer_with_a_token_policy(tiny_encoder, policy):
    scorer = Scorer(tiny_encoder, centering="fixed", **policy)
    if scorer.config.idf:
        scorer.fit_idf(REFS, HYPS)
    scorer.fit_centering(REFS, progress=False)
    with torch.no_grad():
        expected = scorer(HYPS, REFS)
    torch.testing.assert_close(MoverReward(scorer)(HYPS, REFS), expected, atol=1e-5, rtol=0)


def test_multiple_references_pooled_like_scorer(fixed_scorer, reward):
    refs = [[REFS[i], REFS[(i + 1) % 5]] for i in range(5)]
    with torch.no_grad():
        expected = fixed_scorer(HYPS, refs)
    torch.testing.assert_close(reward(HYPS, refs), expected, atol=ATOL, rtol=0)
    singles = torch.stack([reward(HYPS, [g[k] for g in refs]) for k in range(2)])  # [2, B]
    torch.testing.assert_close(reward(HYPS, refs), singles.amax(0), atol=ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["none", "dimension", "sentence"])
def test_per_text_centerings_need_no_fit(tiny_encoder, mode):
    scorer = Scorer(tiny_encoder, centering=mode)
    with torch.no_grad():
        expected = scorer(HYPS, REFS)
    torch.testing.assert_close(MoverReward(scorer)(HYPS, REFS), expected, atol=ATOL, rtol=0)


def test_a_sentence_centered_bigram_reward_gives_a_text_spanned_by_its_one_bigram_0():
    """``sentence`` centering, ``ngram=2``: "a" (or "the") with its [CLS] has one bigram, the sum of its
    tokens centered on their own mean: 0, so its pairs score 0 as the scorer scores them, whichever
    side it is on — from the references' units encoded (first call) and cached (second; a reward
    keeps no clouds of n-grams). A reward fitted with a centering of its own (a corpus mean) moves
    that bigram as it is: no text is centered on its own mean."""
    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens="cls"),
                    centering="sentence", ngram=2)
    hyps, refs = ["a", "the cat sat", "a", "the cat sat"], [["the"], ["a dog"], ["the cat", "a dog"], ["the"]]
    zero = [True, False, True, True]
    with torch.no_grad():
        expected = scorer(hyps, refs)
    assert (expected == 0).tolist() == zero
    reward = MoverReward(scorer)
    for _ in range(2):
        torch.testing.assert_close(reward(hyps, refs), expected, atol=ATOL, rtol=0)
        assert (reward(hyps, refs) == 0).tolist() == zero
    reward.fit(REFS, centering="fixed")
    assert (reward(hyps, refs) != 0).all()


# --- centering policy -------------------------------------------------------------------------------

def test_batch_centering_raises_until_fitted(tiny_scorer):
    reward = MoverReward(tiny_scorer)
    with pytest.raises(RuntimeError, match="centering='batch'.*fit"):
        reward(HYPS, REFS)
    reward.fit(REFS)
    assert reward(HYPS, REFS).shape == (5,)
    assert tiny_scorer.config.centering == "batch" and tiny_scorer.centering.mode == "batch"  # untouched


def test_unfitted_fixed_centering_raises(tiny_encoder):
    with pytest.raises(RuntimeError, match="fit_centering"):
        MoverReward(Scorer(tiny_encoder, centering="fixed"))(HYPS, REFS)


def test_fit_matches_scorer_fit_centering(tiny_encoder, fixed_scorer):
    reward = MoverReward(Scorer(tiny_encoder)).fit(REFS, batch_size=2)
    torch.testing.assert_close(reward.centering.mean, fixed_scorer.centering.mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(reward(HYPS, REFS), MoverReward(fixed_scorer)(HYPS, REFS), atol=ATOL, rtol=0)
    center = [f for f in reward.signature.split("|") if f.startswith("center:")]
    assert center[0].startswith("center:fixed-") and "center:batch" in reward.scorer.signature


def test_fit_counts_each_distinct_text_once(tiny_encoder):
    """Repeated texts, and texts equal up to outer whitespace, are one text of the corpus mean."""
    repeated = [REFS[0], REFS[0], f" {REFS[1]}\t", *REFS[1:], REFS[2] + " ", REFS[2]]
    fitted = MoverReward(Scorer(tiny_encoder)).fit(repeated, batch_size=2)
    distinct = MoverReward(Scorer(tiny_encoder)).fit(REFS, batch_size=2)
    torch.testing.assert_close(fitted.centering.mean, distinct.centering.mean, atol=1e-7, rtol=0)
    torch.testing.assert_close(fitted(HYPS, REFS), distinct(HYPS, REFS), atol=ATOL, rtol=0)


def test_fit_validates(tiny_scorer):
    with pytest.raises(ValueError, match="texts is empty"):
        MoverReward(tiny_scorer).fit([])
    with pytest.raises(ValueError, match="batch_size"):
        MoverReward(tiny_scorer).fit(REFS, batch_size=0)


# --- batch independence ------------------------------------------------------------------------------

def test_reward_independent_of_batch_partners(reward):
    alone = torch.stack([reward([h], [r])[0] for h, r in zip(HYPS, REFS)])  # [5]
    together = reward(HYPS, REFS)
    order = [3, 0, 4, 1, 2]
    shuffled = reward([HYPS[i] for i in order], [REFS[i] for i in order])
    extra = reward(HYPS + ["the quick brown fox jumps over the lazy dog " * 3, ""], REFS + ["a", "b"])[:5]
    torch.testing.assert_close(together, alone, atol=ATOL, rtol=0)
    torch.testing.assert_close(shuffled, alone[order], atol=ATOL, rtol=0)
    torch.testing.assert_close(extra, alone, atol=ATOL, rtol=0)


def test_self_critical_sampled_independent_of_greedy(fixed_scorer):
    reward = SelfCriticalReward(fixed_scorer)
    out1 = reward(HYPS, ["the"] * 5, REFS)
    out2 = reward(HYPS, list(reversed(REFS)), REFS)
    out3 = reward(HYPS[:2], HYPS[2:4], REFS[:2])
    torch.testing.assert_close(out1.sampled, out2.sampled, atol=ATOL, rtol=0)
    torch.testing.assert_close(out3.sampled, out1.sampled[:2], atol=ATOL, rtol=0)


def test_group_rewards_independent_of_other_groups(fixed_scorer):
    reward = GroupReward(fixed_scorer)
    groups = [[HYPS[0], HYPS[1], "the cat"], [HYPS[2], HYPS[3], "a fox"]]
    both = reward(groups, REFS[:2]).rewards
    first = reward(groups[:1], REFS[:1]).rewards
    swapped = reward([groups[1], groups[0]], [REFS[1], REFS[0]]).rewards
    torch.testing.assert_close(both[:1], first, atol=ATOL, rtol=0)
    torch.testing.assert_close(both, swapped.flip(0), atol=ATOL, rtol=0)


# --- self-critical -----------------------------------------------------------------------------------

def test_self_critical_advantage(reward, fixed_scorer):
    greedy = ["the cat sat", "a dog", "the lazy dog", "she eats food", "the sun"]
    out = SelfCriticalReward(fixed_scorer)(HYPS, greedy, REFS)
    torch.testing.assert_close(out.sampled, reward(HYPS, REFS), atol=ATOL, rtol=0)
    torch.testing.assert_close(out.greedy, reward(greedy, REFS), atol=ATOL, rtol=0)
    assert torch.equal(out.advantage, out.sampled - out.greedy)
    assert out.advantage[0] == 0  # same text: exactly no advantage


def test_self_critical_several_references(fixed_scorer):
    refs = [[r, "the dog"] for r in REFS]
    out = SelfCriticalReward(fixed_scorer)(HYPS, HYPS[::-1], refs)
    assert out.advantage.shape == (5,) and out.advantage[2] == 0


def test_self_critical_validates(fixed_scorer):
    reward = SelfCriticalReward(fixed_scorer)
    with pytest.raises(ValueError, match="same length"):
        reward(HYPS, HYPS[:2], REFS)
    with pytest.raises(ValueError, match="hyps and refs"):
        reward(HYPS, HYPS, REFS[:2])
    with pytest.raises(TypeError, match="greedy"):
        reward(HYPS, "a text", REFS)


# --- no graph, modes ---------------------------------------------------------------------------------

def test_no_graph_and_grad_mode_restored(fixed_scorer):
    reward = SelfCriticalReward(fixed_scorer)
    assert all(p.requires_grad for p in fixed_scorer.parameters())
    with torch.enable_grad():
        out = reward(HYPS, REFS, REFS)
        assert torch.is_grad_enabled()
    assert not any(t.requires_grad or t.grad_fn is not None for t in out)
    with torch.no_grad():
        reward(HYPS, REFS, REFS)
        assert not torch.is_grad_enabled()
    # usable as a constant in a policy-gradient loss (not an inference tensor)
    logp = torch.zeros(5, requires_grad=True)
    (-(out.advantage * logp).sum()).backward()
    torch.testing.assert_close(logp.grad, -out.advantage)


def test_eval_mode_for_the_call_then_restored(fixed_scorer):
    reward = MoverReward(fixed_scorer)
    seen = []
    fixed_scorer.encoder.model.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    fixed_scorer.train()
    fixed_scorer.centering.eval()  # mixed modes must come back as they were
    first = reward(HYPS, REFS)
    reward.clear_cache()
    second = reward(HYPS, REFS)  # dropout off: deterministic
    assert seen and not any(seen)
    assert fixed_scorer.training and fixed_scorer.encoder.training and not fixed_scorer.centering.training
    assert torch.equal(first, second)


# --- group rewards -----------------------------------------------------------------------------------

GROUPS = [["the cat sat", "a cat", "the mat", "dog"], ["a dog barked", "the dog", "", "a dog barked"]]


def test_group_rewards_match_flat_scores(reward, fixed_scorer):
    out = GroupReward(fixed_scorer)(GROUPS, REFS[:2])
    flat = reward([c for g in GROUPS for c in g], [REFS[i] for i in range(2) for _ in range(4)])
    assert out.rewards.shape == (2, 4)
    torch.testing.assert_close(out.rewards.flatten(), flat, atol=ATOL, rtol=0)
    assert out.rewards[1, 2] == 0  # empty completion


def test_group_baselines_against_naive_loops(fixed_scorer):
    mean = GroupReward(fixed_scorer)(GROUPS, REFS[:2])
    loo = GroupReward(fixed_scorer, baseline="leave_one_out")(GROUPS, REFS[:2])
    r = mean.rewards.double()
    torch.testing.assert_close(mean.advantages.sum(1), torch.zeros(2), atol=1e-6, rtol=0)
    for n in range(2):
        for g in range(4):
            others = [r[n, k] for k in range(4) if k != g]
            torch.testing.assert_close(loo.baseline[n, g].double(), sum(others) / 3, atol=1e-6, rtol=0)
            torch.testing.assert_close(mean.baseline[n, g].double(), r[n].sum() / 4, atol=1e-6, rtol=0)
    # RLOO = GRPO's advantage scaled by G / (G - 1)
    torch.testing.assert_close(loo.advantages, mean.advantages * 4 / 3, atol=1e-6, rtol=0)


def test_group_std_normalisation(fixed_scorer):
    out = GroupReward(fixed_scorer, normalize_std=True, eps=1e-4)(GROUPS, REFS[:2])
    r = out.rewards
    expected = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    torch.testing.assert_close(out.advantages, expected)
    plain = GroupReward(fixed_scorer)(GROUPS, REFS[:2])
    torch.testing.assert_close(plain.advantages, r - r.mean(1, keepdim=True))  # off by default


def test_group_advantages_edge_cases():
    single = group_advantages(torch.tensor([[0.3], [0.5]]), normalize_std=True)
    assert torch.equal(single.advantages, torch.zeros(2, 1))
    same = group_advantages(torch.full((1, 3), 0.7), "leave_one_out", normalize_std=True)
    assert torch.equal(same.advantages, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="leave_one_out"):
        group_advantages(torch.ones(2, 1), "leave_one_out")
    with pytest.raises(ValueError, match="baseline"):
        group_advantages(torch.ones(2, 2), "median")


def test_group_validates(fixed_scorer):
    with pytest.raises(ValueError, match="same number"):
        GroupReward(fixed_scorer)([["a", "b"], ["c"]], REFS[:2])
    with pytest.raises(ValueError, match="G=1"):
        GroupReward(fixed_scorer, baseline="leave_one_out")([["a"], ["c"]], REFS[:2])
    with pytest.raises(ValueError, match="baseline"):
        GroupReward(fixed_scorer, baseline="max")
    with pytest.raises(TypeError, match="completions"):
        GroupReward(fixed_scorer)("a b", REFS[:1])


def test_group_encodes_each_reference_once(fixed_scorer):
    reward = GroupReward(fixed_scorer)
    encoded = record_encoded(fixed_scorer)
    reward(GROUPS, [[REFS[0], REFS[2]], REFS[1]])
    reward(GROUPS[::-1], [REFS[1], REFS[0]])  # next epoch: references from the cache
    assert [encoded.count(r) for r in REFS[:3]] == [1, 1, 1]
    assert reward.cache_info().misses == 3 and reward.cache_info().hits == 2


# --- the reference cache -----------------------------------------------------------------------------

def test_cache_does_not_change_results(fixed_scorer):
    cached, uncached = MoverReward(fixed_scorer), MoverReward(fixed_scorer, cache_size=0)
    first = cached(HYPS, REFS)
    assert cached.cache_info().misses == 5 and cached.cache_info().hits == 0
    again = cached(HYPS, REFS)
    assert cached.cache_info().hits == 5 and cached.cache_info().currsize == 5
    assert torch.equal(first, again) and torch.equal(first, uncached(HYPS, REFS))
    assert uncached.cache_info().currsize == 0 and uncached.cache_info().misses == 5


@pytest.mark.parametrize("options", [dict(method="twmd", direction="f1"), dict(method="trwmd"), dict(method="cka"),
                                     dict(method="moverscore"), dict(idf=True, ngram=2)], ids=str)
def test_cached_references_give_the_uncached_rewards(tiny_encoder, options):
    scorer = Scorer(tiny_encoder, centering="fixed", **options)
    if scorer.config.idf:
        scorer.fit_idf(REFS, HYPS)
    scorer.fit_centering(REFS, progress=False)
    cached, uncached = MoverReward(scorer), MoverReward(scorer, cache_size=0)
    cached(HYPS[:2], REFS[:2])
    mixed = cached(HYPS[::-1], REFS[::-1])  # two references (and their self-terms) from the cache
    torch.testing.assert_close(mixed, uncached(HYPS[::-1], REFS[::-1]), atol=ATOL, rtol=0)


def record_reference_clouds(scorer) -> list[int]:
    """How many texts each call of ``scorer.token_clouds`` for the references gets from now on."""
    sizes, method = [], scorer.token_clouds

    def spy(units, side, *args, **kwargs):
        if side == "ref":
            sizes.append(units.mask.shape[0])
        return method(units, side, *args, **kwargs)

    scorer.token_clouds = spy
    return sizes


@pytest.mark.parametrize("options", [{}, dict(direction="f1"), dict(method="trwmd"), dict(method="bertscore"),
                                     dict(method="cka"), dict(multi_ref="mean")], ids=str)
def test_cached_reference_clouds_give_the_uncached_rewards(tiny_encoder, options):
    """After a call, its references' clouds are cached: a call with only those references makes no
    reference cloud (no centering, no normalising), gathers the references' clouds and self-terms, and
    gives the uncached rewards to the bit."""
    scorer = Scorer(tiny_encoder, centering="fixed", **options).fit_centering(REFS, progress=False)
    groups = [[REFS[0]], [REFS[1]], [REFS[2], REFS[0]], [REFS[3]], [REFS[4]]]  # several for one hypothesis
    partial_refs = [REFS[0], "a new reference"]
    uncached = MoverReward(scorer, cache_size=0)
    expected, expected_partly = uncached(HYPS, groups), uncached(HYPS[:2], partial_refs)
    cached = MoverReward(scorer)
    first = cached(HYPS, groups)
    assert cached.cache.known_clouds == set(REFS)
    clouds = record_reference_clouds(scorer)
    again, reversed_ = cached(HYPS, groups), cached(HYPS[::-1], groups[::-1])
    assert clouds == []  # the clouds were gathered
    assert torch.equal(again, first) and torch.equal(first, expected)
    torch.testing.assert_close(reversed_, first.flip(0), atol=ATOL, rtol=0)
    partly = cached(HYPS[:2], partial_refs)  # one cloud to make: the units path
    assert clouds == [2] and torch.equal(partly, expected_partly)


def test_reference_clouds_are_not_kept_where_they_need_the_empty_text_placeholder(tiny_encoder, fixed_scorer):
    """IDF weights (a text of zero weights is empty, which only the device knows), an empty reference in
    the call, or a sentence mover (it moves units): the references' units are used every time."""
    idf = Scorer(tiny_encoder, centering="fixed", idf=True).fit_idf(REFS, HYPS).fit_centering(REFS, progress=False)
    with_empty = REFS[:4] + [" "]
    sentences = Scorer(tiny_encoder, method="sms", centering="none")
    for scorer, refs in ((idf, REFS), (fixed_scorer, with_empty), (sentences, REFS)):
        reward = MoverReward(scorer)
        first = reward(HYPS, refs)
        assert not reward.cache.known_clouds and torch.equal(reward(HYPS, refs), first)
        assert torch.equal(first, MoverReward(scorer, cache_size=0)(HYPS, refs))


CACHED_OPTIONS = [{}, dict(direction="f1"), dict(method="trwmd"), dict(method="bertscore"), dict(multi_ref="mean")]


@functools.cache
def fitted_scorer(option: int) -> Scorer:
    """A scorer of ``CACHED_OPTIONS[option]`` on one tiny encoder, centered on REFS (built once)."""
    encoder = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert")
    return Scorer(encoder, centering="fixed", **CACHED_OPTIONS[option]).fit_centering(REFS, progress=False)


pair = st.tuples(st.sampled_from(HYPS + [""]),
                 st.lists(st.sampled_from(REFS + [" ", "the cat", "a new reference"]), min_size=1, max_size=2))


@given(option=st.integers(0, len(CACHED_OPTIONS) - 1), cache_size=st.integers(1, 4),
       calls=st.lists(st.lists(pair, min_size=1, max_size=4), min_size=1, max_size=5))
def test_a_cached_reward_is_each_pairs_own_through_any_sequence_of_calls(option, cache_size, calls):
    """Generated sequences of calls through a small cache (hits, misses, evictions, references whose
    clouds are kept or not, empty texts, one or two references a hypothesis): every reward is the one
    its pair gets alone, uncached, to float32 rounding; the cache holds the ``cache_size`` references
    used last (a call's own in order of appearance, the ones it found first), each with its units, in
    its own self-term slot, and a cloud or self-term only of a reference it holds."""
    scorer = fitted_scorer(option)
    cached, alone = MoverReward(scorer, cache_size=cache_size), MoverReward(scorer, cache_size=0)
    used = {}  # the references least recently used first
    for call in calls:
        hyps, groups = [h for h, _ in call], [g for _, g in call]
        expected = torch.cat([alone([h], [g]) for h, g in call])
        torch.testing.assert_close(cached(hyps, groups), expected, atol=ATOL, rtol=0)
        refs = list(dict.fromkeys(r.strip() for g in groups for r in g))  # a reference is known stripped
        for ref in [r for r in refs if r in used] + [r for r in refs if r not in used]:
            used.pop(ref, None)
            used[ref] = None
        used = dict.fromkeys(list(used)[-cache_size:])
        cache = cached.cache
        assert list(cache.lru) == list(used) and set(cache.units.spans) == set(used)
        assert sorted(cache.lru.values()) == sorted(set(cache.lru.values())) and set(cache.lru.values()) <= set(
            range(cache_size))
        assert cache.known_self_terms <= set(used) and set(cache.clouds.spans) == cache.known_clouds <= set(used)


def test_evicted_references_lose_their_clouds(fixed_scorer):
    reward, uncached = MoverReward(fixed_scorer, cache_size=2), MoverReward(fixed_scorer, cache_size=0)
    for ref in (REFS[0], REFS[1], REFS[0], REFS[2], REFS[1], REFS[2], REFS[0]):
        assert torch.equal(reward(HYPS[:2], [ref, ref]), uncached(HYPS[:2], [ref, ref]))
        assert reward.cache.known_clouds == set(reward.cache.lru) and len(reward.cache.clouds) == len(reward.cache.lru)


def record_self_terms(scorer) -> list[int]:
    """How many texts each call of ``scorer.self_similarities`` gets from now on."""
    sizes, method = [], scorer.self_similarities

    def spy(units, *args, **kwargs):
        sizes.append(units.mask.shape[0])
        return method(units, *args, **kwargs)

    scorer.self_similarities = spy
    return sizes


def test_reference_self_terms_computed_once(fixed_scorer):
    """C(ref, ref) is cached with the reference: computed for new references only."""
    reward = GroupReward(fixed_scorer)
    sizes = record_self_terms(fixed_scorer)
    reward(GROUPS, [[REFS[0], REFS[2]], REFS[1]])
    reward(GROUPS[::-1], [REFS[3], REFS[0]])
    reward(GROUPS, [REFS[1], REFS[3]])
    assert sizes == [3, 1]


@pytest.mark.parametrize("refit", ["scorer", "reward"])
def test_new_centering_mean_recomputes_self_terms(fixed_scorer, refit):
    reward = MoverReward(fixed_scorer)
    reward(HYPS, REFS)
    if refit == "scorer":
        fixed_scorer.fit_centering(HYPS, progress=False)
        expected = MoverReward(fixed_scorer, cache_size=0)(HYPS, REFS)
    else:
        reward.fit(HYPS)
        expected = MoverReward(fixed_scorer, cache_size=0).fit(HYPS)(HYPS, REFS)
    torch.testing.assert_close(reward(HYPS, REFS), expected, atol=ATOL, rtol=0)
    assert reward.cache_info().invalidations == 0  # the token vectors stay cached


def test_cache_invalidated_by_new_idf(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="fixed", idf=True).fit_idf(REFS, HYPS).fit_centering(REFS, progress=False)
    reward = MoverReward(scorer)
    reward(HYPS, REFS[::-1])
    scorer.fit_idf(HYPS, REFS)  # new dictionaries: the cached references' weights are stale
    torch.testing.assert_close(reward(HYPS, REFS[::-1]), MoverReward(scorer, cache_size=0)(HYPS, REFS[::-1]),
                               atol=ATOL, rtol=0)
    assert reward.cache_info().invalidations == 1


def test_cache_is_lru_and_bounded(fixed_scorer):
    reward = MoverReward(fixed_scorer, cache_size=2)
    encoded = record_encoded(fixed_scorer)
    for ref in (REFS[0], REFS[1], REFS[0], REFS[2], REFS[0], REFS[1]):
        reward(["the cat"], [ref])
    # REFS[1] was least recently used when REFS[2] arrived, so it is encoded twice; REFS[0] once.
    assert [encoded.count(r) for r in REFS[:3]] == [1, 2, 1]
    info = reward.cache_info()
    assert (info.hits, info.misses, info.currsize, info.maxsize) == (2, 4, 2, 2)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_cache_invalidated_by_optimizer_step(tiny_encoder, optimizer):
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)
    reward = MoverReward(scorer)
    before = reward(HYPS, REFS)
    opt = optimizer(scorer.parameters(), lr=1e-2)
    (-scorer(HYPS, REFS).sum()).backward()
    opt.step()
    after = reward(HYPS, REFS)
    assert reward.cache_info().invalidations == 1
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, MoverReward(scorer, cache_size=0)(HYPS, REFS), atol=0, rtol=0)


def test_cache_invalidated_by_load_state_dict_and_to(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)
    reward = MoverReward(scorer)
    before = reward(HYPS, REFS)
    state = {k: v.clone() for k, v in scorer.state_dict().items()}
    with torch.no_grad():
        scorer.encoder.model.embeddings.word_embeddings.weight.mul_(1.5)
    reward(HYPS, REFS)
    scorer.load_state_dict(state)
    assert torch.equal(reward(HYPS, REFS), before)
    assert reward.cache_info().invalidations == 2
    scorer.to(torch.float64)
    reward(HYPS, REFS)
    assert reward.cache_info().invalidations == 3


def test_clear_cache_for_writes_through_data(tiny_encoder):
    """``p.data`` writes bypass the version counter: the documented remedy is clear_cache()."""
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)
    reward = MoverReward(scorer)
    reward(HYPS, REFS)
    scorer.encoder.model.embeddings.word_embeddings.weight.data.mul_(1.5)
    reward.clear_cache()
    torch.testing.assert_close(reward(HYPS, REFS), MoverReward(scorer, cache_size=0)(HYPS, REFS), atol=0, rtol=0)


@pytest.mark.parametrize("cache_size", [1024, 1])
def test_cache_consistent_after_a_failed_call(fixed_scorer, cache_size):
    """An exception in the encoder (e.g. out of memory) leaves no half-cached reference behind."""
    reward = MoverReward(fixed_scorer, cache_size=cache_size)
    reward(HYPS[:1], REFS[:1])
    forward = fixed_scorer.encoder.forward
    fixed_scorer.encoder.forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        reward(HYPS[:2], REFS[1:3])
    fixed_scorer.encoder.forward = forward
    torch.testing.assert_close(reward(HYPS, REFS), MoverReward(fixed_scorer, cache_size=0)(HYPS, REFS),
                               atol=ATOL, rtol=0)


def test_cache_size_validated(fixed_scorer):
    with pytest.raises(ValueError, match="cache_size"):
        MoverReward(fixed_scorer, cache_size=-1)
    with pytest.raises(TypeError, match="scorer"):
        MoverReward("not a scorer")


# --- degenerate generations --------------------------------------------------------------------------

def test_degenerate_generations(reward, fixed_scorer):
    hyps = ["", "   ", "!!! ... ?", "the cat sat " * 10, "."]
    out = reward(hyps, REFS)
    assert torch.isfinite(out).all()
    assert out[0] == 0 and out[1] == 0
    with torch.no_grad():  # no implicit penalty: the repeated phrase gets its plain score
        torch.testing.assert_close(out[3], fixed_scorer(hyps[3:4], REFS[3:4])[0], atol=ATOL, rtol=0)
    assert torch.equal(reward(["", ""], REFS[:2]), torch.zeros(2))
    assert reward(["the cat"], [""])[0] == 0  # empty reference
    assert reward([], []).shape == (0,)


def test_explicit_shaping_hook(fixed_scorer):
    def length_penalty(hyps, scores):
        return scores - 0.01 * torch.tensor([len(h.split()) for h in hyps], dtype=scores.dtype)

    plain = MoverReward(fixed_scorer)(HYPS, REFS)
    shaped = MoverReward(fixed_scorer, shaping=length_penalty)(HYPS, REFS)
    torch.testing.assert_close(shaped, length_penalty(HYPS, plain))
    with pytest.raises(ValueError, match="shaping must return"):
        MoverReward(fixed_scorer, shaping=lambda h, s: s[:1])(HYPS, REFS)
    with pytest.raises(TypeError, match="shaping"):
        MoverReward(fixed_scorer, shaping=3)


def test_repr_and_signature(reward):
    assert "MoverReward(<twmd|model:tiny-bert" in repr(reward)
    assert reward.signature == reward.scorer.signature


# --- TRL adapter (contract only; tests/test_trl.py runs it in a real trainer) ------------------------

def test_trl_adapter_contract(fixed_scorer, reward):
    from torchmover.integrations.trl import TRLReward, as_trl_reward

    f = as_trl_reward(reward)
    assert isinstance(f, TRLReward) and not isinstance(f, torch.nn.Module)
    assert f.__name__ == "torchmover_twmd_recall"
    assert as_trl_reward(fixed_scorer, name="mover").__name__ == "mover"
    completions = [HYPS[0], [{"role": "assistant", "content": HYPS[1]}], HYPS[2], HYPS[3]]
    refs = [REFS[0], [REFS[1], REFS[2]], None, []]
    out = f(prompts=["p"] * 4, completions=completions, reference=refs, completion_ids=[[1]] * 4,
            trainer_state=None, log_extra=None, log_metric=None)
    assert out[2] is None and out[3] is None and all(isinstance(x, float) for x in out[:2])
    expected = reward([HYPS[0], HYPS[1]], [[REFS[0]], [REFS[1], REFS[2]]]).tolist()
    assert out[:2] == pytest.approx(expected, abs=ATOL)


def test_trl_adapter_parse_hook(reward):
    from torchmover.integrations.parsing import strip_reasoning
    from torchmover.integrations.trl import as_trl_reward

    f = as_trl_reward(reward, parse=strip_reasoning)
    completions = [f"<think>{REFS[1]}</think> {HYPS[0]}", [{"role": "assistant", "content": f"<think>x</think>{HYPS[1]}"}]]
    out = f(prompts=["p"] * 2, completions=completions, reference=REFS[:2])
    assert out == pytest.approx(reward(HYPS[:2], REFS[:2]).tolist(), abs=ATOL)
    assert "parse='strip_reasoning'" in repr(f)
    with pytest.raises(TypeError, match=r"parse must return a str, got int for completions\[0\]"):
        as_trl_reward(reward, parse=len)(prompts=["p"], completions=["a"], reference=["b"])
    with pytest.raises(TypeError, match="parse must be a callable"):
        as_trl_reward(reward, parse="strip")


# --- threads and pickling ---------------------------------------------------------------------------

def test_concurrent_calls_with_a_small_cache_equal_single_threaded(fixed_scorer):
    import random
    from concurrent.futures import ThreadPoolExecutor

    reward = MoverReward(fixed_scorer, cache_size=2)
    calls = [[(HYPS[(i + j) % 5], REFS[(i * 3 + j) % 5]) for j in range(1 + i % 3)] for i in range(32)]
    random.Random(0).shuffle(calls)
    want = [reward.score([h for h, _ in c], [r for _, r in c]) for c in calls]
    reward.clear_cache()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda c: reward.score([h for h, _ in c], [r for _, r in c]), calls))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
    info = reward.cache_info()
    assert info.currsize <= 2 and info.hits + info.misses == 2 * sum(len({r for _, r in c}) for c in calls)


@pytest.mark.parametrize("cls", [MoverReward, SelfCriticalReward, GroupReward])
def test_fitted_reward_pickles_after_a_forward_pass(tiny_scorer, cls):
    import pickle

    reward = cls(tiny_scorer, cache_size=8).fit(REFS)
    before = reward.score(HYPS, REFS)  # a forward pass: transformers has installed its hooks
    copy = pickle.loads(pickle.dumps(reward))
    assert type(copy) is cls and copy.cache_info().currsize == 0 and copy.signature == reward.signature
    torch.testing.assert_close(copy.score(HYPS, REFS), before, atol=ATOL, rtol=0)
    torch.testing.assert_close(reward.score(HYPS, REFS), before, atol=ATOL, rtol=0)  # the original still scores
    assert copy.cache_info().currsize == 5  # the copy refills its own cache


@pytest.mark.parametrize("options", [dict(method="twmd", centering="none"), dict(method="twmd", centering="dimension"),
                                     dict(method="trwmd", centering="none"), dict(method="bertscore", centering="none")])
def test_identical_pairs_never_score_above_one(tiny_encoder, options):
    """Sim(X, X) = 1 on every path, to float rounding (no clamp): the references' self-terms cached by
    calls with two references each (other padding, other sums) round a few ulp away from the cross
    term of an identical pair (1.0000001), and bertscore's cosine of a unit vector with itself above 1;
    never by more than 1e-6."""
    from conftest import WORDS
    from torchmover.reward.batching import BatchedReward

    scorer = Scorer(tiny_encoder, **options)
    reward = MoverReward(scorer)
    for i in range(0, len(WORDS), 2):  # the reproduction: r.score(["", ""], ["a", "b"])
        reward.score(["", ""], WORDS[i:i + 2])
    with BatchedReward(MoverReward(scorer), max_wait_ms=0) as batched:
        paths = {"reward, cached self-terms": torch.tensor([reward.score([w], [w]).item() for w in WORDS]),
                 "batcher": torch.tensor([batched.score_one(w, w) for w in WORDS]),
                 "Scorer.score": scorer.score(WORDS, WORDS, progress=False), "Scorer.forward": scorer(WORDS, WORDS)}
    for path, scores in paths.items():
        torch.testing.assert_close(scores, torch.ones_like(scores), atol=1e-6, rtol=0, msg=path)
