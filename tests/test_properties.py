"""The family's contracts, on every path: hypothesis-generated token clouds and texts, and a grid of
empty texts.

Contracts (module docs of :mod:`torchmover.functional.family`): finite values and gradients; the
proved bounds, on the unclamped scores (``|C(X1, X2)| <= 1`` for every token member, so
``|Sim| <= 1 / sqrt(C(X1, X1) C(X2, X2))``, and ``|Sim| <= 1`` where the bound is 1); F1 between P
and R; a pair with an empty text scores exactly 0; scores invariant under permutations of a text's
tokens and of the batch's pairs; ``Sim(X, X) = 1``; a pair's score independent of its batch-mates for
the members that do not iterate to a tolerance. Every tolerance below is float64 rounding, except
MoverScore's ``Sim(X, X)`` (an entropic plan at ``T = 1e-3``).
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import assume, given, strategies as st

import torchmover.functional as F
from torchmover.functional.family import family_similarity, pair_similarity, self_similarity, signed_f1, token_cloud
from torchmover.functional.members import get_member, member_term
from torchmover.functional.sentences import VARIANTS

from conftest import WORDS, tiny_model, tiny_tokenizer

ROUNDING = 1e-6
DIRECTED = {"twmd": (0.1, 1), "twmd-2": (0.5, 2), "twmd-converged": (0.1, None), "trwmd": (0.15, None),
            "bertscore": (None, None)}
UNDIRECTED = {"wmd": (None, None), "moverscore": (None, None), "sbert": (None, None), "cka": (None, None)}
BOUNDED_BY_ONE = ("bertscore", "moverscore", "sbert", "cka")  # |Sim| <= 1 itself (module docs)
ITERATING = ("twmd-converged", "wmd", "moverscore")  # solved to a tolerance: batch independence is transport's test
CENTERINGS = ("none", "batch", "sentence", "dimension")


def method_of(name: str) -> str:
    return name.split("-")[0]


def term_of(name: str):
    temperature, n_iter = {**DIRECTED, **UNDIRECTED}[name]
    return member_term(method_of(name), temperature, n_iter)


def similarity(name, direction, hyp, ref, hm, rm, hw=None, rw=None, normalize=None):
    normalize = get_member(method_of(name)).normalized if normalize is None else normalize
    return family_similarity(term_of(name), hyp, ref, hm, rm, hyp_weights=hw, ref_weights=rw,
                             normalize=normalize, direction=direction)


@st.composite
def token_clouds(draw):
    """A batch of pairs of float64 token clouds: random lengths (0 = an empty text), repeated
    tokens, optional weights (some 0), centered by one of the :func:`F.center` modes."""
    b, l1, l2, d = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(2, 8))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31 - 1)))
    ref = torch.randn(b, l1, d, generator=g, dtype=torch.float64)
    hyp = torch.randn(b, l2, d, generator=g, dtype=torch.float64)
    if draw(st.booleans()):  # repeated tokens, within a text and across the pair
        ref[:, -1] = ref[:, 0]
        hyp[:, 0] = ref[:, 0]
    rm = torch.arange(l1) < torch.tensor(draw(st.lists(st.integers(0, l1), min_size=b, max_size=b)))[:, None]
    hm = torch.arange(l2) < torch.tensor(draw(st.lists(st.integers(0, l2), min_size=b, max_size=b)))[:, None]
    weighted = draw(st.booleans())
    rw = torch.rand(b, l1, generator=g, dtype=torch.float64).mul(3).floor() if weighted else None  # 0, 1 or 2
    hw = torch.rand(b, l2, generator=g, dtype=torch.float64).mul(3).floor() if weighted else None
    centering = draw(st.sampled_from(CENTERINGS))
    if centering == "batch":  # both sides on one mean, as the Scorer centers
        mean = torch.cat([ref[rm], hyp[hm], ref.new_zeros(1, d)]).sum(0) / max(int(rm.sum() + hm.sum()), 1)
        ref, hyp = F.center(ref, rm, "fixed", mean), F.center(hyp, hm, "fixed", mean)
    else:
        ref, hyp = F.center(ref, rm, centering), F.center(hyp, hm, centering)
    return hyp, ref, hm, rm, hw, rw


def is_empty(mask, weights):
    kept = mask if weights is None else mask & (weights > 0)
    return ~kept.any(-1)


def check_member_on_clouds(name, direction, hyp, ref, hm, rm, hw, rw):
    """Every contract of one member and direction on one batch of clouds; returns the scores."""
    h, r = hyp.clone().requires_grad_(), ref.clone().requires_grad_()
    score = similarity(name, direction, h, r, hm, rm, hw, rw)
    assert torch.isfinite(score).all(), score
    score.sum().backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(r.grad).all()
    score = score.detach()

    empty = is_empty(hm, hw) | is_empty(rm, rw)
    assert (score[empty] == 0).all(), score

    raw = similarity(name, direction, hyp, ref, hm, rm, hw, rw, normalize=False)
    assert (raw.abs() <= 1 + ROUNDING).all(), raw  # a plan of total mass 1 over cosines (module docs)
    term = term_of(name)
    if method_of(name) in BOUNDED_BY_ONE:
        assert (score.abs() <= 1 + ROUNDING).all(), score
    else:  # Sim = C(X1, X2) / sqrt(C(X1, X1) C(X2, X2)), unclamped
        selfs = [self_similarity(term, token_cloud(x, m, w), direction) for x, m, w in ((hyp, hm, hw), (ref, rm, rw))]
        bound = (1 + ROUNDING) * (selfs[0] * selfs[1]).clamp_min(0).rsqrt()
        assert (score.abs()[~empty] <= bound[~empty]).all(), (score, bound)

    # permutations: of each text's tokens, and of the batch's pairs
    g = torch.Generator().manual_seed(1)
    pr, ph, pb = (torch.randperm(n, generator=g) for n in (ref.shape[1], hyp.shape[1], ref.shape[0]))
    permuted = similarity(name, direction, hyp[:, ph], ref[:, pr], hm[:, ph], rm[:, pr],
                          None if hw is None else hw[:, ph], None if rw is None else rw[:, pr])
    torch.testing.assert_close(permuted, score, atol=ROUNDING, rtol=0)
    shuffled = similarity(name, direction, hyp[pb], ref[pb], hm[pb], rm[pb],
                          None if hw is None else hw[pb], None if rw is None else rw[pb])
    torch.testing.assert_close(shuffled, score[pb], atol=ROUNDING, rtol=0)

    if name not in ITERATING:  # each pair alone, padded to its own length
        for i in range(ref.shape[0]):
            alone = similarity(name, direction, hyp[i:i + 1], ref[i:i + 1], hm[i:i + 1], rm[i:i + 1],
                               None if hw is None else hw[i:i + 1], None if rw is None else rw[i:i + 1])
            torch.testing.assert_close(alone, score[i:i + 1], atol=ROUNDING, rtol=0)

    # Sim(X, X) = 1: each reference against itself, with the same masses on both sides, unless C(X, X) = 0
    own = similarity(name, direction, ref, ref, rm, rm, rw, rw)
    assert (own[is_empty(rm, rw)] == 0).all()
    zero_vector = (ref.norm(dim=-1) == 0) & rm  # e.g. a one-token text centered on its own mean
    regular = ~is_empty(rm, rw) & ~zero_vector.any(-1)
    if get_member(method_of(name)).normalized:
        regular &= self_similarity(term, token_cloud(ref, rm, rw), direction) > 1e-8
    torch.testing.assert_close(own[regular], torch.ones_like(own[regular]),
                               atol=2e-3 if name == "moverscore" else ROUNDING, rtol=0)
    return score


@pytest.mark.parametrize("name", [*DIRECTED, *UNDIRECTED])
@given(clouds=token_clouds())
def test_token_members_keep_every_contract_on_random_clouds(name, clouds):
    """Finite values and gradients, the bounds (unclamped), emptiness, permutation invariance, batch
    independence (members that do not iterate to a tolerance), ``Sim(X, X) = 1``; and for the directed
    members, F1 between precision and recall."""
    if name in UNDIRECTED:
        check_member_on_clouds(name, "recall", *clouds)
        return
    p, r, f = (check_member_on_clouds(name, d, *clouds) for d in ("precision", "recall", "f1"))
    assert ((f >= torch.minimum(p, r) - ROUNDING) & (f <= torch.maximum(p, r) + ROUNDING)).all(), (p, r, f)


@given(clouds=token_clouds(), variant=st.sampled_from(VARIANTS), temperature=st.sampled_from([None, 0.1]))
def test_sentence_movers_keep_their_contracts_on_random_clouds(clouds, variant, temperature):
    hyp, ref, hm, rm, _, _ = clouds
    ids_h = torch.arange(hyp.shape[1]).div(2, rounding_mode="floor").expand(hm.shape)
    ids_r = torch.arange(ref.shape[1]).div(2, rounding_mode="floor").expand(rm.shape)
    h, r = hyp.clone().requires_grad_(), ref.clone().requires_grad_()
    score = F.sentence_movers(h, r, hm, rm, ids_h, ids_r, variant=variant, temperature=temperature, n_iter=2)
    assert torch.isfinite(score).all()
    score.sum().backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(r.grad).all()
    assert ((score >= 0) & (score <= 1 + ROUNDING)).all(), score  # exp(−distance), distance >= 0
    empty = ~hm.any(-1) | ~rm.any(-1)
    assert (score[empty] == 0).all()
    pb = torch.randperm(ref.shape[0], generator=torch.Generator().manual_seed(1))
    shuffled = F.sentence_movers(hyp[pb], ref[pb], hm[pb], rm[pb], ids_h[pb], ids_r[pb], variant=variant,
                                 temperature=temperature, n_iter=2)
    torch.testing.assert_close(shuffled, score.detach()[pb], atol=ROUNDING, rtol=0)


# --- F1 ---------------------------------------------------------------------------------------------

# scores: 0, or of a magnitude where 2PR does not underflow (signed_f1's docs)
finite = st.floats(-1.0, 1.0, allow_nan=False, width=64).filter(lambda v: v == 0 or abs(v) >= 1e-150)


@given(p=finite, r=finite)
def test_signed_f1_lies_between_p_and_r_with_a_bounded_gradient(p, r):
    pt = torch.tensor(p, dtype=torch.float64, requires_grad=True)
    rt = torch.tensor(r, dtype=torch.float64, requires_grad=True)
    f = signed_f1(pt, rt)
    ulp = 2 * math.ulp(max(abs(p), abs(r)))  # 2PR / (P + R) at P = R rounds
    assert min(p, r) - ulp <= f.item() <= max(p, r) + ulp
    f.backward()
    assert abs(pt.grad.item()) <= 2 and abs(rt.grad.item()) <= 2
    if p > 0 and r > 0:
        assert f.item() == pytest.approx(2 * p * r / (p + r), rel=1e-12)
    if not ((p > 0 and r > 0) or (p < 0 and r < 0)):
        assert f.item() == 0


def test_signed_f1_is_continuous_and_zero_where_the_signs_differ():
    """The issue's case: P and R of opposite signs, where ``2PR / (P + R)`` is −1 or explodes."""
    p, r = torch.tensor([0.141, -0.2, 1e-30, 0.3]), torch.tensor([-0.132, 0.1999, -1e-30, 0.0])
    assert signed_f1(p, r).tolist() == [0.0, 0.0, 0.0, 0.0]
    near = signed_f1(torch.tensor([1e-9, 0.5]), torch.tensor([0.5, 1e-9]))
    assert (near.abs() < 1e-8).all()  # tends to 0 on the axes


def test_f1_of_every_directed_member_lies_between_p_and_r_when_the_signs_differ():
    """A hypothesis token anti-aligned with the reference: R < 0 < P for bertscore (one token that
    matches the reference's best, one opposite to all of it), where ``2PR / (P + R)`` leaves [P, R]."""
    ref = torch.tensor([[[1.0, 0.0, 0.0], [0.9, 0.1, 0.0]]], dtype=torch.float64)
    hyp = torch.tensor([[[-1.0, 0.0, 0.0]]], dtype=torch.float64)
    hyp2 = torch.tensor([[[-1.0, 0.0, 0.0], [0.2, 1.0, 0.0], [0.95, 0.05, 0.0], [0.0, 1.0, 0.2]]], dtype=torch.float64)
    for name in DIRECTED:
        for h in (hyp, hyp2, -hyp2):
            p, r, f = (similarity(name, d, h, ref, None, None) for d in ("precision", "recall", "f1"))
            assert torch.minimum(p, r) - ROUNDING <= f <= torch.maximum(p, r) + ROUNDING, (name, p, r, f)
    p, r, f = F.bertscore(hyp2, ref)
    assert torch.minimum(p, r) <= f <= torch.maximum(p, r), (p, r, f)


# --- bounds: proved, not clamped ------------------------------------------------------------------

def test_scores_are_the_unclamped_ratio_even_above_one():
    """One-iteration TWMD at T = 1 with unequal masses on the two sides of one text is not bounded
    by 1 (module docs; the cloud was found by gradient ascent): the score is the ratio itself."""
    x = torch.tensor([[[0.54, 0.84], [-0.89, -0.46], [-0.04, -1.0]]], dtype=torch.float64)
    a = torch.tensor([[6.0, 0.2, 0.2]], dtype=torch.float64)
    b = torch.tensor([[2.1, 0.5, 0.5]], dtype=torch.float64)
    score = F.tempered_wmd(x, x, hyp_weights=b, ref_weights=a, temperature=1.0)
    term = member_term("twmd", 1.0, 1)["recall"]
    cross = family_similarity(term, x, x, hyp_weights=b, ref_weights=a, normalize=False)
    selfs = [self_similarity(term, token_cloud(x, torch.ones(1, 3, dtype=torch.bool), w)) for w in (a, b)]
    assert score.item() > 1.1
    assert cross.abs().item() <= 1  # the proved bound of the term
    torch.testing.assert_close(score, cross / (selfs[0] * selfs[1]).sqrt(), atol=1e-12, rtol=0)


def test_the_rounding_clamp_is_at_most_1e_6():
    """Where the proved bound is 1 (sbert, cka, bertscore, moverscore) a score may round above it,
    never by more than 1e-6: identical float32 texts, cached self-terms of another batch."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, 32, generator=g)
    cloud = token_cloud(x, torch.ones(8, 6, dtype=torch.bool))
    wide = token_cloud(torch.cat([x, torch.randn(8, 9, 32, generator=g)], 1),
                       torch.arange(15) < torch.full((8, 1), 6))  # the same texts, padded differently
    for name in ("sbert", "cka", "twmd", "trwmd", "bertscore"):
        term = term_of(name)
        for direction in ("recall", "precision", "f1") if method_of(name) in DIRECTED else ("recall",):
            normalize = get_member(name).normalized
            ref_self = self_similarity(term, wide, direction) if normalize else None
            s = pair_similarity(term, cloud, cloud, normalize=normalize, direction=direction, ref_self=ref_self)
            assert (s - 1).abs().max() <= ROUNDING, (name, direction, s)


# --- masses ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("side", ["hyp_weights", "ref_weights"])
def test_non_finite_or_negative_weights_are_refused_naming_the_argument(bad, side):
    x = torch.randn(2, 3, 4)
    w = torch.ones(2, 3)
    w[1, 2] = bad
    for score in (F.tempered_wmd, F.tempered_rwmd, F.sbert, F.cka, F.wmd, F.moverscore, F.bertscore):
        with pytest.raises(ValueError, match=side):
            score(x, x, **{side: w})
    F.tempered_wmd(x, x, **{side: w.abs().nan_to_num(posinf=1.0)}, validate=False)  # skipped: no error


# --- texts through the Scorer and the rewards --------------------------------------------------------

POLICIES = ("drop", "cls", "keep", "target")
SCORER_MEMBERS = [(m, d) for m in ("twmd", "trwmd", "bertscore") for d in ("recall", "precision", "f1")] + \
                 [(m, "recall") for m in ("wmd", "moverscore", "sbert", "cka", "sms", "s+wms", "wms")]
EMPTY_HYPS = ["", "   ", "the cat sat", "a dog", "big red fox"]
EMPTY_REFS = ["the cat sat on the mat", "a red car", "", " \n ", "the quick fox"]
EMPTY_ROWS = [0, 1, 2, 3]  # an empty hypothesis, or an empty reference; the last pair is not empty


@functools.lru_cache(maxsize=None)
def encoder(policy: str):
    from torchmover import Encoder

    return Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert", special_tokens=policy)


def scorer_or_none(policy, method, direction, centering, idf, **options):
    """A Scorer with these options, or None where the options are not a valid combination."""
    from torchmover import Scorer

    if method in VARIANTS and (policy != "drop" or idf):
        return None  # whole documents: no token policy
    try:
        scorer = Scorer(encoder(policy), method=method, direction=direction, centering=centering, idf=idf,
                        **options)
    except ValueError:  # special_tokens="target" outside the matching members
        return None
    return scorer.fit_idf(EMPTY_REFS + ["the dog ran", "a cat"]) if idf else scorer


def assert_empty_rows_zero(scores, name):
    scores = scores.detach().cpu()
    assert torch.isfinite(scores).all(), (name, scores)
    assert (scores[EMPTY_ROWS] == 0).all(), (name, scores.tolist())
    assert scores[-1] != 0, (name, scores.tolist())  # the control pair


def valid(policy, method):
    """The special-token policies a member takes: the sentence movers none but ``drop`` (whole documents),
    ``target`` only the matching members."""
    return policy == "drop" if method in VARIANTS else policy != "target" or get_member(method).matching


@pytest.mark.parametrize("policy,method,direction",
                         [(p, m, d) for p in POLICIES for m, d in SCORER_MEMBERS if valid(p, m)])
def test_an_empty_text_scores_exactly_zero_in_the_scorer(policy, method, direction):
    """Empty or whitespace hypothesis or reference: exactly 0 (precision, recall and F1), no NaN in
    values or gradients, under every special-token policy, member, direction, centering and IDF
    setting (each centering and each IDF setting once: the rule is the encoder's, before either)."""
    tried = 0
    for centering, idf in (("none", False), ("batch", True), ("sentence", False), ("dimension", True)):
        scorer = scorer_or_none(policy, method, direction, centering, idf and method not in VARIANTS)
        if scorer is not None:
            tried += 1
            name = (policy, method, direction, centering, idf)
            scores = scorer(EMPTY_HYPS, EMPTY_REFS, return_all=True)
            for s in scores:
                assert_empty_rows_zero(s, name)
            sum(s.sum() for s in scores).backward()
            grads = [p.grad for p in scorer.parameters() if p.grad is not None]
            assert grads and all(torch.isfinite(g).all() for g in grads), name
            scorer.zero_grad()
    assert tried == 4


REWARD_MEMBERS = [("twmd", "f1"), ("trwmd", "recall"), ("bertscore", "f1"), ("wmd", "recall"), ("sbert", "recall"),
                  ("sms", "recall")]


@pytest.mark.parametrize("policy,method,direction",
                         [(p, m, d) for p in POLICIES for m, d in REWARD_MEMBERS if valid(p, m)])
def test_an_empty_text_scores_exactly_zero_on_every_reward_path(policy, method, direction):
    """The same through ``Scorer.score`` (batched, arena) and the rewards: uncached, cached,
    self-critical and group."""
    from torchmover import GroupReward, MoverReward, SelfCriticalReward

    tried = 0
    for centering, idf in (("none", True), ("batch", False)):
        scorer = scorer_or_none(policy, method, direction, centering, idf and method not in VARIANTS)
        if scorer is not None:
            tried += 1
            name = (policy, method, direction, centering, idf)
            assert_empty_rows_zero(scorer.score(EMPTY_HYPS, EMPTY_REFS, batch_size=2), name)
            reward, critic, group = MoverReward(scorer), SelfCriticalReward(scorer), GroupReward(scorer)
            if centering == "batch":  # rewards center on a fitted corpus mean
                for r in (reward, critic, group):
                    r.fit(EMPTY_REFS + ["the dog ran"])
            for _ in range(2):  # uncached, then cached
                assert_empty_rows_zero(reward(EMPTY_HYPS, EMPTY_REFS), name)
            result = critic(EMPTY_HYPS, EMPTY_HYPS[::-1], EMPTY_REFS)
            assert_empty_rows_zero(result.sampled, name)
            assert (result.greedy[[2, 3, 4]] == 0).all() and (result.greedy[[0, 1]] != 0).all(), name
            assert torch.equal(result.advantage, result.sampled - result.greedy), name
            rewards = group([[h, "big red fox"] for h in EMPTY_HYPS], EMPTY_REFS).rewards
            assert_empty_rows_zero(rewards[:, 0], name)
    assert tried == 2


words = st.sampled_from(WORDS + ["кошка", "猫", "chat", "!", "...", "é", "Ωmega"])
texts = st.one_of(
    st.sampled_from(["", "   ", "\n\t"]),  # empty
    words,  # one token
    st.lists(words, min_size=1, max_size=8).map(" ".join),
    st.tuples(words, st.integers(2, 80)).map(lambda wn: " ".join([wn[0]] * wn[1])),  # repeated, up to truncated
    st.lists(words, min_size=40, max_size=90).map(" ".join),  # very long: truncated at the window
)


@given(data=st.data(), hyps=st.lists(texts, min_size=1, max_size=3))
def test_scorer_keeps_every_contract_on_random_texts(data, hyps):
    refs = data.draw(st.lists(texts, min_size=len(hyps), max_size=len(hyps)))
    method, direction = data.draw(st.sampled_from(SCORER_MEMBERS))
    policy = data.draw(st.sampled_from(POLICIES))
    centering = data.draw(st.sampled_from(CENTERINGS))
    scorer = scorer_or_none(policy, method, direction, centering, data.draw(st.booleans()))
    assume(scorer is not None)
    with torch.no_grad():
        p, r, f = scorer(hyps, refs, return_all=True)
        for s in (p, r, f):
            assert torch.isfinite(s).all()
            empty = torch.tensor([not h.strip() or not t.strip() for h, t in zip(hyps, refs)])
            assert (s[empty] == 0).all(), (hyps, refs, s)
            if method in BOUNDED_BY_ONE or method in VARIANTS:
                assert (s.abs() <= 1 + ROUNDING).all(), s
        assert ((f >= torch.minimum(p, r) - ROUNDING) & (f <= torch.maximum(p, r) + ROUNDING)).all(), (p, r, f)
        if centering in ("batch", "sentence"):
            return  # they can center a text's vectors to 0 (one token alone): C(X, X) = 0, scored 0
        own = scorer(refs, refs)
        nonempty = torch.tensor([bool(t.strip()) for t in refs])
        tolerance = 2e-3 if method in ("moverscore", *VARIANTS) else 1e-5
        torch.testing.assert_close(own[nonempty], torch.ones_like(own[nonempty]), atol=tolerance, rtol=0)
        assert (own[~nonempty] == 0).all()


@pytest.mark.filterwarnings("ignore:.*longer than .* tokens were truncated")
@given(data=st.data(), hyps=st.lists(texts, min_size=1, max_size=5))
def test_a_corpus_score_is_each_pairs_own_on_random_texts(data, hyps):
    """``Scorer.score`` (distinct texts encoded once in token-budget batches, their units kept in one
    block and read back per pair batch) gives every pair the score of ``Scorer.forward`` on that pair
    alone — or, with ``batch`` centering, on the whole call at once — whatever the batch size, the
    texts repeated within and across the two sides, and one or two references a hypothesis."""
    groups = [data.draw(st.lists(st.sampled_from(hyps) | texts, min_size=1, max_size=2), label="refs") for _ in hyps]
    method, direction = data.draw(st.sampled_from(SCORER_MEMBERS), label="member")
    policy, centering = data.draw(st.sampled_from(POLICIES)), data.draw(st.sampled_from(CENTERINGS))
    ngram = data.draw(st.sampled_from([1, 2]), label="ngram")
    scorer = scorer_or_none(policy, method, direction, centering, data.draw(st.booleans(), label="idf"), ngram=ngram)
    assume(scorer is not None)
    batch_size = data.draw(st.integers(1, 4), label="batch size")
    with torch.no_grad():
        got = scorer.score(hyps, groups, batch_size=batch_size, progress=False, return_all=True)
        if centering == "batch":
            expected = scorer(hyps, groups, return_all=True)
        else:
            expected = [torch.cat(scores) for scores in zip(*(scorer([h], [g], return_all=True)
                                                               for h, g in zip(hyps, groups)))]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=0)
