"""The OpenRLHF adapter file and ``torchmover serve`` driven by OpenRLHF's own code, as a training job
drives them: the user guide's ``train_ppo_ray`` flags read by OpenRLHF's own argument parser, its
``SingleTurnAgentExecutor`` loading the reward file (or posting to servers) and running each sample,
and its ``SamplesGenerator`` turning the result into the ``Experience`` the trainer reads. Only the
generation engine is replaced (by a fixed-response engine; ``vllm`` is stubbed when absent). Skipped
without OpenRLHF; CI installs it ``--no-deps`` in a side environment (.ci/run)."""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import logging
import os
import subprocess
import sys
import types
import urllib.request
import json
from types import SimpleNamespace

import pytest
import torch


def _stub_vllm() -> None:
    """A ``vllm`` with the three names OpenRLHF's rollout modules import (the engine is never run)."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = type("SamplingParams", (SimpleNamespace,), {})
    vllm.inputs = types.ModuleType("vllm.inputs")
    vllm.inputs.TokensPrompt = dict
    vllm.utils = types.ModuleType("vllm.utils")
    vllm.utils.random_uuid = lambda: "0"
    sys.modules.update({"vllm": vllm, "vllm.inputs": vllm.inputs, "vllm.utils": vllm.utils})


pytest.importorskip("openrlhf")
pytest.importorskip("ray")
if importlib.util.find_spec("vllm") is None:
    _stub_vllm()

from conftest import chat_tokenizer, configure_reward_env  # noqa: E402
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402
from openrlhf.utils.agent import SingleTurnAgentExecutor  # noqa: E402
from vllm import SamplingParams  # noqa: E402

from torchmover import Scorer  # noqa: E402
from torchmover.integrations.configured import FAILURES_LOG, process_reward, reset_process_reward  # noqa: E402
from torchmover.reward.rewards import MoverReward  # noqa: E402

REFS = ["the cat sat on the mat", "a dog barked in the house", "the sun is big and red", "we eat good food"]
PROMPTS = [f"<|im_start|>user\nSummarise text {i}.<|im_end|>\n<|im_start|>assistant\n" for i in range(4)]
RESPONSES = ["<think>\nthe cat, then</think>\n\nthe cat sat", "a dog barked all day", "the red sun", "good food"]
ANSWERS = ["the cat sat", "a dog barked all day", "the red sun", "good food"]  # reasoning stripped
ATOL = 1e-5


@pytest.fixture
def env(monkeypatch, tiny_model_dir, tmp_path):
    variables = configure_reward_env(monkeypatch, tiny_model_dir, tmp_path / "references.txt", REFS,
                                     strip_reasoning="1")
    yield variables
    reset_process_reward()


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer(*PROMPTS, *RESPONSES)


@pytest.fixture
def direct(tiny_model_dir):
    return MoverReward(Scorer(str(tiny_model_dir), layer=2)).fit(REFS)


def reward_file() -> str:
    """The path the user guide gives to --reward.remote_url: ``python -m torchmover.integrations.openrlhf``."""
    return subprocess.run([sys.executable, "-m", "torchmover.integrations.openrlhf"], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.strip()


def train_ppo_ray_args(argv: list[str]):
    """The args OpenRLHF's ``python -m openrlhf.cli.train_ppo_ray ARGV`` trains with: its own ``__main__``
    block (parser, parse, checks, ``remote_url.split(",")``) run up to ``train(args)``, which is captured."""
    path = importlib.util.find_spec("openrlhf.cli.train_ppo_ray").origin
    tree = ast.parse(open(path, encoding="utf-8").read())
    namespace: dict = {"__name__": "__main__"}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module([node], []), path, "exec"), namespace)
            except ImportError:  # deepspeed & co., which the argument handling does not use
                pass
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    captured = []
    namespace["train"] = captured.append
    old_argv, sys.argv = sys.argv, ["train_ppo_ray", *argv]
    try:
        exec(compile(ast.Module(main.body, []), path, "exec"), namespace)
    finally:
        sys.argv = old_argv
    return captured[0]


def guide_args(remote_url: str):
    """The user guide's flags (docs/guide/rewards.md) with OpenRLHF's required model flag."""
    return train_ppo_ray_args(["--actor.model_name_or_path", "policy", "--data.label_key", "reference",
                               "--reward.remote_url", remote_url])


class FixedEngine:
    """vLLM's place in SingleTurnAgentExecutor.execute: answers each prompt with its fixed response's
    tokens, the end-of-turn token included, as a chat model does."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        prompt = self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        response = RESPONSES[PROMPTS.index(prompt)] if prompt in PROMPTS else "something"
        ids = self.tokenizer(text=response, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        output = SimpleNamespace(token_ids=ids, text=response, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[output])


def rollout(executor, tokenizer, prompts, labels):
    """Every sample through executor.execute at once (as the rollout actor gathers them), then into
    the Experience the trainer reads."""
    async def run():
        params = SamplingParams(max_tokens=None, logprobs=None)
        return await asyncio.gather(*(executor.execute(p, label, params, 256, tokenizer, FixedEngine(tokenizer))
                                      for p, label in zip(prompts, labels)))

    outputs = asyncio.run(run())
    return outputs, [SamplesGenerator._process_response_into_experience(None, o, max_len=256) for o in outputs]


def test_the_guides_flags_reach_the_executor():
    args = guide_args("http://10.0.0.1:8000/get_reward,http://10.0.0.2:8000/get_reward")
    assert args.reward.remote_url == ["http://10.0.0.1:8000/get_reward", "http://10.0.0.2:8000/get_reward"]
    assert args.data.label_key == "reference"
    for old_flag in ("--remote_rm_url", "--label_key"):  # older guides' flags are not OpenRLHF 0.11's
        with pytest.raises(SystemExit):
            train_ppo_ray_args(["--actor.model_name_or_path", "policy", old_flag, "x"])


def test_the_executor_loads_the_file_and_the_trainer_reads_torchmovers_rewards(env, tokenizer, direct):
    args = guide_args(reward_file())
    executor = SingleTurnAgentExecutor(args.reward.remote_url)  # what each rollout actor does at its start
    assert process_reward().stats()["samples"] == 0  # built when the executor loaded reward_func
    labels = [REFS[0], [REFS[1], REFS[2]], REFS[2], REFS[3]]
    outputs, experiences = rollout(executor, tokenizer, PROMPTS, labels)
    expected = direct.score(ANSWERS, labels)
    got = torch.cat([e.rewards.flatten() for e in experiences])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat([e.scores.flatten() for e in experiences]), expected, atol=ATOL, rtol=0)
    info = experiences[0].info
    assert info["torchmover_twmd_recall"].item() == pytest.approx(expected[0].item(), abs=ATOL)
    assert info[FAILURES_LOG].item() == 0
    assert process_reward().batched.stats()["batches"] < len(PROMPTS)  # the to_thread calls, batched


def test_a_failure_is_a_warning_and_a_logged_count(env, tokenizer, direct, caplog):
    """OpenRLHF logs a reward function's exception at INFO and keeps the sample without reward."""
    executor = SingleTurnAgentExecutor(reward_file())
    with caplog.at_level(logging.WARNING, logger="torchmover"):
        outputs, _ = rollout(executor, tokenizer, PROMPTS[:1], [REFS[0]])
        outputs, _ = rollout(executor, tokenizer, PROMPTS[1:2], [""])  # no --data.label_key: "" labels
    assert outputs[0]["reward"] is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "torchmover"]
    assert len(warnings) == 1 and "(1 of 2 so far" in warnings[0] and "labels[0] is ''" in warnings[0]
    _, experiences = rollout(executor, tokenizer, PROMPTS[2:3], [REFS[2]])
    assert experiences[0].info[FAILURES_LOG].item() == 1


@pytest.fixture
def replicas(env, tmp_path):
    """Two ``torchmover serve`` replicas on loopback (one per GPU in production: --device cuda:N),
    configured by the same environment as the file."""
    processes, urls = [], []
    try:
        for _ in range(2):
            process = subprocess.Popen([sys.executable, "-m", "torchmover", "serve", "--port", "0", "--no-progress"],
                                       stderr=subprocess.PIPE, text=True,
                                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            processes.append(process)
            line = ""
            while "serving on" not in line:
                line = process.stderr.readline()
                assert line, "a replica exited before listening"
            urls.append(line.split("serving on ")[1].split()[0])
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        return json.loads(response.read())


def test_replicas_behind_openrlhfs_endpoint_list(replicas, tokenizer, direct):
    """OpenRLHF cycles through the --reward.remote_url list: every request is answered exactly once,
    by one replica or the other, with the reward the file gives."""
    args = guide_args(",".join(url + "/get_reward" for url in replicas))
    executor = SingleTurnAgentExecutor(args.reward.remote_url)
    n = 24
    prompts, labels = [PROMPTS[i % 4] for i in range(n)], [REFS[i % 4] for i in range(n)]
    outputs, experiences = rollout(executor, tokenizer, prompts, labels)
    got = torch.tensor([e.rewards.flatten()[0].item() for e in experiences])
    torch.testing.assert_close(got, direct.score([ANSWERS[i % 4] for i in range(n)], labels), atol=ATOL, rtol=0)
    answered = [health(url)["pairs"] for url in replicas]
    assert sum(answered) == n and min(answered) > 0
    file_executor = SingleTurnAgentExecutor(reward_file())
    _, from_file = rollout(file_executor, tokenizer, PROMPTS, REFS)
    assert [set(e.info) for e in from_file] == [set(e.info) for e in experiences[:4]]
    assert [e.rewards.flatten()[0].item() for e in from_file] == pytest.approx(got[:4].tolist(), abs=ATOL)
