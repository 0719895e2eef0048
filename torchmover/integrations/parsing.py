"""From what an RL framework hands a reward to the texts torchmover scores.

A *completion parser* is any callable ``parse(completion_text) -> text to score``; the TRL, verl and
OpenRLHF adapters all accept one (``parse=...``) and apply it to each generation before scoring.
This module holds the ones RL practitioners need:

- :func:`strip_reasoning`: drop reasoning traces (``<think>…</think>`` or other delimiters), so that
  only the answer is compared with the reference.
- :func:`response_from_query`: OpenRLHF passes ``query`` = prompt + response decoded *with* special
  tokens; cut the response out of it, given the prompt.
- :func:`strip_special_tokens`: remove chat-template special tokens (``<|im_end|>``, ``</s>``, ...).
- :func:`reference_list`: one row's reference(s) as a list of str (str, list, tuple, NumPy array or
  None), shared by the adapters.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

from ..scorer.inputs import as_list

__all__ = ["DEFAULT_SPECIAL_TOKENS", "Parser", "check_parser", "reference_list", "response_from_query",
           "strip_reasoning", "strip_special_tokens"]

# parse(completion_text) -> text to score
Parser = Callable[[str], str]

# Special tokens of the common chat templates, matched when no explicit list is given: anything of
# the form <|...|> (GPT, Llama 3, Qwen, Phi) or <｜...｜> (DeepSeek), and these literals.
DEFAULT_SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
                          "[CLS]", "[SEP]", "[PAD]", "[INST]", "[/INST]")
_DEFAULT_PATTERN = re.compile(
    r"<\|[^<>|\s]{0,64}\|>|<｜[^<>｜]{0,64}｜>|" + "|".join(map(re.escape, DEFAULT_SPECIAL_TOKENS)))

# A left-truncated prompt (OpenRLHF keeps its last max_prompt_length tokens) is recognised when at
# least this many of its last non-space characters begin the query.
MIN_PROMPT_OVERLAP = 32
ON_MISMATCH = ("error", "query")


def check_parser(parse) -> Parser | None:
    """``parse`` itself if it is None or callable; a TypeError naming the argument otherwise."""
    if parse is not None and not callable(parse):
        raise TypeError(f"parse must be a callable(completion_text) -> str or None, got {type(parse).__name__}")
    return parse


def apply_parser(parse: Parser | None, text: str, where: str) -> str:
    """``parse(text)``, checked to be a str (the error names ``where``)."""
    if parse is None:
        return text
    out = parse(text)
    if not isinstance(out, str):
        raise TypeError(f"parse must return a str, got {type(out).__name__} for {where}")
    return out


def strip_reasoning(text: str, open: str = "<think>", close: str = "</think>") -> str:
    """``text`` without its reasoning traces, stripped of surrounding whitespace.

    Every ``open … close`` span is removed. A ``close`` before any ``open`` means the trace was opened
    by the prompt (the Qwen3 and DeepSeek-R1 chat templates end the prompt with ``<think>``): everything
    up to it is dropped. A trace that is opened but never closed (generation stopped mid-thought) leaves
    no answer: the rest of the text is dropped, so the completion scores as empty (reward 0).

    >>> strip_reasoning("<think>the user wants a cat</think> A cat sat.")
    'A cat sat.'
    >>> strip_reasoning("hmm, cats...</think>A cat sat.")
    'A cat sat.'
    >>> strip_reasoning("<think>still thinking")
    ''
    >>> strip_reasoning("[R]why[/R] ok", open="[R]", close="[/R]")
    'ok'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not (isinstance(open, str) and open and isinstance(close, str) and close):
        raise ValueError(f"open and close must be non-empty strings, got {open!r} and {close!r}")
    first_open, first_close = text.find(open), text.find(close)
    pos = first_close + len(close) if first_close != -1 and (first_open == -1 or first_close < first_open) else 0
    kept = []
    while True:
        start = text.find(open, pos)
        if start == -1:
            kept.append(text[pos:])
            break
        kept.append(text[pos:start])
        end = text.find(close, start + len(open))
        if end == -1:
            break
        pos = end + len(close)
    return "".join(kept).strip()


def _special_pattern(special_tokens: Iterable[str] | None) -> re.Pattern:
    if special_tokens is None:
        return _DEFAULT_PATTERN
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a list of strings (e.g. tokenizer.all_special_tokens), got a str")
    tokens = sorted({t for t in special_tokens if t}, key=len, reverse=True)
    for t in tokens:
        if not isinstance(t, str):
            raise TypeError(f"special_tokens must hold strings, got {type(t).__name__}")
    return re.compile("|".join(map(re.escape, tokens))) if tokens else re.compile(r"(?!)")


def strip_special_tokens(text: str, special_tokens: Iterable[str] | None = None) -> str:
    """``text`` without special tokens, stripped of surrounding whitespace. ``special_tokens``: the exact
    strings to remove (e.g. ``tokenizer.all_special_tokens``); None = the common chat-template tokens
    (``<|...|>``, ``<｜...｜>`` and :data:`DEFAULT_SPECIAL_TOKENS`).

    >>> strip_special_tokens("A cat sat.<|im_end|>\\n<|endoftext|>")
    'A cat sat.'
    """
    return _special_pattern(special_tokens).sub("", text).strip()


def _visible_chars(text: str, pattern: re.Pattern) -> list[int]:
    """Positions in ``text`` of the characters that are neither whitespace nor inside a special token."""
    hidden = [False] * len(text)
    for m in pattern.finditer(text):
        hidden[m.start():m.end()] = [True] * (m.end() - m.start())
    return [i for i, c in enumerate(text) if not (hidden[i] or c.isspace())]


def _suffix_prefix_overlap(prefix_of: str, suffix_of: str) -> int:
    """Length of the longest suffix of ``suffix_of`` that is a prefix of ``prefix_of`` (KMP prefix
    function of ``prefix_of + sep + suffix_of``, O(n))."""
    s = prefix_of[:len(suffix_of)] + "\0" + suffix_of
    pi = [0] * len(s)
    for i in range(1, len(s)):
        k = pi[i - 1]
        while k and s[i] != s[k]:
            k = pi[k - 1]
        pi[i] = k + (s[i] == s[k])
    return pi[-1]


def response_from_query(query: str, prompt: str, *, special_tokens: Iterable[str] | None = None,
                        on_mismatch: str = "error") -> str:
    """The response in OpenRLHF's ``query`` (prompt + response, decoded with special tokens), without
    special tokens and surrounding whitespace.

    OpenRLHF (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor.execute``) tokenizes the prompt,
    keeps its last ``max_prompt_length`` tokens, appends the generated tokens (the end-of-turn token
    included) and decodes the whole with ``skip_special_tokens=False``, so the query need not start
    with the prompt string verbatim. The response starts after the prompt, found by the first rule
    that applies:

    1. the query starts with the prompt verbatim;
    2. ignoring whitespace and special tokens, the query starts with the prompt (re-tokenisation
       changed spaces, a BOS token was added, ...);
    3. ignoring them, the query starts with the last ``>= 32`` characters of the prompt (the prompt was
       truncated from the left).

    Otherwise ``on_mismatch="error"`` raises a ValueError showing both beginnings, and
    ``on_mismatch="query"`` scores the whole query (special tokens removed). Special tokens are those
    of :func:`strip_special_tokens` (pass ``tokenizer.all_special_tokens`` to be exact).

    >>> response_from_query("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>",
    ...                     "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n")
    'Hello!'
    >>> response_from_query("<s> [INST] Hi [/INST] Hello!</s>", "[INST] Hi [/INST]")
    'Hello!'
    """
    for name, value in (("query", query), ("prompt", prompt)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
    pattern = _special_pattern(special_tokens)
    if query.startswith(prompt):
        return pattern.sub("", query[len(prompt):]).strip()
    query_chars = _visible_chars(query, pattern)
    query_visible = "".join(query[i] for i in query_chars)
    prompt_visible = "".join(prompt[i] for i in _visible_chars(prompt, pattern))
    if query_visible.startswith(prompt_visible):
        matched = len(prompt_visible)
    else:
        matched = _suffix_prefix_overlap(query_visible, prompt_visible)
        if matched < MIN_PROMPT_OVERLAP:
            if on_mismatch == "query":
                return pattern.sub("", query).strip()
            raise ValueError(
                "the prompt is not a prefix of the query (not even ignoring whitespace and special tokens, nor "
                f"as a left-truncated prompt): query starts {query[:80]!r}, prompt starts {prompt[:80]!r}. "
                "Pass special_tokens=tokenizer.all_special_tokens, or on_mismatch='query' to score the whole query")
    start = query_chars[matched - 1] + 1 if matched else 0
    return pattern.sub("", query[start:]).strip()


def reference_list(value, where: str) -> list[str] | None:
    """One row's reference(s) as a list of str: a str (NumPy's ``str_`` included), any sequence or 1-D
    array of them, or None. None, empty and whitespace-only entries are dropped (an empty reference
    would score every completion 0; OpenRLHF passes ``""`` as the label when no ``--data.label_key`` is
    given), and no reference at all gives None; any other type raises a TypeError naming ``where``."""
    if value is None:
        return None
    refs = [value] if isinstance(value, str) else as_list(where, value, "strings (or a str, or None)")
    for r in refs:
        if r is not None and not isinstance(r, str):
            raise TypeError(f"{where} must hold strings, got {type(r).__name__}")
    return [str(r) for r in refs if r is not None and r.strip()] or None
