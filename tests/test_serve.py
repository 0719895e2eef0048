"""The reward server: real HTTP requests on 127.0.0.1 against MoverReward in-process, bad bodies, load."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("aiohttp")

from torchmover import Scorer  # noqa: E402
from torchmover.reward.batching import BatchedReward  # noqa: E402
from torchmover.reward.rewards import MoverReward  # noqa: E402
from torchmover.integrations import openrlhf  # noqa: E402
from torchmover.integrations.config import RewardConfig  # noqa: E402
from torchmover.integrations.configured import FAILURES_LOG, reset_process_reward  # noqa: E402
from torchmover.integrations.server import RewardServer, response_from_query  # noqa: E402

REFS = ["the cat sat on the mat", "a dog barked in the house", "the quick brown fox jumps over the lazy dog",
        "she eats good food", "the sun is big and red"]
HYPS = ["the cat sat", "a dog ran in the city", "the brown fox", "he eats bad food", "the moon is small",
        "we ran", "the red car", "a big tree"]
ATOL = 1e-5


@pytest.fixture
def reward(tiny_encoder):
    return MoverReward(Scorer(tiny_encoder, centering="fixed").fit_centering(REFS, progress=False))


@pytest.fixture
def server(reward):
    with BatchedReward(reward, max_batch_size=64, max_wait_ms=5) as batched:
        with RewardServer(batched, max_request_bytes=4096) as server:
            yield server


def post(url: str, body, timeout: float = 60) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.status, json.loads(response.read())


def openrlhf_body(pairs, prompt="<|im_start|>user\nsummarise: {}<|im_end|>\n<|im_start|>assistant\n"):
    prompts = [prompt.format(i) for i in range(len(pairs))]
    return {"query": [p + h + "<|im_end|>" for p, (h, _) in zip(prompts, pairs)], "prompts": prompts,
            "labels": [r for _, r in pairs]}


def test_response_from_query():  # the helper of torchmover.integrations.parsing (tests/test_parsing.py)
    assert response_from_query("<s>Q: hi A: a cat sat</s>", "Q: hi A:") == "a cat sat"
    assert response_from_query("Q: a cat<|im_end|>\n<|endoftext|>", "Q:") == "a cat"
    assert response_from_query("Q:", "Q:") == ""
    with pytest.raises(ValueError, match="not a prefix of the query"):
        response_from_query("something else", "Q:")


def test_score_endpoint_equals_reward(server, reward):
    refs = [REFS[i % 5] if i % 3 else [REFS[i % 5], REFS[0]] for i in range(len(HYPS))]
    status, body = post(server.url + "/score", {"hyps": HYPS, "refs": refs})
    assert status == 200
    torch.testing.assert_close(torch.tensor(body["rewards"]), reward.score(HYPS, refs), atol=ATOL, rtol=0)


@pytest.mark.parametrize("path", ["/get_reward", "/"])
def test_openrlhf_protocol_equals_reward(server, reward, path):
    pairs = [(h, REFS[i % 5]) for i, h in enumerate(HYPS)]
    status, body = post(server.url + path, openrlhf_body(pairs))
    assert status == 200 and set(body) == {"rewards", "scores", "extra_logs"}
    want = reward.score([h for h, _ in pairs], [r for _, r in pairs])
    torch.testing.assert_close(torch.tensor(body["rewards"]), want, atol=ATOL, rtol=0)
    assert body["extra_logs"] == {"torchmover_twmd_recall": body["rewards"], FAILURES_LOG: [0.0] * len(pairs)}
    assert body["scores"] == body["rewards"]


def test_health(server, reward):
    status, body = get(server.url + "/health")
    assert status == 200 and body["status"] == "ok" and body["signature"] == reward.signature
    assert body["device"] == "cpu" and body["max_batch_size"] == 64


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    ([1, 2], 400, "must be a JSON object"),
    ({"refs": ["a"]}, 400, "missing field 'hyps'"),
    ({"hyps": "a cat", "refs": ["a"]}, 400, "hyps must be a list"),
    ({"hyps": ["a", 3], "refs": ["a", "b"]}, 400, r"hyps[1] must be a str"),
    ({"hyps": ["a", "b"], "refs": ["a"]}, 400, "same length"),
    ({"hyps": ["a"], "refs": [[]]}, 400, "refs[0] is an empty list"),
    ({"hyps": ["x" * 5000], "refs": ["a"]}, 413, "Maximum request body size"),
])
def test_malformed_score_requests_get_4xx_and_the_server_stays_up(server, reward, body, status, message):
    got_status, got = post(server.url + "/score", body)
    assert got_status == status and message in got["error"]
    assert post(server.url + "/score", {"hyps": HYPS[:1], "refs": REFS[:1]})[0] == 200


@pytest.mark.parametrize("body, message", [
    ({"query": ["a"], "prompts": ["a"]}, "missing field 'labels'"),
    ({"query": ["Q: a", "Q: b"], "prompts": ["Q:"], "labels": ["a"]}, "prompts has 1 values for 2 queries"),
    ({"query": ["Q: a"], "prompts": ["P:"], "labels": ["a"]}, "the prompt is not a prefix of the query"),
    ({"query": ["Q: a"], "prompts": ["Q:"], "labels": [None]}, "labels[0] is None: no reference"),
    ({"query": ["Q: a"], "prompts": ["Q:"], "labels": [{"x": "a"}]}, "must be a list of strings"),
    ({"query": [3], "prompts": ["Q:"], "labels": ["a"]}, "must be strings"),
])
def test_malformed_openrlhf_requests(server, body, message):
    status, got = post(server.url + "/get_reward", body)
    assert status == 400 and message in got["error"]


def test_failed_requests_are_counted(server):
    """OpenRLHF logs a failed request at INFO only: the server logs each at WARNING and reports the count."""
    post(server.url + "/get_reward", {"query": ["Q: a"], "prompts": ["P:"], "labels": ["a"]})
    assert get(server.url + "/health")[1]["failures"] == 1
    status, body = post(server.url + "/get_reward", {"query": ["Q: a"], "prompts": ["Q:"], "labels": ["a"]})
    assert status == 200 and body["extra_logs"][FAILURES_LOG] == [1.0]


def test_the_server_reads_the_shared_settings(reward):
    """labels[i] = None gets missing_score, <think> traces are stripped, a dict label is read at
    reference_field, query special tokens are the configured ones: as in the adapter file."""
    config = RewardConfig(missing_score=-1.0, strip_reasoning=("<think>", "</think>"),
                          reference_field="ground_truth.summary", query_special_tokens=("<END>",))
    with BatchedReward(reward) as batched, RewardServer(batched, config=config) as server:
        status, body = post(server.url + "/get_reward", {
            "query": ["Q:<think>no idea</think> the cat sat<END>", "Q: a dog", "Q: the cat"],
            "prompts": ["Q:", "Q:", "Q:"], "labels": [{"summary": REFS[0]}, {"summary": None}, {"other": REFS[0]}]})
    assert status == 200
    assert body["rewards"] == pytest.approx([reward.score(["the cat sat"], REFS[:1]).item(), -1.0, -1.0], abs=ATOL)
    with pytest.raises(ValueError, match="reads verl's extra_info"):
        RewardServer(BatchedReward(reward), config=RewardConfig(reference_field="extra_info.refs"))


def test_unknown_path_and_method(server):
    assert post(server.url + "/nope", {})[0] == 404
    with pytest.raises(urllib.error.HTTPError) as error:
        get(server.url + "/score")
    assert error.value.code == 405


def test_load_every_response_matches_its_request(server, reward):
    """32 concurrent clients x 50 single-sample OpenRLHF requests: nothing lost, nothing mixed up."""
    pairs = [(h, r) for h in HYPS for r in REFS]  # 40 distinct pairs
    want = reward.score([h for h, _ in pairs], [r for _, r in pairs]).tolist()

    def client(c):
        out = []
        for k in range(50):
            i = (c * 50 + k) % len(pairs)
            status, body = post(server.url + "/get_reward", openrlhf_body([pairs[i]], prompt=f"client {c} asks {k}: "))
            out.append((i, status, body["rewards"]))
        return out

    start = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        results = [r for rows in pool.map(client, range(32)) for r in rows]
    assert time.monotonic() - start < 300
    assert len(results) == 32 * 50 and all(status == 200 for _, status, _ in results)
    for i, _, rewards in results:
        assert rewards == pytest.approx([want[i]], abs=ATOL)
    stats = get(server.url + "/health")[1]
    assert stats["pairs"] == 32 * 50 + 0 and stats["batches"] < 32 * 50  # requests were coalesced


@contextlib.contextmanager
def serving(args, env=None):
    """``torchmover serve ARGS --port 0`` in a subprocess (environment ``env``, default: ours without
    TORCHMOVER_* variables); yields its URL once it listens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHMOVER_")} if env is None else env
    env = {**env, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "torchmover", "serve", *args, "--port", "0", "--no-progress"],
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        while "serving on" not in line:
            line = process.stderr.readline()
            assert line, "the server exited before listening"
        yield line.split("serving on ")[1].split()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_cli_serve(tiny_model_dir, tmp_path, reward):
    refs = tmp_path / "refs.txt"
    refs.write_text("\n".join(REFS) + "\n")
    with serving(["--model", str(tiny_model_dir), "--layer", "2", "--centering", "batch",
                  "--fit-references", str(refs)]) as url:
        status, body = post(url + "/score", {"hyps": HYPS[:3], "refs": REFS[:3]})
        assert status == 200 and len(body["rewards"]) == 3
        assert get(url + "/health")[1]["signature"].startswith("twmd|model:")


PROMPT = "<|im_start|>user\nSummarise.<|im_end|>\n<|im_start|>assistant\n"
SAME_REQUESTS = [  # (queries, prompts, labels), each one request / one reward_func call
    ([PROMPT + "<think>a dog? no: " + REFS[1] + "</think>\n" + HYPS[0] + "<|im_end|>"], [PROMPT], [REFS[0]]),
    ([PROMPT + HYPS[2] + "<|im_end|>", PROMPT + "<think>unfinished"], [PROMPT] * 2, [[REFS[2], REFS[3]], REFS[2]]),
    ([PROMPT + HYPS[3] + "<|im_end|>"], [PROMPT], [None]),
    (["<s>" + HYPS[4]], ["another prompt entirely, which the query does not start with"], [REFS[4]]),
]


@pytest.fixture
def file_adapter_env(monkeypatch, tiny_model_dir, tmp_path):
    """The environment of a user's job: the settings as TORCHMOVER_* variables."""
    refs = tmp_path / "refs.txt"
    refs.write_text("\n".join(REFS) + "\n")
    settings = {"TORCHMOVER_MODEL": str(tiny_model_dir), "TORCHMOVER_OPTIONS": '{"layer": 2}',
                "TORCHMOVER_FIT_REFERENCES": str(refs), "TORCHMOVER_STRIP_REASONING": "1",
                "TORCHMOVER_MISSING_SCORE": "-0.5", "TORCHMOVER_ON_PROMPT_MISMATCH": "query"}
    for name in [n for n in os.environ if n.startswith("TORCHMOVER_")]:
        monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    reset_process_reward()
    yield settings
    reset_process_reward()


def file_adapter_answers():
    spec = importlib.util.spec_from_file_location("reward_func", openrlhf.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answers = [module.reward_func(*request) for request in SAME_REQUESTS]
    return [(a["rewards"].tolist(), {k: v.tolist() for k, v in a["extra_logs"].items()}) for a in answers]


@pytest.mark.parametrize("configured_by", ["environment", "flags"])
def test_file_adapter_and_server_give_the_same_rewards(file_adapter_env, tiny_model_dir, configured_by):
    """The same OpenRLHF requests through the adapter file (settings from the environment) and through
    `torchmover serve` (the same environment, or the same settings as flags): identical rewards and
    extra_logs, reasoning stripped, the missing label's fixed reward, the mismatched prompt's fallback."""
    expected = file_adapter_answers()
    if configured_by == "environment":
        args, env = [], {**os.environ}
    else:
        args, env = ["--model", str(tiny_model_dir), "--layer", "2", "--device", "cpu", "--strip-reasoning",
                     "--missing-score", "-0.5",
                     "--fit-references", file_adapter_env["TORCHMOVER_FIT_REFERENCES"],
                     "--on-prompt-mismatch", "query"], None
    with serving(args, env) as url:
        answers = [post(url + "/get_reward", {"query": q, "prompts": p, "labels": l}) for q, p, l in SAME_REQUESTS]
    assert [status for status, _ in answers] == [200] * len(SAME_REQUESTS)
    for (rewards, logs), (_, body) in zip(expected, answers):
        assert body["rewards"] == pytest.approx(rewards, abs=ATOL)
        assert set(body["extra_logs"]) == set(logs) and body["extra_logs"][FAILURES_LOG] == logs[FAILURES_LOG]
    assert expected[2][0] == [-0.5] and expected[1][0][1] == 0.0  # the missing label; the unfinished trace


def test_cli_serve_refuses_batch_centering_without_references(tiny_model_dir, capsys):
    from torchmover.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tiny_model_dir), "--layer", "2", "--centering", "batch"])
    assert exit_.value.code == 2 and "--fit-references" in capsys.readouterr().err
