"""Spans: each text is moved over the columns that hold its units, not its batch's padded width."""
import numpy as np
import pytest
import torch

from torchmover import Scorer
from torchmover.arena import TokenArena
from torchmover.encoding import kept_spans
from torchmover.scorer import Units, length_batches


def test_kept_spans_run_from_the_first_to_past_the_last_true_column():
    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]], dtype=bool)
    assert kept_spans(mask) == [(1, 5), (0, 0), (0, 6), (5, 6)]
    assert kept_spans(np.zeros((2, 0), dtype=bool)) == [(0, 0), (0, 0)]


def _batch(widths, length, dim=3, offset=0):
    """Padded units whose row i holds ``widths[i]`` real units from column 1 on (column 0 a masked
    [CLS]); vector entries number the (row, column) so that a gather can be checked by value."""
    n = len(widths)
    vectors = torch.arange(n * length * dim, dtype=torch.float32).reshape(n, length, dim) + offset
    mask = torch.zeros(n, length, dtype=torch.bool)
    for i, w in enumerate(widths):
        mask[i, 1:1 + w] = True
    spans = [(1, 1 + w) if w else (0, 0) for w in widths]
    return Units(vectors, mask), spans


@pytest.mark.parametrize("build", ["of", "add"])
def test_a_gather_reads_each_text_over_its_span(build):
    first, first_spans = _batch([2, 4, 0], length=6)
    second, second_spans = _batch([1, 3], length=5, offset=1000)
    batches = [(["a", "b", "e"], first, first_spans), (["c", "d"], second, second_spans)]
    if build == "of":
        arena = TokenArena.of(batches)
    else:
        arena = TokenArena(Units)
        for keys, units, spans in batches:
            arena.add(keys, units, spans)
    assert arena.widths() == {"a": 2, "b": 4, "c": 1, "d": 3, "e": 0}
    index, width = arena.index(["c", "a", "e"])
    assert width == 2  # the widest span, not the batches' 6 or 5 columns
    got = arena.gather(torch.tensor(index), 3, width)
    assert got.mask.tolist() == [[True, False], [True, True], [False, False]]
    torch.testing.assert_close(got.vectors[0, 0], second.vectors[0, 1])
    torch.testing.assert_close(got.vectors[1], first.vectors[0, 1:3])


def test_spans_must_lie_within_the_batch():
    units, _ = _batch([2], length=4)
    with pytest.raises(ValueError, match="not within its 4 columns"):
        TokenArena(Units).add(["a"], units, [(1, 5)])
    with pytest.raises(ValueError, match="1 keys for 2 spans"):
        TokenArena(Units).add(["a"], units, [(1, 3), (0, 0)])


def test_compaction_keeps_only_the_spans():
    units, spans = _batch([1, 1, 1], length=8)  # 24 rows written, 3 within spans: holes outnumber them
    arena = TokenArena(Units)
    arena.add(["a", "b", "c"], units, spans)
    before = arena.gather(torch.tensor(arena.index(["c", "a"])[0]), 2, 1)
    arena.compact()
    assert arena.size == 3 and arena.live == 3
    after = arena.gather(torch.tensor(arena.index(["c", "a"])[0]), 2, 1)
    torch.testing.assert_close(after.vectors, before.vectors)


@pytest.mark.parametrize("options", [{}, {"stopwords": ("the", "a")}])
def test_embed_trims_the_columns_no_text_uses_and_reports_each_texts_span(tiny_encoder, options):
    scorer = Scorer(tiny_encoder, centering="none", **options)
    texts = ["the cat sat on the mat", "a dog", "the", ""]
    units, spans = scorer.embed_with_spans(texts)
    full = scorer.encoder(texts, token_policy=None if scorer.config.token_policy_is_identity else scorer._keep_mask)
    assert units.mask.shape[1] == full.mask.any(0).nonzero().max() + 1 - full.mask.any(0).nonzero().min()
    for row, (first, stop) in zip(units.mask, spans):
        assert not row[:first].any() and not row[stop:].any()
        assert stop == first or (row[first] and row[stop - 1])
    assert spans[3] == (0, 0)  # the empty text
    assert (spans[2] == (0, 0)) == bool(options)  # "the" is a stopword or a one-token text


def test_a_batch_of_empty_texts_scores_zero(tiny_scorer):
    scores = tiny_scorer.score(["", " ", "\t"], ["", "  ", ""], batch_size=2, progress=False)
    assert scores.tolist() == [0.0, 0.0, 0.0]


def test_length_batches_sort_longest_first_and_close_a_batch_at_half_the_area():
    lengths = [3, 10, 7, 8, 10, 2, 5, 9]
    batches = length_batches(lengths, batch_size=3)
    assert [[lengths[i] for i in b] for b in batches] == [[10, 10, 9], [8, 7], [5], [3], [2]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:  # each item's square area, padded to its batch's longest, at most doubles
        assert len(b) <= 3 and all(2 * lengths[i] ** 2 >= lengths[b[0]] ** 2 for i in b)
    assert length_batches([], 4) == [] and length_batches([0, 0, 0], 2) == [[0, 1], [2]]

