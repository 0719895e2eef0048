"""Ray Data: ScoreBatches (torchmover.integrations.ray) scores a batch of pairs as Scorer.score does, one
scorer per worker; refused where a batch's scores would depend on how Ray cuts the dataset. The last
test runs it through ``Dataset.map_batches`` on a local Ray instance (skipped without ``ray``; CI runs
it in a side environment with ``ray[data]``)."""
import numpy as np
import pytest
import torch

from torchmover import Scorer
from torchmover.integrations.ray import ScoreBatches

HYPS = ["the cat sat on the mat", "a dog barked", "the quick brown fox jumps over the lazy dog", "the sun", "they ran"]
REFS = [["a cat was on the mat", "the cat sat"], "the dog barked", ["a fox jumps over the dog"], "the moon is blue",
        ["we ran", "they ran to the city"]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A scorer with a fitted centering mean, saved: what a Ray worker loads."""
    from conftest import tiny_model, tiny_tokenizer
    from torchmover import Encoder

    scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), centering="fixed")
    scorer.fit_centering([r for g in REFS for r in ([g] if isinstance(g, str) else g)], progress=False)
    path = tmp_path_factory.mktemp("ray-scorer")
    scorer.save_pretrained(path)
    return path


def expected(path, return_all=False):
    scores = Scorer.from_pretrained(path, device="cpu").score(HYPS, REFS, progress=False, return_all=return_all)
    return scores


def numpy_batch():
    refs = np.empty(len(REFS), dtype=object)  # as Ray Data gives a column of lists: arrays of texts
    refs[:] = [np.array(r if isinstance(r, list) else [r], dtype=object) for r in REFS]
    return {"hyp": np.array(HYPS, dtype=object), "ref": refs, "id": np.arange(len(HYPS))}


def test_a_numpy_batch_gets_the_scores_of_score(saved):
    out = ScoreBatches(str(saved))(numpy_batch())
    assert out["score"].dtype == np.float32 and list(out["id"]) == list(range(len(HYPS)))
    torch.testing.assert_close(torch.from_numpy(out["score"]), expected(saved), rtol=0, atol=1e-6)


def test_a_pandas_batch_with_other_columns_and_all_three_directions(saved):
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"candidate": HYPS, "gold": REFS})
    out = ScoreBatches(str(saved), hyps="candidate", refs="gold", output="m", return_all=True)(frame)
    for name, values in zip(("precision", "recall", "f1"), expected(saved, return_all=True)):
        torch.testing.assert_close(torch.tensor(out[f"m_{name}"].to_numpy()), values, rtol=0, atol=1e-6)


def test_scores_that_would_depend_on_the_batching_are_refused(tiny_encoder):
    with pytest.raises(ValueError, match="centering='batch' would center each batch"):
        ScoreBatches(Scorer(tiny_encoder, centering="batch"))
    with pytest.raises(ValueError, match=r"needs IDF \(fit_idf\), the centering mean \(fit_centering\), the rescaling"):
        ScoreBatches(Scorer(tiny_encoder, centering="fixed", idf=True, rescale=True))
    with pytest.raises(TypeError, match="scorer must be"):
        ScoreBatches(3)
    with pytest.raises(KeyError, match="no column 'hyp'"):
        ScoreBatches(Scorer(tiny_encoder, centering="none"))({"text": np.array(["a"])})


def test_references_that_are_not_texts_are_named_by_column_and_row(tiny_encoder):
    """Before, a null or non-text reference raised Python's bare "'NoneType' object is not iterable"."""
    scorer = Scorer(tiny_encoder, centering="none")
    score = ScoreBatches(scorer, refs="gold")
    for bad, error in ((None, ValueError), ("  ", ValueError), (np.nan, TypeError), (3, TypeError)):
        batch = {"hyp": np.array(["a cat", "a dog"], dtype=object), "gold": np.array(["a cat", bad], dtype=object)}
        with pytest.raises(error, match=r"^column 'gold', row 1 of the batch (has no reference|must be a list)"):
            score(batch)
    # a column of equal-length lists may come as a 2-D array: one row of references each, blanks dropped
    out = score({"hyp": np.array(["a cat", "a dog"]), "gold": np.array([["the cat", "a cat sat"], ["dogs", " "]])})
    torch.testing.assert_close(torch.from_numpy(out["score"]),
                               scorer.score(["a cat", "a dog"], [["the cat", "a cat sat"], ["dogs"]], progress=False),
                               rtol=0, atol=1e-6)


def test_map_batches_on_a_local_ray_instance(saved):
    ray = pytest.importorskip("ray")
    import ray.data

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        rows = [{"id": i, "hyp": h, "ref": r if isinstance(r, list) else [r]} for i, (h, r) in enumerate(zip(HYPS, REFS))]
        dataset = ray.data.from_items(rows).map_batches(ScoreBatches, fn_constructor_kwargs={"scorer": str(saved)},
                                                        batch_size=2, concurrency=1)
        scored = sorted(dataset.take_all(), key=lambda row: row["id"])
    finally:
        ray.shutdown()
    assert [row["hyp"] for row in scored] == HYPS
    torch.testing.assert_close(torch.tensor([row["score"] for row in scored]), expected(saved), rtol=0, atol=1e-6)
