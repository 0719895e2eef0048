"""verl and OpenRLHF adapters, called exactly as the frameworks call them (argument layout copied from
verl's reward managers and OpenRLHF's SingleTurnAgentExecutor), and the process-wide reward's config."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from torchmover import Scorer
from torchmover.integrations import config as integration_config
from torchmover.integrations import openrlhf, verl
from torchmover.integrations.config import RewardConfig, build_reward, process_reward, reset_process_reward
from torchmover.reward.rewards import MoverReward

REFS = ["the cat sat on the mat", "a dog barked in the house", "the sun is big and red", "we eat good food"]
HYPS = ["the cat sat", "a dog ran in the city", "the red sun", "food"]
ATOL = 1e-5


@pytest.fixture
def env(monkeypatch, tiny_model_dir, tmp_path):
    """The process-wide reward configured through the environment: the tiny model, fitted on REFS;
    rebuilt for each test. Returns the monkeypatch to set more variables before the first call."""
    fit = tmp_path / "references.txt"
    fit.write_text("\n".join(REFS) + "\n")
    for name in [n for n in __import__("os").environ if n.startswith("TORCHMOVER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TORCHMOVER_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("TORCHMOVER_FIT_REFERENCES", str(fit))
    monkeypatch.setenv("TORCHMOVER_MAX_WAIT_MS", "20")
    monkeypatch.setenv("TORCHMOVER_OPTIONS", '{"layer": 2}')
    reset_process_reward()
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


def test_verl_batch_manager_layout(env, direct):
    # verl/workers/reward_manager/batch.py: data_sources is the non_tensor_batch NumPy array, ground
    # truths a list, extra_infos the object array of dicts
    out = verl.compute_score_batch(
        data_sources=np.array(["s"] * 4, dtype=object), solution_strs=HYPS,
        ground_truths=[np.str_(r) for r in REFS],
        extra_infos=np.array([{"rollout_reward_scores": {}} for _ in HYPS], dtype=object))
    assert isinstance(out, list) and all(type(x) is float for x in out)
    assert out == pytest.approx(direct.score(HYPS, REFS).tolist(), abs=ATOL)
    with pytest.raises(ValueError, match="ground_truths has 3 values for 4"):
        verl.compute_score_batch(data_sources=["s"] * 4, solution_strs=HYPS, ground_truths=REFS[:3])


def test_verl_reference_field(env, direct):
    env.setenv("TORCHMOVER_REFERENCE_FIELD", "extra_info.summary.text")
    expected = direct.score([HYPS[1]], [REFS[1]]).item()
    got = verl.compute_score("s", HYPS[1], ground_truth="unused", extra_info={"summary": {"text": REFS[1]}})
    assert got == pytest.approx(expected, abs=ATOL)
    with pytest.raises(ValueError, match=r"data_source='cnn'.*extra_info.summary.text.*TORCHMOVER_MISSING_SCORE"):
        verl.compute_score("cnn", HYPS[1], ground_truth=REFS[1], extra_info={"summary": {}})


def test_verl_missing_references(env, direct):
    with pytest.raises(ValueError, match="data_source='s'.*no reference"):
        verl.compute_score("s", HYPS[0], None, {})
    reset_process_reward()
    env.setenv("TORCHMOVER_MISSING_SCORE", "-1")
    assert verl.compute_score("s", HYPS[0], None, {}) == -1.0
    assert verl.compute_score("s", HYPS[0], np.array([], dtype=object), {}) == -1.0
    out = verl.compute_score_batch(["s"] * 3, HYPS[:3], [REFS[0], None, [None]])
    assert out[1:] == [-1.0, -1.0] and out[0] == pytest.approx(direct.score(HYPS[:1], REFS[:1]).item(), abs=ATOL)
    with pytest.raises(TypeError, match="solution_str must be a str"):
        verl.compute_score("s", None, REFS[0])
    with pytest.raises(TypeError, match=r"ground_truth of sample 1 must be a list of strings \(or a str, or None\), got dict"):
        verl.compute_score_batch(["s"] * 2, HYPS[:2], [REFS[0], {"target": REFS[1]}])


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
    """verl executes custom_reward_function.path as a standalone module ("custom_module"): the file
    must not rely on relative imports, and shares the one process-wide reward."""
    spec = importlib.util.spec_from_file_location("custom_module", verl.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.compute_score("s", HYPS[2], REFS[2]) == pytest.approx(direct.score(HYPS[2:3], REFS[2:3]).item(), abs=ATOL)
    assert module.process_reward() is verl.process_reward()


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
    """What SingleTurnAgentExecutor does with a --remote_rm_url ending in .py."""
    spec = importlib.util.spec_from_file_location("reward_func", openrlhf.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


def test_openrlhf_reward_func_one_sample(env, direct):
    reward_func = load_as_openrlhf()
    info = reward_func([PROMPT + HYPS[0] + "<|im_end|>"], [PROMPT], [REFS[0]])
    assert set(info) == {"rewards", "scores", "extra_logs"}
    expected = direct.score(HYPS[:1], REFS[:1])
    torch.testing.assert_close(info["rewards"], expected, atol=ATOL, rtol=0)
    # what OpenRLHF's samples_generator does with it
    assert torch.tensor([info["rewards"]]).item() == pytest.approx(expected.item(), abs=ATOL)
    assert [v.flatten()[0].item() for v in info["extra_logs"].values()] == pytest.approx([expected.item()], abs=ATOL)
    assert list(info["extra_logs"]) == ["torchmover_twmd_recall"]


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
    with pytest.raises(ValueError, match=r"labels\[0\] is None.*TORCHMOVER_MISSING_SCORE"):
        reward_func([query], [PROMPT], [None])
    with pytest.raises(ValueError, match="not a prefix of the query"):
        reward_func(["unrelated text"], [PROMPT], [REFS[0]])
    with pytest.raises(ValueError, match="labels has 1 values for 2 queries"):
        reward_func([query, query], [PROMPT, PROMPT], [REFS[0]])


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
                                "special_tokens": ["<END>"]}))
    config = RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path), "TORCHMOVER_MAX_BATCH_SIZE": "16",
                                    "TORCHMOVER_OTHER": "ignored"})
    assert config.max_batch_size == 16 and config.options == {"direction": "f1", "centering": "none", "layer": 2}
    assert config.strip_reasoning == ("[R]", "[/R]") and config.special_tokens == ("<END>",)
    reward = build_reward(config)
    assert reward.scorer.config.direction == "f1" and reward.scorer.centering.mode == "none"
    toml = tmp_path / "reward.toml"
    toml.write_text('preset = "twmd-b"\nmodel = "m"\nmissing_score = 0.5\nstrip_reasoning = true\n')
    config = RewardConfig.from_env({"TORCHMOVER_CONFIG": str(toml)})
    assert (config.preset, config.model, config.missing_score, config.strip_reasoning) == \
        ("twmd-b", "m", 0.5, ("<think>", "</think>"))


@pytest.mark.parametrize("environ, error", [
    ({"TORCHMOVER_MAX_BATCH_SIZE": "many"}, "max_batch_size .*must be an int"),
    ({"TORCHMOVER_OPTIONS": "{direction: f1}"}, "options .*JSON object"),
    ({"TORCHMOVER_STRIP_REASONING": "<think>"}, "strip_reasoning .*two delimiters"),
    ({"TORCHMOVER_REFERENCE_FIELD": "labels"}, "reference_field must start with"),
    ({"TORCHMOVER_ON_PROMPT_MISMATCH": "skip"}, "on_prompt_mismatch must be one of"),
    ({"TORCHMOVER_SCORER": "dir", "TORCHMOVER_PRESET": "twmd-b"}, "excludes model and preset"),
    ({"TORCHMOVER_CONFIG": "/nonexistent.json"}, "not a file"),
])
def test_config_errors(environ, error):
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        RewardConfig.from_env(environ)


def test_config_unknown_file_key(tmp_path):
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({"modle": "x"}))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['modle'\] in TORCHMOVER_CONFIG="):
        RewardConfig.from_env({"TORCHMOVER_CONFIG": str(path)})


def test_batch_centered_preset_without_fit_fails_on_build(tiny_model_dir):
    with pytest.raises(RuntimeError, match="centering='batch'"):
        build_reward(RewardConfig(model=str(tiny_model_dir), options={"centering": "batch", "layer": 2}))


def test_process_reward_is_built_once(env):
    with ThreadPoolExecutor(8) as pool:
        shared = list(pool.map(lambda _: process_reward(), range(8)))
    assert all(s is shared[0] for s in shared)
    reset_process_reward()
    assert shared[0].batched.closed and process_reward() is not shared[0]
