"""The host-side plan of a call (torchmover.scorer.plan), on generated calls: the rows a plan sends
read back every (hypothesis, reference) pair of the call, with its owner, whatever the repeats and the
order of the distinct texts; laying the pairs out by groups of hypotheses keeps every pair, its
reference and its owner, and each hypothesis's pairs in their order."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from torchmover.scorer.plan import call_plan, pairs_by_group

WORDS = ["a", "b", "c", "d", "e"]


@st.composite
def calls(draw):
    """Hypotheses, their reference groups (texts repeat within and across sides) and the call's
    distinct texts, the distinct hypotheses first, each side in a drawn order."""
    hyps = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6), label="hyps")
    one_each = draw(st.booleans(), label="one reference each")
    groups = [draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=1 if one_each else 3), label="refs")
              for _ in hyps]
    distinct_hyps = list(dict.fromkeys(hyps))
    others = [t for t in dict.fromkeys(r for g in groups for r in g) if t not in distinct_hyps]
    texts = draw(st.permutations(distinct_hyps), label="hyp rows") + draw(st.permutations(others), label="ref rows")
    return hyps, groups, texts


def read_pairs(plan, texts):
    """Each pair as ``(owner, hypothesis text, reference text)``, read through the plan's rows."""
    index, n = plan.index, plan.n_hyps if plan.index.owner is None else len(plan.index.owner)
    ref_rows = range(len(texts))[plan.ref_rows] if isinstance(plan.ref_rows, slice) else plan.ref_rows
    return [(p if index.owner is None else index.owner[p],
             texts[p if index.hyp is None else index.hyp[p]],
             texts[ref_rows[p if index.ref is None else index.ref[p]]]) for p in range(n)]


@given(call=calls())
@settings(max_examples=8 * settings().max_examples)  # cheap cases: 8x the profile's
def test_a_call_plan_reads_back_every_pair_with_its_owner(call):
    hyps, groups, texts = call
    plan = call_plan(hyps, groups, texts)
    assert plan.n_hyps == len(hyps) and plan.n_hyp_texts == len(set(hyps))
    assert set(texts[:plan.n_hyp_texts]) == set(hyps)  # the distinct hypotheses first
    assert read_pairs(plan, texts) == [(i, h, r) for i, (h, g) in enumerate(zip(hyps, groups)) for r in g]
    assert (plan.index.owner is None) == all(len(g) == 1 for g in groups)


@given(call=calls(), data=st.data())
@settings(max_examples=8 * settings().max_examples)  # cheap cases: 8x the profile's
def test_pairs_laid_out_by_groups_keep_every_pair_its_owner_and_their_order(call, data):
    hyps, groups, texts = call
    plan = call_plan(hyps, groups, texts)
    n = plan.n_hyp_texts
    inner = data.draw(st.sets(st.integers(1, max(n - 1, 1))).map(sorted), label="group bounds") if n > 1 else []
    bounds = [0, *inner, n]
    index, slices = pairs_by_group(plan.index, plan.n_hyps, bounds)
    grouped = plan._replace(index=index)
    before, after = read_pairs(plan, texts), read_pairs(grouped, texts)
    assert sorted(after) == sorted(before)  # every pair once, with its reference and owner
    for hyp_rows, pairs in slices:  # a group's pairs: contiguous, their hypotheses within its rows
        assert all(hyp_rows.start <= index.hyp[p] < hyp_rows.stop for p in range(pairs.start, pairs.stop))
    pair_bounds = [0] + [p.stop for _, p in slices]
    assert [p.start for _, p in slices] == pair_bounds[:-1] and pair_bounds[-1] == len(after)  # back to back
    assert [(h.start, h.stop) for h, _ in slices] == list(zip(bounds, bounds[1:]))
    for hyp in set(hyps):  # a hypothesis's pairs in their order (multi_ref="mean" sums in it)
        assert [pair for pair in after if pair[1] == hyp] == [pair for pair in before if pair[1] == hyp]
