"""Distributed batch centering: W gloo processes on slices of a batch == one process on the batch."""
import pytest
import torch

import _ddp
from torchmover.functional.centering import token_mean
from torchmover.functional.centering import global_token_mean
from torchmover.runtime.distributed import all_reduce_sum, is_distributed

# Distinct texts: the scorer encodes each distinct text of a call once, so a text repeated on two
# ranks would count twice in the distributed mean and once in the single-process one.
HYPS = ["the cat sat on the mat", "a dog barked", "the sun is red", "they ran to the city",
        "a small child eats food", "the quick brown fox"]
REFS = ["a cat was on the mat", ["the dog barked", "a dog runs"], "the moon is blue",
        "we ran to the old house", "the child eats", ["a fox jumps over the lazy dog", "quick fox"]]


def test_local_fallback_is_token_mean_bit_for_bit():
    torch.manual_seed(0)
    x, mask = torch.randn(3, 5, 4, requires_grad=True), torch.rand(3, 5) > 0.3
    assert not is_distributed()
    assert torch.equal(global_token_mean(x, mask), token_mean(x, mask))
    mean, count = global_token_mean(x, mask, return_count=True)
    assert count == int(mask.sum())
    y = torch.randn(4)
    assert all_reduce_sum(y) is y


def test_global_token_mean_without_tokens_is_zero():
    assert torch.equal(global_token_mean(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.bool)), torch.zeros(4))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _ddp.run(_ddp.centering_worker, 2, tmp_path_factory.mktemp("ddp"), HYPS, REFS, timeout=90)


@pytest.mark.parametrize("mode", ["batch", "running"])
def test_two_processes_match_one_process_on_the_whole_batch(two_ranks, mode):
    single = _ddp.loss_and_grad(_ddp.tiny_scorer(mode), HYPS, REFS)
    for rank, out in enumerate(two_ranks):
        torch.testing.assert_close(out[mode]["scores"], single["scores"][rank::2])
        # the running estimate (and its token count) is the global one, identical on every rank
        torch.testing.assert_close(out[mode]["mean"], single["mean"])
        assert int(out[mode]["num_tokens"]) == int(single["num_tokens"])
    torch.testing.assert_close(sum(out[mode]["loss"] for out in two_ranks), single["loss"])
    # each rank's backward carries the other ranks' dependence on the shared mean (the all-reduce's
    # backward), so the gradients summed over ranks are those of the single process
    total_grad = sum(out[mode]["grad"] for out in two_ranks)
    assert single["grad"].abs().sum() > 0
    torch.testing.assert_close(total_grad, single["grad"], rtol=1e-4, atol=1e-6)


def test_a_mean_over_ranks_is_no_ranks_one_text_own(two_ranks):
    """``ngram=2``: each rank's call holds one text (against itself), so each rank's own mean is that
    text's, whose one bigram would be 0 — but the mean is over both ranks' texts, as in one process
    on the whole batch: there it is neither text's own, and the bigrams are moved as they are."""
    single = _ddp.loss_and_grad(_ddp.tiny_scorer("batch", **_ddp.BIGRAMS), _ddp.LONE_TEXTS, _ddp.LONE_TEXTS)
    assert (single["scores"] != 0).all()
    for rank, out in enumerate(two_ranks):
        torch.testing.assert_close(out["bigrams"]["scores"], single["scores"][rank::2])


def test_without_sync_each_rank_centers_on_its_own_slice(two_ranks):
    """The control: the comparison above has teeth."""
    single = _ddp.loss_and_grad(_ddp.tiny_scorer("batch"), HYPS, REFS)
    assert not torch.allclose(two_ranks[0]["batch_nosync"]["scores"], single["scores"][0::2], atol=1e-4)
    torch.testing.assert_close(two_ranks[0]["eval_rank0"], two_ranks[0]["batch_nosync"]["scores"])


# --- corpus statistics fitted over ranks ---------------------------------------------------------------

CORPUS = ["the cat sat on the mat", "a dog barked in the house", "the quick brown fox jumps over the lazy dog",
          "she eats good food", "the sun is big and red", "a small child", "they ran to the old city"]


@pytest.fixture(scope="module")
def fitted_on_two_ranks(tmp_path_factory):
    return _ddp.run(_ddp.fit_worker, 2, tmp_path_factory.mktemp("ddp_fit"), CORPUS, HYPS, REFS, timeout=120)


def test_fits_on_two_ranks_equal_the_single_process_fit(fitted_on_two_ranks):
    from torchmover import Encoder, Scorer
    from torchmover.reward.rewards import MoverReward
    from conftest import tiny_model, tiny_tokenizer

    scorer = _ddp.tiny_scorer("fixed").eval().fit_centering(CORPUS, progress=False)
    idf_scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), centering="none", idf=True)
    idf_scorer.fit_idf(CORPUS, HYPS)
    reward = MoverReward(_ddp.tiny_scorer("batch").eval()).fit(CORPUS)
    one_text = _ddp.tiny_scorer("fixed").eval().fit_centering(CORPUS[:1], progress=False)
    for out in fitted_on_two_ranks:
        torch.testing.assert_close(out["mean"], scorer.centering.mean, rtol=0, atol=1e-7)
        assert int(out["num_tokens"]) == int(scorer.centering.num_tokens)
        torch.testing.assert_close(out["reward_mean"], reward.centering.mean, rtol=0, atol=1e-7)
        torch.testing.assert_close(out["reward"], reward(HYPS, REFS), rtol=0, atol=1e-6)
        assert out["idf_ref"] == idf_scorer.idf["ref"].to_dict() and out["idf_hyp"] == idf_scorer.idf["hyp"].to_dict()
        torch.testing.assert_close(out["one_text_mean"], one_text.centering.mean, rtol=0, atol=1e-7)  # rank 1: no text
        assert "every rank must fit on the same texts" in out["mismatch"]
    # each rank encoded (and cached) only its share: texts[rank::2]
    assert [int(out["cached"]) for out in fitted_on_two_ranks] == [4, 3]
