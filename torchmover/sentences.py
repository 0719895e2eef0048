"""Sentence movers: Sentence Mover's Similarity (SMS), S+WMS and WMS on contextual token vectors.

Clark, Celikyilmaz & Smith (2019), "Sentence Mover's Similarity: Automatic Evaluation for
Multi-Sentence Texts" (ACL). A document ``A`` is a bag of units — its words, its sentences, or
both — each with a mass; the distance of two documents is the earth mover's distance between their
bags under the Euclidean ground cost, and the similarity is ``exp(−distance)``:

    word units      x_w = unit token vector,                       mass 1 / |A|          (WMS)
    sentence units  x_s = mean of the word vectors of sentence s,  mass |s| / |A|        (SMS)
    union           both, with masses 1 / (2|A|) and |s| / (2|A|)                          (S+WMS)

    WMD(A, B) = min_{π ≥ 0, π1 = a, πᵀ1 = b} Σ_ij π_ij ‖x_i − y_j‖,     Sim(A, B) = exp(−WMD(A, B))

``|A|`` is the number of real tokens of ``A`` and ``|s|`` that of sentence ``s``. The paper's
word masses are ``count(w) / |A|`` per word type; with contextual vectors every token is its own
unit with mass ``1 / |A|``, which is the same thing whenever equal words have equal vectors.

Three pieces, used in this order:

* :func:`split_sentences` — a documented rule-based splitter (any ``str -> list[str]`` can replace it);
* :func:`encode_documents` — texts -> token vectors with the sentence index of every token, never
  truncated (long texts are encoded sentence by sentence, long sentences in chunks);
* :func:`sentence_movers` — the similarity on a padded batch, differentiable w.r.t. the vectors.
"""
from __future__ import annotations

import bisect
import re
from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from .family import WMD_TEMPERATURE, _check_inputs, _log, _placeholder_for_empty, _unit_vectors
from .devices import autocast_off
from .transport import check_temperature, converged_sinkhorn, cost_matrix, sinkhorn

__all__ = ["split_sentences", "encode_documents", "sentence_movers", "DocumentEmbeddings", "VARIANTS"]

Splitter = Callable[[str], "list[str]"]

# --- splitting ------------------------------------------------------------------------------------

# Words ending in "." after which a sentence does not end (matched case-sensitively, so "No. 5"
# does not split but "He said no. Then" does). A single capital initial ("J. Smith") is also kept.
ABBREVIATIONS = frozenset({
    "Mr.", "Mrs.", "Ms.", "Dr.", "Prof.", "St.", "Jr.", "Sr.", "No.", "Nos.", "Inc.", "Ltd.", "Co.", "Corp.",
    "Gen.", "Col.", "Lt.", "Sgt.", "Capt.", "Gov.", "Sen.", "Rep.", "Mt.", "Ave.",
    "Fig.", "Figs.", "Eq.", "Vol.", "cf.", "al.", "approx.",
    "e.g.", "i.e.", "E.g.", "I.e.", "etc.", "vs.", "U.S.", "U.K.",
})
OPENERS = "\"'“‘«([{"
CLOSERS = "\"'”’»)]}"
# A run of terminal punctuation, then closing quotes/brackets, then (not consumed) whitespace.
_SENTENCE_END = re.compile(r"[.!?…]+[" + re.escape(CLOSERS) + r"]*(?=\s)")
_INITIAL = re.compile(r"[A-Z]\.")


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences with a few rules; returns the stripped, non-empty sentences.

    A sentence ends

    * at every line break, and
    * after a run of ``. ! ? …`` (optionally followed by closing quotes or brackets) when whitespace
      follows and the next character is an upper-case letter, a digit, or an opening quote or
      bracket —

    except after one of :data:`ABBREVIATIONS` (``Mr.``, ``Dr.``, ``e.g.``, ``U.S.``, ``No.``, ...)
    or a single capital initial (``J. Smith``). Decimals such as ``3.5`` never split (no whitespace
    follows the point). Empty or whitespace-only text gives ``[]``.

    Example:
        >>> split_sentences("Dr. J. Smith paid $3.5 million. The U.S. firm agreed!  \\"Fine.\\" Done")
        ['Dr. J. Smith paid $3.5 million.', 'The U.S. firm agreed!', '"Fine."', 'Done']
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    sentences = []
    for line in text.splitlines():
        start = 0
        for end in _SENTENCE_END.finditer(line):
            rest = line[end.end():].lstrip()
            if not rest or not (rest[0].isupper() or rest[0].isdigit() or rest[0] in OPENERS):
                continue
            if end.group() == "." and _is_abbreviation(line[start:end.end()]):
                continue
            sentences.append(line[start:end.end()].strip())
            start = end.end()
        sentences.append(line[start:].strip())
    return [s for s in sentences if s]


def _is_abbreviation(head: str) -> bool:
    """Whether the last word of ``head`` (which ends in ".") is an abbreviation or an initial."""
    word = head.rsplit(None, 1)[-1].lstrip(OPENERS)
    return word in ABBREVIATIONS or _INITIAL.fullmatch(word) is not None


def _sentence_spans(text: str, sentences: Sequence[str]) -> list[tuple[int, int]] | None:
    """Character spans ``(start, end)`` of ``sentences`` found in order in ``text``, or ``None`` if
    one is not a substring there (a splitter that rewrites its input)."""
    spans, position = [], 0
    for sentence in sentences:
        start = text.find(sentence, position)
        if start < 0:
            return None
        spans.append((start, start + len(sentence)))
        position = start + len(sentence)
    return spans


def _check_splitter_output(sentences, text: str) -> list[str]:
    if not isinstance(sentences, (list, tuple)) or not all(isinstance(s, str) for s in sentences):
        raise ValueError(f"splitter must return a list of str, got {sentences!r} for {text[:60]!r}")
    return list(sentences)


# --- encoding -------------------------------------------------------------------------------------

class DocumentEmbeddings(NamedTuple):
    """Padded token vectors of documents with the sentence each token belongs to.

    Attributes:
        embeddings: ``[N, L, D]`` token vectors (real tokens first, then zero padding).
        mask: ``[N, L]`` True for real tokens (special tokens are never included).
        sentence_ids: ``[N, L]`` index, in ``splitter(text)``, of each token's sentence; ``−1`` on
            padding.
        input_ids: ``[N, L]`` token ids (the tokenizer's pad id on padding), e.g. for IDF weights.
    """

    embeddings: Tensor
    mask: Tensor
    sentence_ids: Tensor
    input_ids: Tensor | None = None


class _Token(NamedTuple):
    sequence: int  # row of the encoded batch
    position: int  # position in that row
    sentence: int  # sentence index in the document


def encode_documents(encoder, texts: Sequence[str], splitter: Splitter = split_sentences) -> DocumentEmbeddings:
    """Encode ``texts`` with ``encoder`` (an :class:`~torchmover.Encoder`), keeping every token and
    recording the sentence it belongs to.

    * A text that fits in ``encoder.max_length`` tokens (special tokens included) is encoded whole,
      in one window; each token gets the sentence whose character span (``splitter``'s sentences
      located in order in the text) holds the token's last character, read from the fast
      tokenizer's offsets. Tokens outside every sentence (characters a splitter dropped) are left out.
    * A longer text is encoded sentence by sentence, and a sentence longer than the window in
      consecutive chunks of at most ``max_length`` tokens (special tokens included), cut between
      words where possible; each chunk sees only its own context. Nothing is truncated. So is a text
      whose sentences cannot be located in it (a splitter that rewrites text).

    All windows of the batch go through the encoder in one call. Special tokens are dropped whatever
    ``encoder.special_tokens`` says (they belong to no sentence). No ``no_grad`` is used: the result
    is differentiable w.r.t. the encoder's parameters. Empty texts get an all-False mask.
    """
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of str, got a single str")
    texts = list(texts)
    tokenizer, max_length = encoder.tokenizer, encoder.max_length
    if max_length - tokenizer.num_special_tokens_to_add(pair=False) < 1:
        raise ValueError(f"encoder.max_length={max_length} leaves no room for tokens")
    whole = tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False,
                      return_offsets_mapping=True, return_special_tokens_mask=True)

    windows: list[str] = []  # the strings to encode, each at most max_length tokens
    window_sentence: list[list[tuple[int, int]] | int] = []  # spans (whole text) or a sentence id
    documents: list[int] = []  # per text, index of its first window; windows are contiguous per text
    for n, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{n}] must be a str, got {type(text).__name__}")
        sentences = _check_splitter_output(splitter(text), text)
        spans = _sentence_spans(text, sentences)
        documents.append(len(windows))
        if not sentences:
            continue
        if spans is not None and len(whole["input_ids"][n]) <= max_length:
            windows.append(text)
            window_sentence.append(spans)
            continue
        for k, sentence in enumerate(sentences):
            for chunk in _chunks(tokenizer, sentence, max_length):
                windows.append(chunk)
                window_sentence.append(k)
    documents.append(len(windows))

    dtype = encoder.dtype
    if not windows:
        empty = torch.zeros(len(texts), 0, dtype=torch.long, device=encoder.device)
        return DocumentEmbeddings(torch.zeros(len(texts), 0, encoder.hidden_size, dtype=dtype, device=encoder.device),
                                  empty.bool(), empty - 1, empty)

    batch = tokenizer(windows, padding=True, truncation=False, verbose=False,
                      return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    encoded = encoder(windows)  # same tokenizer, same padding; nothing is cut (every window fits)
    assert torch.equal(encoded.input_ids.cpu(), batch["input_ids"]), "window tokenisation differs from Encoder's"
    real = batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()  # [R, Lw]

    offsets = batch["offset_mapping"].tolist()  # [R][Lw] (start, end) character offsets
    tokens_per_doc: list[list[_Token]] = []
    for n in range(len(texts)):
        tokens = []
        for r in range(documents[n], documents[n + 1]):
            sentence = window_sentence[r]
            for position in real[r].nonzero().flatten().tolist():
                if isinstance(sentence, int):
                    tokens.append(_Token(r, position, sentence))
                    continue
                start, end = offsets[r][position]
                k = _sentence_of(sentence, end - 1 if end > start else start)
                if k is not None:
                    tokens.append(_Token(r, position, k))
        tokens_per_doc.append(tokens)
    return _gather(encoded.embeddings, batch["input_ids"], tokens_per_doc, tokenizer.pad_token_id or 0)


def _sentence_of(spans: list[tuple[int, int]], char: int) -> int | None:
    """Index of the span holding character ``char``, ``None`` if none does."""
    k = bisect.bisect_right([start for start, _ in spans], char) - 1
    return k if k >= 0 and char < spans[k][1] else None


def _chunks(tokenizer, sentence: str, max_length: int) -> list[str]:
    """``sentence`` itself if it fits in ``max_length`` tokens, else consecutive substrings that do,
    cut between words where possible. A single word longer than a window is cut inside; its
    continuation is then re-tokenised as a word of its own (no character is lost, but its first
    piece may differ from the one it had in the whole sentence)."""
    if len(tokenizer(sentence, truncation=False, verbose=False)["input_ids"]) <= max_length:
        return [sentence]
    encoding = tokenizer(sentence, add_special_tokens=False, truncation=False, verbose=False,
                         return_offsets_mapping=True)
    offsets, words = encoding["offset_mapping"], encoding.word_ids()
    capacity = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    chunks, i = [], 0
    while i < len(offsets):
        j = min(i + capacity, len(offsets))
        if j < len(offsets) and words[j] is not None and words[j] == words[j - 1]:
            first = j - 1  # back off to the start of the word cut at j, unless it starts the chunk
            while first > i and words[first - 1] == words[j]:
                first -= 1
            j = first if first > i else j
        while True:  # re-tokenising a substring can differ (BPE word-initial pieces): shrink until it fits
            chunk = sentence[offsets[i][0]:offsets[j - 1][1]]
            if j - i == 1 or len(tokenizer(chunk, truncation=False, verbose=False)["input_ids"]) <= max_length:
                break
            j -= 1
        chunks.append(chunk)
        i = j
    return chunks


def _gather(hidden: Tensor, input_ids: Tensor, tokens_per_doc: list[list[_Token]], pad_id: int) -> DocumentEmbeddings:
    """Pick each document's tokens out of the encoded windows (one differentiable gather)."""
    rows, length, dim = hidden.shape  # [R, Lw, D]
    n_docs, width = len(tokens_per_doc), max((len(t) for t in tokens_per_doc), default=0)
    padding = rows * length  # index of an appended zero vector
    index = torch.full((n_docs, width), padding, dtype=torch.long, device="cpu")  # [N, L], host
    sentence_ids = torch.full((n_docs, width), -1, dtype=torch.long, device="cpu")  # [N, L], host
    for n, tokens in enumerate(tokens_per_doc):
        if tokens:
            r, p, k = (torch.tensor(v, dtype=torch.long, device="cpu") for v in zip(*tokens))
            index[n, :len(tokens)] = r * length + p
            sentence_ids[n, :len(tokens)] = k
    flat = torch.cat([hidden.reshape(padding, dim), hidden.new_zeros(1, dim)])  # [R·Lw + 1, D]
    ids = torch.cat([input_ids.reshape(-1), torch.tensor([pad_id], device=input_ids.device)])
    device = hidden.device
    return DocumentEmbeddings(flat[index.to(device)], (sentence_ids >= 0).to(device),
                              sentence_ids.to(device), ids[index].to(device))


# --- similarity -----------------------------------------------------------------------------------

VARIANTS = ("sms", "s+wms", "wms")


def sentence_movers(
    hyp: Tensor, ref: Tensor, hyp_mask: Tensor | None = None, ref_mask: Tensor | None = None,
    hyp_sentence_ids: Tensor | None = None, ref_sentence_ids: Tensor | None = None, *,
    variant: str = "sms", temperature: float | None = None, n_iter: int = 1,
) -> Tensor:
    """Sentence Mover's Similarity ``exp(−WMD)`` of Clark et al. (2019), ``[B]``.

    Args:
        hyp: ``[B, L2, D]`` hypothesis token vectors (centred by the caller if wanted).
        ref: ``[B, L1, D]`` reference token vectors.
        hyp_mask, ref_mask: ``[B, L2]``, ``[B, L1]`` True for real tokens (default: all real).
        hyp_sentence_ids, ref_sentence_ids: ``[B, L2]``, ``[B, L1]`` sentence index of each token
            (:attr:`DocumentEmbeddings.sentence_ids`); a token with a negative id is not real.
            ``None``: the whole text is one sentence.
        variant: ``"sms"`` (sentence units), ``"wms"`` (word units) or ``"s+wms"`` (both).
        temperature: ``None`` for the exact distance; a float for the tempered variant.
        n_iter: Sinkhorn iterations of the tempered variant.

    Token vectors are L2-normalised and used as the word vectors ``x_w``; a sentence's vector is the
    mean ``x_s = (1/|s|) Σ_{w∈s} x_w`` (not re-normalised). Word units weigh ``1/|A|``, sentence
    units ``|s|/|A|`` (``|A|`` real tokens in the document, ``|s|`` in the sentence); in ``s+wms``
    both halved, so each side's masses sum to 1. With ``C_ij = ‖x_i − y_j‖`` between reference
    units ``i`` (masses ``a``) and hypothesis units ``j`` (masses ``b``):

        WMD = Σ_ij π_ij C_ij,        score = exp(−WMD)

    * ``temperature=None``: ``π`` is the entropic optimum at ``T = 1e-3`` solved to convergence
      (:func:`~torchmover.transport.converged_sinkhorn` with the Euclidean cost), within ~1e-3 of
      the LP; the gradient is the envelope gradient ``∂WMD/∂C = π*`` (plan held constant).
    * ``temperature=T``: ``π`` is ``n_iter`` log-domain Sinkhorn iterations from the Gibbs plan
      ``log π⁰ = −C / T`` (columns, then rows: every reference unit ships exactly its mass),
      unrolled, so the gradient is exact.

    A single-sentence text has one SMS unit: its score is ``exp(−‖mean(x) − mean(y)‖)``.
    ``Sim(X, X) = 1`` up to the solver's accuracy. A pair with an empty text (no real token on
    either side) scores exactly 0, with zero (finite) gradient. Computed in at least float32.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> x, ids = torch.randn(2, 5, 8, dtype=torch.float64), torch.tensor([[0, 0, 1, 1, 1]] * 2)
        >>> mask = torch.tensor([[True] * 5, [False] * 5])  # the second text is empty
        >>> sentence_movers(x, x, mask, mask, ids, ids, variant="s+wms").round(decimals=6).tolist()
        [1.0, 0.0]
    """
    with autocast_off(hyp.device):
        return _sentence_movers(hyp, ref, hyp_mask, ref_mask, hyp_sentence_ids, ref_sentence_ids,
                                variant, temperature, n_iter)


def _sentence_movers(hyp, ref, hyp_mask, ref_mask, hyp_sentence_ids, ref_sentence_ids, variant, temperature, n_iter):
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError(f"temperature must be a positive float or None (exact), got {temperature!r}")
        check_temperature(temperature)
        if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
            raise ValueError(f"n_iter must be a positive int, got {n_iter!r}")
    hyp_mask, ref_mask = _check_inputs(hyp, ref, hyp_mask, ref_mask)
    dtype = torch.promote_types(torch.promote_types(hyp.dtype, ref.dtype), torch.float32)
    x, mx, a = _units(ref.to(dtype), ref_mask, ref_sentence_ids, variant, "ref_sentence_ids")  # [B, U1, D]
    y, my, b = _units(hyp.to(dtype), hyp_mask, hyp_sentence_ids, variant, "hyp_sentence_ids")  # [B, U2, D]
    empty = ~(mx.any(-1) & my.any(-1))  # [B]
    x, mx, a = _placeholder_for_empty(x, mx, a, empty)
    y, my, b = _placeholder_for_empty(y, my, b, empty)
    cost = cost_matrix(x, y, "euclidean")  # [B, U1, U2]  C_ij = ‖x_i − y_j‖
    if temperature is None:
        plan = converged_sinkhorn(x, y, mx, my, a, b, WMD_TEMPERATURE, cost="euclidean").plan  # no graph
    else:
        plan = sinkhorn(-cost, mx, my, _log(a), _log(b), float(temperature), n_iter, exact="rows").plan
    distance = (plan * cost).sum((-1, -2))  # [B]  WMD = Σ π C
    score = torch.exp(-distance)
    return torch.where(empty, torch.zeros_like(score), score)


def _units(x: Tensor, mask: Tensor, sentence_ids: Tensor | None, variant: str, name: str):
    """Unit vectors ``[B, U, D]``, their mask ``[B, U]`` and masses ``[B, U]`` (summing to 1 over a
    non-empty document) for one side: words (``U = L``), sentences (``U = S``) or both (``L + S``)."""
    if sentence_ids is None:
        sentence_ids = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    elif (not isinstance(sentence_ids, Tensor) or sentence_ids.shape != mask.shape
          or sentence_ids.is_floating_point() or sentence_ids.dtype == torch.bool):
        got = f"{sentence_ids.dtype} {tuple(sentence_ids.shape)}" if isinstance(sentence_ids, Tensor) else type(sentence_ids)
        raise ValueError(f"{name} must be an integer tensor of shape {tuple(mask.shape)}, got {got}")
    sentence_ids = sentence_ids.to(device=mask.device, dtype=torch.long)
    valid = mask & (sentence_ids >= 0)  # [B, L]
    words = _unit_vectors(x, valid)  # [B, L, D]  x_w
    size = valid.sum(-1, keepdim=True).clamp_min(1).to(x.dtype)  # [B, 1]  |A|
    word_mass = valid.to(x.dtype) / size  # [B, L]  1/|A|
    if variant == "wms":
        return words, valid, word_mass
    ids = sentence_ids.masked_fill(~valid, 0)
    n_sentences = int(ids.max()) + 1 if ids.numel() else 1
    member = torch.nn.functional.one_hot(ids, n_sentences).to(x.dtype) * valid.unsqueeze(-1)  # [B, L, S]
    counts = member.sum(1)  # [B, S]  |s|
    sentences = member.transpose(1, 2) @ words / counts.clamp_min(1).unsqueeze(-1)  # [B, S, D]  x_s
    sentence_mask, sentence_mass = counts > 0, counts / size  # [B, S]  |s|/|A|
    if variant == "sms":
        return sentences, sentence_mask, sentence_mass
    return (torch.cat([words, sentences], 1), torch.cat([valid, sentence_mask], 1),
            torch.cat([word_mass, sentence_mass], 1) / 2)
