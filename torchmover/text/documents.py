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
        input_ids: ``[N, L]`` token ids (the encoder's pad id on padding: the tokenizer's, or 0 for a
            tokenizer without one), e.g. for IDF weights.
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
      located in order in the stripped text) holds the token's last character, read from the fast
      tokenizer's offsets. Tokens outside every sentence (characters a splitter dropped) are left out.
    * A longer text is encoded sentence by sentence, and a sentence longer than the window in
      consecutive chunks of at most ``max_length`` tokens (special tokens included), cut between
      words where possible (:func:`_chunks`); each chunk sees only its own context. Nothing is
      truncated. So is a text whose sentences cannot be located in it (a splitter that rewrites text).

    Every window is tokenized once, by the encoder (:meth:`~torchmover.Encoder.tokenize`: stripped),
    and goes through it in one call, padded as it pads; each window's tokens are read from that
    tokenization. Special tokens are dropped whatever ``encoder.special_tokens`` says (they belong
    to no sentence). No ``no_grad`` is used: the result is differentiable w.r.t. the encoder's
    parameters. Empty texts get an all-False mask.
    """
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of str, got a single str")
    texts = list(texts)
    for n, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{n}] must be a str, got {type(text).__name__}")
    if encoder.max_length - encoder.tokenizer.num_special_tokens_to_add(pair=False) < 1:
        raise ValueError(f"encoder.max_length={encoder.max_length} leaves no room for tokens")
    stripped = [text.strip() for text in texts]
    fits = encoder.fits(stripped)

    windows: list[str] = []  # the strings to encode, each at most max_length tokens
    window_sentence: list[list[tuple[int, int]] | int] = []  # spans (whole text) or a sentence id
    documents: list[int] = []  # per text, index of its first window; windows are contiguous per text
    for n, text in enumerate(texts):
        sentences = _check_splitter_output(splitter(text), text)
        spans = _sentence_spans(stripped[n], sentences)
        documents.append(len(windows))
        if not sentences:
            continue
        if spans is not None and fits[n]:
            windows.append(stripped[n])
            window_sentence.append(spans)
            continue
        for k, sentence in enumerate(sentences):
            for chunk in _chunks(encoder, sentence):
                windows.append(chunk)
                window_sentence.append(k)
    documents.append(len(windows))

    if not windows:
        dtype, device = encoder.dtype, encoder.device
        empty = torch.zeros(len(texts), 0, dtype=torch.long, device=device)
        return DocumentEmbeddings(torch.zeros(len(texts), 0, encoder.hidden_size, dtype=dtype, device=device),
                                  empty.bool(), empty - 1, empty)

    batch = encoder.tokenize(windows)  # every window fits: nothing is cut
    encoded = encoder(windows, with_word_ids=False, tokenized=batch)  # right-padded: positions are the tokens'
    tokens_per_doc = [[token for r in range(documents[n], documents[n + 1])
                       for token in _window_tokens(r, batch.encodings[r], window_sentence[r])]
                      for n in range(len(texts))]
    return _gather(encoded.embeddings, encoded.input_ids, tokens_per_doc, encoder.tokenizer.pad_token_id or 0)


def _window_tokens(row: int, encoding, sentence: list[tuple[int, int]] | int) -> list[_Token]:
    """The tokens of window ``row`` (its fast-tokenizer ``encoding``) that are not special, each with
    its sentence: ``sentence`` itself for a window of one sentence, else the one of the character
    spans ``sentence`` that holds the token's last character (a token in none is left out)."""
    tokens = []
    for position, (special, (start, end)) in enumerate(zip(encoding.special_tokens_mask, encoding.offsets)):
        if special:
            continue
        k = sentence if isinstance(sentence, int) else _sentence_of(sentence, end - 1 if end > start else start)
        if k is not None:
            tokens.append(_Token(row, position, k))
    return tokens


def _sentence_of(spans: list[tuple[int, int]], char: int) -> int | None:
    """Index of the span holding character ``char``, ``None`` if none does."""
    k = bisect.bisect_right([start for start, _ in spans], char) - 1
    return k if k >= 0 and char < spans[k][1] else None


def _chunks(encoder, sentence: str) -> list[str]:
    """``sentence`` (stripped) if it fits the ``encoder``'s window (:meth:`~torchmover.Encoder.fits`),
    else consecutive stripped substrings that do, cut between words where possible: each takes as
    many of the sentence's tokens as the window holds, backs off to the start of a word cut at its
    end (:func:`_word_cut`), then gives back tokens, a word at a time where it can, until it fits as
    the encoder tokenizes it alone (re-tokenising a substring can differ: BPE word-initial pieces).
    A single word longer than a window is cut inside; its continuation is then re-tokenised as a
    word of its own (no character is lost, but its first piece may differ from the one it had in
    the whole sentence), and a one-token piece that is still too long alone is cut between
    characters (:func:`_character_chunks`)."""
    if encoder.fits([sentence])[0]:
        return [sentence.strip()]
    tokenizer = encoder.tokenizer
    encoding = tokenizer(sentence, add_special_tokens=False, truncation=False, verbose=False,
                         return_offsets_mapping=True)
    offsets, words = encoding["offset_mapping"], encoding.word_ids()
    capacity = encoder.max_length - tokenizer.num_special_tokens_to_add(pair=False)
    chunks, i = [], 0
    while i < len(offsets):
        j = _word_cut(words, i, min(i + capacity, len(offsets)))
        while j - i > 1 and not encoder.fits([sentence[offsets[i][0]:offsets[j - 1][1]]])[0]:
            j = _word_cut(words, i, j - 1)
        chunks += _character_chunks(encoder, sentence[offsets[i][0]:offsets[j - 1][1]].strip())
        i = j
    return [chunk for chunk in chunks if chunk]


def _word_cut(words: list[int | None], i: int, j: int) -> int:
    """Where a chunk of the tokens ``i`` to ``j`` (exclusive; ``words``: each token's word id) ends:
    ``j``, or the start of the word that ``j`` cuts, unless that word starts the chunk."""
    if j == len(words) or words[j] is None or words[j] != words[j - 1]:
        return j
    first = j - 1
    while first > i and words[first - 1] == words[j]:
        first -= 1
    return first if first > i else j


def _character_chunks(encoder, piece: str) -> list[str]:
    """``piece`` if it fits the ``encoder``'s window, else consecutive stripped runs of its characters,
    each the longest that fits (a word piece tokenised alone can take more tokens: WordPiece's
    ``##yl`` alone is ``y ##l``). A character that alone takes more tokens than the window holds
    (a byte-level BPE tokenizer's bytes of one character, in a window of one token) raises
    ``ValueError``."""
    chunks = []
    while piece and not encoder.fits([piece])[0]:
        end = next((end for end in range(len(piece) - 1, 0, -1) if encoder.fits([piece[:end]])[0]), 0)
        if end == 0:
            raise ValueError(f"the character {piece[0]!r} takes more tokens alone than encoder.max_length="
                             f"{encoder.max_length} leaves for text: the sentence movers cannot encode it whole")
        chunks.append(piece[:end].strip())
        piece = piece[end:].strip()
    return chunks + [piece]


def _gather(hidden: Tensor, input_ids: Tensor, tokens_per_doc: list[list[_Token]], pad_id: int) -> DocumentEmbeddings:
    """Pick each document's tokens out of the encoded windows ``hidden`` ``[R, Lw, D]`` and their
    ``input_ids`` ``[R, Lw]`` (one differentiable gather, on their device)."""
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
    ids = torch.cat([input_ids.reshape(-1), input_ids.new_full((1,), pad_id)])
    device = hidden.device
    index = index.to(device)
    return DocumentEmbeddings(flat[index], (sentence_ids >= 0).to(device), sentence_ids.to(device), ids[index])
