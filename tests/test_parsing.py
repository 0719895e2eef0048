"""Completion parsers: reasoning traces, the response inside OpenRLHF's query, references of any shape."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import chat_tokenizer

from torchmover.integrations.parsing import (
    reference_list, response_from_query, strip_reasoning, strip_special_tokens,
)


@pytest.mark.parametrize("text, expected", [
    ("no trace here ", "no trace here"),
    ("<think>a</think>one<think>b</think> two", "one two"),
    ("opened by the prompt</think>\nanswer", "answer"),           # Qwen3 / R1 templates open the trace
    ("first</think> answer <think>more</think>end", "answer end"),
    ("<think>ran out of tokens", ""),                              # no answer: scores as empty
    ("answer <think>late, unfinished", "answer"),
    ("<think></think>", ""),
])
def test_strip_reasoning(text, expected):
    assert strip_reasoning(text) == expected


def test_strip_reasoning_custom_delimiters_and_errors():
    assert strip_reasoning("<reasoning>x</reasoning>y", "<reasoning>", "</reasoning>") == "y"
    assert strip_reasoning("<think>kept</think>", "[R]", "[/R]") == "<think>kept</think>"
    with pytest.raises(ValueError, match="open and close"):
        strip_reasoning("x", "", "</think>")
    with pytest.raises(TypeError, match="text must be a str"):
        strip_reasoning(None)


PROMPT = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSummarise: the cat sat on the mat all day long.<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("query, prompt", [
    (PROMPT + "A cat sat.<|im_end|>", PROMPT),                                    # verbatim prefix
    ("<|begin_of_text|>" + PROMPT + "A cat sat.<|eot_id|>", PROMPT),                # a BOS token added
    (PROMPT.replace("\n", " ").replace("  ", " ") + " A cat sat.", PROMPT),       # re-tokenised spaces
    (PROMPT[PROMPT.index("<|im_start|>user"):] + "A cat sat.<|im_end|><|endoftext|>", PROMPT),  # left-truncated
    ("<s>[INST] Summarise: the cat sat. [/INST] A cat sat.</s>", "[INST]Summarise: the cat sat.[/INST]"),
])
def test_response_from_query(query, prompt):
    assert response_from_query(query, prompt) == "A cat sat."


def test_response_repeating_the_prompt_is_kept_whole():
    query = PROMPT + "Summarise: the cat sat on the mat all day long.<|im_end|>"
    assert response_from_query(query, PROMPT) == "Summarise: the cat sat on the mat all day long."
    # truncated prompt whose response repeats its tail: the response starts after the first match
    assert response_from_query(PROMPT[60:] + "all day long.", PROMPT) == "all day long."


def test_response_from_query_mismatch():
    with pytest.raises(ValueError, match="not a prefix of the query.*on_mismatch='query'"):
        response_from_query("something else entirely<|im_end|>", PROMPT)
    assert response_from_query("something else<|im_end|>", PROMPT, on_mismatch="query") == "something else"
    with pytest.raises(ValueError, match="on_mismatch"):
        response_from_query("q", "p", on_mismatch="ignore")
    with pytest.raises(TypeError, match="prompt must be a str"):
        response_from_query("q", None)


def test_response_from_query_explicit_special_tokens():
    query = "<BOS>Question? <SEP>Answer.<END>"
    assert response_from_query(query, "Question?", special_tokens=["<BOS>", "<SEP>", "<END>"]) == "Answer."
    # the default list does not know these tokens: the BOS hides the prompt
    with pytest.raises(ValueError, match="not a prefix"):
        response_from_query(query, "Question?")
    with pytest.raises(TypeError, match="list of strings"):
        response_from_query(query, "Question?", special_tokens="<BOS>")
    assert strip_special_tokens("a<|x|> b</s>") == "a b"


@pytest.mark.parametrize("max_prompt_tokens", [None, 20])
def test_response_from_openrlhf_query(max_prompt_tokens):
    """The query exactly as OpenRLHF's SingleTurnAgentExecutor builds it: prompt tokens (without special
    tokens added, left-truncated), then the generated tokens with the end-of-turn token, decoded with
    skip_special_tokens=False."""
    tok = chat_tokenizer(PROMPT)
    response = " The cat sat on the mat, all day long. "
    prompt_ids = tok(text=PROMPT, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens:
        prompt_ids = prompt_ids[-max_prompt_tokens:]
    action_ids = tok(text=response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    query = tok.decode(prompt_ids + action_ids, skip_special_tokens=False)
    assert query.endswith("<|im_end|>") and (max_prompt_tokens is None) == query.startswith(PROMPT)
    assert response_from_query(query, PROMPT) == response.strip()
    assert response_from_query(query, PROMPT, special_tokens=tok.all_special_tokens) == response.strip()


def test_reference_list_shapes():
    assert reference_list("a", "x") == ["a"]
    assert reference_list(np.str_("a"), "x") == ["a"] and type(reference_list(np.str_("a"), "x")[0]) is str
    assert reference_list(np.array(["a", "b"]), "x") == ["a", "b"]
    assert reference_list(np.array(["a", None, "b"], dtype=object), "x") == ["a", "b"]
    assert reference_list(("a",), "x") == ["a"]
    for missing in (None, [], [None], np.array([], dtype=object)):
        assert reference_list(missing, "x") is None
    with pytest.raises(TypeError, match=r"labels\[2\] must hold strings, got int"):
        reference_list(["a", 3], "labels[2]")
    with pytest.raises(TypeError, match=r"labels\[2\] must be a list of strings \(or a str, or None\), got dict"):
        reference_list({"a": 1}, "labels[2]")
