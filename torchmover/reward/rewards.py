"""Rewards for policy-gradient training: self-critical (SCST) and group baselines (GRPO / RLOO).

A reward is the scorer's similarity of a generation to its reference(s), computed **without a
graph**: the policy gradient ``∇J ≈ (r − b) ∇ log p(y)`` treats the reward as a constant.

- :class:`SelfCriticalReward`: ``A = r(y_sampled) − r(y_greedy)``, the self-critical baseline of
  Rennie et al. (2017), Eq. 7 of the sentence-mover paper (Clark et al., 2019).
- :class:`GroupReward`: ``G`` completions per prompt, ``A_g = r_g − b_g`` with ``b`` the group mean
  (GRPO) or the mean of the ``G − 1`` others (RLOO), optionally divided by the group's std.
- :class:`MoverReward`: the shared shell (``reward(hyps, refs) -> Tensor[B]``), also what the TRL
  adapter (:func:`torchmover.integrations.trl.as_trl_reward`) calls.

Stability. With ``centering="batch"`` a text's score depends on every other text of the call: a
sampled and a greedy generation would center each other, and a completion's reward would change with
its group. A reward therefore only uses a centering that is independent of the batch: the scorer's own
``fixed`` / ``running`` mean (fitted), ``sentence``, ``dimension`` or ``none``, or a corpus mean
fitted by :meth:`MoverReward.fit` (e.g. on the training references), which then replaces the scorer's
centering inside the reward without touching the scorer. A ``batch`` scorer that was not fitted this
way raises an error that says so, instead of silently returning batch-dependent rewards. A text's
reward is then the same (to float32 rounding, ~1e-7) whatever else is in the call.

Reference cache. References repeat across epochs and across the ``G`` completions of a prompt, so
a reward keeps each reference's token units, self-term ``C(ref, ref)`` and token cloud on the device
(:class:`~torchmover.reward.cache.ReferenceCache`, ``reward.cache``): a call whose references are all
cached neither encodes, centers nor normalises a reference, and solves two transport problems per pair
instead of three. Clouds are not kept for the sentence movers (they move units), nor where a reference
cloud needs the empty-text placeholder of :func:`~torchmover.functional.family.token_cloud` (IDF
weights, n-grams, pooled subwords, ``special_tokens="target"`` or a reference without tokens). The
cache is bound to what produced it: every call compares a fingerprint of the encoder's parameters and
buffers (identity, storage, dtype, device and autograd version counter, which every in-place update
such as ``optimizer.step()`` or ``load_state_dict`` bumps), the scorer's configuration and IDF
dictionaries, and empties the cache when it changed; the self-terms and clouds also follow the
centering's mean. Writes that bypass the version counter (``p.data.copy_(...)``) are not seen: call
:meth:`MoverReward.clear_cache` after them.

No host-device synchronisation. A reward call reads nothing back from the device: every index (pairs,
cached rows, self-term slots) is built on the host from the texts and sent in one transfer before the
encoder runs, and the scores stay on the device (``tests/test_hotpath.py`` proves it op by op). No
per-call NaN check either: that no NaN comes out is a property of the family's arithmetic, tested on
degenerate inputs.

Transport batches. Every transport problem of a batch is padded to its longest texts, and a call's
completions differ in length several times over. Where the device has a batch cost
(:data:`~torchmover.scorer.plan.TRANSPORT_BATCH_COST`: the CPU) the completions are tokenized before
the call's plan is made, cut into batches of similar length
(:func:`~torchmover.scorer.plan.transport_groups`) and their pairs laid out batch after batch, on the
host; each batch is then moved on its own, cut to its own widest texts. A reward depends on its batch
through float rounding only. Elsewhere (a GPU, whose transport is bound by launching its kernels) a
call is one batch.

Threads and processes. A reward may be called from many threads at once: its scoring, cache and
counters run under one lock, so concurrent calls are serialised and each gets its own rewards; to
turn many concurrent small calls into few large ones, wrap the reward in a
:class:`~torchmover.reward.batching.BatchedReward`. A reward pickles (e.g. into a worker process), fitted
centering included, without its reference cache, which the copy refills.

Degenerate generations. A text with no real token (empty or whitespace-only) scores exactly 0 (as
does a pair with an empty reference; with ``rescale=True`` the rescaled 0, ``−b / (1 − b)``);
punctuation-only or repetitive texts get their ordinary, finite score. No length or repetition
penalty is applied implicitly; pass ``shaping`` to apply one explicitly.
"""
from __future__ import annotations

import functools
import itertools
import threading
from typing import Callable, NamedTuple, Sequence, cast

import numpy as np
import torch
from torch import Tensor, nn

from .._internal.moduletree import eval_mode, submodules, weights_fingerprint
from .._internal.transfer import to_device
from ..functional.centering import Centering
from ..functional.family import TokenCloud
from ..functional.members import get_member
from ..functional.transport import warn_if_not_converged
from ..runtime.devices import autocast_off
from ..runtime.distributed import shard
from ..scorer import Scorer
from ..scorer.inputs import as_list, check_references, check_texts, distinct_stripped
from ..scorer.plan import (TRANSPORT_BATCH_COST, PairGroup, PairIndex, pair_groups, pair_index, pairs_by_group,
                           transport_groups)
from ..scorer.references import needs_pieces, score_in_pieces, split_references
from ..scorer.signature import tensor_digest
from ..scorer.units import Units
from ..text.encoder import take_tokens
from .cache import CacheInfo, ReferenceCache, ReferencePlan, Spans

__all__ = ["CacheInfo", "GroupReward", "GroupRewardResult", "MoverReward", "SelfCriticalResult",
           "SelfCriticalReward", "group_advantages", "shaping_name"]

BATCH_INDEPENDENT = ("none", "dimension", "sentence")
BASELINES = ("mean", "leave_one_out")

# shaping(hyps, scores [B]) -> rewards [B]
Shaping = Callable[[list, Tensor], Tensor]


class SelfCriticalResult(NamedTuple):
    """Self-critical rewards, all ``[B]``, without a graph: ``advantage = sampled − greedy``."""

    sampled: Tensor
    greedy: Tensor
    advantage: Tensor


class GroupRewardResult(NamedTuple):
    """Group rewards ``[N, G]`` with the baseline subtracted from each and the advantages
    ``(rewards − baseline) / (std + eps)`` (``/ 1`` without std normalisation); no graph."""

    rewards: Tensor
    baseline: Tensor
    advantages: Tensor


def _synchronized(method):
    """Run ``method`` under the reward's lock (re-entrant: locked methods call each other)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class _Hypotheses(NamedTuple):
    """A call's distinct hypotheses in the order they are encoded, their tokens where they were
    tokenized before the call's plan (else None), and each transport group's ``(rows, pairs)``
    (:func:`~torchmover.scorer.plan.pairs_by_group`; None: the pairs are moved in one batch)."""

    texts: list[str]
    tokens: object
    groups: list[tuple[slice, slice]] | None

    def pair_groups(self, spans: list[tuple[int, int]], pairs: PairIndex,
                    ref_spans: list[tuple[int, int]] | None) -> list[PairGroup] | None:
        """The :class:`~torchmover.scorer.plan.PairGroup` of each group (None: one batch), from the unit
        ``spans`` of the hypotheses and ``ref_spans`` of the reference rows (``pairs``: the call's host
        pairs, which map its pairs to those rows)."""
        if self.groups is None:
            return None
        # with groups, the references' spans are given and pairs is a host plan of pairs_by_group (lists)
        return pair_groups(self.groups, [b for _, b in spans],
                           [cast(Spans, ref_spans)[r][1] for r in cast(list[int], pairs.ref)])


def shaping_name(function: Callable) -> str:
    """``module:qualified name`` of a ``shaping`` function (of its type, for a callable object without a
    name), as signatures name it."""
    named = function if hasattr(function, "__qualname__") else type(function)
    return f"{named.__module__}:{named.__qualname__}"


class MoverReward:
    """``reward(hyps, refs) -> Tensor[B]``: the scorer's score of each hypothesis against its
    reference(s), as a reward (no graph; the scorer in eval mode for the call, each of its modules'
    modes restored afterwards; the caller's grad mode untouched; autocast off, so that a training loop's
    mixed precision does not reach the encoder: its precision is the scorer's ``dtype``).

    Args:
        scorer: a :class:`~torchmover.Scorer`. Its method, direction, temperature and reference
            pooling (``multi_ref``) are used as configured. Its centering must not depend on the batch
            (see the module docs): otherwise call :meth:`fit` before the first reward.
        cache_size: how many references' token vectors to keep (LRU); 0 disables the cache.
        shaping: optional ``shaping(hyps, scores) -> rewards`` (``list[str]``, ``Tensor[B]`` ->
            ``Tensor[B]``) applied to the scores, e.g. an explicit length penalty. None by default:
            nothing is applied implicitly.

    Rewards are float tensors on the encoder's device, ``requires_grad=False``, and not inference
    tensors, so they can multiply log-probabilities in a loss. A hypothesis or reference with no real
    token (empty, whitespace) scores exactly 0 (``rescale=True``: ``−b / (1 − b)``); no NaN comes out.
    """

    def __init__(self, scorer: Scorer, *, cache_size: int = 1024, shaping: Shaping | None = None):
        if not isinstance(scorer, Scorer):
            raise TypeError(f"scorer must be a torchmover.Scorer, got {type(scorer).__name__}")
        if not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a non-negative int, got {cache_size!r}")
        if shaping is not None and not callable(shaping):
            raise TypeError(f"shaping must be callable(hyps, scores) -> rewards, got {type(shaping).__name__}")
        self._scorer, self.cache_size, self.shaping = scorer, cache_size, shaping
        self._centering: Centering | None = None  # set by fit(); replaces the scorer's centering
        self.cache = ReferenceCache(cache_size)
        self._lock = threading.RLock()

    def __getstate__(self) -> dict:
        """Pickled without its lock and its cache's contents (the copy starts with an empty cache; the
        counters are kept)."""
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def scorer(self) -> Scorer:
        return self._scorer

    def __repr__(self) -> str:
        shaping = "" if self.shaping is None else f", shaping={getattr(self.shaping, '__name__', self.shaping)!r}"
        return f"{type(self).__name__}(<{self.signature}>, cache_size={self.cache_size}{shaping})"

    @property
    def scored_signature(self) -> str:
        """What pins the scores before ``shaping``: the scorer's signature, with the centering the reward
        actually uses."""
        fields = self._scorer.signature.split("|")
        centering = self._centering
        if centering is not None:
            fields = [f"center:fixed-{tensor_digest(centering.mean)}" if f.startswith("center:") else f
                      for f in fields]
        return "|".join(fields)

    @property
    def signature(self) -> str:
        """What pins the rewards: :attr:`scored_signature`, followed by ``|shaping:<module:name>`` where a
        ``shaping`` function changes them (:func:`shaping_name`: the function is named, its code is not
        pinned)."""
        if self.shaping is None:
            return self.scored_signature
        return f"{self.scored_signature}|shaping:{shaping_name(self.shaping)}"

    # --- centering ---------------------------------------------------------------------------------

    @property
    def centering(self) -> Centering:
        """The centering applied to every text, independent of the batch (raises if there is none)."""
        if self._centering is not None:
            return self._centering
        scorer_centering = self._scorer.centering
        mode = scorer_centering.mode
        if self._scorer_centering_is_independent():
            return scorer_centering
        if mode == "batch":
            raise RuntimeError(
                "the scorer uses centering='batch', which makes a text's reward depend on the other texts "
                "of the call (sampled and greedy generations, or the G completions of a group, would center "
                "each other). Call reward.fit(reference_texts) to center on a fixed corpus mean, or build the "
                "scorer with centering='fixed' and call scorer.fit_centering(texts)."
            )
        raise RuntimeError(
            f"the scorer's centering={mode!r} has no mean yet: call scorer.fit_centering(texts) or "
            "reward.fit(reference_texts) first"
        )

    @_synchronized
    def fit(self, texts: Sequence[str], batch_size: int = 64, *, centering: str | None = None,
            distributed: bool = True) -> "MoverReward":
        """Fit the reward on a corpus ``texts`` (e.g. the training references): fill the reference cache,
        and center every reward on the mean of all real token vectors of the distinct texts of ``texts``
        where asked or needed; the scorer itself is not modified. Returns ``self``. Texts equal up to
        outer whitespace are one text, counted once however often it repeats
        (:func:`~torchmover.scorer.inputs.distinct_stripped`), as ``batch`` centering counts a call's
        texts and as :func:`~torchmover.evaluation.scoring.fit_to_call` fits a ``fixed`` mean.

        ``centering``: ``None`` (default) fits that corpus mean only where the scorer's centering
        depends on the batch (``batch``) or has no mean yet (an unfitted ``fixed`` / ``running``): a
        scorer whose centering is already independent of the batch (``none``, ``sentence``,
        ``dimension``, a fitted mean) keeps its scores. ``"fixed"`` centers on the corpus mean in any
        case. A fitted mean is visible in :attr:`signature` (``center:fixed-<digest>``).

        Under ``torch.distributed`` (and ``distributed=True``) every rank passes the same ``texts``,
        encodes (and caches) its share ``texts[rank::world_size]``, and the (sum, count) is
        all-reduced: every rank gets the mean of the whole corpus (as
        :meth:`Scorer.fit_centering`). A collective: every rank must call it."""
        texts = distinct_stripped("texts", texts)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if centering not in (None, "fixed"):
            raise ValueError(f"centering must be None (only where needed) or 'fixed', got {centering!r}")
        if not texts:
            raise ValueError("texts is empty: fit needs at least one text with a real token")
        encoder = self._scorer.encoder
        if distributed:
            texts = shard(texts, encoder.device)
        chunks = (self._reference_units(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size))
        with autocast_off(encoder.device):  # the units are encoded (and cached) as the chunks are consumed
            if centering is None and self._scorer_centering_is_independent():
                for _ in chunks:  # the cache filled, the scores left alone
                    pass
                return self
            mean = Centering("fixed", dim=encoder.hidden_size).to(encoder.device)
            mean.fit((units[:2] for units in chunks), distributed=distributed)
        self._centering = mean.eval()
        return self

    def _scorer_centering_is_independent(self) -> bool:
        """Whether the scorer's own centering makes a text's reward independent of the other texts of
        its call (a per-text rule, or a mean already fitted)."""
        centering = self._scorer.centering
        return centering.mode in BATCH_INDEPENDENT or (centering.mode in ("fixed", "running") and centering.fitted)

    # --- reference cache ---------------------------------------------------------------------------

    @_synchronized
    def cache_info(self) -> CacheInfo:
        return self.cache.info()

    @_synchronized
    def clear_cache(self) -> None:
        """Forget every cached reference (counters are kept)."""
        self.cache.clear()

    def _check_fingerprint(self, walk: list[nn.Module]) -> None:
        """Empty the cache if the encoder's weights, the config or the IDF tables changed. ``walk``:
        :func:`~torchmover._internal.moduletree.submodules` of the scorer, whose tensors other than its
        centering's are the encoder's (the cache holds units before centering)."""
        scorer = self._scorer
        centering = scorer.centering  # bound once: a submodule attribute is a slow nn.Module lookup
        encoder = weights_fingerprint(m for m in walk if m is not centering)
        self.cache.check((encoder, scorer.config, tuple(map(id, scorer.idf.values()))))

    @_synchronized
    def reference_embeddings(self, texts: Sequence[str]) -> list[Units]:
        """Units of each text (:meth:`Scorer.embed`: before centering, real units only ``[n_i, ...]``,
        no graph), from the cache where present; the missing distinct texts are encoded in one batch."""
        texts = check_texts("texts", texts)
        return self._reference_units(texts).unpad()

    def _reference_units(self, texts: list[str]) -> Units:
        """Padded units of ``texts`` (one row each, in order), through the cache."""
        plan = self._plan_references(list(dict.fromkeys(texts)))
        where = self.cache.units.index(plan.cached)
        row = {t: i for i, t in enumerate(plan.texts)}
        order = [row[t] for t in texts]
        rows, sent_order = to_device([where.rows, None if order == list(range(len(plan.texts))) else order],
                                     self._scorer.encoder.device)
        with self.cache.undo_on_error(plan):
            units, _ = self.cache.gather_units(plan, cast(Tensor, rows), where, self._encode)  # rows: an array
        return units if sent_order is None else units.select(sent_order)

    def _plan_references(self, texts: list[str], walk: list[nn.Module] | None = None) -> ReferencePlan:
        """The cache's :meth:`~torchmover.reward.cache.ReferenceCache.plan` of the distinct ``texts``,
        after checking its fingerprint. ``walk``: the scorer's
        :func:`~torchmover._internal.moduletree.submodules`, if the caller has them."""
        self._check_fingerprint(submodules(self._scorer) if walk is None else walk)
        return self.cache.plan(texts)

    def _encode(self, texts: list[str]) -> tuple[Units, list[tuple[int, int]]]:
        """:meth:`Scorer.embed_with_spans` of ``texts`` (padded), no graph."""
        with eval_mode(self._scorer), torch.no_grad():
            return self._scorer.embed_with_spans(texts)

    # --- scoring -----------------------------------------------------------------------------------

    def __call__(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> Tensor:
        """Rewards ``[B]`` of ``hyps`` against ``refs`` (one str, or a list of str, per hypothesis)."""
        return self.score(hyps, refs)

    @_synchronized
    def score(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> Tensor:
        """Rewards ``[B]``: ``Sim(hyp, ref)`` of the configured family member on centered token
        vectors, pooled over several references by the scorer's ``multi_ref``, then ``shaping``. A
        call of many references is scored in pieces of bounded memory
        (:mod:`torchmover.scorer.references`). A converged member (``wmd``, ``moverscore``, the exact
        sentence movers) warns once per call if some of its transport problems stopped at ``max_iter``."""
        with warn_if_not_converged(), autocast_off(self._scorer.encoder.device):
            return self._score(hyps, refs)

    def _score(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> Tensor:
        hyps = check_texts("hyps", hyps)
        groups = check_references(hyps, refs)
        centering = self.centering
        encoder = self._scorer.encoder
        device = encoder.device
        if not hyps:
            return torch.zeros(0, dtype=torch.promote_types(encoder.dtype, torch.float32), device=device)
        if needs_pieces(groups):  # many references: scored in pieces, in bounded memory
            scores = cast(Tensor, score_in_pieces(  # pieces of _scores: a tensor each, never a PRF
                split_references(hyps, groups), len(hyps), self._scorer.config.multi_ref,
                lambda piece_hyps, piece_groups: self._scores(piece_hyps, piece_groups, centering, device)))
        else:
            scores = self._scores(hyps, groups, centering, device)
        if self.shaping is not None:
            shaped = torch.as_tensor(self.shaping(list(hyps), scores), device=scores.device)
            if shaped.shape != scores.shape:
                raise ValueError(f"shaping must return {tuple(scores.shape)} rewards, got {tuple(shaped.shape)}")
            scores = shaped.to(scores.dtype)
        return scores

    def _scores(self, hyps: list[str], groups: list[list[str]], centering: Centering,
                device: torch.device) -> Tensor:
        """The scores ``[B]`` of one call, before ``shaping``."""
        walk = submodules(self._scorer)  # once, for the cache's fingerprint and eval mode
        plan = self._plan_references(list(dict.fromkeys(itertools.chain.from_iterable(groups))), walk)
        self.cache.check_centering(weights_fingerprint(submodules(centering)))
        hyp_texts, tokens, bounds = self._hypotheses_by_length(list(dict.fromkeys(hyps)), device)
        pairs = pair_index(hyps, groups, {t: i for i, t in enumerate(hyp_texts)},
                           {t: i for i, t in enumerate(plan.texts)})
        slices = None
        if bounds is not None:
            pairs, slices = pairs_by_group(pairs, len(hyps), bounds)
        hyp = _Hypotheses(hyp_texts, tokens, slices)
        if self.cache.has_clouds(plan.texts):
            return self._score_with_cached_clouds(hyp, len(hyps), plan.texts, pairs, centering, walk, device)
        return self._score_with_units(hyp, len(hyps), plan, pairs, centering, walk, device)

    def _hypotheses_by_length(self, texts: list[str],
                              device: torch.device) -> tuple[list[str], object, list[int] | None]:
        """The distinct hypotheses ``texts`` in the order they are encoded, their tokens, and the bounds
        of their transport groups (rows; :func:`~torchmover.scorer.plan.transport_groups`). Where the
        device has a :data:`~torchmover.scorer.plan.TRANSPORT_BATCH_COST` the texts are tokenized
        now, before the call's plan is made, and laid out group after group; elsewhere (and for the
        sentence movers) they are returned as they are, to be tokenized by the encoder, and the
        bounds are None: one batch, as where one batch is best."""
        cost = TRANSPORT_BATCH_COST.get(device.type)
        if cost is None or get_member(self._scorer.config.method).documents:
            return texts, None, None
        tokens = self._scorer.tokenize(texts)
        groups = transport_groups(list(map(len, tokens["input_ids"])), cost)
        if groups is None:
            return texts, tokens, None
        order = np.concatenate(groups).tolist()
        return [texts[i] for i in order], take_tokens(tokens, order), np.cumsum([0] + list(map(len, groups))).tolist()

    def _score_with_cached_clouds(self, hyp: _Hypotheses, n_hyps: int, ref_texts: list[str],
                                  pairs: PairIndex, centering: Centering, walk: list[nn.Module],
                                  device: torch.device) -> Tensor:
        """Scores when every reference's cloud (and self-term) is cached: each pair's reference cloud
        and self-term read from the cache by indices built on the host and sent, with the pairs', in
        one transfer before the encoder runs."""
        call = self.cache.cloud_call(ref_texts, pairs).to_device(device)
        with eval_mode(self._scorer, walk), torch.no_grad():
            hyp_units, hyp_spans = self._scorer.embed_with_spans(hyp.texts, hyp.tokens)
            refs, ref_self = self.cache.gather_clouds(call)  # [P, W]: a reference per pair
            ref_spans = None if hyp.groups is None else self.cache.clouds.gathered_spans(ref_texts)
            return self._scorer.score_pairs(hyp_units.centered(centering), refs,
                                            PairIndex(call.pairs.hyp, None, call.pairs.owner), n_hyps, ref_self,
                                            nonempty=all(b > a for a, b in hyp_spans),
                                            groups=hyp.pair_groups(hyp_spans, pairs, ref_spans))  # [B]

    def _score_with_units(self, hyp: _Hypotheses, n_hyps: int, plan: ReferencePlan, pairs: PairIndex,
                          centering: Centering, walk: list[nn.Module], device: torch.device) -> Tensor:
        """Scores from the references' units (cached ones gathered, missing ones encoded), centered and
        made into clouds now; the clouds of the cached references are kept where they can be (see the
        module docs)."""
        ref_texts = plan.texts
        host = self.cache.units_call(plan, pairs)
        call = host.to_device(device)  # every index of the call, in one transfer before the encoder runs
        with eval_mode(self._scorer, walk), torch.no_grad():
            with self.cache.undo_on_error(plan):
                hyp_units, hyp_spans = self._scorer.embed_with_spans(hyp.texts, hyp.tokens)
                ref_units, ref_spans = self.cache.gather_units(plan, cast(Tensor, call.rows), host.where,
                                                               self._encode)  # a sent plan: its rows are a tensor
            hyp_units, ref_units = hyp_units.centered(centering), ref_units.centered(centering)
            balanced = centering.mode == "sentence"  # each text on its own mean (a reward's never depends on the batch)
            refs = ref_units if get_member(self._scorer.config.method).documents else \
                self._scorer.token_clouds(ref_units, "ref", all(b > a for a, b in ref_spans),
                                          balanced=balanced)  # sentence movers: units
            ref_self = None
            if call.self_terms is not None:
                ref_self = self.cache.self_terms(ref_texts, refs, call.self_terms, self._scorer.self_similarities)
            if isinstance(refs, TokenCloud):
                self.cache.store_clouds(ref_texts, refs, cast(list[int], host.keep), cast(Tensor, call.keep), ref_spans)
            return self._scorer.score_pairs(hyp_units, refs, call.pairs, n_hyps, ref_self,
                                            nonempty=all(b > a for a, b in hyp_spans),
                                            groups=hyp.pair_groups(hyp_spans, pairs, ref_spans),
                                            balanced=(balanced, balanced))  # [B]


class SelfCriticalReward(MoverReward):
    """Self-critical reward (Rennie et al., 2017; Clark et al., 2019, Eq. 7):
    ``A = r(y_sampled) − r(y_greedy)``, ``r`` the scorer's similarity to the reference(s).

    ``reward(sampled, greedy, refs)`` -> :class:`SelfCriticalResult` of ``[B]`` tensors without a graph;
    the policy loss is ``−(A · log p(y_sampled)).mean()``. Sampled and greedy texts are scored in one
    call, but as the centering is independent of the batch (see :class:`MoverReward`) neither affects
    the other's reward; where the two texts are equal the advantage is exactly 0.

    Example:
        >>> import torch
        >>> from torchmover import Scorer
        >>> reward = SelfCriticalReward(Scorer(device="cpu"))  # a centering scorer: .fit(train_references) first
        >>> out = reward(["a cat sat on it"], ["the cat sat"], ["the cat sat on the mat"])
        >>> [round(a, 4) for a in out.advantage.tolist()]
        [0.0212]
        >>> sampled_logprob = torch.tensor([-3.2], requires_grad=True)  # log p(sampled), from the policy
        >>> loss = -(out.advantage * sampled_logprob).mean()
    """

    def __call__(self, sampled: Sequence[str], greedy: Sequence[str],  # type: ignore[override]  # its own call
                 refs: Sequence[str] | Sequence[Sequence[str]]) -> SelfCriticalResult:
        sampled, greedy = check_texts("sampled", sampled), check_texts("greedy", greedy)
        if len(sampled) != len(greedy):
            raise ValueError(f"sampled and greedy must have the same length, got {len(sampled)} and {len(greedy)}")
        groups = check_references(sampled, refs)
        rewards = self.score(sampled + greedy, groups + groups)
        r_sampled, r_greedy = rewards[:len(sampled)], rewards[len(sampled):]
        return SelfCriticalResult(r_sampled, r_greedy, r_sampled - r_greedy)


class GroupReward(MoverReward):
    """Group-relative rewards for GRPO / RLOO: ``G`` completions per prompt, each scored against its
    prompt's reference(s) (encoded once per distinct reference, and cached across calls).

    ``A_g = (r_g − b_g) / (σ + eps)`` if ``normalize_std`` else ``r_g − b_g``, with
    ``b_g = (1/G) Σ_k r_k`` (``baseline="mean"``, GRPO) or ``b_g = 1/(G−1) Σ_{k≠g} r_k``
    (``"leave_one_out"``, RLOO; needs ``G ≥ 2``), and ``σ`` the group's standard deviation (Bessel
    corrected, as TRL; 0 for ``G = 1``). Normalising by ``σ`` is off by default: it weights groups
    whose completions score alike more heavily (Liu et al., 2025, "Dr. GRPO").

    ``reward(completions, refs)`` with ``completions`` a list of ``N`` lists of ``G`` texts and ``refs``
    ``N`` references (a str or a list of str each) -> :class:`GroupRewardResult` of ``[N, G]`` tensors.
    """

    def __init__(self, scorer: Scorer, *, baseline: str = "mean", normalize_std: bool = False,
                 eps: float = 1e-4, cache_size: int = 1024, shaping: Shaping | None = None):
        super().__init__(scorer, cache_size=cache_size, shaping=shaping)
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.baseline, self.normalize_std, self.eps = baseline, bool(normalize_std), eps

    def __call__(self, completions: Sequence[Sequence[str]],  # type: ignore[override]  # its own call
                 refs: Sequence[str] | Sequence[Sequence[str]]) -> GroupRewardResult:
        completions = as_list("completions", completions, "lists of strings", ndim=2)
        groups = [check_texts(f"completions[{i}]", c) for i, c in enumerate(completions)]
        sizes = {len(c) for c in groups}
        if len(sizes) > 1:
            raise ValueError(f"every prompt needs the same number of completions G, got sizes {sorted(sizes)}")
        n, g = len(groups), (sizes.pop() if sizes else 0)
        if n and g == 0:
            raise ValueError("completions has empty groups: G must be at least 1")
        if self.baseline == "leave_one_out" and n and g < 2:
            raise ValueError(f"baseline='leave_one_out' needs at least 2 completions per prompt, got G={g}")
        ref_groups = check_references(groups, refs)
        rewards = self.score([c for group in groups for c in group],
                             [rg for rg in ref_groups for _ in range(g)]).view(n, g)  # [N, G]
        return group_advantages(rewards, self.baseline, self.normalize_std, self.eps)


def group_advantages(rewards: Tensor, baseline: str = "mean", normalize_std: bool = False,
                     eps: float = 1e-4) -> GroupRewardResult:
    """Baselines and advantages of group rewards ``[N, G]`` (see :class:`GroupReward`)."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    g = rewards.shape[1]
    # Shifted by each group's first reward first (Σ, mean are shift-invariant): a group of equal
    # rewards then gets exactly 0 advantages, not rounding noise that the std division would amplify.
    d = rewards - rewards[:, :1]  # [N, G]
    advantages = d - d.mean(1, keepdim=True)  # r − mean
    if baseline == "leave_one_out":
        if g < 2:
            raise ValueError(f"baseline='leave_one_out' needs G >= 2, got {g}")
        advantages = advantages * (g / (g - 1))  # r − (Σ_k r_k − r) / (G − 1) = G/(G−1) (r − mean)
    base = rewards - advantages
    if normalize_std:
        std = rewards.std(1, keepdim=True) if g > 1 else torch.zeros_like(rewards[:, :1])  # [N, 1]
        advantages = advantages / (std + eps)
    return GroupRewardResult(rewards, base, advantages)
