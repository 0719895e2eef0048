"""verl and OpenRLHF adapters, called exactly as the frameworks call them (argument layout copied from
verl's reward managers and OpenRLHF's SingleTurnAgentExecutor), and the process-wide reward's config.
tests/test_verl.py and tests/test_openrlhf.py drive them through the frameworks' own code."""
from __future__ import annotations

import asyncio
import codecs
import json
import logging
import random
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import configure_reward_env, load_file

from torchmover import Scorer
from torchmover.evaluation.scoring import fit_to_call
from torchmover.integrations import config as integration_config
from torchmover.integrations import configured
from torchmover.integrations import openrlhf, verl
from torchmover.integrations.config import RewardConfig, build_reward, settings_table
from torchmover.integrations.configured import FAILURES_LOG, process_reward, reset_process_reward
from torchmover.reward.batching import BatchedReward
from torchmover.reward.rewards import MoverReward
from torchmover.scorer.signature import signature_diff

REFS = ["the cat sat on the mat", "a dog barked in the house", "the sun is big and red", "we eat good food"]
HYPS = ["the cat sat", "a dog ran in the city", "the red sun", "food"]
ATOL = 1e-5


@pytest.fixture
def env(monkeypatch, tiny_model_dir, tmp_path):
    """The process-wide reward configured through the environment: the tiny model, fitted on REFS;
    rebuilt for each test. Returns the monkeypatch to set more variables before the first call."""
    configure_reward_env(monkeypatch, tiny_model_dir, tmp_path / "references.txt", REFS)
    yield monkeypatch
    reset_process_reward()


@pytest.fixture
def direct(tiny_model_dir):
    """The same reward built by hand, scored directly (no batcher, no adapter)."""
    return MoverReward(Scorer(str(tiny_model_dir), layer=2)).fit(REFS)


# --- verl --------------------------------------------------------------------------------------------

def test_verl_compute_score_as_naive_manager_calls_it(env, direct):
    # verl/workers/reward_manager/naive.py: keywords, ground_truth from reward_model.ground_truth,
    # extra_info with num_turns / rollout_reward_scores added
    out = [verl.compute_score(data_source="summaries", solution_str=h, ground_truth=r,
                              extra_info={"index": i, "num_turns": None, "rollout_reward_scores": {}})
           for i, (h, r) in enumerate(zip(HYPS, REFS))]
    assert all(type(x) is float for x in out)
    assert out == pytest.approx(direct.score(HYPS, REFS).tolist(), abs=ATOL)
    # verl/workers/reward_manager/prime.py: positional (task, completion, reference, extra_info);
    # the reward loop adds reward_router_address / reward_model_tokenizer, reward_kwargs are merged in
    assert verl.compute_score("summaries", HYPS[0], REFS[0], None) == pytest.approx(out[0], abs=ATOL)
    assert verl.compute_score(data_source="s", solution_str=HYPS[0], ground_truth=REFS[0], extra_info={},
                              reward_router_address=None, reward_model_tokenizer=None, my_kwarg=1) \
        == pytest.approx(out[0], abs=ATOL)


def test_verl_numpy_ground_truths(env, direct):
    two = direct.score([HYPS[0]], [[REFS[0], REFS[1]]]).item()
    assert verl.compute_score("s", HYPS[0], np.str_(REFS[0]), {}) == pytest.approx(
        direct.score([HYPS[0]], [REFS[0]]).item(), abs=ATOL)
    for truth in (np.array([REFS[0], REFS[1]], dtype=object), np.array([REFS[0], REFS[1]]), [REFS[0], REFS[1]]):
        assert verl.compute_score("s", HYPS[0], truth, {}) == pytest.approx(two, abs=ATOL)


def test_verl_reference_field(env, direct):
    env.setenv("TORCHMOVER_REFERENCE_FIELD", "extra_info.summary.text")
    expected = direct.score([HYPS[1]], [REFS[1]]).item()
    got = verl.compute_score("s", HYPS[1], ground_truth="unused", extra_info={"summary": {"text": REFS[1]}})
    assert got == pytest.approx(expected, abs=ATOL)
    with pytest.raises(ValueError, match=r"data_source='cnn'.*TORCHMOVER_MISSING_SCORE.*TORCHMOVER_REFERENCE_FIELD"):
        verl.compute_score("cnn", HYPS[1], ground_truth=REFS[1], extra_info={"summary": {}})


def test_verl_missing_references(env, direct):
    with pytest.raises(ValueError, match="data_source='s'.*no reference"):
        verl.compute_score("s", HYPS[0], None, {})
    reset_process_reward()
    env.setenv("TORCHMOVER_MISSING_SCORE", "-1")
    # the first call of a process must have a reference: a wrong field would train on -1 everywhere
    with pytest.raises(ValueError, match="first call of this process has no reference"):
        verl.compute_score("s", HYPS[0], None, {})
    assert verl.compute_score("s", HYPS[0], REFS[0], {}) == pytest.approx(direct.score(HYPS[:1], REFS[:1]).item(), abs=ATOL)
    for missing in (None, np.array([], dtype=object), [None], "", "  "):
        assert verl.compute_score("s", HYPS[0], missing, {}) == -1.0
    with pytest.raises(TypeError, match="solution_str must be a str"):
        verl.compute_score("s", None, REFS[0])
    with pytest.raises(TypeError, match=r"ground_truth of the sample of data_source='s' must be a list of strings "
                                        r"\(or a str, or None\), got dict"):
        verl.compute_score("s", HYPS[1], {"target": REFS[1]})


def test_verl_many_threads(env, direct):
    """verl's reward loop runs compute_score in an executor thread pool, one sample per call: every
    result equals direct scoring, and the micro-batcher scored them in fewer batches than calls."""
    n = 48
    hyps = [f"{HYPS[i % 4]} {'and ' * (i % 5)}" for i in range(n)]
    refs = [REFS[(i * 3) % 4] for i in range(n)]
    start = threading.Barrier(16)

    def call(i):
        if i < 16:
            start.wait()
        return verl.compute_score(data_source="s", solution_str=hyps[i], ground_truth=refs[i], extra_info={})

    with ThreadPoolExecutor(16) as pool:
        out = list(pool.map(call, range(n)))
    assert out == pytest.approx(direct.score(hyps, refs).tolist(), abs=ATOL)
    stats = process_reward().batched.stats()
    assert stats["pairs"] == n and stats["batches"] < n


def test_verl_loads_the_file_as_verl_does(env, direct):
    """verl executes custom_reward_function.path as a standalone module ("custom_module_<hash>"): the
    file must not rely on relative imports, and shares the one process-wide reward."""
    module = load_file(verl.__file__, "custom_module_1")
    assert module.compute_score("s", HYPS[2], REFS[2]) == pytest.approx(direct.score(HYPS[2:3], REFS[2:3]).item(), abs=ATOL)
    assert module.process_reward() is verl.process_reward()


@pytest.mark.parametrize("adapter, function", [(verl, "compute_score"), (openrlhf, "reward_func")])
def test_the_reward_is_built_when_the_framework_fetches_the_function(env, adapter, function, tiny_model_dir, tmp_path):
    """Loading the file builds nothing (docs, doctests, `python -m ...openrlhf`); fetching the function,
    as verl's reward worker and OpenRLHF's rollout actor do at their start, builds the reward, so a bad
    setting fails there, before any rollout."""
    env.setenv("TORCHMOVER_OPTIONS", '{"layer": 2, "no_such_option": 1}')
    module = load_file(adapter.__file__, "loaded")
    assert configured._process_reward is None  # loaded, not built
    with pytest.raises(ValueError, match=r"options \(TORCHMOVER_OPTIONS, --options; read from the environment\) "
                                         r"= .* cannot be built: .*no_such_option"):
        getattr(module, function)
    env.setenv("TORCHMOVER_OPTIONS", '{"layer": 2}')
    env.setenv("TORCHMOVER_STRIP_REASONNG", "1")
    with pytest.raises(ValueError, match=r"unknown variable\(s\) \['TORCHMOVER_STRIP_REASONNG'\]"):
        getattr(module, function)
    env.delenv("TORCHMOVER_STRIP_REASONNG")
    env.setenv("TORCHMOVER_MODEL", "/nonexistent/model")
    env.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"model \(TORCHMOVER_MODEL, --model; read from the environment\) = "
                                      r"'/nonexistent/model', .* cannot be built: .*no such local directory"):
        getattr(module, function)
    configure_reward_env(env, tiny_model_dir, tmp_path / "references.txt", REFS)
    assert callable(getattr(module, function))
    with pytest.raises(AttributeError, match="no attribute 'compute_scores'"):
        module.compute_scores


def test_openrlhf_refuses_a_verl_only_reference_field_at_load(env):
    env.setenv("TORCHMOVER_REFERENCE_FIELD", "extra_info.summary")
    with pytest.raises(ValueError, match="reads verl's extra_info"):
        load_file(openrlhf.__file__, "reward_func").reward_func


def test_reasoning_traces_are_stripped(env, direct):
    env.setenv("TORCHMOVER_STRIP_REASONING", "1")
    expected = direct.score([HYPS[0]], [REFS[0]]).item()
    assert verl.compute_score("s", f"<think>a dog? no, {REFS[1]}</think>\n{HYPS[0]}", REFS[0]) == pytest.approx(expected, abs=ATOL)
    assert verl.compute_score("s", "<think>out of tokens", REFS[0]) == 0.0


def test_custom_parser_after_reasoning(env, direct, monkeypatch):
    monkeypatch.setattr(integration_config, "_test_parse", lambda text: text.split("Answer:")[-1], raising=False)
    env.setenv("TORCHMOVER_STRIP_REASONING", "[R] [/R]")
    env.setenv("TORCHMOVER_PARSE", "torchmover.integrations.config:_test_parse")
    got = verl.compute_score("s", "[R]hmm[/R] Let me see. Answer: " + HYPS[3], REFS[3])
    assert got == pytest.approx(direct.score([" " + HYPS[3]], [REFS[3]]).item(), abs=ATOL)


# --- OpenRLHF ----------------------------------------------------------------------------------------

PROMPT = "<|im_start|>user\nSummarise the text.<|im_end|>\n<|im_start|>assistant\n"


def load_as_openrlhf():
    """What SingleTurnAgentExecutor does with a --reward.remote_url ending in .py."""
    return load_file(openrlhf.__file__, "reward_func").reward_func


def test_openrlhf_reward_func_one_sample(env, direct):
    reward_func = load_as_openrlhf()
    info = reward_func([PROMPT + HYPS[0] + "<|im_end|>"], [PROMPT], [REFS[0]])
    assert set(info) == {"rewards", "scores", "extra_logs"}
    expected = direct.score(HYPS[:1], REFS[:1])
    torch.testing.assert_close(info["rewards"], expected, atol=ATOL, rtol=0)
    # what OpenRLHF's samples_generator does with it
    assert torch.tensor([info["rewards"]]).item() == pytest.approx(expected.item(), abs=ATOL)
    assert [v.flatten()[0].item() for v in info["extra_logs"].values()] == pytest.approx([expected.item(), 0.0], abs=ATOL)
    assert list(info["extra_logs"]) == ["torchmover_twmd_recall", FAILURES_LOG]


def test_openrlhf_many_threads_like_agent_executor(env, direct):
    """_fetch_rewards_via_func: one asyncio.to_thread(reward_func, [q], [p], [l]) per sample, gathered."""
    reward_func = load_as_openrlhf()
    n = 32
    hyps = [HYPS[i % 4] + " and" * (i % 3) for i in range(n)]
    refs = [REFS[(i + 1) % 4] for i in range(n)]
    queries = [PROMPT + h + "<|im_end|>" for h in hyps]

    async def gather():
        return await asyncio.gather(*(asyncio.to_thread(reward_func, [q], [PROMPT], [r]) for q, r in zip(queries, refs)))

    infos = asyncio.run(gather())
    got = [info["rewards"].item() for info in infos]
    assert got == pytest.approx(direct.score(hyps, refs).tolist(), abs=ATOL)
    # older OpenRLHF (remote_rm_utils.py) calls it once per micro-batch
    batch = reward_func(queries, [PROMPT] * n, refs)["rewards"]
    assert batch.shape == (n,) and batch.tolist() == pytest.approx(got, abs=ATOL)


def test_openrlhf_labels_and_reasoning(env, direct):
    env.setenv("TORCHMOVER_STRIP_REASONING", "true")
    reward_func = load_as_openrlhf()
    query = PROMPT + "<think>\nfirst, the cat</think>\n\n" + HYPS[0] + "<|im_end|>"
    got = reward_func([query, query], [PROMPT, PROMPT], [[REFS[0], REFS[1]], np.array([REFS[0]])])["rewards"]
    expected = direct.score([HYPS[0]] * 2, [[REFS[0], REFS[1]], [REFS[0]]])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match=r"labels\[0\] is None: no reference.*TORCHMOVER_MISSING_SCORE"):
        reward_func([query], [PROMPT], [None])
    with pytest.raises(ValueError, match=r"labels\[0\] is '': no reference"):  # OpenRLHF without --data.label_key
        reward_func([query], [PROMPT], [""])
    with pytest.raises(ValueError, match="not a prefix of the query"):
        reward_func(["unrelated text"], [PROMPT], [REFS[0]])
    with pytest.raises(ValueError, match="labels has 1 values for 2 queries"):
        reward_func([query, query], [PROMPT, PROMPT], [REFS[0]])


def test_openrlhf_failures_are_logged_at_warning_and_counted(env, direct, caplog):
    """OpenRLHF logs a reward function's exception at INFO and goes on: each failure is logged at
    WARNING with the running count, and every later answer carries the count in extra_logs."""
    reward_func = load_as_openrlhf()
    query = PROMPT + HYPS[0] + "<|im_end|>"
    with caplog.at_level(logging.WARNING, logger="torchmover"):
        for failing in (["unrelated text"], [query]):
            with pytest.raises(ValueError):
                reward_func(failing, [PROMPT], [None if failing == [query] else REFS[0]])
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]
    assert "(1 of 1 so far" in caplog.records[0].getMessage() and "not a prefix" in caplog.records[0].getMessage()
    assert "(2 of 2 so far" in caplog.records[1].getMessage()
    info = reward_func([query, query], [PROMPT] * 2, [REFS[0], REFS[0]])
    assert info["extra_logs"][FAILURES_LOG].tolist() == [2.0, 2.0]
    assert process_reward().stats() == {"samples": 4, "failures": 2}


def test_openrlhf_missing_score_and_mismatch_fallback(env, direct):
    env.setenv("TORCHMOVER_MISSING_SCORE", "0")
    env.setenv("TORCHMOVER_ON_PROMPT_MISMATCH", "query")
    reward_func = load_as_openrlhf()
    got = reward_func([HYPS[0] + "<|im_end|>", PROMPT + HYPS[1]], ["another prompt", PROMPT], [REFS[0], None])
    expected = direct.score(HYPS[:1], REFS[:1]).item()
    assert got["rewards"].tolist() == pytest.approx([expected, 0.0], abs=ATOL)


# --- config ------------------------------------------------------------------------------------------

def test_config_file_then_environment(tmp_path, tiny_model_dir):
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({"model": str(tiny_model_dir), "options": {"direction": "f1", "centering": "none",
                                                                      "layer": 2}, "max_batch_size": 8, "strip_reasoning": ["[R]", "[/R]"],
                                "query_special_tokens": ["<END>"]}))
    config = RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path), "TORCHMOVER_MAX_BATCH_SIZE": "16",
                                    "TORCHMOVER_OPTIONS": '{"layer": 1}', "OTHER": "ignored"})
    assert config.max_batch_size == 16 and config.options == {"direction": "f1", "centering": "none", "layer": 1}
    assert config.strip_reasoning == ("[R]", "[/R]") and config.query_special_tokens == ("<END>",)
    # the command line (torchmover serve's flags) over both
    flags = RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path), "TORCHMOVER_MAX_BATCH_SIZE": "16"},
                                  flags={"max_batch_size": "32", "options": {"layer": 2}, "strip_reasoning": "true"})
    assert (flags.max_batch_size, flags.options["layer"], flags.options["direction"], flags.strip_reasoning) == (
        32, 2, "f1", ("<think>", "</think>"))
    reward = build_reward(config)
    assert reward.scorer.config.direction == "f1" and reward.scorer.centering.mode == "none"
    toml = tmp_path / "reward.toml"
    toml.write_text('preset = "twmd-b"\nmodel = "m"\nmissing_score = 0.5\nstrip_reasoning = true\n')
    config = RewardConfig.from_env({"TORCHMOVER_CONFIG": str(toml)})
    assert (config.preset, config.model, config.missing_score, config.strip_reasoning) == \
        ("twmd-b", "m", 0.5, ("<think>", "</think>"))


def test_a_toml_file_on_python_3_10_is_read_by_tomli_or_refused_naming_it(tmp_path, monkeypatch):
    """Python 3.10 (supported) has no ``tomllib``: the ``tomli`` package reads the file instead, and
    without it the error names both and the JSON alternative."""
    import tomllib
    import types

    toml = tmp_path / "reward.toml"
    toml.write_text('preset = "twmd-b"\nmissing_score = 0.5\n')
    monkeypatch.setitem(sys.modules, "tomllib", None)  # import tomllib: ModuleNotFoundError, as on 3.10
    monkeypatch.setitem(sys.modules, "tomli", types.SimpleNamespace(load=tomllib.load))
    assert RewardConfig.from_env({"TORCHMOVER_CONFIG": str(toml)}).missing_score == 0.5
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(ValueError, match=r"reward\.toml.*Python 3\.11 or later, or the tomli package.*\.json"):
        RewardConfig.from_env({"TORCHMOVER_CONFIG": str(toml)})


@pytest.mark.parametrize("environ, error", [
    ({"TORCHMOVER_MAX_BATCH_SIZE": "many"}, "max_batch_size .*must be an int"),
    ({"TORCHMOVER_OPTIONS": "{direction: f1}"}, "options .*JSON object"),
    ({"TORCHMOVER_STRIP_REASONING": "<think>"}, "strip_reasoning .*two delimiters"),
    ({"TORCHMOVER_REFERENCE_FIELD": "labels"}, "reference_field must start with"),
    ({"TORCHMOVER_ON_PROMPT_MISMATCH": "skip"}, "on_prompt_mismatch must be one of"),
    ({"TORCHMOVER_SCORER": "dir", "TORCHMOVER_PRESET": "twmd-b"}, "excludes model and preset"),
    ({"TORCHMOVER_CONFIG": "/nonexistent.json"}, "not a file"),
    ({"TORCHMOVER_CACHE_SIZE": "0"}, r"cache_size \(TORCHMOVER_CACHE_SIZE, --cache-size\) must be a positive int"),
    ({"TORCHMOVER_SPECIAL_TOKENS": "<s>"}, r"unknown variable\(s\) \['TORCHMOVER_SPECIAL_TOKENS'\]"),
    ({"TORCHMOVER_QUERY_SPECIAL_TOKENS": "[<s>"}, "query_special_tokens .*JSON list"),
    # a reward is never NaN or infinite, and a batch never waits forever
    ({"TORCHMOVER_MISSING_SCORE": "nan"}, r"missing_score \(TORCHMOVER_MISSING_SCORE, --missing-score\) must be"),
    ({"TORCHMOVER_MISSING_SCORE": "-inf"}, "missing_score .*must be a finite number"),
    ({"TORCHMOVER_MAX_WAIT_MS": "inf"}, r"max_wait_ms \(TORCHMOVER_MAX_WAIT_MS, --max-wait-ms\) must be a finite"),
    ({"TORCHMOVER_MAX_WAIT_MS": "nan"}, "max_wait_ms .*must be a finite number >= 0"),
])
def test_config_errors(environ, error):
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        RewardConfig.from_env(environ)


def test_non_finite_numbers_are_refused_from_every_source(tmp_path):
    """Before, missing_score nan was taken (a NaN reward, sent by the server as the non-JSON token NaN),
    and max_wait_ms inf was refused only by BatchedReward, after the model was loaded."""
    path = tmp_path / "reward.json"
    path.write_text('{"missing_score": NaN}')
    with pytest.raises(ValueError, match="missing_score .*must be a finite number"):
        RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)})
    with pytest.raises(ValueError, match="missing_score .*must be a finite number"):
        RewardConfig.from_env({}, flags={"missing_score": "inf"})
    with pytest.raises(ValueError, match="max_wait_ms .*must be a finite number"):
        RewardConfig(max_wait_ms=float("inf"))
    config = RewardConfig.from_env({"TORCHMOVER_MISSING_SCORE": "-1e3", "TORCHMOVER_MAX_WAIT_MS": "0"})
    assert (config.missing_score, config.max_wait_ms) == (-1e3, 0.0)


@pytest.mark.parametrize("name", ["reward.json", "reward.toml"])
def test_a_config_file_that_starts_with_a_byte_order_mark_is_read(tmp_path, name):
    """Before: "Unexpected UTF-8 BOM" (JSON) or "Invalid statement" (TOML)."""
    path = tmp_path / name
    path.write_bytes(codecs.BOM_UTF8 + ('{"missing_score": 0.5}' if name.endswith(".json") else
                                        "missing_score = 0.5\n").encode())
    assert RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)}).missing_score == 0.5


@pytest.mark.parametrize("name, text, parser_says", [
    ("reward.json", '{"missing_score":\n', r"Expecting value: line 2 column 1 \(char 18\)"),
    ("reward.toml", "missing_score = \n", "Invalid value"),
    ("reward.json", b'{"model": "\xff"}', "invalid start byte"),
])
def test_a_config_file_that_does_not_parse_is_named(tmp_path, name, text, parser_says):
    """Before, the parser's message alone: neither the file nor TORCHMOVER_CONFIG was named."""
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    kind = "TOML" if name.endswith(".toml") else "JSON"
    with pytest.raises(ValueError, match=rf"^TORCHMOVER_CONFIG='{re.escape(str(path))}': not valid {kind} "
                                         rf"\(.*{parser_says}.*\)$"):
        RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)})


def test_config_unknown_file_key(tmp_path):
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({"modle": "x"}))
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['modle'\] in TORCHMOVER_CONFIG="):
        RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)})


@pytest.mark.parametrize("name, text", [
    ("reward.json", '{"cache_size": 2.9}'), ("reward.json", '{"cache_size": true}'),
    ("reward.json", '{"max_batch_size": "many"}'), ("reward.json", '{"missing_score": false}'),
    ("reward.toml", "missing_score = false"), ("reward.toml", "max_wait_ms = true"),
    ("reward.json", '{"options": null}'), ("reward.json", '{"options": ["direction"]}'),
])
def test_a_file_value_of_the_wrong_kind_is_refused_naming_the_setting_and_the_file(tmp_path, name, text):
    """Before, a bool was read as 0 or 1 and a fraction truncated where an int is due (missing_score =
    false gave a fixed 0 reward), and options that are not an object raised a bare TypeError."""
    path = tmp_path / name
    path.write_text(text)
    key = text.strip("{").split('"')[1] if name.endswith(".json") else text.split()[0]
    with pytest.raises(ValueError, match=rf"^{key} \(from TORCHMOVER_CONFIG={re.escape(str(path))}\) must be "):
        RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)})


@pytest.mark.parametrize("value", ["[1]", "null", '"f1"'])
def test_options_that_are_not_an_object_are_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match=r"^options \(from the environment\) must be a JSON object"):
        RewardConfig.from_env({"TORCHMOVER_OPTIONS": value})


def test_numbers_are_read_from_strings_and_from_numbers_of_their_kind(tmp_path):
    path = tmp_path / "reward.toml"
    path.write_text("cache_size = 8.0\nmax_batch_size = 4\nmax_wait_ms = 2\nmissing_score = -1\n")
    config = RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)})
    assert (config.cache_size, config.max_batch_size, config.max_wait_ms, config.missing_score) == (8, 4, 2.0, -1.0)
    assert type(config.cache_size) is int and type(config.missing_score) is float
    config = RewardConfig.from_env({"TORCHMOVER_CACHE_SIZE": " 8 ", "TORCHMOVER_MISSING_SCORE": "0.5"})
    assert (config.cache_size, config.missing_score) == (8, 0.5)


@pytest.mark.parametrize("spec, error", [("no_such_module_xyz:f", "ModuleNotFoundError: No module named"),
                                         ("json:no_such_fn", "AttributeError: module 'json' has no attribute"),
                                         ("json:__name__", "is not callable"), ("json", "must be 'module:function'")])
def test_a_parse_function_that_cannot_be_used_is_named_with_its_source(tmp_path, spec, error):
    """Before, an import error of the module or the function came out bare (ModuleNotFoundError,
    AttributeError), naming neither the setting nor where it was read."""
    from torchmover.integrations.config import build_parser

    with pytest.raises(ValueError, match=r"^parse \(TORCHMOVER_PARSE, --parse; read from the environment\)"
                                         rf".*{error}"):
        build_parser(RewardConfig.from_env({"TORCHMOVER_PARSE": spec}))
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({"parse": spec}))
    with pytest.raises(ValueError, match=rf"^parse \(TORCHMOVER_PARSE, --parse; read from TORCHMOVER_CONFIG="
                                         rf"{re.escape(str(path))}\)"):
        build_parser(RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)}))


@pytest.mark.parametrize("options, error", [({"directon": "f1"}, "unexpected keyword argument 'directon'"),
                                            ({"direction": "sideways"}, "direction must be one of")])
def test_scorer_options_the_scorer_refuses_are_named_with_their_sources(tmp_path, tiny_model_dir, options, error):
    """Before, an unknown option raised Scorer's bare TypeError and a bad value ScorerConfig's ValueError,
    naming neither the setting nor where it was read; options merged from two sources name both."""
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({"model": str(tiny_model_dir), "options": options}))
    config = RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path), "TORCHMOVER_OPTIONS": '{"layer": 2}'})
    with pytest.raises(ValueError, match=rf"options \(TORCHMOVER_OPTIONS, --options; read from TORCHMOVER_CONFIG="
                                         rf"{re.escape(str(path))} and the environment\) = "
                                         rf".* cannot be built: .*{error}"):
        build_reward(config)
    with pytest.raises(ValueError, match=r"options \(TORCHMOVER_OPTIONS, --options\) = .* cannot be built"):
        build_reward(RewardConfig(model=str(tiny_model_dir), options=options))  # no source to name


def test_batch_centered_preset_without_fit_fails_on_build(tiny_model_dir):
    with pytest.raises(ValueError, match="centers on the batch.*TORCHMOVER_FIT_REFERENCES, --fit-references"):
        build_reward(RewardConfig(model=str(tiny_model_dir), options={"centering": "batch", "layer": 2}))


def test_device_auto_is_resolved_as_the_scorer_resolves_it(tiny_model_dir):
    """``serve --device auto`` (and TORCHMOVER_DEVICE=auto): the best available device, not a crash in
    ``Module.to("auto")``."""
    from torchmover.runtime.devices import resolve_device

    reward = build_reward(RewardConfig(model=str(tiny_model_dir), device="auto",
                                        options={"layer": 2, "centering": "none"}))
    assert next(reward.scorer.parameters()).device.type == resolve_device("auto").type


def test_pass_cost_among_the_scorer_options_reaches_the_encoder(tiny_model_dir):
    """From a config's options, and from the JSON of TORCHMOVER_OPTIONS (null: one pass a call)."""
    reward = build_reward(RewardConfig(model=str(tiny_model_dir),
                                       options={"layer": 2, "centering": "none", "pass_cost": 0}))
    assert reward.scorer.encoder.pass_cost == 0
    config = RewardConfig.from_env({"TORCHMOVER_MODEL": str(tiny_model_dir),
                                    "TORCHMOVER_OPTIONS": '{"layer": 2, "centering": "none", "pass_cost": null}'})
    assert build_reward(config).scorer.encoder.pass_cost is None


def test_fit_references_fit_the_scorers_statistics_as_serve_does(tiny_model_dir, tmp_path):
    """One rule for every transport: IDF and a fixed centering mean fitted on the references (the
    command line's fit_to_call), a batch-centered reward centered on their mean, nothing else touched."""
    fit = tmp_path / "refs.txt"
    fit.write_text("\n".join(REFS) + "\n\n")
    fixed = build_reward(RewardConfig(model=str(tiny_model_dir), fit_references=str(fit),
                                      options={"layer": 2, "centering": "fixed", "idf": True}))
    expected = Scorer(str(tiny_model_dir), layer=2, centering="fixed", idf=True)
    expected.fit_idf(REFS, REFS)
    expected.fit_centering(REFS, progress=False)
    torch.testing.assert_close(fixed.score(HYPS, REFS), MoverReward(expected).score(HYPS, REFS), atol=ATOL, rtol=0)
    none = build_reward(RewardConfig(model=str(tiny_model_dir), fit_references=str(fit),
                                     options={"layer": 2, "centering": "none"}))
    assert none.centering.mode == "none"  # not re-centered behind the scorer's back
    fit.write_text("\n \n")
    with pytest.raises(ValueError, match="has no reference"):
        build_reward(RewardConfig(model=str(tiny_model_dir), fit_references=str(fit), options={"layer": 2}))


def random_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct random texts of the tiny model's words, 3 to 9 words each."""
    from conftest import WORDS

    rng = random.Random(seed)
    texts: dict[str, None] = {}
    while len(texts) < n:
        texts[" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))] = None
    return list(texts)


def test_a_batch_centered_rescaled_reward_is_rebuilt_from_its_signature(tiny_model_dir, tmp_path):
    """The documented rebuild (Scorer.from_signature, then the command line's fits on the same
    references) gives the reward's signature and rewards: the baseline is fitted under the fixed mean
    the reward centers on. 1500 references: the 1000 baseline pairs leave some out, so a baseline
    fitted under batch centering (on the mean of the sampled texts) differs from it."""
    corpus = random_corpus(1500)
    fit = tmp_path / "refs.txt"
    fit.write_text("\n".join(corpus) + "\n")
    reward = build_reward(RewardConfig(model=str(tiny_model_dir), fit_references=str(fit),
                                       options={"layer": 2, "centering": "batch", "rescale": True}))
    rebuilt = fit_to_call(Scorer.from_signature(reward.signature, model=str(tiny_model_dir)), corpus, corpus)
    assert rebuilt.signature == reward.signature
    assert torch.equal(MoverReward(rebuilt).score(HYPS, REFS), reward.score(HYPS, REFS))
    batch = Scorer(str(tiny_model_dir), layer=2, centering="batch", rescale=True).fit_baseline(corpus)
    assert batch.baseline != reward.scorer.baseline


# The references of REFS repeated, and with outer whitespace: the same four distinct references
REPEATED_REFS = [REFS[0], REFS[0], f" {REFS[1]}", REFS[1], f"{REFS[2]}\t", REFS[0] + "  ", REFS[3], REFS[3]]


@pytest.mark.parametrize("options", [dict(centering="none", idf=True), dict(centering="batch"),
                                     dict(centering="fixed", idf=True)])
def test_fit_references_count_each_distinct_reference_once(tiny_model_dir, tmp_path, options):
    """A file whose lines repeat, or differ only by outer whitespace, fits what the same references
    once each fit (the command line's rule): the same IDF, the same centering mean, the same rewards."""
    rewards = {}
    for name, lines in (("repeated", REPEATED_REFS), ("distinct", REFS)):
        path = tmp_path / f"{name}.txt"
        path.write_text("\n".join(lines) + "\n")
        rewards[name] = build_reward(RewardConfig(model=str(tiny_model_dir), fit_references=str(path),
                                                  options={"layer": 2, **options}))
    repeated, distinct = rewards["repeated"], rewards["distinct"]
    assert {side: idf.to_dict() for side, idf in repeated.scorer.idf.items()} == \
        {side: idf.to_dict() for side, idf in distinct.scorer.idf.items()}
    if options["centering"] != "none":
        torch.testing.assert_close(repeated.centering.mean, distinct.centering.mean, atol=1e-7, rtol=0)
    torch.testing.assert_close(repeated.score(HYPS, REFS), distinct.score(HYPS, REFS), atol=ATOL, rtol=0)


def test_an_adapter_fitted_on_repeated_references_gives_the_rewards_of_the_distinct_ones(
        monkeypatch, tiny_model_dir, tmp_path, direct):
    """verl's compute_score, configured with a reference file that repeats lines (batch centering: the
    reward centered on the references' mean), rewards as a reward fitted on each reference once."""
    configure_reward_env(monkeypatch, tiny_model_dir, tmp_path / "references.txt", REPEATED_REFS)
    try:
        out = [verl.compute_score(data_source="s", solution_str=h, ground_truth=r, extra_info={})
               for h, r in zip(HYPS, REFS)]
    finally:
        reset_process_reward()
    assert out == pytest.approx(direct.score(HYPS, REFS).tolist(), abs=ATOL)


def test_the_user_guide_lists_every_setting_as_it_is():
    """docs/guide/rewards.md's table: one row per setting, with its variable and its serve flag."""
    from pathlib import Path

    guide = (Path(__file__).parents[1] / "docs" / "guide" / "rewards.md").read_text(encoding="utf-8")
    documented = {cells[0].strip("` "): cells[1].strip("` ") for cells in
                  (line.split("|")[1:-1] for line in guide.splitlines() if line.startswith("| `"))
                  if cells[1].strip().startswith("`TORCHMOVER_")}
    assert documented == {key: var for key, var, _, _, _ in settings_table()}
    from torchmover.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {flag for action in serve._actions for flag in action.option_strings}
    assert {flag for _, _, flag, _, _ in settings_table() if flag != "--options"} <= flags


# --- the configured reward's signature -----------------------------------------------------------------

# The reward fields of the default settings, after the reward's own signature
DEFAULT_REWARD_FIELDS = ("|reffield:ground_truth|strip:none|parse:none|missing:error|qtokens:default|mismatch:error"
                         "|shaping:none")


def configured_signature(reward: MoverReward, **settings) -> str:
    """The signature of ``reward`` configured by ``settings`` (a :class:`RewardConfig`'s fields)."""
    with BatchedReward(reward) as batched:
        return configured.ConfiguredReward(batched, RewardConfig(**settings)).signature


@pytest.fixture
def plain_reward(tiny_encoder):
    return MoverReward(Scorer(tiny_encoder, centering="none"))


@pytest.mark.parametrize("settings, changed", [
    (dict(reference_field="ground_truth.text"), {"reffield": ("ground_truth", "ground_truth.text")}),
    (dict(strip_reasoning=("<think>", "</think>")), {"strip": ("none", '["<think>","</think>"]')}),
    (dict(parse="torchmover.integrations.parsing:strip_special_tokens"),
     {"parse": ("none", "torchmover.integrations.parsing:strip_special_tokens")}),
    (dict(missing_score=-0.5), {"missing": ("error", "-0.5")}),
    (dict(query_special_tokens=("<|im_end|>", "</s>")), {"qtokens": ("default", r'["<\u007cim_end\u007c>","</s>"]')}),
    (dict(on_prompt_mismatch="query"), {"mismatch": ("error", "query")}),
])
def test_each_setting_that_changes_what_is_scored_is_in_the_signature(plain_reward, settings, changed):
    """The configured reward's signature is the reward's followed by the reward fields: each setting
    that changes what a sample is scored as changes its own field, and only it."""
    default = configured_signature(plain_reward)
    assert default == plain_reward.signature + DEFAULT_REWARD_FIELDS
    assert signature_diff(default, configured_signature(plain_reward, **settings)) == changed


def length_penalty(hyps, scores):
    return scores - 0.01 * torch.tensor([len(h.split()) for h in hyps], dtype=scores.dtype)


def test_the_rewards_shaping_is_in_the_signature(tiny_encoder, plain_reward):
    """In the configured reward's signature (always a field), and in the reward's own (a field where
    there is shaping, which the TRL path and ``repr`` show); the scores' signature is the scorer's."""
    shaped = MoverReward(plain_reward.scorer, shaping=length_penalty)
    assert signature_diff(configured_signature(plain_reward), configured_signature(shaped)) == \
        {"shaping": ("none", f"{__name__}:length_penalty")}
    assert plain_reward.signature == plain_reward.scored_signature == plain_reward.scorer.signature
    assert shaped.scored_signature == plain_reward.signature
    assert shaped.signature == f"{plain_reward.signature}|shaping:{__name__}:length_penalty"
    assert f"|shaping:{__name__}:length_penalty>" in repr(shaped)


def test_a_reward_signature_parts_into_the_scorers_and_the_settings(plain_reward):
    tokens = ("<|im_end|>", "<｜end｜>", "</s>")
    signature = configured_signature(plain_reward, strip_reasoning=("<|think|>", "</|think|>"),
                                     query_special_tokens=tokens, missing_score=0)
    scorer_signature, fields = configured.split_reward_signature(signature)
    assert scorer_signature == plain_reward.signature and tuple(fields) == configured.REWARD_FIELDS
    assert json.loads(fields["strip"]) == ["<|think|>", "</|think|>"] and json.loads(fields["qtokens"]) == list(tokens)
    assert float(fields["missing"]) == 0.0
    with pytest.raises(ValueError, match="not a configured reward's signature"):
        configured.split_reward_signature(plain_reward.signature)


def test_the_process_reward_logs_its_signature(env, caplog):
    with caplog.at_level(logging.INFO, logger="torchmover"):
        signature = process_reward().signature
    assert f"torchmover reward: built, signature {signature}" in caplog.messages
    assert signature.endswith(DEFAULT_REWARD_FIELDS)


def test_process_reward_is_built_once(env):
    with ThreadPoolExecutor(8) as pool:
        shared = list(pool.map(lambda _: process_reward(), range(8)))
    assert all(s is shared[0] for s in shared)
    reset_process_reward()
    assert shared[0].batched.closed and process_reward() is not shared[0]
