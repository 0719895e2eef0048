"""The reference cache of a reward: what is known of each reference, kept on the device across calls.

References repeat across epochs and across the ``G`` completions of a prompt. For each cached
reference (LRU over texts, ``size`` at most) the cache keeps, on the device:

- its token units before centering (encoder output after the token policy), in a
  :class:`~torchmover._internal.arena.TokenArena` (flat tensors, one growable block);
- its self-term ``C(ref, ref)`` (the normaliser of ``Sim``: one of the three transport problems of a
  pair), in a slot of one ``[size]`` tensor;
- its token cloud (centered unit vectors and masses, as the transport takes them), in a second arena.

The units depend on the encoder's weights, the scorer's config and its IDF tables (:meth:`check`
empties the cache when their fingerprint changes); the self-terms and clouds also on the centering
(:meth:`check_centering` drops them when its mean changes).

A call works in two halves. On the host, before the encoder runs: :meth:`plan` does the LRU
bookkeeping (hits, misses, evictions, self-term slots), then :meth:`cloud_call` or :meth:`units_call`
builds every index the call needs, as one host plan sent in one transfer. On the device: a call whose
references all have a cloud reads each pair's cloud and self-term straight from the cache
(:meth:`gather_clouds`); otherwise the cached units are gathered and the missing references encoded
(:meth:`gather_units`), and after centering the self-terms (:meth:`self_terms`) and clouds
(:meth:`store_clouds`) of the cached references are read or stored. Nothing reads device data.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Callable, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor

from .._internal.arena import Gather, TokenArena
from .._internal.transfer import plan_to_device
from ..functional.family import TokenCloud
from ..scorer.plan import PairIndex
from ..scorer.units import Units

Spans = list[tuple[int, int]]


class CacheInfo(NamedTuple):
    """Reference-cache statistics (as ``functools.lru_cache``'s), plus how often the cache was emptied
    because the encoder's weights changed."""

    hits: int
    misses: int
    maxsize: int
    currsize: int
    invalidations: int


class ReferencePlan(NamedTuple):
    """A call's distinct references on the host: ``cached`` (gathered from the cache) then ``missing``
    (encoded now); ``evicted``: cached texts that leave the cache after the call."""

    cached: list[str]
    missing: list[str]
    evicted: list[str]

    @property
    def texts(self) -> list[str]:
        """The rows of the call's reference units."""
        return self.cached + self.missing


class CloudCall(NamedTuple):
    """The indices of a call whose references all have a cached cloud: the clouds' arena ``rows``
    (``where``: the host side of that gather), the call's ``pairs`` (references: rows of ``where``),
    and each pair's self-term slot (``None`` for a member without self-terms)."""

    rows: np.ndarray | Tensor
    where: Gather
    pairs: PairIndex
    slots: list[int] | Tensor | None

    def to_device(self, device: torch.device | str | None) -> CloudCall:
        """This plan with its index fields on ``device``: :func:`~torchmover._internal.transfer.plan_to_device`."""
        return plan_to_device(self, device)


class SelfTermPlan(NamedTuple):
    """Where the self-terms of a call's references come from: the slots of the ``known`` ones, the rows
    to compute (``need``; ``None``: all), the order of ``known + computed`` as rows (``None``: as is),
    and the slots / computed positions to store in the cache."""

    known: list[int] | Tensor
    need: list[int] | Tensor | None
    order: list[int] | Tensor | None
    store_slots: list[int] | Tensor
    store_rows: list[int] | Tensor

    def to_device(self, device: torch.device | str | None) -> SelfTermPlan:
        """This plan with its index fields on ``device``: :func:`~torchmover._internal.transfer.plan_to_device`."""
        return plan_to_device(self, device)


class UnitsCall(NamedTuple):
    """The indices of a call that builds its references' clouds from units: the cached units' arena
    ``rows`` (``where``: the host side), the call's ``pairs``, the reference rows whose cloud is to be
    kept (``keep``), and the :class:`SelfTermPlan` (None without a cache)."""

    rows: np.ndarray | Tensor
    where: Gather
    pairs: PairIndex
    keep: list[int] | Tensor
    self_terms: SelfTermPlan | None

    def to_device(self, device: torch.device | str | None) -> UnitsCall:
        """This plan with its index fields on ``device``: :func:`~torchmover._internal.transfer.plan_to_device`."""
        return plan_to_device(self, device)


class ReferenceCache:
    """Units, self-terms and clouds of up to ``size`` references on the device (see the module docs).
    ``size=0`` keeps nothing. Not thread-safe: its reward calls it under its lock. Pickles as its
    size and counters (the copy starts empty)."""

    def __init__(self, size: int):
        self.size = size
        self.hits = self.misses = self.invalidations = 0
        self.fingerprint: tuple | None = None
        self.centering_fingerprint: tuple | None = None
        self.clear()

    def __getstate__(self) -> dict:
        return {"size": self.size, "hits": self.hits, "misses": self.misses, "invalidations": self.invalidations}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["size"])
        self.hits, self.misses, self.invalidations = state["hits"], state["misses"], state["invalidations"]

    def info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, self.size, len(self.lru), self.invalidations)

    def clear(self) -> None:
        """Forget every reference (the counters are kept)."""
        self.units = TokenArena(Units)  # token units of the cached references
        self.lru: OrderedDict[str, int] = OrderedDict()  # cached texts, least recently used first -> slot
        self.self_term_values: Tensor | None = None  # [size] C(ref, ref) by slot, under centering_fingerprint
        self.known_self_terms: set[str] = set()
        self.clouds = TokenArena(TokenCloud, zero_padding=True)  # their clouds, under centering_fingerprint
        self.known_clouds: set[str] = set()
        self.centering_fingerprint = None

    def check(self, fingerprint: tuple) -> None:
        """Empty the cache if ``fingerprint`` (of the encoder's weights, the config and the IDF tables)
        is not the one its references were encoded under."""
        if fingerprint != self.fingerprint:
            if self.lru:
                self.invalidations += 1
            self.clear()
            self.fingerprint = fingerprint

    def check_centering(self, fingerprint: tuple) -> None:
        """Drop the self-terms and clouds if the centering's ``fingerprint`` changed."""
        if fingerprint != self.centering_fingerprint:
            self.known_self_terms.clear()
            self.clouds.clear()
            self.known_clouds.clear()
            self.centering_fingerprint = fingerprint

    # --- host side -----------------------------------------------------------------------------------

    def plan(self, texts: list[str]) -> ReferencePlan:
        """The host side of fetching the distinct ``texts``: which are cached, which to encode, and the
        LRU bookkeeping (recency, eviction, self-term slots) done now."""
        self.units.compact()
        self.clouds.compact()
        cached = [t for t in texts if t in self.lru]
        missing = [t for t in texts if t not in self.lru]
        self.misses += len(missing)
        self.hits += len(texts) - len(missing)
        evicted = []
        if self.size:
            for t in cached:
                self.lru.move_to_end(t)
            free = sorted(set(range(self.size)) - set(self.lru.values()), reverse=True) if missing else []
            for t in missing:
                if len(self.lru) == self.size:
                    old, slot = self.lru.popitem(last=False)
                    evicted.append(old)
                    self.known_self_terms.discard(old)
                    self.known_clouds.discard(old)
                    self.clouds.remove(old)
                    free.append(slot)
                self.lru[t] = free.pop()
        return ReferencePlan(cached, missing, evicted)

    @contextlib.contextmanager
    def undo_on_error(self, plan: ReferencePlan):
        """Undo the LRU bookkeeping of ``plan`` if the block fails before the references are stored (e.g.
        out of memory in the encoder), so that the cache stays consistent."""
        try:
            yield
        except BaseException:
            for t in plan.missing:
                if t not in self.units:
                    self.lru.pop(t, None)
            for t in plan.evicted:
                self.units.remove(t)
            raise

    def has_clouds(self, texts: list[str]) -> bool:
        """Whether every text of ``texts`` has its cloud cached."""
        return self.known_clouds.issuperset(texts)

    def cloud_call(self, texts: list[str], pairs: PairIndex) -> CloudCall:
        """The host plan of a call whose references ``texts`` all have a cloud (:meth:`has_clouds`)."""
        where = self.clouds.index(texts)
        slots = None
        if self.self_term_values is not None:
            slots = [self.lru[t] for t in texts]
            slots = slots if pairs.ref is None else [slots[i] for i in pairs.ref]
        return CloudCall(where.rows, where, pairs, slots)

    def units_call(self, plan: ReferencePlan, pairs: PairIndex) -> UnitsCall:
        """The host plan of a call that builds its references' clouds from units (``plan.texts``)."""
        texts = plan.texts
        where = self.units.index(plan.cached)
        keep = [i for i, t in enumerate(texts) if t in self.lru and t not in self.known_clouds]
        return UnitsCall(where.rows, where, pairs, keep, self._self_term_plan(texts) if self.size else None)

    def _self_term_plan(self, texts: list[str]) -> SelfTermPlan:
        known = [t for t in texts if t in self.known_self_terms]
        known_set = set(known)
        need = [i for i, t in enumerate(texts) if t not in known_set]
        position = {t: k for k, t in enumerate(known + [texts[i] for i in need])}
        order = [position[t] for t in texts]
        store = [(self.lru[texts[i]], k) for k, i in enumerate(need) if texts[i] in self.lru]
        return SelfTermPlan([self.lru[t] for t in known], None if len(need) == len(texts) else need,
                            None if order == list(range(len(texts))) else order,
                            [slot for slot, _ in store], [k for _, k in store])

    # --- device side ---------------------------------------------------------------------------------

    def gather_clouds(self, call: CloudCall) -> tuple[TokenCloud, Tensor | None]:
        """Each pair's reference cloud ``[P, W]`` and self-term ``[P]`` (None without self-terms), read
        from the cache by a sent :class:`CloudCall`."""
        # a sent plan: its index fields are tensors; slots are given where the self-terms were stored
        clouds = self.clouds.gather(cast(Tensor, call.rows), call.where, cast(Tensor | None, call.pairs.ref))
        self_terms = None if call.slots is None else \
            cast(Tensor, self.self_term_values).index_select(0, cast(Tensor, call.slots))
        return clouds, self_terms

    def gather_units(self, plan: ReferencePlan, rows: Tensor, where: Gather,
                     encode: Callable[[list[str]], tuple[Units, Spans]]) -> tuple[Units, Spans]:
        """Padded units of ``plan.texts`` — the cached ones gathered by the sent ``rows`` (``where``:
        their host side), the missing ones encoded by ``encode`` and stored — and the span of each row's
        units (known on the host); evicts ``plan.evicted``. Call it under :meth:`undo_on_error`."""
        spans: Spans = []
        if plan.missing:
            new, spans = encode(plan.missing)
            if self.size:
                self.units.add(plan.missing, new, spans)
        spans = self.units.gathered_spans(plan.cached) + list(spans)
        units = self.units.gather(rows, where) if plan.cached else None
        for t in plan.evicted:
            self.units.remove(t)
        if units is None:
            return new, spans
        return (units.concat(new) if plan.missing else units), spans

    def self_terms(self, texts: list[str], refs: Units | TokenCloud, plan: SelfTermPlan,
                   compute: Callable[[Units | TokenCloud], Tensor | None]) -> Tensor | None:
        """``C(ref, ref)`` ``[N]`` of the centered references ``refs`` (rows = ``texts``): read from the
        cache where known, the others by ``compute`` (None: the member has no self-terms) and stored,
        as the sent :class:`SelfTermPlan` says."""
        # a sent plan (SelfTermPlan.to_device): its index fields are tensors, or None
        need, order = cast(Tensor | None, plan.need), cast(Tensor | None, plan.order)
        known_slots, store_slots = cast(Tensor, plan.known), cast(Tensor, plan.store_slots)
        computed = None
        if need is None or need.shape[0]:
            computed = compute(refs if need is None else refs.select(need))
            if computed is None:
                return None
            if store_slots.shape[0]:
                if self.self_term_values is None:
                    self.self_term_values = computed.new_zeros(self.size)
                store_rows = cast(Tensor, plan.store_rows)
                self.self_term_values.index_copy_(0, store_slots, computed.index_select(0, store_rows))
                self.known_self_terms.update(t for t in texts if t in self.lru)
        if known_slots.shape[0]:  # known slots: their values were stored
            known = cast(Tensor, self.self_term_values).index_select(0, known_slots)
            computed = known if computed is None else torch.cat([known, computed])
        # computed is None only where every row is known: then it is set just above
        return cast(Tensor, computed) if order is None else cast(Tensor, computed).index_select(0, order)

    def store_clouds(self, texts: list[str], clouds: TokenCloud, keep: list[int], keep_rows: Tensor,
                     spans: Spans) -> None:
        """Keep the clouds of the rows ``keep`` of ``clouds`` (rows = ``texts``; ``keep_rows``: ``keep``
        sent). A cloud with the empty-text placeholder is not kept (see :mod:`torchmover.reward.rewards`)."""
        if keep and clouds.empty is None:
            self.clouds.add([texts[i] for i in keep], clouds.select(keep_rows), [spans[i] for i in keep])
            self.known_clouds.update(texts[i] for i in keep)
