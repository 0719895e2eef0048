"""Scoring large lists (:meth:`Scorer.score <torchmover.Scorer.score>`): no graph, every distinct text
encoded once, pairs scored in length-sorted batches gathered from a device arena.

As the peers do it: every distinct text of the list (of each chunk of ``SCORE_CHUNK`` hypotheses) is
encoded once, in batches of ``batch_size`` texts of similar length (trimmed to their longest) kept on
the device in a :class:`~torchmover._internal.arena.TokenArena`; then the pairs are scored in batches
of at most ``batch_size`` hypotheses of similar length, by the length of their longest text in units
(its span in the arena: no padding, no dropped tokens; :func:`~torchmover.scorer.plan.length_batches`),
each gathered from the arena by a :class:`~torchmover.scorer.plan.BatchPlan` built on the host; the
plans of a chunk are sent in one transfer. The scores stay on the device until the end: nothing in
the loop waits for it.

Under ``batch`` centering a first pass computes the mean of every real token of the call's distinct
texts (:func:`call_means`), the set that ``Scorer.forward`` on the whole list centers on, so both give
the same scores whatever the batch size. (A call of more than ``SCORE_CHUNK`` hypotheses encodes all
but its last chunk twice, once for the mean, to bound memory.)
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from .._internal.arena import TokenArena
from .._internal.transfer import send_plans, to_device
from ..functional.centering import token_sum
from ..runtime.distributed import all_reduce_sum
from .inputs import check_references, check_texts, distinct_texts
from .plan import BatchPlan, call_plan, length_batches
from .units import PRF

SCORE_CHUNK = 8192  # hypotheses whose distinct texts Scorer.score encodes and holds at once


def score_corpus(scorer: nn.Module, hyps: Sequence[str], refs, batch_size: int = 64, progress: bool = True, *,
                 return_all: bool = False, centering_group=None) -> Tensor | PRF:
    """:meth:`Scorer.score <torchmover.Scorer.score>` of ``scorer`` (a :class:`~torchmover.Scorer`; see
    there and the module docs)."""
    from tqdm.auto import tqdm

    hyps = check_texts("hyps", hyps)
    groups = check_references(hyps, refs)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    order = sorted(range(len(hyps)), key=lambda i: -(len(hyps[i]) + max(map(len, groups[i]))))
    chunks = [order[start:start + SCORE_CHUNK] for start in range(0, len(order), SCORE_CHUNK)]
    device = scorer.encoder.device
    out = torch.zeros(3 if return_all else 1, len(hyps), device=device)
    was_training = scorer.training
    scorer.eval()
    try:
        means, kept = None, None  # kept: the units of the last chunk, encoded by the first pass
        if scorer.config.centering == "batch":
            means, kept = call_means(scorer, hyps, groups, chunks, batch_size, progress, centering_group)
        with tqdm(total=len(hyps), desc="scoring", unit="pair", disable=not progress) as bar:
            for c in reversed(range(len(chunks))):
                chunk = chunks[c]
                arena = kept if kept is not None and c == len(chunks) - 1 else embed_distinct(
                    scorer, [hyps[i] for i in chunk], [groups[i] for i in chunk], batch_size, progress)
                kept = None
                for plan in send_plans(batch_plans(arena, hyps, groups, chunk, batch_size), device):
                    scores = scorer.score_call(plan.call, arena.gather(plan.rows, plan.where), return_all=return_all,
                                               means=means, nonempty=plan.nonempty)
                    out.index_copy_(1, plan.positions, torch.stack(list(scores) if return_all else [scores]).float())
                    bar.update(plan.call.n_hyps)
    finally:
        scorer.train(was_training)
    out = out.cpu()
    return PRF(*out) if return_all else out[0]


def batch_plans(arena: TokenArena, hyps: list[str], groups: list[list[str]], chunk: list[int],
                batch_size: int) -> list[BatchPlan]:
    """The host plans of the pair batches of ``chunk`` (positions in ``hyps``), whose texts are in
    ``arena``: batches of similar length (each pair's longest text in units, known on the host), the
    texts of each side in storage order (few runs to gather)."""
    n_units = arena.widths()
    longest = [max(n_units[hyps[i]], *map(n_units.__getitem__, groups[i])) for i in chunk]
    plans = []
    for positions in length_batches(longest, batch_size):
        idx = [chunk[k] for k in positions]
        batch_hyps, batch_groups = [hyps[i] for i in idx], [groups[i] for i in idx]
        texts = distinct_texts(batch_hyps, batch_groups)
        n_hyp_texts = len(dict.fromkeys(batch_hyps))  # first; each side in storage order
        texts = [*arena.in_storage_order(texts[:n_hyp_texts]), *arena.in_storage_order(texts[n_hyp_texts:])]
        where = arena.index(texts)
        plans.append(BatchPlan(idx, where.rows, where, call_plan(batch_hyps, batch_groups, texts),
                               arena.all_have_units(texts)))
    return plans


def call_means(scorer: nn.Module, hyps: list[str], groups: list[list[str]], chunks: list[list[int]],
               batch_size: int, progress: bool, group) -> tuple[tuple[Tensor, ...], TokenArena | None]:
    """The first pass under ``batch`` centering: the mean unit vector of the call's distinct texts —
    ``μ = Σ_texts Σ_tokens x / Σ_texts n_tokens`` (float64 sums), one mean (``joint``) or the
    hypotheses' and the references' (``separate``; ``pairs``: each text counted once per pair it is
    in, as :meth:`Scorer.pair_means <torchmover.Scorer.pair_means>`) — summed over the ranks of
    ``group`` if given. Returns the means and the arena of the last chunk (to be reused)."""
    scope = scorer.config.center_scope
    sides = (None,) if scope == "joint" else ("hyp", "ref")
    dim, device = scorer.encoder.hidden_size, scorer.encoder.device
    stats = torch.zeros(len(sides), dim + 1, dtype=torch.float64, device=device)  # per side (Σ x, n)
    seen = {side: set() for side in sides}
    arena = None
    for chunk in chunks:
        chunk_hyps, chunk_groups = [hyps[i] for i in chunk], [groups[i] for i in chunk]
        arena = embed_distinct(scorer, chunk_hyps, chunk_groups, batch_size, progress)
        side_texts = {None: distinct_texts(chunk_hyps, chunk_groups),  # each side's text of every pair
                      "hyp": [h for h, g in zip(chunk_hyps, chunk_groups) for _ in g],
                      "ref": [r for g in chunk_groups for r in g]}
        for k, side in enumerate(sides):
            if scope == "pairs":  # repeats included: a text's rows are gathered once per pair
                new = side_texts[side]
            else:
                new = [t for t in dict.fromkeys(side_texts[side]) if t not in seen[side]]
                seen[side].update(new)
            if new:
                where = arena.index(arena.in_storage_order(new))
                units = arena.gather(to_device([where.rows], device)[0], where)
                stats[k, :-1] += token_sum(units.vectors, units.mask, torch.float64)
                stats[k, -1] += units.mask.sum()
    if group is not None:
        stats = all_reduce_sum(stats, group)  # one collective for every side
    means = tuple((s[:-1] / s[-1].clamp_min(1)).float() for s in stats)
    return means, arena


def embed_distinct(scorer: nn.Module, hyps: list[str], groups: list[list[str]], batch_size: int,
                   progress: bool) -> TokenArena:
    """Units of every distinct text (keyed by text), encoded in batches of texts of similar length
    (in characters: a free proxy of the token count, which the encoder trims each batch to)."""
    from tqdm.auto import tqdm

    texts = sorted(distinct_texts(hyps, groups), key=len)
    batches = [texts[start:start + batch_size] for start in range(0, len(texts), batch_size)]
    return TokenArena.of([(batch, *scorer.embed_with_spans(batch)) for batch in
                          tqdm(batches, desc="encoding", unit="batch", disable=not progress, leave=False)])
