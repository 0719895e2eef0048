"""Centering modes and the Centering module against naive per-token loops."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchmover import Centering, center


def data(seed=0, batch=3, length=5, dim=4, pad=float("nan"), offset=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, dim, generator=g, dtype=torch.float64) + offset
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    mask = torch.arange(length) < lengths[:, None]
    return x.masked_fill(~mask[..., None], pad), mask


def naive_center(x, mask, mode, mean=None):
    """Token by token, in NumPy."""
    x, mask = x.numpy(), mask.numpy()
    out = np.zeros_like(x)
    real = [(b, i) for b in range(x.shape[0]) for i in range(x.shape[1]) if mask[b, i]]
    if mode == "batch":
        mean = sum(x[b, i] for b, i in real) / len(real)
    for b, i in real:
        if mode == "none":
            out[b, i] = x[b, i]
        elif mode == "dimension":
            out[b, i] = x[b, i] - sum(x[b, i]) / x.shape[2]
        elif mode == "sentence":
            tokens = [x[b, j] for j in range(x.shape[1]) if mask[b, j]]
            out[b, i] = x[b, i] - sum(tokens) / len(tokens)
        else:  # batch, fixed
            out[b, i] = x[b, i] - np.asarray(mean)
    return out


@pytest.mark.parametrize("mode", ["none", "dimension", "sentence", "batch", "fixed"])
def test_center_matches_naive_reference(mode):
    x, mask = data(1, offset=3.0)
    mean = torch.tensor([1.0, -2.0, 0.5, 4.0], dtype=torch.float64) if mode == "fixed" else None
    x_before = x.clone()
    x.requires_grad_()
    out = center(x, mask, mode, mean)
    np.testing.assert_allclose(out.detach().numpy(), naive_center(x_before, mask, mode, mean), rtol=1e-12, atol=1e-12)
    assert torch.equal(x.detach().isnan(), x_before.isnan())  # not modified in place
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[~mask] == 0).all()


def test_center_batch_mode_depends_on_the_batch_but_fixed_does_not():
    x, mask = data(2, offset=1.0)
    alone = center(x[:1], mask[:1], "batch")
    together = center(x, mask, "batch")
    assert (alone - together[:1]).abs().max() > 1e-3
    mean = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(center(x[:1], mask[:1], "fixed", mean), center(x, mask, "fixed", mean)[:1])


def test_center_validates_arguments():
    x, mask = data(3)
    with pytest.raises(ValueError, match="mode"):
        center(x, mask, "corpus")
    with pytest.raises(ValueError, match="mean"):
        center(x, mask, "fixed")
    with pytest.raises(ValueError, match="mean"):
        center(x, mask, "batch", torch.zeros(4))
    with pytest.raises(ValueError, match="mean"):
        center(x, mask, "fixed", torch.zeros(5))


def mean_pairwise_cosine(x, mask):
    u = torch.nn.functional.normalize(x[mask], dim=-1)
    n = u.shape[0]
    gram = u @ u.T
    return float((gram.sum() - gram.diagonal().sum()) / (n * (n - 1)))


def test_batch_centering_removes_the_shared_direction():
    """Vectors with a strong common offset: cosines near 1 before centering, near 0 after."""
    g = torch.Generator().manual_seed(4)
    offset = 10.0 * torch.nn.functional.normalize(torch.randn(16, generator=g, dtype=torch.float64), dim=0)
    x = torch.randn(8, 12, 16, generator=g, dtype=torch.float64) + offset
    mask = torch.arange(12) < torch.randint(4, 13, (8,), generator=g)[:, None]
    assert mean_pairwise_cosine(x, mask) > 0.8
    assert abs(mean_pairwise_cosine(center(x, mask, "batch"), mask)) < 0.03
    assert abs(mean_pairwise_cosine(Centering("batch")(x, mask), mask)) < 0.03
    # dimension centering removes only the all-ones direction, not this offset
    assert mean_pairwise_cosine(center(x, mask, "dimension"), mask) > 0.5


@pytest.mark.parametrize("mode", ["none", "dimension", "sentence", "batch"])
def test_module_stateless_modes_equal_the_function(mode):
    x, mask = data(5)
    module = Centering(mode)
    for training in (True, False):
        module.train(training)
        torch.testing.assert_close(module(x, mask), center(x, mask, mode))
    assert not module.fitted


def test_module_running_mode():
    x1, m1 = data(6, offset=2.0)
    x2, m2 = data(7, offset=-1.0)
    x3, m3 = data(8)
    module = Centering("running", momentum=0.25).double()
    with pytest.raises(RuntimeError, match="fit"):
        module.eval()(x1, m1)
    module.train()
    batch_mean = lambda x, m: torch.as_tensor(x.numpy()[m.numpy()].mean(0))  # noqa: E731
    out1 = module(x1, m1)  # train: batch statistics
    np.testing.assert_allclose(out1.numpy(), naive_center(x1, m1, "batch"), atol=1e-12)
    torch.testing.assert_close(module.mean.double(), batch_mean(x1, m1), atol=1e-6, rtol=0)
    out2 = module(x2, m2)
    np.testing.assert_allclose(out2.numpy(), naive_center(x2, m2, "batch"), atol=1e-12)
    expected = 0.75 * batch_mean(x1, m1) + 0.25 * batch_mean(x2, m2)
    torch.testing.assert_close(module.mean.double(), expected, atol=1e-6, rtol=0)
    assert int(module.num_tokens) == int(m1.sum() + m2.sum())
    module.eval()  # eval: the running mean, no update
    out3 = module(x3, m3)
    np.testing.assert_allclose(out3.numpy(), naive_center(x3, m3, "fixed", module.mean.double().numpy()), atol=1e-12)
    torch.testing.assert_close(module.mean.double(), expected, atol=1e-6, rtol=0)


def test_module_running_mode_gradient_flows_through_the_batch_mean():
    x, mask = data(9, pad=0.0)
    x.requires_grad_()
    out = Centering("running").train()(x, mask)
    out[0, 0, 0].backward()
    n = int(mask.sum())
    expected = torch.zeros_like(x)
    expected[..., 0] = -1.0 / n * mask
    expected[0, 0, 0] += 1.0
    torch.testing.assert_close(x.grad, expected)


def test_module_fixed_mode_fit_exact_mean():
    x, mask = data(10, offset=5.0)
    module = Centering("fixed")
    with pytest.raises(RuntimeError, match="fit"):
        module(x, mask)
    assert module.fit(x, mask) is module and module.fitted
    real = x.numpy()[mask.numpy()]
    np.testing.assert_allclose(module.mean.numpy(), real.mean(0), rtol=1e-6)
    assert int(module.num_tokens) == real.shape[0]
    for training in (True, False):  # fixed: the same in both modes
        module.train(training)
        np.testing.assert_allclose(module(x, mask).numpy(), naive_center(x, mask, "fixed", module.mean.double().numpy()),
                                   atol=1e-12)


def test_module_fit_on_batches_is_the_exact_corpus_mean():
    """Batches of different sizes: the token mean, not the mean of batch means."""
    batches = [data(11, batch=1, length=2, offset=1.0), data(12, batch=4, length=7, offset=-3.0),
               data(13, batch=2, length=3)]
    module = Centering("fixed").fit(iter(batches))
    real = np.concatenate([x.numpy()[m.numpy()] for x, m in batches])
    np.testing.assert_allclose(module.mean.numpy(), real.mean(0), rtol=1e-6)
    assert int(module.num_tokens) == real.shape[0]
    mean_of_means = np.mean([x.numpy()[m.numpy()].mean(0) for x, m in batches], axis=0)
    assert np.abs(mean_of_means - real.mean(0)).max() > 1e-2  # the distinction is real here
    # no mask: every token is real
    plain = torch.randn(2, 3, 4, dtype=torch.float64)
    np.testing.assert_allclose(Centering("fixed").fit(plain).mean.numpy(), plain.reshape(-1, 4).mean(0).numpy(),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="real token"):
        Centering("fixed").fit(plain, torch.zeros(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("mode", ["fixed", "running"])
def test_state_dict_round_trip_into_a_fresh_module(mode):
    x, mask = data(14, offset=2.0)
    module = Centering(mode)
    if mode == "fixed":
        module.fit(x, mask)
    else:
        module.train()(x, mask)
    module.eval()
    fresh = Centering(mode)  # lazily sized: its buffer is empty until loaded
    assert fresh.mean.numel() == 0
    fresh.load_state_dict(module.state_dict())
    fresh.eval()
    assert fresh.fitted and fresh.mean.shape == (4,)
    torch.testing.assert_close(fresh.mean, module.mean)
    assert int(fresh.num_tokens) == int(module.num_tokens)
    torch.testing.assert_close(fresh(x, mask), module(x, mask))


def test_module_validates_arguments():
    with pytest.raises(ValueError, match="mode"):
        Centering("corpus")
    with pytest.raises(ValueError, match="momentum"):
        Centering("running", momentum=0.0)


@pytest.mark.parametrize("mode", ["none", "fixed", "running", "batch"])
def test_shift_is_what_eval_mode_subtracts_from_every_token(mode):
    """``x − shift`` equals the module's eval-mode centering on every real token, to the bit, so a store
    of token vectors can be centered once, row by row."""
    torch.manual_seed(0)
    x, mask = torch.randn(3, 5, 4), torch.rand(3, 5) > 0.3
    module = Centering(mode, dim=4)
    if mode in ("fixed", "running"):
        module.fit(torch.randn(2, 6, 4) + 1)
    module.eval()
    mean = torch.randn(4) if mode == "batch" else None
    shift = module.shift(mean)
    centered = module(x, mask, mean)
    expected = x if shift is None else x - shift
    assert torch.equal(centered[mask], expected[mask])
    assert (shift is None) == (mode == "none")


def test_shift_refuses_what_depends_on_the_tokens():
    for mode in ("sentence", "dimension", "batch"):
        with pytest.raises(ValueError, match="one vector"):
            Centering(mode, dim=4).eval().shift()
    with pytest.raises(ValueError, match="one vector"):
        Centering("none", dim=4).train().shift()
    with pytest.raises(ValueError, match="explicit mean"):
        Centering("fixed", dim=4).eval().shift(torch.zeros(4))
    with pytest.raises(RuntimeError, match="no mean yet"):
        Centering("fixed", dim=4).eval().shift()
