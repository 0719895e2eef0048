"""No host-device synchronisation in the hot paths, proved op by op on the CPU.

Every hot path runs under :class:`optrace.OpTrace`, a ``TorchDispatchMode`` that sees every
aten op, the same ops a CUDA run launches. It keeps the ops *issued by torchmover*: the innermost
Python frame outside ``torch`` that called the op is in the torchmover package. Ops issued by the
tokenizer and by the encoder's own code (``transformers`` frames, e.g. its attention-mask checks) are
outside torchmover's control and are not recorded; the encoder's forward is marked by a forward
pre-hook instead (:meth:`OpTrace.mark`). The tests assert that

- none of the recorded ops would block the host on CUDA (scalar reads, ``nonzero``, ``unique``,
  boolean-mask indexing, ``equal``, ``repeat_interleave`` without ``output_size``, asynchronous
  asserts, ...): the failure message names each op and the torchmover frames that issued it;
- no data goes from the host to the device after the encoder has started (a tensor built from Python
  data, a ``Tensor.to(device)``, a ``tolist()`` of a device tensor): on a GPU each would wait for the
  whole encoder. Everything the device needs is built from the tokenizer's output and sent before.

Each call is run once before it is traced (warm-up: the IDF table is sent to the device once, the
reference cache is filled), then traced.
"""
from __future__ import annotations

import pytest
import torch

from torchmover import Scorer
from torchmover import functional as F
from optrace import OpTrace
from torchmover.reward.rewards import GroupReward, MoverReward, SelfCriticalReward
from torchmover.scorer.units import Units
from torchmover._internal.transfer import to_device
import torchmover.scorer.plan as plan

HYPS = ["the cat sat on the mat .", "a dog barked", "", "the quick brown fox jumps over the lazy dog , he said"]
REFS = ["a cat sat on the mat", "the dog barked at the man", "the sun", "the fox jumps"]


def traced(call, scorer=None) -> OpTrace:
    """``call()`` under an :class:`OpTrace`, the encoder's start marked."""
    with OpTrace() as trace:
        handle = None if scorer is None else scorer.encoder.model.register_forward_pre_hook(lambda *_: trace.mark())
        try:
            call()
        finally:
            if handle is not None:
                handle.remove()
    return trace


def assert_sync_free(trace: OpTrace, encoder_runs: bool = True) -> None:
    assert trace.kernel_ops, "nothing was recorded: the trace does not see torchmover's ops"
    assert not trace.syncs, "ops that sync host and device on CUDA:\n" + "\n".join(map(str, trace.syncs))
    if encoder_runs:
        assert trace.marked, "the encoder never ran"
    late = trace.late_host_data
    assert not late, "host data sent after the encoder started:\n" + "\n".join(map(str, late))


POLICIES = {"default": {}, "idf": {"idf": True}, "stopwords": {"stopwords": "english"},
            "punctuation": {"punctuation": "drop"}, "ascii": {"punctuation": "ascii"},
            "subwords-first": {"subwords": "first"}, "subwords-mean": {"subwords": "mean"},
            "bigrams+idf": {"ngram": 2, "idf": True}, "f1": {"direction": "f1"}, "trwmd": {"method": "trwmd"},
            "bertscore": {"method": "bertscore"}, "sbert": {"method": "sbert"}, "cka": {"method": "cka"},
            "separate": {"centering": "batch", "center_scope": "separate"},
            "pairs": {"centering": "batch", "center_scope": "pairs"},
            "bigrams-separate": {"ngram": 2, "centering": "batch", "center_scope": "separate"},
            "bigrams-sentence": {"ngram": 2, "centering": "sentence"}}


def make_scorer(tiny_encoder, **options) -> Scorer:
    scorer = Scorer(tiny_encoder, **options)
    if scorer.config.idf:
        scorer.fit_idf(REFS, HYPS)
    return scorer


@pytest.mark.parametrize("options", POLICIES.values(), ids=POLICIES.keys())
def test_forward_is_sync_free(tiny_encoder, options):
    scorer = make_scorer(tiny_encoder, **options)
    groups = [[r] for r in REFS[:3]] + [[REFS[3], REFS[0]]]  # several references for one hypothesis
    expected = scorer(HYPS, groups)
    assert_sync_free(traced(lambda: scorer(HYPS, groups), scorer))
    assert torch.isfinite(expected).all()


def test_forward_with_grad_is_sync_free(tiny_encoder):
    scorer = make_scorer(tiny_encoder, centering="batch")
    trace = traced(lambda: scorer(HYPS, REFS).sum().backward(), scorer)
    assert_sync_free(trace)


@pytest.mark.parametrize("options", [{}, {"idf": True, "stopwords": "english"}, {"subwords": "mean"}], ids=str)
def test_score_inner_loop_is_sync_free(tiny_encoder, options):
    """``Scorer.score``: encoding batch after batch (each batch's tokens sent asynchronously), then
    every batch's indices in one asynchronous transfer per chunk, the batches scored on the device; the
    scores come back to the host once, at the end."""
    scorer = make_scorer(tiny_encoder, centering="none", **options)  # a pair's score then is the same in any batch
    hyps, refs = HYPS * 5, REFS[1:] + REFS[:1] + REFS * 4
    expected = torch.cat([scorer(hyps[i:i + 1], refs[i:i + 1]) for i in range(len(hyps))])
    trace = traced(lambda: scorer.score(hyps, refs, batch_size=3, progress=False), scorer)
    assert_sync_free(trace)
    torch.testing.assert_close(scorer.score(hyps, refs, batch_size=3, progress=False), expected.detach(),
                               atol=1e-5, rtol=0)


def test_grouped_passes_are_sync_free(tiny_encoder):
    """The encoder's passes by length group (``pass_cost=0``: a pass per distinct length): the order of
    the groups goes with the model inputs in one transfer, each pass reads its rows as a slice."""
    tiny_encoder.pass_cost = 0
    scorer = make_scorer(tiny_encoder, centering="batch")
    passes = []
    handle = tiny_encoder.model.register_forward_pre_hook(lambda *_: passes.append(1))
    trace = traced(lambda: scorer(HYPS, REFS).sum().backward(), scorer)
    handle.remove()
    assert len(passes) >= 3
    assert_sync_free(trace)
    reward = MoverReward(make_scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False))
    reward(HYPS, REFS)
    assert_sync_free(traced(lambda: reward(HYPS[::-1], REFS), reward.scorer))


@pytest.fixture
def fitted_scorer(tiny_encoder):
    return make_scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False)


@pytest.mark.parametrize("cache_size", [1024, 2, 0])
def test_reward_is_sync_free(fitted_scorer, cache_size):
    """Cached, partly cached (a cache smaller than the call: misses and evictions) and uncached."""
    reward = MoverReward(fitted_scorer, cache_size=cache_size)
    reward(HYPS[:2], REFS[:2])  # two references cached
    assert_sync_free(traced(lambda: reward(HYPS, REFS), fitted_scorer))


@pytest.mark.parametrize("device_type", ["cpu", "meta"])
def test_rewards_moved_in_batches_by_length_are_sync_free(fitted_scorer, monkeypatch, device_type):
    """The transport in batches by length (a batch cost of 0: a batch per distinct length), cached,
    uncached, with several references: the pairs are laid out on the host before the call's one
    transfer and each batch is read by slices; on the meta device, where no data can be read at all."""
    monkeypatch.setitem(plan.TRANSPORT_BATCH_COST, device_type, 0)
    batches = []
    grouped = Scorer._grouped_pair_scores
    monkeypatch.setattr(Scorer, "_grouped_pair_scores",
                        lambda self, *a, **k: batches.append(a[-1]) or grouped(self, *a, **k))
    rewards = [MoverReward(fitted_scorer, cache_size=size) for size in (1024, 0)]
    for reward in rewards:
        reward(HYPS[:2], REFS[:2])
    if device_type == "meta":
        on_meta(fitted_scorer)
    for reward in rewards:
        for refs in (REFS, [[r, REFS[0]] for r in REFS]):
            trace = traced(lambda: reward(HYPS, refs), fitted_scorer)
            if device_type == "cpu":
                assert_sync_free(trace)
    assert batches and all(len(groups) > 1 for groups in batches)


@pytest.mark.parametrize("options", [{"idf": True}, {"stopwords": "english", "punctuation": "drop"},
                                     {"subwords": "mean"}, {"method": "bertscore", "direction": "f1"}], ids=str)
def test_reward_policies_are_sync_free(tiny_encoder, options):
    scorer = make_scorer(tiny_encoder, **options)
    reward = MoverReward(scorer).fit(REFS)
    reward(HYPS, REFS)
    assert_sync_free(traced(lambda: reward(HYPS, REFS[::-1]), scorer))


def test_self_critical_and_group_rewards_are_sync_free(fitted_scorer):
    self_critical, group = SelfCriticalReward(fitted_scorer), GroupReward(fitted_scorer, normalize_std=True)
    self_critical(HYPS, HYPS[::-1], REFS)
    assert_sync_free(traced(lambda: self_critical(HYPS, HYPS[::-1], REFS), fitted_scorer))
    groups = [HYPS[:2], HYPS[2:]]
    group(groups, REFS[:2])
    assert_sync_free(traced(lambda: group(groups, [REFS[2], REFS[3]]), fitted_scorer))


def test_reward_op_count_does_not_grow_with_cached_references(fitted_scorer):
    """The cached references are gathered by one index, not re-padded one by one."""
    counts = []
    for n_refs in (2, 4):
        reward = MoverReward(fitted_scorer)
        hyps, refs = HYPS * 2, [REFS[i % n_refs] for i in range(8)]
        reward(hyps, refs)
        counts.append(len(traced(lambda: reward(hyps, refs), fitted_scorer).kernel_ops))
    assert counts[0] == counts[1]


def test_one_iteration_twmd_is_sync_free():
    torch.manual_seed(0)
    hyp, ref = torch.randn(3, 5, 8), torch.randn(3, 4, 8)
    hyp_mask, ref_mask = torch.rand(3, 5) > 0.3, torch.rand(3, 4) > 0.3
    hyp_mask[0] = False  # an empty text
    for direction in ("recall", "precision", "f1"):
        assert_sync_free(traced(lambda: F.tempered_wmd(hyp, ref, hyp_mask, ref_mask, direction=direction)),
                         encoder_runs=False)
    weights = torch.rand(3, 4)  # user weights are validated at the boundary: one read, unless validate=False
    checked = traced(lambda: F.tempered_wmd(hyp, ref, hyp_mask, ref_mask, ref_weights=weights))
    assert [op.frame.split(" in ")[1] for op in checked.syncs] == ["_masses"]
    assert_sync_free(traced(lambda: F.tempered_wmd(hyp, ref, hyp_mask, ref_mask, ref_weights=weights,
                                                   validate=False)), encoder_runs=False)


@pytest.mark.parametrize("member", ["tempered_rwmd", "bertscore", "sbert", "cka"])
def test_weighted_members_are_sync_free_without_validation(member):
    """Every member with weights takes ``validate``: the weights' check is its only device read."""
    torch.manual_seed(0)
    hyp, ref = torch.randn(3, 5, 8), torch.randn(3, 4, 8)
    hyp_weights, ref_weights = torch.rand(3, 5), torch.rand(3, 4)
    fn = getattr(F, member)
    checked = traced(lambda: fn(hyp, ref, hyp_weights=hyp_weights, ref_weights=ref_weights))
    assert checked.syncs and {op.frame.split(" in ")[1] for op in checked.syncs} == {"_masses"}
    assert_sync_free(traced(lambda: fn(hyp, ref, hyp_weights=hyp_weights, ref_weights=ref_weights, validate=False)),
                     encoder_runs=False)


def test_the_trace_names_syncing_ops_and_their_frames():
    """The guard can fail: known syncing code is caught, with the op and the torchmover frame."""
    units = Units(torch.randn(2, 3, 4), torch.tensor([[True, False, True], [True, True, False]]))
    trace = traced(units.unpad)
    assert {op.name for op in trace.syncs} == {"aten::index.Tensor"}
    assert all(op.frame.startswith("torchmover/scorer/units.py") and "in unpad" in " ".join(op.stack) for op in trace.syncs)
    assert "boolean-mask indexing" in str(trace.syncs[0])
    x, mask = torch.randn(1, 2, 4), torch.ones(1, 2, dtype=torch.bool)
    with OpTrace() as trace:
        torch.zeros(2, device="cpu").sum().item()  # not torchmover's: not recorded
        to_device([[1, 2]], "cpu")  # before the mark
        trace.mark()
        to_device([[1, 2]], "cpu")  # asynchronous: not late
        F.tempered_wmd(x, x, mask, mask)  # moves the user's masks to the vectors' device: blocking
    assert not trace.syncs
    assert {op.frame.split(" in ")[1] for op in trace.late_host_data} == {"_check_inputs"}


def on_meta(scorer: Scorer) -> Scorer:
    """``scorer`` on the ``meta`` device (shapes and dtypes, no data), its model's forward replaced
    by one that returns hidden states of the right shape (transformers' own mask checks read data)."""
    from types import SimpleNamespace

    scorer = scorer.to("meta")
    model = scorer.encoder.model
    width, layers = model.config.hidden_size, scorer.encoder.layer

    def shapes_only(input_ids, **_):
        h = torch.empty(*input_ids.shape, width, device="meta")
        return SimpleNamespace(hidden_states=(h,) * (layers + 1), last_hidden_state=h)
    model.forward = shapes_only
    return scorer


@pytest.mark.parametrize("options", [{}, {"idf": True, "stopwords": "english"}, {"subwords": "mean"},
                                     {"method": "bertscore", "direction": "f1"}, {"pass_cost": 0}], ids=str)
def test_rewards_run_on_the_meta_device(fitted_scorer, tiny_encoder, options):
    """A second proof, independent of the trace: no data can be read from a meta tensor (a scalar
    read, ``nonzero``, ``unique`` raise), so a whole call that runs there reads none (also with the
    encoder's passes by length group: ``pass_cost=0``)."""
    options = dict(options)
    tiny_encoder.pass_cost = options.pop("pass_cost", "auto")
    scorer = fitted_scorer if not options else make_scorer(tiny_encoder, **options)
    reward, self_critical = MoverReward(scorer), SelfCriticalReward(scorer)
    if options:  # fitted on the CPU
        reward.fit(REFS)
        self_critical.fit(REFS)
    reward(HYPS[:2], REFS[:2])  # two references cached on the CPU: moving the scorer must drop them
    on_meta(scorer)
    for scores in (reward(HYPS, REFS), self_critical(HYPS, HYPS[::-1], REFS).advantage):
        assert scores.device.type == "meta" and scores.shape == (len(HYPS),)
