"""Scoring large lists (:meth:`Scorer.score <torchmover.Scorer.score>`): no graph, every distinct text
encoded once, pairs scored in length-sorted batches gathered from a device arena, and, under
``torch.distributed``, each rank scoring a share of the pairs.

As the peers do it: the pairs are taken in chunks of ``SCORE_CHUNK`` hypotheses and at most
``SCORE_CHUNK_REFERENCES`` references (:func:`score_chunks`, in input order); every distinct
text of a chunk is tokenized and encoded once, in batches of similar token count, longest first,
each of at most ``batch_size`` texts and ``batch_size`` × twice the median text's token count of
padded tokens (:func:`~torchmover.scorer.plan.length_batches`), each batch's units copied into the
one block of a :class:`~torchmover._internal.arena.TokenArena` (only the rows of its texts' units:
:meth:`~torchmover._internal.arena.TokenArena.append`). Where each unit's centered unit vector
depends on nothing but itself (no centering, a fitted mean, or the call's ``batch`` mean), every
unit is then centered and normalised there once (:func:`unit_vectors_once`). Then the chunk's pairs
are scored in batches of similar length, by the length of their longest text in units, under the
same token budget alone (pairs × their longest text: about ``2 · batch_size`` pairs of the median
length, more short ones, fewer long ones), each closing where padding would more than double a
pair's square problem (:func:`~torchmover.scorer.plan.length_batches` with ``squares``), each
gathered from the arena (one ``index_select`` per field) by a
:class:`~torchmover.scorer.plan.BatchPlan` built on the host; the plans of a chunk are sent in one
transfer. The scores stay on the device until the end: nothing in the loop waits for it.

Memory is bounded by the chunk: its arena (the units of its distinct texts, no padding) and one
encoder batch's working memory, which grows with the batch's padded area, bounded by the budget.
Texts are encoded longest first so that each batch's working memory fits in what the batches before
it freed (shortest first, every batch would need more than any before it, and the allocator would
keep growing the heap). An encoder batch also holds at most ``batch_size`` texts: most batches then
pad to less than the budget, and the call's peak stays lower than with batches all filled to it
(measured on the CPU: the performance guide). On the CPU the batches' working memory comes from the C
heap, whose allocator keeps what they free, more than the next batches need; the heap's free pages
are handed back to the system after each quarter of the chunk's tokens is encoded
(:func:`~torchmover.runtime.heap.release_free_heap`, ``HEAP_TRIMS`` times a chunk), so that the
resident set does not hold them beside the growing block.

Under ``batch`` centering a first pass computes the mean of every real token of the call's distinct
texts (:func:`call_means`), the set that ``Scorer.forward`` on the whole list centers on, so both give
the same scores whatever the batch size. It sums the units of each chunk's arena, never padding the
call's texts to one width. (A call of more than ``SCORE_CHUNK`` hypotheses encodes all but its last chunk
twice, once for the mean, to bound memory.)

**Sharded** (``distributed=True`` under ``torch.distributed``): every rank passes the same list; each
chunk is cut into one contiguous share per rank, balanced by token count (:func:`chunk_share`: pairs
vary tenfold in length, so equal pair counts would leave ranks idle), each rank encodes and scores its
share, and the shares are gathered in rank order, so every rank returns the scores of the whole list
in input order. The ``batch`` centering mean is that of one process: each distinct text is counted
by one rank, the one whose share holds its first pair (:func:`owned_texts`), and the sums are
all-reduced once. With ``centering_group`` each rank passes a list of its own and the mean is over
every rank's texts: a text on several ranks is counted once too, by the first rank that holds it
(:func:`lower_ranks_texts`), so the mean is that of one process on every rank's lists.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol, Sequence, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from .._internal.arena import TokenArena
from .._internal.transfer import send_plans
from ..functional.centering import Centering, token_sum
from ..functional.family import unit_vectors_
from ..functional.members import get_member
from ..runtime.distributed import all_gather_shares, all_reduce_sum, differing_on_ranks, is_distributed
from ..runtime.heap import release_free_heap
from ..runtime.progress import PairProgress
from ..text.encoder import Encoder, take_tokens
from .config import ScorerConfig
from .inputs import distinct_texts
from .plan import BatchPlan, CallPlan, call_plan, length_batches
from .signature import signature_diff
from .units import PRF, BatchMeans, Units


class CorpusScorer(Protocol):
    """What the functions here read of a :class:`~torchmover.Scorer` (a protocol, so that this module
    does not import the scorer's, which imports it)."""

    config: ScorerConfig
    encoder: Encoder
    centering: Centering
    training: bool

    @property
    def signature(self) -> str: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def tokenize(self, texts: Sequence[str]) -> Any: ...

    def embed_with_spans(self, texts: Sequence[str], tokenized=None) -> tuple[Units, list[tuple[int, int]]]: ...

    def score_call(self, plan: CallPlan, units: Units, *, return_all: bool = False, means: BatchMeans | None = None,
                   nonempty: bool = False, unit_vectors: bool = False) -> Tensor | PRF: ...


HEAP_TRIMS = 4  # on the CPU, the C heap's free pages go back to the system after each quarter of a chunk's tokens
SCORE_CHUNK = 8192  # hypotheses whose distinct texts Scorer.score encodes and holds at once
SCORE_CHUNK_REFERENCES = 4 * SCORE_CHUNK  # and references (at least one hypothesis a chunk)


def score_chunks(groups: list[list[str]]) -> list[slice]:
    """The chunks of a call, in input order: consecutive hypotheses, at most ``SCORE_CHUNK`` of them
    and, past the first, at most ``SCORE_CHUNK_REFERENCES`` references."""
    chunks, start, references = [], 0, 0
    for i, group in enumerate(groups):
        if i > start and (i - start == SCORE_CHUNK or references + len(group) > SCORE_CHUNK_REFERENCES):
            chunks.append(slice(start, i))
            start, references = i, 0
        references += len(group)
    if start < len(groups):
        chunks.append(slice(start, len(groups)))
    return chunks


def score_corpus(scorer: CorpusScorer, hyps: list[str], groups: list[list[str]], batch_size: int = 64,
                 progress: bool | None = None, *, return_all: bool = False, centering_group=None,
                 distributed: bool = False) -> Tensor | PRF:
    """:meth:`Scorer.score <torchmover.Scorer.score>` of ``scorer`` (a :class:`~torchmover.Scorer`; see
    there and the module docs) on lists it has checked: ``hyps`` and one list of references each."""
    check_batch_size(batch_size)
    group = sharding_group(scorer, distributed, centering_group)
    if group is not None:
        check_same_call(scorer, hyps, groups, return_all, group)
    chunks = [(hyps[run], groups[run]) for run in score_chunks(groups)]
    centered = scorer.config.centering == "batch"
    with eval_mode(scorer), PairProgress(len(hyps), progress) as bar:
        bar.plan(len(hyps) + (len(hyps) - len(chunks[-1][0]) if centered and chunks else 0))  # pairs encoded
        means, kept = None, None  # kept: the last chunk's arena and share, encoded by the first pass
        if centered:
            means, *kept = call_means(scorer, chunks, batch_size, group=group, sum_group=centering_group, bar=bar)
        parts = []
        for c in reversed(range(len(chunks))):  # the last chunk first: its arena is at hand
            # kept: call_means's arena and share of the last chunk
            arena, share = cast(tuple[TokenArena | None, Share | None], kept) if kept and c == len(chunks) - 1 \
                else (None, None)
            parts.append(score_chunk(scorer, *chunks[c], batch_size, means=means, return_all=return_all, group=group,
                                     arena=arena, share=share, bar=bar))
            kept = None
    out = torch.cat(parts[::-1], dim=1).cpu() if parts else torch.zeros(3 if return_all else 1, 0, device="cpu")
    return PRF(*out) if return_all else out[0]


def check_same_call(scorer: CorpusScorer, hyps: list[str], groups: list[list[str]], return_all: bool, group) -> None:
    """Raise ``ValueError`` on every rank of ``group`` unless every rank called with what its share of the
    scores depends on: the same lists, the same ``return_all``, a scorer of the same
    :attr:`~torchmover.Scorer.signature` (every option that changes a score, the fitted IDF, centering
    mean and baseline by digest, the encoder's dtype, the library versions), and the same chunk sizes
    (which set the collectives). ``batch_size`` may differ: no score depends on it. The message names
    what differs (a signature by its fields, from rank 0 and the first rank that differs). One
    all-reduce of digests (:func:`differing_on_ranks`); one all-gather more where the signatures differ."""
    signature = scorer.signature
    differing = differing_on_ranks({"hyps and refs": [hyps, groups], "return_all": return_all,
                                    "scorer signature": signature,
                                    "SCORE_CHUNK": [SCORE_CHUNK, SCORE_CHUNK_REFERENCES]}, scorer.encoder.device, group)
    if "scorer signature" in differing:
        differing[differing.index("scorer signature")] = "scorer signature (" + signature_fields_differing(
            signature, group) + ")"
    if differing:
        raise ValueError("score(distributed=True): every rank must pass the same hyps and refs, with the same "
                         "return_all, to a scorer of the same signature (each scores a share of the pairs); "
                         f"these differ between the ranks: {'; '.join(differing)}")


def signature_fields_differing(signature: str, group) -> str:
    """The fields in which some rank's ``signature`` differs from rank 0's, with both values, named for the
    first rank that differs: the same text on every rank (one ``all_gather_object``)."""
    every: list[str] = [""] * dist.get_world_size(group)
    dist.all_gather_object(every, signature, group=group)
    rank = next(r for r, other in enumerate(every) if other != every[0])
    return ", ".join(f"{field}: {ours or '(absent)'} on rank 0, {theirs or '(absent)'} on rank {rank}"
                     for field, (ours, theirs) in signature_diff(every[0], every[rank]).items())


def check_batch_size(batch_size) -> None:
    if type(batch_size) is not int or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def sharding_group(scorer: CorpusScorer, distributed: bool, centering_group=None):
    """The process group that shares out a call: the world under ``distributed=True`` in a
    ``torch.distributed`` job of more than one process, else None (``distributed=True`` outside one
    is a one-process call). Checks the options."""
    if not isinstance(distributed, bool):
        raise ValueError(f"distributed must be True or False, got {distributed!r}")
    if distributed and centering_group is not None:
        raise ValueError("give distributed=True (every rank passes the whole list, each scores a share) or "
                         "centering_group (each rank scores its own list on a mean over all ranks), not both")
    return dist.group.WORLD if distributed and is_distributed() else None


@contextlib.contextmanager
def eval_mode(scorer: CorpusScorer) -> Iterator[None]:
    """``scorer`` in eval mode inside the block, its mode restored after."""
    was_training = scorer.training
    scorer.eval()
    try:
        yield
    finally:
        scorer.train(was_training)


class Share(NamedTuple):
    """This rank's contiguous share ``[start, stop)`` of a chunk's pairs, and every rank's ``sizes``."""

    start: int
    stop: int
    sizes: list[int]


def chunk_share(scorer: CorpusScorer, hyps: list[str], groups: list[list[str]], group=None) -> Share:
    """This rank's share of the pairs ``(hyps, groups)`` among the ranks of ``group`` (all of them
    outside one): contiguous, balanced by token count (:func:`balanced_bounds` of each pair's tokens,
    its hypothesis and references, counted by the tokenizer: a pair's cost is its encoder work)."""
    if group is None:
        return Share(0, len(hyps), [len(hyps)])
    tokens = scorer.encoder.token_counts(distinct_texts(hyps, groups))
    count = dict(zip(distinct_texts(hyps, groups), tokens))
    costs = [count[h] + sum(map(count.__getitem__, g)) for h, g in zip(hyps, groups)]
    bounds = balanced_bounds(costs, dist.get_world_size(group))
    start, stop = bounds[dist.get_rank(group)]
    return Share(start, stop, [b - a for a, b in bounds])


def balanced_bounds(costs: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges ``[start, stop)`` covering ``costs`` in order, each of about
    ``sum(costs) / parts``: an item goes to the part its cost's midpoint falls in."""
    cost = np.asarray(costs, dtype=np.float64)
    total = cost.sum()
    if not len(cost) or total <= 0:
        cuts = np.linspace(0, len(cost), parts + 1).round().astype(int)
        return list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    midpoints = np.cumsum(cost) - cost / 2
    part = np.minimum((midpoints * parts / total).astype(np.int64), parts - 1)  # non-decreasing
    cuts = np.searchsorted(part, np.arange(parts + 1), side="left")
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))


def score_chunk(scorer: CorpusScorer, hyps: list[str], groups: list[list[str]], batch_size: int, *,
                means: BatchMeans | None = None, return_all: bool = False, group=None,
                arena: TokenArena | None = None, share: Share | None = None,
                bar: PairProgress | None = None) -> Tensor:
    """Scores ``[k, len(hyps)]`` (``k`` = 3 with ``return_all``, else 1) of the pairs of one chunk, in
    order, on the scorer's device: this rank's share (``share``, default :func:`chunk_share`) scored
    from ``arena`` (default: its texts encoded now), then every rank's share gathered."""
    share = share or chunk_share(scorer, hyps, groups, group)
    mine_h, mine_g = hyps[share.start:share.stop], groups[share.start:share.stop]
    if arena is None:
        arena = embed_distinct(scorer, distinct_texts(mine_h, mine_g), batch_size, credit(bar, len(hyps)))
    device = scorer.encoder.device
    unit = unit_vectors_once(scorer, arena, means)
    out = torch.zeros(3 if return_all else 1, len(mine_h), device=device)
    for plan in send_plans(batch_plans(arena, mine_h, mine_g, batch_size), device):
        # a sent plan (send_plans): its index fields are tensors; scores: a PRF exactly with return_all
        scores = scorer.score_call(plan.call, arena.gather(cast(Tensor, plan.rows), plan.where), return_all=return_all,
                                   means=means, nonempty=plan.nonempty, unit_vectors=unit)
        out.index_copy_(1, cast(Tensor, plan.positions),
                        torch.stack(list(scores) if return_all else [cast(Tensor, scores)]).float())
    return out if group is None else all_gather_shares(out, share.sizes, group)


def unit_vectors_once(scorer: CorpusScorer, arena: TokenArena, means: BatchMeans | None) -> bool:
    """Center and normalise every unit of ``arena`` in place, once, where each unit's centered unit
    vector depends on nothing but itself — ``(x − c) / ‖x − c‖`` with one vector ``c`` for every text
    (:meth:`Centering.shift <torchmover.Centering.shift>`: no centering, a fitted mean, or the call's
    ``batch`` mean ``means``, shared by both sides) — and the family reads the units as they are (no
    n-grams, no sentence movers). Then every pair batch gathers unit vectors, and nothing is centered
    or normalised per batch: the same values to the bit, computed once per text instead of once per
    batch it is read in. Returns whether it did (else the arena is left as it is)."""
    c, centering = scorer.config, scorer.centering
    if (get_member(c.method).documents or c.ngram > 1 or c.center_scope != "joint"
            or not centering.subtracts_one_vector(given_mean=means is not None)):
        return False
    shift = centering.shift(None if means is None else means.vectors[0])

    def center_and_normalize(x: Tensor, mask: Tensor) -> None:
        if shift is not None:
            x.sub_(shift.to(x))
        unit_vectors_(x, mask)

    arena.transform_(center_and_normalize)
    return True


def credit(bar: PairProgress | None, pairs: float) -> Callable[[float], None] | None:
    """The callback by which an encoding of a chunk of ``pairs`` pairs moves ``bar``: the fraction of
    its tokens encoded (:func:`embed_distinct`), times ``pairs``."""
    return None if bar is None else (lambda fraction: bar.advance(pairs * fraction))


def batch_plans(arena: TokenArena, hyps: list[str], groups: list[list[str]], batch_size: int) -> list[BatchPlan]:
    """The host plans of the pair batches of ``(hyps, groups)``, whose texts are in ``arena`` (one block,
    :func:`embed_distinct`): batches of similar length (each pair's longest text in units, known on the
    host), the distinct texts in order of appearance, hypotheses first, so that where every pair has
    texts of its own the pairs are the gathered rows as they lie (nothing to select after the gather)."""
    n_units = arena.widths()
    longest = [max(n_units[h], *map(n_units.__getitem__, g)) for h, g in zip(hyps, groups)]
    plans = []
    for positions in length_batches(longest, batch_size, squares=True):
        batch_hyps, batch_groups = [hyps[i] for i in positions], [groups[i] for i in positions]
        texts = distinct_texts(batch_hyps, batch_groups)
        where = arena.index(texts)
        plans.append(BatchPlan(positions, where.rows, where, call_plan(batch_hyps, batch_groups, texts),
                               arena.all_have_units(texts)))
    return plans


def centering_sides(scorer: CorpusScorer) -> tuple[str | None, ...]:
    """The sides whose mean ``batch`` centering takes: one for both (``joint``), or each apart."""
    return (None,) if scorer.config.center_scope == "joint" else ("hyp", "ref")


def side_texts(hyps: list[str], groups: list[list[str]], side: str | None) -> list[str]:
    """The texts of a side of the pairs, in pair order: the hypotheses (``hyp``), the references
    (``ref``), or both (``None``: each pair's hypothesis, then its references)."""
    if side == "hyp":
        return hyps
    if side == "ref":
        return [r for g in groups for r in g]
    return [t for h, g in zip(hyps, groups) for t in (h, *g)]


def pair_texts(hyps: list[str], groups: list[list[str]], side: str) -> list[str]:
    """The texts of a side once per (hypothesis, reference) pair, repeats included: each hypothesis once
    per reference of its group (``hyp``), each reference (``ref``). What ``center_scope="pairs"``
    averages (the TWMD authors' mini-batches concatenate the pairs' texts)."""
    if side == "hyp":
        return [h for h, g in zip(hyps, groups) for _ in g]
    return [r for g in groups for r in g]


def call_means(scorer: CorpusScorer, chunks: Iterable[tuple[list[str], list[list[str]]]], batch_size: int, *,
               group=None, sum_group=None,
               bar: PairProgress | None = None) -> tuple[BatchMeans, TokenArena | None, Share | None]:
    """The first pass under ``batch`` centering: the mean unit vector of the distinct texts of every
    chunk — ``μ = Σ_texts Σ_tokens x / Σ_texts n_tokens`` — one per side of :func:`centering_sides`
    (one mean, ``joint``; or the hypotheses' and the references', ``separate``), from
    :func:`token_sums`, and whether each is one text's own (the only one with a unit). Returns the
    means, and the arena and share of the last chunk (to be reused: it holds every text of the share)."""
    stats, arena, share = token_sums(scorer, chunks, batch_size, centering_sides(scorer), group=group,
                                     sum_group=sum_group, bar=bar)
    dim = stats.shape[1] - 2
    vectors = tuple((s[:dim] / s[dim].clamp_min(1)).float() for s in stats)
    return BatchMeans(vectors, stats[:, dim + 1] == 1), arena, share


def token_sums(scorer: CorpusScorer, chunks: Iterable[tuple[list[str], list[list[str]]]], batch_size: int,
               sides: Sequence[str | None], *, group=None, sum_group=None, bar: PairProgress | None = None,
               weight: float = 1.0) -> tuple[Tensor, TokenArena | None, Share | None]:
    """``[len(sides), D + 2]`` float64: per side (:func:`side_texts`), the sum of the unit vectors of the
    distinct texts of every chunk and their number (each distinct text counted once; each pair's,
    repeats included, with ``center_scope="pairs"``), then the number of distinct texts that have a
    unit, summed from the arena of each chunk's texts of those sides (never padded to one width).

    ``group``: the chunks are shared out among its ranks (:func:`chunk_share`); each text is counted
    by its owner (:func:`owned_texts`), and the sums are all-reduced over ``group``. ``sum_group``:
    each rank has chunks of its own, each distinct text of them all is counted by the first rank
    that holds it (:func:`lower_ranks_texts`), and the sums are all-reduced over it.
    ``bar`` is credited ``weight`` × the chunk's pairs for each chunk encoded. Returns the sums, and
    the arena and share of the last chunk."""
    dim, device = scorer.encoder.hidden_size, scorer.encoder.device
    stats = torch.zeros(len(sides), dim + 2, dtype=torch.float64, device=device)  # per side (Σ x, n, texts)
    if sum_group is not None and is_distributed(sum_group):
        chunks = list(chunks)
        seen = lower_ranks_texts(chunks, sides, sum_group)  # counted by the first rank that holds them
    else:
        seen = {side: SeenTexts() for side in sides}
    arena, share = None, None
    for hyps, groups in chunks:
        share = chunk_share(scorer, hyps, groups, group)
        mine_h, mine_g = hyps[share.start:share.stop], groups[share.start:share.stop]
        encoded = dict.fromkeys(t for side in sides for t in side_texts(mine_h, mine_g, side))
        arena = embed_distinct(scorer, list(encoded), batch_size, credit(bar, len(hyps) * weight))
        for k, side in enumerate(sides):
            texts = side_texts(hyps, groups, side)
            distinct = seen[side].new(texts)
            if group:
                distinct = owned_texts(distinct, texts, side, groups, share)
            # repeats included with center_scope="pairs": a text's rows are summed once per pair
            counted = pair_texts(mine_h, mine_g, cast(str, side)) if scorer.config.center_scope == "pairs" \
                else distinct  # "pairs": the sides are "hyp" and "ref" (centering_sides)
            for units in arena.flat(arena.in_storage_order(counted)):  # in pieces: never a copy of them all
                stats[k, :dim] += token_sum(units.vectors[None], units.mask[None], torch.float64)
                stats[k, dim] += units.mask.sum()
            stats[k, dim + 1] += (arena.unit_counts(distinct) > 0).sum()
    if group is not None or sum_group is not None:
        stats = all_reduce_sum(stats, group if group is not None else sum_group)  # one collective for every side
    return stats, arena, share


def lower_ranks_texts(chunks: list[tuple[list[str], list[list[str]]]], sides: Sequence[str | None],
                      group) -> dict[str | None, "SeenTexts"]:
    """Per side, the texts of the ``chunks`` of every rank of ``group`` before this one, as met
    (:class:`SeenTexts`): a pass that starts from them counts a text held by several ranks on the
    first of them only. One ``all_gather_object`` of each rank's distinct digests (8 bytes a text)."""
    mine = {side: np.unique(np.fromiter((text_digest(t) for hyps, groups in chunks
                                         for t in side_texts(hyps, groups, side)), dtype=np.uint64))
            for side in sides}
    every: list[Any] = [None] * dist.get_world_size(group)  # all_gather_object: every rank's mine
    dist.all_gather_object(every, mine, group=group)
    lower = every[:dist.get_rank(group)]
    return {side: SeenTexts([d[side] for d in lower]) for side in sides}


def owned_texts(new: list[str], texts: list[str], side: str | None, groups: list[list[str]], share: Share) -> list[str]:
    """The texts of ``new`` that this rank counts: those whose first pair lies in its ``share``
    (``texts``: :func:`side_texts` of the chunk, in pair order; ``groups``: its references, to map a
    text's position back to its pair). Each text of a chunk has one first pair, so one owner."""
    pair_of = np.arange(len(groups)) if side == "hyp" else np.repeat(
        np.arange(len(groups)), [len(g) + (side is None) for g in groups])
    first: dict[str, int] = {}
    for text, pair in zip(texts, pair_of.tolist()):
        first.setdefault(text, pair)
    return [t for t in new if share.start <= first[t] < share.stop]


@torch.no_grad()
def embed_distinct(scorer: CorpusScorer, texts: Sequence[str], batch_size: int, on_batch=None) -> TokenArena:
    """Units of every distinct text of ``texts`` (keyed by text), without a graph, encoded in batches of
    similar length, of at most ``batch_size`` texts and a token budget
    (:func:`~torchmover.scorer.plan.length_batches`), the longest batch first, each batch's units
    copied into the arena's one block as soon as it is encoded, without its padding
    (:meth:`TokenArena.append <torchmover._internal.arena.TokenArena.append>`), so that any pair
    batch is one gather from it and an encoder batch's working memory is freed before the next runs.
    The vectors are kept in float32 or wider (what the transport runs in), whatever the encoder's
    precision.

    The texts are tokenized once, here (:meth:`Scorer.tokenize <torchmover.Scorer.tokenize>`), and
    batched by their token counts, so that a batch pads little; each batch's tokens go to the encoder
    as they are, and the block is made as large as their token count (no block grows). (The sentence
    movers, which encode each sentence of a document, are batched by characters.) ``on_batch(fraction)``:
    called after each batch with the fraction of the texts' length it encoded (a progress bar's credit).
    On the CPU, the C heap's free pages go back to the system after the batches in which the tokens
    encoded reach each ``1 / HEAP_TRIMS`` of the texts' tokens (see the module docs)."""
    texts = list(dict.fromkeys(texts))
    tokenized = None if get_member(scorer.config.method).documents or not texts else scorer.tokenize(texts)
    lengths = list(map(len, texts if tokenized is None else tokenized["input_ids"]))
    arena = TokenArena(Units, zero_padding=True, capacity=0 if tokenized is None else 1 + sum(lengths))
    total, encoded, trimmed = sum(lengths) or 1, 0, 0
    for batch in length_batches(lengths, batch_size, most=batch_size):
        batch_texts = [texts[i] for i in batch]
        units, spans = scorer.embed_with_spans(batch_texts, None if tokenized is None else take_tokens(tokenized, batch))
        arena.append(batch_texts, units._replace(vectors=units.vectors.to(torch.promote_types(units.vectors.dtype,
                                                                                               torch.float32))), spans)
        on_cpu = units.vectors.device.type == "cpu"
        del units  # the batch's encoder output is freed before the next batch runs
        batch_tokens = sum(lengths[i] for i in batch)
        encoded += batch_tokens
        if on_cpu and HEAP_TRIMS * encoded // total > trimmed:  # another 1 / HEAP_TRIMS of the tokens encoded
            trimmed = HEAP_TRIMS * encoded // total
            release_free_heap()
        if on_batch is not None:
            on_batch(batch_tokens / total)
    return arena


def text_digest(text: str) -> int:
    """A 64-bit digest of ``text`` (BLAKE2b)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class SeenTexts:
    """The texts a pass over a corpus has met, as a sorted array of their 64-bit digests
    (:func:`text_digest`): 8 bytes a distinct text whatever its length, so a pass over a corpus larger
    than memory keeps it. (Two distinct texts of one corpus share a digest with probability about
    ``n² / 2⁶⁵``: 3·10⁻⁸ for a million texts.)"""

    def __init__(self, digests: Sequence[np.ndarray] = ()):
        """``digests``: arrays of digests of texts met before (e.g. on other ranks)."""
        self.digests = np.unique(np.concatenate([np.zeros(0, dtype=np.uint64), *digests]))

    def __len__(self) -> int:
        return len(self.digests)

    def new(self, texts: Iterable[str]) -> list[str]:
        """The distinct texts of ``texts`` not met before, in order of first appearance; they are met
        now."""
        distinct = list(dict.fromkeys(texts))
        digests = np.fromiter(map(text_digest, distinct), dtype=np.uint64, count=len(distinct))
        fresh = ~np.isin(digests, self.digests)
        self.digests = np.union1d(self.digests, digests[fresh])
        return [text for text, is_new in zip(distinct, fresh.tolist()) if is_new]
