"""MoverMetric: the Scorer as a torchmetrics Metric."""
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchmetrics")

import _ddp  # noqa: E402
from torchmover import Scorer  # noqa: E402
from torchmover.evaluation.metric import MoverMetric  # noqa: E402

HYPS = ["the cat sat on the mat", "a dog barked", "the sun is red", "they ran to the city", "the quick brown fox"]
REFS = ["a cat was on the mat", ["the dog barked", "a dog runs"], "the moon is blue",
        "we ran to the old house", ["a fox jumps over the lazy dog", "quick fox"]]
CORPUS = ["the cat sat on the mat", "a dog barked at night", "the quick brown fox jumps", "we ran to the city"]


@pytest.fixture
def fixed_scorer(tiny_encoder):
    return Scorer(tiny_encoder, centering="fixed").fit_centering(CORPUS, progress=False)


def test_traits():
    assert MoverMetric.is_differentiable is True
    assert MoverMetric.higher_is_better is True
    assert MoverMetric.full_state_update is False


def test_scores_are_the_scorers(fixed_scorer):
    metric = MoverMetric(fixed_scorer, return_per_sample=True)
    metric.update(HYPS, REFS)
    value = metric.compute()
    with torch.no_grad():
        expected = fixed_scorer(HYPS, REFS)
    torch.testing.assert_close(value["per_sample"], expected)
    torch.testing.assert_close(value["score"], expected.mean())


def test_two_updates_equal_one_on_the_union(fixed_scorer):
    once, twice = MoverMetric(fixed_scorer), MoverMetric(fixed_scorer)
    once.update(HYPS, REFS)
    twice.update(HYPS[:2], REFS[:2])
    twice.update(HYPS[2:], REFS[2:])
    torch.testing.assert_close(twice.compute(), once.compute())


@pytest.mark.parametrize("scope", ["joint", "separate", "pairs"])
def test_batch_centering_result_does_not_depend_on_the_updates(tiny_encoder, scope):
    """With centering="batch" compute() centers on every text seen: the same result however the data
    is cut into updates, equal to the scorer's forward on the whole list at once."""
    scorer = Scorer(tiny_encoder, centering="batch", center_scope=scope)
    with torch.no_grad():
        whole = scorer(HYPS, REFS)
    for cuts in ([5], [2, 5], [1, 2, 3, 4, 5]):
        metric, start = MoverMetric(scorer, return_per_sample=True), 0
        for end in cuts:
            metric.update(HYPS[start:end], REFS[start:end])
            start = end
        value = metric.compute()
        torch.testing.assert_close(value["per_sample"], whole)
        torch.testing.assert_close(value["score"], whole.mean())
        assert metric.scores == [] and len(metric.preds) == len(HYPS)


def test_batch_centering_forward_is_the_batch_value_and_accumulates(tiny_encoder):
    scorer = Scorer(tiny_encoder, centering="batch")
    metric = MoverMetric(scorer)
    loss = metric(HYPS[:3], REFS[:3])
    with torch.no_grad():
        torch.testing.assert_close(loss.detach(), scorer(HYPS[:3], REFS[:3]).mean())
    assert loss.requires_grad
    metric(HYPS[3:], REFS[3:])
    with torch.no_grad():
        torch.testing.assert_close(metric.compute(), scorer(HYPS, REFS).mean())
    metric.reset()
    assert metric.preds == [] and metric.targets == []


def test_scores_in_eval_mode_when_the_parent_trains_unless_asked(fixed_scorer):
    parent = torch.nn.Module()
    parent.metric = MoverMetric(fixed_scorer, return_per_sample=True)
    parent.train()
    assert fixed_scorer.training
    with torch.no_grad():
        expected = fixed_scorer.eval()(HYPS, REFS)
    parent.train()
    for _ in range(2):  # dropout would make the two updates differ
        parent.metric.update(HYPS, REFS)
    per_sample = parent.metric.compute()["per_sample"]
    torch.testing.assert_close(per_sample, torch.cat([expected, expected]))
    assert fixed_scorer.training and fixed_scorer.encoder.training  # modes restored

    trained = MoverMetric(fixed_scorer, return_per_sample=True, train_scorer=True)
    trained.update(HYPS, REFS)
    assert not torch.allclose(trained.compute()["per_sample"], expected)  # dropout on: asked for
    with pytest.raises(TypeError, match="train_scorer"):
        MoverMetric(fixed_scorer, train_scorer="yes")


@pytest.mark.parametrize("centering", ["fixed", "batch"])
def test_a_single_string_pair(fixed_scorer, tiny_encoder, centering):
    scorer = fixed_scorer if centering == "fixed" else Scorer(tiny_encoder, centering="batch")
    metric = MoverMetric(scorer, return_per_sample=True)
    metric.update("the cat sat on the mat", "a cat was on the mat")
    with torch.no_grad():
        expected = scorer(["the cat sat on the mat"], ["a cat was on the mat"])
    torch.testing.assert_close(metric.compute()["per_sample"].reshape(1), expected)


def test_plot_bounds(fixed_scorer, tiny_encoder):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    metric = MoverMetric(fixed_scorer)
    assert (metric.plot_lower_bound, metric.plot_upper_bound) == (-1.0, 1.0)
    metric.update(HYPS, REFS)
    _, ax = metric.plot()
    low, high = ax.get_ylim()
    assert low < -1.0 and 1.0 < high < 1.5  # the bounds, with torchmetrics' margin
    rescaled = MoverMetric(Scorer(tiny_encoder, centering="none", rescale=True).fit_baseline(HYPS, progress=False))
    rescaled.update(HYPS, REFS)
    _, ax = rescaled.plot()
    assert ax.get_ylim()[0] > -1.0  # no lower bound: rescaled scores may go below -1, the axis follows them


def test_reset(fixed_scorer):
    metric = MoverMetric(fixed_scorer)
    metric.update(HYPS[:2], REFS[:2])
    metric.reset()
    assert metric.scores == []
    metric.update(HYPS[2:], REFS[2:])
    with torch.no_grad():
        torch.testing.assert_close(metric.compute(), fixed_scorer(HYPS[2:], REFS[2:]).mean())


def test_forward_is_differentiable_and_state_keeps_no_graph(fixed_scorer):
    metric = MoverMetric(fixed_scorer)
    loss = metric(HYPS[:3], REFS[:3])  # forward: the batch value, with autograd
    assert loss.requires_grad
    loss.backward()
    reference = Scorer(fixed_scorer.encoder, centering="fixed")
    reference.centering.load_state_dict(fixed_scorer.centering.state_dict())
    grads = [p.grad.clone() for p in fixed_scorer.encoder.parameters() if p.grad is not None]
    assert grads and sum(g.abs().sum() for g in grads) > 0
    fixed_scorer.zero_grad(set_to_none=True)
    reference(HYPS[:3], REFS[:3]).mean().backward()
    for g, p in zip(grads, [p for p in fixed_scorer.encoder.parameters() if p.grad is not None]):
        torch.testing.assert_close(g, p.grad)
    metric(HYPS[3:], REFS[3:])
    assert all(not s.requires_grad for s in metric.scores)  # no graph held across steps
    with torch.no_grad():
        torch.testing.assert_close(metric.compute(), fixed_scorer(HYPS, REFS).mean())


def test_built_from_scorer_options_and_argument_checks(tiny_encoder, fixed_scorer):
    metric = MoverMetric(model=tiny_encoder, method="bertscore", direction="f1", sync_on_compute=False)
    assert metric.scorer.config.method == "bertscore" and metric.sync_on_compute is False
    with pytest.raises(ValueError, match="either scorer or Scorer options"):
        MoverMetric(fixed_scorer, method="wmd")
    with pytest.raises(TypeError, match="scorer must be a torchmover.Scorer"):
        MoverMetric("tiny-bert")


def test_compute_before_update_is_nan(fixed_scorer):
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(MoverMetric(fixed_scorer).compute())


def test_plot(fixed_scorer):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    metric = MoverMetric(fixed_scorer, return_per_sample=True)
    values = []
    for i in range(0, len(HYPS), 2):
        metric.update(HYPS[i:i + 2], REFS[i:i + 2])
        values.append(metric.compute())
    fig, ax = metric.plot(values)
    assert fig is not None and ax is not None
    fig, ax = metric.plot()
    assert fig is not None


def test_importing_torchmover_does_not_import_torchmetrics():
    code = "import sys, torchmover; assert 'torchmetrics' not in sys.modules; assert 'torchmover.evaluation.metric' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_missing_torchmetrics_says_what_to_install():
    code = ("import sys; sys.modules['torchmetrics'] = None\n"
            "try:\n    import torchmover.evaluation.metric\nexcept ImportError as e:\n    assert 'pip install torchmover[metrics]' in str(e), e\n"
            "else:\n    raise SystemExit('no ImportError')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_ddp_compute_equals_one_process_on_the_union(fixed_scorer, tmp_path):
    ranks = _ddp.run(_ddp.metric_worker, 2, tmp_path, HYPS, REFS, CORPUS, timeout=90)
    with torch.no_grad():
        single = fixed_scorer(HYPS, REFS)
    for out in ranks:  # every rank gets the global result
        torch.testing.assert_close(out["score"], single.mean())
        torch.testing.assert_close(out["per_sample"], torch.cat([single[0::2], single[1::2]]))  # rank-major
    torch.testing.assert_close(ranks[1]["local"], single[1::2])  # compute() leaves the local state


def test_ddp_batch_centering_compute_equals_one_process_on_the_union(tiny_encoder, tmp_path):
    """Under DDP the mean is over every rank's texts (all-reduce of token sums and counts)."""
    ranks = _ddp.run(_ddp.batch_metric_worker, 2, tmp_path, HYPS, REFS, timeout=90)
    scorer = Scorer(tiny_encoder, centering="batch")
    with torch.no_grad():  # one process, the texts of both ranks (no text is on both ranks here)
        single = scorer(HYPS, REFS)
    for out in ranks:
        torch.testing.assert_close(out["per_sample"], torch.cat([single[0::2], single[1::2]]))
        torch.testing.assert_close(out["score"], single.mean())
    assert [out["n_local"] for out in ranks] == [3, 2]  # each rank keeps only its own texts


def test_ddp_batch_centering_counts_a_text_on_both_ranks_once(tiny_encoder, tmp_path):
    """Texts on both ranks (a reference of several systems' outputs, a sampler's padding repeats): the
    mean over the ranks counts each distinct text once, as one process on the union does (it counted
    them once per rank: ~6e-3 off on the default model)."""
    hyps = ["the cat sat on the mat", "the cat sat on the mat", "the sun is red", "a dog", "the sun is red"]
    refs = ["a cat was on the mat", "a cat was on the mat", "the moon is blue", ["the moon is blue", "a dog runs"],
            "we ran to the old house"]
    ranks = _ddp.run(_ddp.batch_metric_worker, 2, tmp_path, hyps, refs, timeout=90)
    with torch.no_grad():
        single = Scorer(tiny_encoder, centering="batch")(hyps, refs)
    for out in ranks:
        torch.testing.assert_close(out["per_sample"], torch.cat([single[0::2], single[1::2]]))


@pytest.mark.parametrize("centering", ["fixed", "batch"])
def test_errors_name_preds_and_target(fixed_scorer, tiny_encoder, centering):
    metric = MoverMetric(fixed_scorer if centering == "fixed" else Scorer(tiny_encoder, centering="batch"))
    with pytest.raises(ValueError, match="preds and target must have the same length, got 2 and 1"):
        metric.update(["a", "b"], ["a"])
    with pytest.raises(TypeError, match=r"preds\[1\] must be a str"):
        metric.update(["a", 3], ["a", "b"])
    with pytest.raises(ValueError, match=r"target\[0\] is an empty list"):
        metric.update(["a"], [[]])
    with pytest.raises(ValueError, match=r"target\[1\] is not valid Unicode"):
        metric.update(["a", "b"], ["a", "b\udc80"])


@pytest.mark.parametrize("copy", ["clone", "deepcopy", "pickle"])
@pytest.mark.parametrize("centering", ["none", "batch"])
def test_per_sample_stays_1d_in_a_copy(tiny_encoder, copy, centering):
    """A copy of the metric (what torchmetrics collections, Lightning and spawned DDP workers make) keeps
    ``per_sample`` 1-D for a single prediction (the unpickled copy lost it: shape ())."""
    import copy as copy_module
    import pickle

    metric = MoverMetric(Scorer(tiny_encoder, centering=centering), return_per_sample=True)
    make = {"clone": MoverMetric.clone, "deepcopy": copy_module.deepcopy,
            "pickle": lambda m: pickle.loads(pickle.dumps(m))}[copy]
    for m in (metric, make(metric)):
        m.update(["the cat sat"], ["a cat sat"])
        assert m.compute()["per_sample"].shape == (1,)


def step_worker(rank: int, world_size: int, hyps, refs) -> dict:
    """``metric(preds, target)`` with ``dist_sync_on_step=True`` on this rank's slice, for each centering: the
    step value's scores, and whether they keep a graph."""
    out = {}
    for centering in ("none", "batch"):
        metric = MoverMetric(_ddp.sharded_scorer({"centering": centering}), return_per_sample=True,
                             dist_sync_on_step=True)
        value = metric(hyps[rank::world_size], refs[rank::world_size])
        out[centering] = value["per_sample"].detach()
        out[centering + ":grad"] = value["per_sample"].requires_grad
    return out


def test_dist_sync_on_step_gathers_every_ranks_step_value(tmp_path):
    """With ``dist_sync_on_step=True`` the step value holds every rank's batch, in rank order, each scored as
    ``forward`` scores it alone (``batch`` centering: on its batch's mean), this rank's with their graph,
    whatever the centering (``batch`` centering returned this rank's scores alone)."""
    ranks = _ddp.run(step_worker, 2, tmp_path, HYPS[:4], REFS[:4], timeout=90)
    for centering in ("none", "batch"):
        scorer = _ddp.sharded_scorer({"centering": centering})
        with torch.no_grad():
            expected = torch.cat([scorer(HYPS[r:4:2], REFS[r:4:2]) for r in range(2)])
        for out in ranks:
            torch.testing.assert_close(out[centering], expected)
            assert out[centering + ":grad"]
