"""torchmover.text.length_groups (which texts run in one forward pass) and the encoder's grouped passes:
the grouping is the cheapest of every possible one, and a grouped call gives the vectors, masks and
gradients of one pass."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder, Scorer
from torchmover.reward.rewards import MoverReward
from torchmover.text.length_groups import (AUTO_PASS_COST, AUTO_PASS_COST_ACCELERATOR, length_groups,
                                           resolve_pass_cost)

TEXTS = ["a cat", "the quick brown fox jumps over the lazy dog and the cat , he said to the man", "",
         "the dog barked", "a man", "the sun is on the mat and the dog sat on the cat , the fox said", "cat"]


def cost(lengths, groups, pass_cost) -> int:
    """Padded tokens plus ``pass_cost`` per pass of ``groups`` (None: one pass)."""
    groups = [np.arange(len(lengths))] if groups is None else groups
    return sum(len(g) * max(lengths[i] for i in g) + pass_cost for g in groups)


def set_partitions(items):
    """Every partition of ``items`` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1:]]


@settings(max_examples=8 * settings().max_examples, deadline=None)  # cheap cases: 8x the profile's
@given(st.lists(st.integers(1, 40), min_size=1, max_size=7), st.integers(0, 60))
def test_the_groups_are_the_cheapest_of_every_partition(lengths, pass_cost):
    """Against every partition of the texts into passes (not only runs of the sorted order)."""
    lengths = np.array(lengths)
    groups = length_groups(lengths, pass_cost)
    best = min(cost(lengths, p, pass_cost) for p in set_partitions(list(range(len(lengths)))))
    assert cost(lengths, groups, pass_cost) == best


@settings(max_examples=8 * settings().max_examples, deadline=None)  # cheap cases: 8x the profile's
@given(st.lists(st.integers(1, 300), min_size=1, max_size=200), st.integers(0, 5000))
def test_the_groups_cover_every_text_once_shortest_first(lengths, pass_cost):
    lengths = np.array(lengths)
    groups = length_groups(lengths, pass_cost)
    if groups is None:
        return
    assert len(groups) >= 2 and all(len(g) for g in groups)
    order = np.concatenate(groups)
    assert sorted(order.tolist()) == list(range(len(lengths)))
    assert (np.diff(lengths[order]) >= 0).all()  # sorted within and across groups
    widths = [lengths[g[-1]] for g in groups]
    assert len(set(widths)) == len(widths)  # a length is never split between two passes
    assert cost(lengths, groups, pass_cost) < cost(lengths, None, pass_cost)  # strictly better than one pass


def test_one_pass_where_no_split_can_pay():
    assert length_groups(np.array([5, 50]), None) is None  # never split
    assert length_groups(np.array([7]), 0) is None
    assert length_groups(np.array([9, 9, 9]), 0) is None  # no padding at all
    assert length_groups(np.array([10, 20]), 10) is None  # saves 10 = the cost of a pass: not more
    assert [g.tolist() for g in length_groups(np.array([20, 10]), 9)] == [[1], [0]]
    assert [g.tolist() for g in length_groups(np.array([3, 30, 4, 31, 3]), 0)] == [[0, 4], [2], [1], [3]]


def test_auto_depends_on_the_device_and_bad_values_are_refused(tiny_encoder):
    assert resolve_pass_cost("auto", "cpu") == AUTO_PASS_COST["cpu"]
    assert resolve_pass_cost("auto", "cuda") == AUTO_PASS_COST_ACCELERATOR
    assert resolve_pass_cost(7, "cuda") == 7 and resolve_pass_cost(None, "cpu") is None
    assert tiny_encoder.pass_cost == "auto"
    for bad in (-1, 1.5, "fast", True):
        with pytest.raises(ValueError, match="pass_cost must be"):
            Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny", pass_cost=bad)
        with pytest.raises(ValueError, match="pass_cost must be"):
            tiny_encoder.pass_cost = bad  # the attribute, set later
    assert tiny_encoder.pass_cost == "auto"


def encoders(dtype=torch.float32):
    """The same tiny encoder twice: one pass per call, and as many passes as lengths."""
    one, grouped = (Encoder(tiny_model().to(dtype), tiny_tokenizer(), layer=2, name="tiny", pass_cost=cost)
                    for cost in (None, 0))
    return one, grouped


def test_grouped_passes_give_the_vectors_masks_and_spans_of_one_pass():
    one, grouped = encoders()
    with torch.no_grad():
        a, b = one(TEXTS), grouped(TEXTS)
    assert len(length_groups(np.array([len(t) for t in one.tokenize(TEXTS)["input_ids"]]), 0)) >= 4
    for field in ("mask", "input_ids", "word_ids", "special"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.spans == b.spans and a.num_words == b.num_words
    torch.testing.assert_close(b.embeddings[a.mask], a.embeddings[a.mask], atol=1e-6, rtol=0)
    valid = a.input_ids != tiny_tokenizer().pad_token_id
    assert (b.embeddings[~valid] == 0).all()  # the padding of a grouped call is zero


def test_grouped_passes_give_the_gradients_of_one_pass():
    """float64: the loss of a Scorer's forward and its gradient for every weight of the encoder."""
    grads, passes = [], []
    for encoder in encoders(torch.float64):
        scorer = Scorer(encoder, centering="batch").double()
        handle = encoder.model.register_forward_pre_hook(lambda *_: passes.append(encoder.pass_cost))
        scorer(TEXTS, TEXTS[::-1]).sum().backward()
        handle.remove()
        grads.append({n: p.grad for n, p in encoder.model.named_parameters() if p.grad is not None})
    assert passes.count(None) == 1 and passes.count(0) >= 4  # one pass against grouped ones
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-10, rtol=1e-8, msg=name)


def test_gradcheck_through_grouped_passes():
    """``torch.autograd.gradcheck`` of a grouped call's vectors in some word embeddings (float64)."""
    _, encoder = encoders(torch.float64)
    name = "model.embeddings.word_embeddings.weight"
    base = dict(encoder.named_parameters())[name].detach()
    rows = torch.tensor(encoder.tokenize(["the cat", "fox"])["input_ids"][0][1:3])  # "the", "cat"

    def vectors(used):
        weight = base.index_put((rows,), used)
        return torch.func.functional_call(encoder, {name: weight}, (TEXTS[:4],)).embeddings

    passes = []
    handle = encoder.model.register_forward_pre_hook(lambda *_: passes.append(1))
    vectors(base[rows])
    handle.remove()
    assert len(passes) >= 2  # the call runs grouped passes
    assert length_groups(np.array([len(t) for t in encoder.tokenize(TEXTS[:4])["input_ids"]]), 0) is not None
    assert torch.autograd.gradcheck(vectors, (base[rows].clone().requires_grad_(True),), eps=1e-6, atol=1e-7)


def test_a_reward_call_scores_alike_in_one_pass_and_in_groups():
    scores = []
    for encoder in encoders():
        reward = MoverReward(Scorer(encoder, centering="fixed").fit_centering(TEXTS, progress=False))
        scores.append(reward(TEXTS, TEXTS[::-1]))
    torch.testing.assert_close(scores[1], scores[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("pass_cost", [0, 3])
def test_the_passes_run_on_the_texts_of_their_groups_cut_to_their_width(pass_cost):
    """The model sees each group's rows cut to its longest text, in the groups' order."""
    _, encoder = encoders()
    encoder.pass_cost = pass_cost
    shapes = []
    handle = encoder.model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    with torch.no_grad():
        encoder(TEXTS)
    handle.remove()
    lengths = np.array([len(t) for t in encoder.tokenize(TEXTS)["input_ids"]])
    groups = length_groups(lengths, pass_cost)
    assert shapes == [(len(g), lengths[g[-1]]) for g in groups]
    assert list(itertools.accumulate(n for n, _ in shapes))[-1] == len(TEXTS)


def test_a_scorer_sets_its_pass_cost_on_its_encoder(tiny_encoder):
    """``Scorer(pass_cost=...)``: set on the encoder it loads; a given encoder keeps its own under
    ``"auto"`` (the default) and takes any other value."""
    tiny_encoder.pass_cost = 0
    assert Scorer(tiny_encoder).encoder.pass_cost == 0
    assert Scorer(tiny_encoder, pass_cost=None).encoder.pass_cost is None
    assert Scorer(tiny_encoder, pass_cost=64).encoder.pass_cost == 64
    with pytest.raises(ValueError, match="pass_cost must be"):
        Scorer(tiny_encoder, pass_cost="fast")
