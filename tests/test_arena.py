"""Spans: each text is moved over the columns that hold its units, not its batch's padded width."""
import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from torchmover import Scorer
from torchmover._internal.arena import TokenArena, flat_rows
from torchmover.text.encoder import kept_spans, template_spans
from optrace import OpTrace
from torchmover.scorer.plan import length_batches
from torchmover.scorer.units import Units


def test_kept_spans_run_from_the_first_to_past_the_last_true_column():
    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]], dtype=bool)
    assert kept_spans(mask) == [(1, 5), (0, 0), (0, 6), (5, 6)]
    assert kept_spans(np.zeros((2, 0), dtype=bool)) == [(0, 0), (0, 0)]


@pytest.mark.parametrize("before,after", [(1, 1), (2, 1), (0, 1), (1, 0), (0, 0)])
def test_template_spans_are_the_kept_spans_of_the_mask_without_the_special_tokens(before, after):
    lengths = list(range(before + after + 4)) + [9, 0, before + after, before + after + 1]
    width = max(lengths)
    columns = np.arange(width)
    lengths_column = np.array(lengths)[:, None]
    mask = (columns >= before) & (columns < lengths_column - after)  # padding and the special tokens dropped
    assert template_spans(lengths, before, after) == kept_spans(mask)


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


def _naive_gather(batches, keys):
    """Reference: each key's units sliced out of its batch over its span, padded to the widest."""
    found = {key: (units.vectors[i], units.mask[i], span)
             for batch_keys, units, spans in batches for i, (key, span) in enumerate(zip(batch_keys, spans))}
    width = max(found[key][2][1] - found[key][2][0] for key in keys)
    vectors = torch.zeros(len(keys), width, found[keys[0]][0].shape[-1])
    mask = torch.zeros(len(keys), width, dtype=torch.bool)
    for i, key in enumerate(keys):
        x, m, (first, stop) = found[key]
        vectors[i, :stop - first], mask[i, :stop - first] = x[first:stop], m[first:stop]
    return vectors, mask


def _gather(arena, keys):
    where = arena.index(keys)
    return arena.gather(torch.tensor(where.rows), where)


def _assert_gathers(arena, batches, keys):
    got = _gather(arena, keys)
    vectors, mask = _naive_gather(batches, keys)
    assert got.mask.tolist() == mask.tolist()
    torch.testing.assert_close(torch.where(got.mask.unsqueeze(-1), got.vectors, 0.0), vectors)


def _store(build, batches, **options):
    arena = TokenArena(Units, **options)
    for keys, units, spans in batches:
        getattr(arena, build)(keys, units, spans)
    return arena


@pytest.mark.parametrize("zero_padding", [False, True])
@pytest.mark.parametrize("build", ["append", "add"])
def test_a_gather_reads_each_text_over_its_span_in_any_order(build, zero_padding):
    first, first_spans = _batch([2, 4, 0], length=6)
    second, second_spans = _batch([1, 3], length=5, offset=1000)
    batches = [(["a", "b", "e"], first, first_spans), (["c", "d"], second, second_spans)]
    arena = _store(build, batches, zero_padding=zero_padding)
    assert arena.widths() == {"a": 2, "b": 4, "c": 1, "d": 3, "e": 0}
    for keys in (["c", "a", "e"], ["d", "c", "e", "b", "a"], ["e", "c"], ["a", "e", "b"], ["b", "d", "b"]):
        where = arena.index(keys)
        assert where.width == max(arena.widths()[k] for k in keys)  # the widest span, not the batches' 6 or 5
        assert where.n == len(keys)
        _assert_gathers(arena, batches, keys)


def test_append_keeps_only_the_rows_of_the_spans_in_one_block_and_capacity_sizes_it():
    full, spans = _batch([2, 4, 3], length=7)
    trimmed = Units(full.vectors[:, 1:6], full.mask[:, 1:6])  # columns cut off as Scorer.embed does
    second, second_spans = _batch([1, 2], length=4, offset=1000)
    batches = [(["a", "b", "c"], trimmed, [(a - 1, b - 1) for a, b in spans]), (["d", "e"], second, second_spans)]
    grown, sized = _store("append", batches), _store("append", batches, capacity=12)
    # only the rows within the spans are written (2 + 4 + 3, then 1 + 2), not the batches' padded 3 x 5 and 2 x 4
    assert grown.written == grown.live == sized.written == 12
    assert grown.fields[0].shape[0] == 18 and sized.fields[0].shape[0] == 12  # 9 rows, doubled; made to size
    assert grown.fields[0].data_ptr() != trimmed.vectors.data_ptr()  # a copy: the batch can be freed
    for arena in (grown, sized):
        _assert_gathers(arena, batches, ["e", "a", "d", "c", "b"])
        with OpTrace() as trace:
            arena.gather(torch.tensor(arena.index(["e", "a"]).rows), arena.index(["e", "a"]))
        assert [op.name for op in trace.kernel_ops].count("aten::index_select") == 2  # one per field


@pytest.mark.parametrize("zero_padding", [False, True])
def test_a_selecting_gather_reads_the_selected_texts(zero_padding):
    """``gather(rows, where, select)`` equals the gather's rows ``select`` (each text as often as it is
    selected, in that order), without gathering the unselected result."""
    first, first_spans = _batch([2, 4, 0], length=6)
    second, second_spans = _batch([1, 3], length=5, offset=1000)
    arena = _store("add", [(["a", "b", "e"], first, first_spans), (["c", "d"], second, second_spans)],
                   zero_padding=zero_padding)
    where = arena.index(["c", "a", "e", "d"])
    rows, select = torch.tensor(where.rows), torch.tensor([3, 0, 0, 2, 1, 3])
    got, expected = arena.gather(rows, where, select), arena.gather(rows, where).select(select)
    assert torch.equal(got.mask, expected.mask) and torch.equal(got.vectors, expected.vectors)
    assert got.mask.shape == (6, 3)


@pytest.mark.parametrize("step", [1, 3, 4, 100])
@pytest.mark.parametrize("build", ["append", "add"])
def test_flat_reads_the_units_of_the_texts_without_padding_in_bounded_pieces(build, step):
    first, first_spans = _batch([2, 4, 0], length=6)
    second, second_spans = _batch([1, 3], length=5, offset=1000)
    batches = [(["a", "b", "e"], first, first_spans), (["c", "d"], second, second_spans)]
    arena = _store(build, batches)
    keys = ["d", "a", "e", "b"]
    pieces = list(arena.flat(keys, step=step))
    vectors, mask = _naive_gather(batches, keys)
    got = torch.cat([p.vectors for p in pieces])
    assert got.shape[0] == 3 + 2 + 0 + 4 and all(p.mask.all() for p in pieces)  # every unit, none of the padding
    torch.testing.assert_close(got, vectors[mask])
    assert all(p.mask.shape[0] <= max(step, 4) for p in pieces)  # at most step rows, or one longer text
    rows = [p.mask.shape[0] for p in pieces]
    assert all(a + b > step for a, b in zip(rows, rows[1:]))  # greedy: no two neighbours would fit in one
    assert list(arena.flat([])) == []


def test_transform_rewrites_every_written_row_once_and_leaves_the_zero_row_zero():
    first, first_spans = _batch([2, 4, 0], length=6, offset=1)
    second, second_spans = _batch([1, 3], length=5, offset=1000)
    batches = [(["a", "b", "e"], first, first_spans), (["c", "d"], second, second_spans)]
    arena = _store("append", batches, zero_padding=True, capacity=64)
    seen = []

    def double(x, mask):
        seen.append(x.shape[0])
        x.mul_(2)
    arena.transform_(double, step=4)
    assert seen == [4, 4, 3]  # the 1 + 10 rows written (the zero row, then the units), 4 at a time, not the 64
    where = arena.index(["d", "a"])
    got = arena.gather(torch.tensor(where.rows), where)
    vectors, mask = _naive_gather(batches, ["d", "a"])
    torch.testing.assert_close(got.vectors, 2 * vectors)  # padding: the zero row, still zero
    TokenArena(Units).transform_(double)  # an empty arena: nothing to do
    assert seen == [4, 4, 3]


def test_flat_rows_is_a_view_when_the_columns_are_evenly_strided_and_a_copy_otherwise():
    x = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    flat, pitch = flat_rows(x[:, 1:4])
    assert pitch == 5 and flat.data_ptr() == x[:, 1:4].data_ptr()
    torch.testing.assert_close(flat[1 * pitch + 2], x[1, 3])
    flat, pitch = flat_rows(x.transpose(0, 1))  # [5, 2, 3]: a column is not a row of its own
    assert pitch == 2 and flat.is_contiguous()
    torch.testing.assert_close(flat[3 * pitch + 1], x[1, 3])


def test_a_batch_of_empty_texts_holds_no_rows():
    empty = Units(torch.zeros(2, 0, 3), torch.zeros(2, 0, dtype=torch.bool))
    full, spans = _batch([2], length=3)
    batches = [(["x", "y"], empty, [(0, 0), (0, 0)]), (["a"], full, spans)]
    arena = _store("append", batches)
    assert arena.written == 2
    _assert_gathers(arena, batches, ["x", "a", "y"])
    assert _gather(arena, ["y", "x"]).mask.shape == (2, 0)
    assert arena.all_have_units(["a"]) and not arena.all_have_units(["a", "y"]) and arena.all_have_units([])


@pytest.mark.parametrize("build", ["append", "add"])
def test_spans_must_lie_within_the_batch(build):
    units, _ = _batch([2], length=4)
    with pytest.raises(ValueError, match="not within its 4 columns"):
        getattr(TokenArena(Units), build)(["a"], units, [(1, 5)])
    with pytest.raises(ValueError, match="1 keys for 2 spans"):
        getattr(TokenArena(Units), build)(["a"], units, [(1, 3), (0, 0)])


def test_compaction_keeps_only_the_spans_and_later_adds_grow_the_compacted_block():
    first, first_spans = _batch([1, 1, 1], length=8)  # 24 rows written, 3 within spans: holes outnumber them
    second, second_spans = _batch([3], length=4, offset=2000)
    batches = [(["a", "b", "c"], first, first_spans), (["f"], second, second_spans)]
    arena = _store("add", batches[:1])
    before = _gather(arena, ["c", "a"])
    arena.remove("b")
    arena.compact()
    assert arena.written == arena.live == 2
    torch.testing.assert_close(_gather(arena, ["c", "a"]).vectors, before.vectors)
    arena.add(*batches[1])
    _assert_gathers(arena, batches, ["f", "a", "c"])


def test_zero_padding_reads_zeros_after_adds_compaction_and_clear():
    """A token cloud's padding must be exactly 0 (the transport relies on it): with ``zero_padding`` the
    block keeps row 0 zero (mask False), where a gather's padding reads from, through compaction and
    clearing, so a gather is one ``index_select`` per field, nothing to mask. Every stored vector
    entry here is non-zero."""
    first, first_spans = _batch([2, 4], length=6, offset=1)
    second, second_spans = _batch([1, 3], length=5, offset=1000)
    batches = [(["a", "b"], first, first_spans), (["c", "d"], second, second_spans)]
    plain = _store("add", batches[:1])
    padding = ~_gather(plain, ["a", "b"]).mask
    assert _gather(plain, ["a", "b"]).vectors[padding].abs().min() > 0  # without it: row 0's units
    arena = TokenArena(Units, zero_padding=True)
    for step, keys in (("add", ["d", "a", "c", "b"]), ("compact", ["c", "a", "d"]), ("clear", ["d", "c"])):
        if step == "add":
            for batch in batches:
                arena.add(*batch)
        elif step == "compact":
            arena.remove("b")
            arena.compact()
            assert arena.written == arena.live + 1 == 7  # compacted: the live rows after the zero row
        else:
            arena.clear()
            arena.add(*batches[1])
        where = arena.index(keys)
        rows = torch.tensor(where.rows)
        with OpTrace() as trace:
            got = arena.gather(rows, where)
        assert [op.name for op in trace.kernel_ops] == ["aten::index_select", "aten::view"] * 2  # padding: row 0
        assert (~got.mask).any() and torch.equal(got.vectors[~got.mask], torch.zeros_like(got.vectors[~got.mask]))
        _assert_gathers(arena, batches, keys)


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
    batches = length_batches(lengths, batch_size=3, squares=True)  # a budget of 3 x 2 x 8 (the median)
    assert [[lengths[i] for i in b] for b in batches] == [[10, 10, 9, 8], [7, 5], [3], [2]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:  # within the budget; padded to its batch's longest, an item's square area at most doubles
        assert len(b) * lengths[b[0]] <= 48 and all(2 * lengths[i] ** 2 >= lengths[b[0]] ** 2 for i in b)
    assert [[lengths[i] for i in b] for b in length_batches(lengths, batch_size=3)] == [[10, 10, 9], [8, 7, 5, 3, 2]]
    assert length_batches([], 4, squares=True) == [] and length_batches([0, 0, 0], 2, squares=True) == [[0, 1, 2]]


KEYS = "abcde"


class ArenaAgainstADict(RuleBasedStateMachine):
    """Generated sequences of adds, appends, removals, compactions, transforms and clears, each read
    back (gathered, selected, flat, its units counted) against a dict of each text's rows sliced out of its batch: the
    arena's bookkeeping (spans, holes, growth, the zero row) never loses or mixes up a unit. Batches
    come contiguous or as columns cut from a wider batch (the view that ``flat_rows`` reads without a
    copy), their fields cut alike or differently (the copy it falls back on)."""

    @initialize(zero_padding=st.booleans(), capacity=st.sampled_from([0, 1, 7, 64]), weights=st.booleans())
    def start(self, zero_padding, capacity, weights):
        self.arena = TokenArena(Units, zero_padding=zero_padding, capacity=capacity)
        self.weights = weights
        self.model: dict[str, Units] = {}  # key -> its rows: vectors [w, 3], mask [w], hyp_weights [w] or None

    @rule(data=st.data(), build=st.sampled_from(["add", "append"]))
    def store(self, data, build):
        keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True), label="keys")
        n, width = len(keys), data.draw(st.integers(0, 8), label="width")
        cut = [data.draw(st.integers(0, 2), label="columns cut before") for _ in range(3)]
        values = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))

        def field(shape, k):  # a [n, width, ...] field, as columns cut[k] on of a wider batch
            return torch.rand((n, width + cut[k] + 1, *shape), generator=values)[:, cut[k]:cut[k] + width]
        vectors, mask = field((3,), 0) - 0.5, field((), 1) < 0.8
        hyp_weights = field((), 2) if self.weights else None
        spans = []
        for _ in keys:
            first = data.draw(st.integers(0, width), label="span start")
            spans.append((first, data.draw(st.integers(first, width), label="span stop")))
        getattr(self.arena, build)(keys, Units(vectors, mask, hyp_weights), spans)
        for i, (key, (first, stop)) in enumerate(zip(keys, spans)):
            self.model[key] = Units(*(None if t is None else t[i, first:stop].clone()
                                      for t in (vectors, mask, hyp_weights)))

    @rule(keys=st.sets(st.sampled_from(KEYS)))
    def remove(self, keys):
        for key in keys:
            self.arena.remove(key)
            self.model.pop(key, None)

    @rule()
    def compact(self):
        self.arena.compact()
        holes = self.arena.written - int(self.arena.zero_padding) - self.arena.live
        assert self.arena.fields is None or holes <= self.arena.live  # the holes no longer outnumber the units

    @rule()
    def clear(self):
        self.arena.clear()
        self.model.clear()

    @rule()
    def transform(self):
        self.arena.transform_(lambda x, mask: x.add_(mask.unsqueeze(-1).to(x.dtype)), step=5)
        self.model = {key: u._replace(vectors=u.vectors + u.mask.unsqueeze(-1)) for key, u in self.model.items()}

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def gather(self, data):
        keys = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, max_size=6), label="read")
        where = self.arena.index(keys)
        rows = torch.tensor(where.rows)
        select = data.draw(st.none() | st.lists(st.integers(0, len(keys) - 1), min_size=1, max_size=4), label="select")
        got = self.arena.gather(rows, where, None if select is None else torch.tensor(select))
        read = keys if select is None else [keys[i] for i in select]
        assert got.mask.shape == (len(read), max(len(self.model[k].mask) for k in keys))
        for i, key in enumerate(read):
            expected, w = self.model[key], len(self.model[key].mask)
            assert torch.equal(got.mask[i, :w], expected.mask) and not got.mask[i, w:].any()
            assert torch.equal(got.vectors[i, :w], expected.vectors)  # a copy: bit-equal
            if self.weights:
                assert torch.equal(got.hyp_weights[i, :w], expected.hyp_weights)
            else:
                assert got.hyp_weights is None
            if self.arena.zero_padding:  # the padding read from the zero row
                assert not got.vectors[i, w:].any()

    @precondition(lambda self: self.model)
    @rule(data=st.data(), step=st.integers(1, 8))
    def flat(self, data, step):
        keys = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=5), label="read")
        pieces = list(self.arena.flat(keys, step=step))
        expected = [self.model[k] for k in keys]
        greedy = []  # each piece: texts in order while their rows fit in step, at least one
        for width in (len(u.mask) for u in expected):
            if greedy and greedy[-1] + width <= step:
                greedy[-1] += width
            else:
                greedy.append(width)
        assert [len(p.mask) for p in pieces] == greedy
        if not keys:
            return
        assert torch.equal(torch.cat([p.vectors for p in pieces]), torch.cat([u.vectors for u in expected]))
        assert torch.equal(torch.cat([p.mask for p in pieces]), torch.cat([u.mask for u in expected]))

    @rule(data=st.data())
    def unit_counts(self, data):
        keys = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=5) if self.model else st.just([]),
                         label="counted")
        assert self.arena.unit_counts(keys).tolist() == [int(self.model[k].mask.sum()) for k in keys]

    @invariant()
    def bookkeeping(self):
        assert self.arena.widths() == {key: len(u.mask) for key, u in self.model.items()}
        assert self.arena.live == sum(len(u.mask) for u in self.model.values())
        if self.arena.fields is not None:
            assert self.arena.written <= self.arena.fields[0].shape[0]
            if self.arena.zero_padding:
                assert not self.arena.fields[0][0].any() and not self.arena.fields[1][0]


TestArenaAgainstADict = ArenaAgainstADict.TestCase
TestArenaAgainstADict.settings = settings(max_examples=8 * settings().max_examples)  # cheap cases: 8x the profile's
