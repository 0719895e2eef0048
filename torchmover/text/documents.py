"""Documents for the sentence movers (:mod:`torchmover.functional.sentences`): texts split into
sentences, and encoded into token vectors that know their sentence.

Two pieces, used in this order:

* :func:`split_sentences` — a documented rule-based splitter (any ``str -> list[str]`` can replace it);
* :func:`encode_documents` — texts -> token vectors with the sentence index of every token, never
  truncated (long texts are encoded sentence by sentence, long sentences in chunks).
"""
from __future__ import annotations

import bisect
import re
from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

__all__ = ["split_sentences", "encode_documents", "DocumentEmbeddings", "Splitter"]

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
