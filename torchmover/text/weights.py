"""Which tokens take part, and with what mass: subword policy, stopwords, punctuation, IDF, n-grams.

Every choice here is an explicit parameter, because each one moves published scores (MoverScore and
BERTScore numbers are often irreproducible for want of them):

- ``subwords``: ``all`` keeps every word piece; ``first`` keeps the first piece of each word (MoverScore
  v2 drops ``##`` pieces); ``mean`` mean-pools the pieces of each word into one vector.
- ``stopwords``: words (lower-cased) whose tokens are dropped; matched on the whole word, rebuilt from
  its pieces with the tokenizer's ``convert_tokens_to_string``.
- ``punctuation``: ``keep``; ``drop`` words made only of punctuation characters (``string.punctuation``
  and Unicode punctuation such as ’ “ –); ``ascii``: only words made of ``string.punctuation``
  characters (MoverScore v2's rule: it drops tokens that are one ``string.punctuation`` character).
- IDF weights from an explicit corpus: ``idf(t) = log((N + 1) / (df(t) + 1))`` with ``N`` documents and
  ``df(t)`` of them containing token ``t`` (tokens never seen: ``log(N + 1)``) — MoverScore v2's and
  BERTScore's formula. MoverScore keeps separate dictionaries for references and hypotheses.
- n-gram units (MoverScore's WMD-n, Eq. 1): an n-gram's vector is the IDF-weighted sum of its token
  vectors, its mass the sum of their IDF weights (normalised later with the other masses).
"""
from __future__ import annotations

import hashlib
import math
import string
import unicodedata
import warnings
from collections import Counter
from typing import Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .._internal.transfer import send
from ..runtime.distributed import is_distributed, shard
from .encoder import check_max_length

SUBWORD_POLICIES = ("all", "first", "mean")
PUNCTUATION_POLICIES = ("keep", "drop", "ascii")

# A short list of English function words (articles, pronouns, auxiliaries, prepositions,
# conjunctions), written for torchmover; pass your own list to match another paper exactly.
ENGLISH_STOPWORDS = tuple(sorted(set("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you your
yours yourself yourselves
""".split())))


class IDF:
    """Inverse document frequencies of token ids, fitted on an explicit corpus.

    ``idf(t) = log((N + 1) / (df(t) + 1))``; ``unseen = log(N + 1)``. Special tokens ([CLS], [SEP])
    occur in every document, so their IDF is exactly 0, as in MoverScore v2.
    """

    def __init__(self, document_frequency: dict[int, int], num_documents: int):
        if num_documents < 1:
            raise ValueError("IDF needs at least one document")
        self.document_frequency = dict(document_frequency)
        self.num_documents = num_documents
        self._tables: dict[torch.device, Tensor] = {}

    @classmethod
    def fit(cls, texts: Iterable[str], tokenizer, max_length: int | None = None) -> "IDF":
        """Count, for every token id, how many of ``texts`` contain it (special tokens included; texts
        stripped and cut to ``max_length`` tokens as the encoder does: pass its
        :attr:`~torchmover.Encoder.max_length`; None: the tokenizer's ``model_max_length``)."""
        texts = list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("IDF.fit needs a non-empty list of strings")
        return cls(document_frequencies(texts, tokenizer, max_length), len(texts))

    def value(self, token_id: int) -> float:
        return math.log((self.num_documents + 1) / (self.document_frequency.get(token_id, 0) + 1))

    @property
    def weightless(self) -> bool:
        """Whether every token of the fitted corpus is in every one of its documents, so that each weighs
        ``log((N + 1) / (N + 1)) = 0``: always so with one document. A text made of those tokens has
        no mass and scores exactly 0."""
        return all(df == self.num_documents for df in self.document_frequency.values())

    def table(self, device: torch.device | str = "cpu") -> Tensor:
        """The dense float32 table ``[max_id + 2]`` on ``device``: entry ``t`` is ``idf(t)`` for every id
        up to the largest one seen in the corpus, the last entry the unseen value (any larger id).
        Built once per device, then reused."""
        device = torch.device(device)
        if device not in self._tables:
            size = max(self.document_frequency, default=-1) + 2
            values = [math.log(self.num_documents + 1)] * size
            for token_id, df in self.document_frequency.items():
                values[token_id] = self.value(token_id)
            self._tables[device] = torch.tensor(values, dtype=torch.float32, device=device)
        return self._tables[device]

    def __call__(self, input_ids: Tensor) -> Tensor:
        """IDF weight of every token id (``[N, L]`` -> float ``[N, L]``): a gather from :meth:`table`
        on the ids' device (no host round trip)."""
        table = self.table(input_ids.device)
        return table[input_ids.clamp_max(table.shape[0] - 1)]

    def digest(self) -> str:
        """Short content hash (for the signature)."""
        payload = repr((self.num_documents, sorted(self.document_frequency.items()))).encode()
        return hashlib.sha256(payload).hexdigest()[:10]

    def to_dict(self) -> dict:
        return {"num_documents": self.num_documents,
                "document_frequency": {str(k): v for k, v in self.document_frequency.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "IDF":
        return cls({int(k): v for k, v in data["document_frequency"].items()}, data["num_documents"])


def warn_if_weightless(dictionaries: Mapping[str, IDF]) -> None:
    """One ``UserWarning`` naming each side of ``dictionaries`` (e.g. ``{"hypotheses": idf}``) whose
    dictionary is :attr:`IDF.weightless`, with its number of documents, and what to do; nothing when
    none is. The warning points at the line that called the fitting function calling this one."""
    sides = [f"of the {side} (fitted on {idf.num_documents} document{'s' if idf.num_documents != 1 else ''})"
             for side, idf in dictionaries.items() if idf.weightless]
    if sides:
        noun, verb, corpus = ("dictionary", "gives", "its corpus") if len(sides) == 1 else \
            ("dictionaries", "give", "their corpora")
        warnings.warn(f"IDF: the {noun} {' and '.join(sides)} {verb} every token of {corpus} weight 0: each "
                      "is in every document, as always with one distinct document. A text made only of those "
                      "tokens has no mass and scores exactly 0 (with the statistics fitted on a call's own texts, "
                      "as torchmover.score and the command line fit them: every pair of the call). Fit the "
                      "dictionaries on a larger corpus with Scorer.fit_idf(references, hypotheses), e.g. the "
                      "training references, or score more texts in one call", UserWarning, stacklevel=3)


def document_frequencies(texts: Sequence[str], tokenizer, max_length: int | None = None) -> Counter:
    """For every token id, how many of ``texts`` contain it (special tokens included; texts stripped
    and cut to ``max_length`` tokens as :meth:`~torchmover.Encoder.tokenize` does; None: the
    tokenizer's ``model_max_length``)."""
    check_max_length(max_length)
    counts: Counter = Counter()
    if texts:
        for ids in tokenizer([t.strip() for t in texts], truncation=True, max_length=max_length)["input_ids"]:
            counts.update(set(ids))
    return counts


def _is_punctuation(word: str, ascii_only: bool) -> bool:
    if ascii_only:
        return bool(word) and all(c in string.punctuation for c in word)
    return bool(word) and all(c in string.punctuation or unicodedata.category(c).startswith("P") for c in word)


def word_strings(input_ids: Tensor, word_ids: Tensor, tokenizer) -> list[dict[int, str]]:
    """For each text, ``{word index: the word}`` rebuilt from its pieces, lower-cased."""
    words = []
    for ids, wids in zip(input_ids.tolist(), word_ids.tolist()):
        pieces: dict[int, list[str]] = {}
        for token, w in zip(tokenizer.convert_ids_to_tokens(ids), wids):
            if w >= 0:
                pieces.setdefault(w, []).append(token)
        words.append({w: tokenizer.convert_tokens_to_string(p).strip().lower() for w, p in pieces.items()})
    return words


def keep_mask(mask: Tensor, input_ids: Tensor, word_ids: Tensor, tokenizer, *, subwords: str = "all",
              stopwords: Sequence[str] = (), punctuation: str = "keep") -> Tensor:
    """``mask`` (``[N, L]``) with the tokens dropped by the subword / stopword / punctuation policy
    removed. ``subwords="mean"`` keeps every piece here: pool them with :func:`pool_subwords`.
    Reads ``input_ids`` and ``word_ids`` on the host: :class:`~torchmover.Encoder` calls it as its
    ``token_policy`` on the tokenizer's output, before anything goes to the device."""
    if subwords not in SUBWORD_POLICIES:
        raise ValueError(f"subwords must be one of {SUBWORD_POLICIES}, got {subwords!r}")
    if punctuation not in PUNCTUATION_POLICIES:
        raise ValueError(f"punctuation must be one of {PUNCTUATION_POLICIES}, got {punctuation!r}")
    keep = mask.clone()
    if subwords == "first":  # special tokens (word id −1) are not pieces of a word: kept
        previous = torch.cat([torch.full_like(word_ids[:, :1], -1), word_ids[:, :-1]], dim=1)
        keep &= (word_ids != previous) | (word_ids < 0)
    if stopwords or punctuation != "keep":
        stop = {w.lower() for w in stopwords}
        dropped_rows = []
        for words, wids in zip(word_strings(input_ids, word_ids, tokenizer), word_ids.tolist()):
            dropped = {w for w, s in words.items()
                       if s in stop or (punctuation != "keep" and _is_punctuation(s, punctuation == "ascii"))}
            dropped_rows.append([w in dropped for w in wids])
        keep &= ~send(torch.tensor(dropped_rows, dtype=torch.bool, device="cpu"), keep.device).reshape(keep.shape)
    return keep


def pool_subwords(x: Tensor, mask: Tensor, word_ids: Tensor, *weights: Tensor, num_words: int | None = None):
    """Mean-pool the pieces of each word: ``[N, L, D]`` -> ``[N, W, D]`` (W = most words in a text,
    ``num_words`` if given — e.g. :attr:`TokenEmbeddings.num_words`, known on the host — else read
    from ``word_ids``, which waits for the device). Special tokens belong to no word and are dropped.

    Returns ``(vectors, mask, *weights)``; a word's weight is the mean of its pieces' weights (for
    each weight tensor given). Only the pieces in ``mask`` count; a word with none is masked.
    Differentiable.
    """
    if num_words is None:
        num_words = int(word_ids.max()) + 1 if word_ids.numel() else 0
    n_words = max(num_words, 1)
    member = (word_ids.unsqueeze(1) == torch.arange(n_words, device=x.device)[None, :, None]) & mask.unsqueeze(1)
    member = member.to(x.dtype)  # [N, W, L]
    count = member.sum(-1)  # [N, W]
    pooled = member @ x / count.clamp_min(1).unsqueeze(-1)
    pooled_weights = [(member * w.unsqueeze(1).to(x.dtype)).sum(-1) / count.clamp_min(1) for w in weights]
    return (pooled, count > 0, *pooled_weights)


def ngrams(x: Tensor, mask: Tensor, weights: Tensor, n: int, *, balanced: bool | Tensor = False):
    """n-gram units over the real tokens (in order): vector ``Σ w_t x_t``, mass ``Σ w_t`` over each
    window of ``n`` consecutive real tokens (MoverScore's Eq. 1). A text with fewer than ``n`` real
    tokens gives one unit of all of them. ``[N, L, D]`` -> ``[N, max(L - n + 1, 1), D]``.

    ``balanced`` (a bool, or a 0-dim bool tensor): every text's real tokens sum to 0 in exact
    arithmetic, ``Σ_t x_t = 0`` (they were centered on their own mean: ``sentence`` centering, or a
    batch mean that is one text's own). Then a text of at most ``n`` real tokens, all of one weight
    ``w``, has one unit ``Σ w x_t = w Σ x_t = 0``, which is written as exactly 0 — in float its sum
    is rounding noise, whose arbitrary direction would be scored — so the text scores as one
    centered to 0 does."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if n == 1:
        return x, mask, weights
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # real tokens first, in order
    x = torch.gather(x, 1, order.unsqueeze(-1).expand_as(x))
    w = torch.gather(torch.where(mask, weights, torch.zeros_like(weights)), 1, order)
    count = mask.sum(1)  # [N]
    L = x.shape[1]
    units = max(L - n + 1, 1)
    if L < n:  # pad so every window exists
        x = torch.cat([x, x.new_zeros(x.shape[0], n - L, x.shape[2])], 1)
        w = torch.cat([w, w.new_zeros(w.shape[0], n - L)], 1)
    weighted = x * w.unsqueeze(-1)
    vectors = torch.stack([weighted[:, k:k + units] for k in range(n)]).sum(0)  # [N, U, D]
    masses = torch.stack([w[:, k:k + units] for k in range(n)]).sum(0)  # [N, U]
    start = torch.arange(units, device=x.device)
    first = start.unsqueeze(0) == 0  # [1, U]
    unit_mask = (start.unsqueeze(0) + n <= count.unsqueeze(1)) | (first & (count.unsqueeze(1) > 0))
    if balanced is not False:  # True, or a flag on the device (never read on the host)
        zero = first & (spans_all_equally(w, count, n) & balanced).unsqueeze(1)  # [N, U]
        vectors = torch.where(zero.unsqueeze(-1), 0.0, vectors)
    return vectors, unit_mask, torch.where(unit_mask, masses, torch.zeros_like(masses))


def spans_all_equally(w: Tensor, count: Tensor, n: int) -> Tensor:
    """``[N]``: the texts whose first n-gram unit spans all of their real tokens (at most ``n``), each
    of the same weight. ``w`` ``[N, L]``: the weights of each text's ``count`` real tokens first."""
    real = torch.arange(w.shape[1], device=w.device).unsqueeze(0) < count.unsqueeze(1)
    heaviest = torch.where(real, w, -torch.inf).amax(1)
    lightest = torch.where(real, w, torch.inf).amin(1)
    return (count <= n) & (heaviest == lightest)


def fit_idf_over_ranks(texts: list[str], tokenizer, device: torch.device | str = "cpu", group=None,
                       max_length: int | None = None) -> IDF:
    """:meth:`IDF.fit` on ``texts`` (the same list on every rank), each rank tokenizing its
    :func:`~torchmover.runtime.distributed.shard`: the document frequencies ``df(t) = Σ_r df_r(t)`` and the document
    count ``N = Σ_r N_r`` are summed as one dense ``[vocab + 1]`` int64 all-reduce, so every rank gets
    the IDF of the whole corpus. ``IDF.fit(texts, tokenizer, max_length)`` outside a distributed job."""
    if not is_distributed(group):
        return IDF.fit(texts, tokenizer, max_length)
    if not texts:
        raise ValueError("IDF.fit needs a non-empty list of strings")
    counts = frequency_counts(shard(texts, device, group), tokenizer, max_length).to(device)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    return idf_of_counts(counts)


def frequency_counts(texts: Sequence[str], tokenizer, max_length: int | None = None) -> Tensor:
    """The document frequencies of ``texts`` (cut to ``max_length`` tokens, as in
    :func:`document_frequencies`) as one dense host tensor ``[vocab + 1]`` int64: ``df(0) … df(V − 1)``,
    then the number of texts (summed over ranks or chunks, then :func:`idf_of_counts`)."""
    counts = torch.zeros(len(tokenizer) + 1, dtype=torch.long)
    frequencies = document_frequencies(texts, tokenizer, max_length)
    if frequencies:
        counts[torch.tensor(list(frequencies))] = torch.tensor(list(frequencies.values()))
    counts[-1] = len(texts)
    return counts


def idf_of_counts(counts: Tensor) -> IDF:
    """The :class:`IDF` of dense :func:`frequency_counts` (on any device)."""
    counts = counts.cpu()
    seen = counts[:-1].nonzero().flatten().tolist()
    return IDF(dict(zip(seen, counts[seen].tolist())), int(counts[-1]))
