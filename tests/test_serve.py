"""The reward server: real HTTP requests on 127.0.0.1 against MoverReward in-process, bad bodies, load."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("aiohttp")

from conftest import configure_reward_env, load_file  # noqa: E402
from torchmover import Scorer  # noqa: E402
from torchmover.reward.batching import BatchedReward  # noqa: E402
from torchmover.reward.rewards import MoverReward  # noqa: E402
from torchmover.integrations import openrlhf  # noqa: E402
from torchmover.integrations.config import RewardConfig  # noqa: E402
from torchmover.integrations.configured import FAILURES_LOG, process_reward, reset_process_reward  # noqa: E402
from torchmover.integrations.server import DEFAULT_MAX_REQUEST_BYTES, RewardServer, response_from_query  # noqa: E402

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
        with RewardServer(batched, max_request_bytes=2**20) as server:
            yield server


def post(url: str, body, timeout: float = 60, content_type: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type})
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


def test_the_guide_documents_the_answer_and_openrlhfs_flag_as_they_are(server):
    """docs/guide/server.md names the extra_logs keys the server answers with, and OpenRLHF 0.11's
    flag (before: "torchmover_reward", which no answer holds, and --remote_rm_url, which it refuses)."""
    guide = (Path(__file__).parents[1] / "docs" / "guide" / "server.md").read_text(encoding="utf-8")
    status, body = post(server.url + "/get_reward", openrlhf_body([(HYPS[0], REFS[0])]))
    assert status == 200 and set(body["extra_logs"]) == {"torchmover_twmd_recall", FAILURES_LOG}
    assert all(f"`{key}`" in guide or f'"{key}"' in guide for key in body["extra_logs"])
    assert "torchmover_reward" not in guide and "--remote_rm_url http" not in guide
    assert "--reward.remote_url http://HOST:8000/get_reward" in guide


def test_health(server, reward):
    """/health's signature is the configured reward's: the reward's, then the fields of its settings."""
    status, body = get(server.url + "/health")
    assert status == 200 and body["status"] == "ok" and body["signature"] == server.reward.signature
    assert body["signature"] == reward.signature + ("|reffield:ground_truth|strip:none|parse:none|missing:error"
                                                    "|qtokens:default|mismatch:error|shaping:none")
    assert body["device"] == "cpu" and body["max_batch_size"] == 64


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    ([1, 2], 400, "must be a JSON object"),
    ({"refs": ["a"]}, 400, "missing field 'hyps'"),
    ({"hyps": "a cat", "refs": ["a"]}, 400, "hyps must be a list"),
    ({"hyps": ["a", 3], "refs": ["a", "b"]}, 400, r"hyps[1] must be a str"),
    ({"hyps": ["a", "b"], "refs": ["a"]}, 400, "same length"),
    ({"hyps": ["a"], "refs": [[]]}, 400, "refs[0] is an empty list"),
    ({"hyps": ["x" * 2**20], "refs": ["a"]}, 413, f"at most {2**20} (max_request_bytes)"),
    # the 500s: deep nesting (RecursionError), lone surrogates (a tokenizer TypeError)
    (b"[" * 100_000, 400, "nested too deeply"),
    (b'{"a":' * 50_000, 400, "nested too deeply"),
    ({"hyps": ["a\ud800b"], "refs": ["a"]}, 400, "hyps[0] is not valid Unicode: lone surrogate '\\ud800' at position 1"),
    ({"hyps": ["a"], "refs": [["b", "\udfff"]]}, 400, "refs[0][1] is not valid Unicode"),
    (b'{"hyps": ["\xff"], "refs": ["a"]}', 400, "not valid JSON"),  # not UTF-8
    (b'{"hyps": [' + b"1" * 5000 + b'], "refs": ["a"]}', 400, "not valid JSON"),  # an int of too many digits
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
    ({"query": ["Q: a\ud800"], "prompts": ["Q:"], "labels": ["a"]}, "query[0] is not valid Unicode"),
    ({"query": ["Q: a"], "prompts": ["Q:"], "labels": [["a", "\ud800"]]},
     "a reference of labels[0] (read at ground_truth) is not valid Unicode: lone surrogate '\\ud800' at position 0"),
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


@pytest.mark.parametrize("body, refused, failures", [
    # refused as a whole, before any sample is read: lengths, types, Unicode
    ({"query": ["Q: a", "Q: b"], "prompts": ["Q:", "Q:"], "labels": ["a"]}, 1, 0),
    ({"query": [1], "prompts": ["Q:"], "labels": ["a"]}, 1, 0),
    ({"query": ["Q: a\ud800"], "prompts": ["Q:"], "labels": ["a"]}, 1, 0),
    # samples read and failed: the whole call fails, each of its samples counts
    ({"query": ["Q: a"], "prompts": ["P:"], "labels": ["a"]}, 0, 1),
    ({"query": ["Q: a", "Q: b"], "prompts": ["Q:", "Q:"], "labels": ["a", None]}, 0, 2),
])
def test_a_request_is_counted_refused_or_failed_never_both(server, caplog, body, refused, failures):
    """Before, a /get_reward whose labels were fewer than its queries, or whose query was not a str,
    was counted both as refused and as failed samples (in /health and OpenRLHF's extra_logs)."""
    caplog.set_level(logging.WARNING, logger="torchmover")
    status, answer = post(server.url + "/get_reward", body)
    health = get(server.url + "/health")[1]
    assert status == 400 and answer["error"] and (health["refused"], health["failures"]) == (refused, failures)
    lines = [r.getMessage() for r in caplog.records]
    assert len([line for line in lines if "refused a request" in line]) == refused
    assert len([line for line in lines if "sample(s) failed" in line]) == (failures > 0)
    status, answer = post(server.url + "/get_reward", {"query": ["Q: a"], "prompts": ["Q:"], "labels": ["a"]})
    assert status == 200 and answer["extra_logs"][FAILURES_LOG] == [float(failures)]


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


def test_a_label_read_at_a_deeper_field_that_is_not_valid_unicode_is_refused(reward):
    """With reference_field ground_truth.answer, a dict label's references are checked as the reward
    reads them: before, they were not checked up front, so the request failed its samples (counted in
    failures) with an error naming refs[0][0], not a field of the request."""
    config = RewardConfig(reference_field="ground_truth.answer")
    with BatchedReward(reward) as batched, RewardServer(batched, config=config) as server:
        for label in ({"answer": "x\ud800"}, {"answer": ["a", None, "x\ud800"]}):
            status, got = post(server.url + "/get_reward", {"query": ["Q: a"], "prompts": ["Q:"], "labels": [label]})
            assert status == 400 and got["error"] == ("a reference of labels[0] (read at ground_truth.answer) is not "
                                                      "valid Unicode: lone surrogate '\\ud800' at position 1")
        health = get(server.url + "/health")[1]
        assert (health["refused"], health["failures"]) == (2, 0)
        status, got = post(server.url + "/get_reward", {"query": ["Q: a"], "prompts": ["Q:"],
                                                        "labels": [{"answer": 3}]})  # unreadable: a failed sample
        assert status == 400 and "must be a list of strings" in got["error"]
        assert get(server.url + "/health")[1]["failures"] == 1


@pytest.mark.parametrize("content_type, status", [
    ("application/json; charset=no-such-charset", 415), ("application/json; charset=latin-1", 415),
    ("application/json; charset=UTF8", 200), ("text/plain", 200)])
def test_charsets(server, content_type, status):
    got_status, got = post(server.url + "/score", {"hyps": ["a"], "refs": ["a"]}, content_type=content_type)
    assert got_status == status and (status == 200 or "must be UTF-8 JSON" in got["error"])


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
    TORCHMOVER_* variables); yields its URL once it listens, and the signature it prints then."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHMOVER_")} if env is None else env
    env = {**env, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "torchmover", "serve", *args, "--port", "0", "--no-progress"],
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        while "serving on" not in line:
            line = process.stderr.readline()
            assert line, "the server exited before listening"
        signature = process.stderr.readline().removeprefix("signature: ").rstrip("\n")
        yield line.split("serving on ")[1].split()[0], signature
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_cli_serve(tiny_model_dir, tmp_path, reward):
    refs = tmp_path / "refs.txt"
    refs.write_text("\n".join(REFS) + "\n")
    with serving(["--model", str(tiny_model_dir), "--layer", "2", "--centering", "batch",
                  "--fit-references", str(refs)]) as (url, signature):
        status, body = post(url + "/score", {"hyps": HYPS[:3], "refs": REFS[:3]})
        assert status == 200 and len(body["rewards"]) == 3
        assert get(url + "/health")[1]["signature"] == signature and signature.startswith("twmd|model:")


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
    yield configure_reward_env(monkeypatch, tiny_model_dir, tmp_path / "refs.txt", REFS, strip_reasoning="1",
                               missing_score="-0.5", on_prompt_mismatch="query")
    reset_process_reward()


def file_adapter_answers():
    module = load_file(openrlhf.__file__, "reward_func")
    answers = [module.reward_func(*request) for request in SAME_REQUESTS]
    return [(a["rewards"].tolist(), {k: v.tolist() for k, v in a["extra_logs"].items()}) for a in answers]


@pytest.mark.parametrize("configured_by", ["environment", "flags"])
def test_file_adapter_and_server_give_the_same_rewards(file_adapter_env, tiny_model_dir, configured_by):
    """The same OpenRLHF requests through the adapter file (settings from the environment) and through
    `torchmover serve` (the same environment, or the same settings as flags): identical rewards and
    extra_logs, reasoning stripped, the missing label's fixed reward, the mismatched prompt's fallback; and
    the same signature, the settings' fields included, printed and returned by /health."""
    expected = file_adapter_answers()
    if configured_by == "environment":
        args, env = [], {**os.environ}
    else:
        args, env = ["--model", str(tiny_model_dir), "--layer", "2", "--device", "cpu", "--strip-reasoning",
                     "--missing-score", "-0.5",
                     "--fit-references", file_adapter_env["TORCHMOVER_FIT_REFERENCES"],
                     "--on-prompt-mismatch", "query"], None
    with serving(args, env) as (url, signature):
        answers = [post(url + "/get_reward", {"query": q, "prompts": p, "labels": l}) for q, p, l in SAME_REQUESTS]
        assert get(url + "/health")[1]["signature"] == signature == process_reward().signature
    assert '|strip:["<think>","</think>"]|parse:none|missing:-0.5|qtokens:default|mismatch:query|' in signature
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


# --- limits, timeouts, abandoned work, slicing, drain ---------------------------------------------

@contextlib.contextmanager
def serving_in_process(reward, max_batch_size: int = 64, **limits):
    with BatchedReward(reward, max_batch_size=max_batch_size, max_wait_ms=5) as batched:
        with RewardServer(batched, **limits) as server:
            yield server


class Gate:
    """Holds the batcher's worker inside ``reward.score`` until :meth:`release`; records each batch's
    hypotheses."""

    def __init__(self, reward):
        self.batches, self.entered, self.opened = [], threading.Event(), threading.Event()
        score = reward.score

        def gated(hyps, refs):
            self.batches.append(list(hyps))
            self.entered.set()
            assert self.opened.wait(60), "the gate was never released"
            return score(hyps, refs)

        reward.score = gated

    def release(self):
        self.opened.set()


def connect(server, timeout: float = 20) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=timeout)
    return sock


def http_request(path: str, body: bytes, content_length: int | None = None) -> bytes:
    length = len(body) if content_length is None else content_length
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
            ).encode() + body


def read_response(sock) -> tuple[int, dict]:
    """The status and JSON body of one response read from ``sock`` (raises on a closed connection)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), json.loads(body[:length])


def closed_by_server(sock) -> bool:
    """Whether the server closes ``sock`` before its timeout (20 s) passes (reads up to EOF)."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def wait_for(condition, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def health(server) -> dict:
    return get(server.url + "/health")[1]


def test_a_connection_that_sends_no_complete_head_in_time_is_closed(reward):
    with serving_in_process(reward, header_timeout=0.5) as server:
        silent, partial = connect(server), connect(server)
        partial.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
        assert closed_by_server(silent) and closed_by_server(partial)
        dribbler = connect(server)  # one header byte every 50 ms: the timer runs from the first byte
        with pytest.raises(OSError):
            for byte in b"POST /score HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: 0123456789abcdef\r\n" * 15:
                dribbler.sendall(bytes([byte]))
                time.sleep(0.05)
        assert post(server.url + "/score", {"hyps": ["a"], "refs": ["a"]})[0] == 200


def test_a_body_that_does_not_arrive_in_time_is_answered_408(reward):
    with serving_in_process(reward, body_timeout=0.5) as server:
        sock = connect(server)
        sock.sendall(http_request("/score", b'{"hyps": ', content_length=100))
        status, body = read_response(sock)
        assert status == 408 and "body_timeout" in body["error"] and closed_by_server(sock)


def test_an_announced_body_over_the_limit_is_refused_before_it_is_read(reward):
    """The issue's client announced 9 MiB and sent 10 bytes: it held the connection forever."""
    with serving_in_process(reward, body_timeout=600) as server:
        sock = connect(server)
        sock.sendall(http_request("/score", b'{"hyps": [', content_length=9437184))
        status, body = read_response(sock)  # at once, not after body_timeout (the socket gives up after 20 s)
        assert status == 413 and f"at most {DEFAULT_MAX_REQUEST_BYTES} (max_request_bytes)" in body["error"]
        assert closed_by_server(sock)


def test_an_idle_keep_alive_connection_is_closed(reward):
    with serving_in_process(reward, idle_timeout=0.5) as server:
        sock = connect(server)
        sock.sendall(http_request("/score", json.dumps({"hyps": ["a"], "refs": ["a"]}).encode()))
        assert read_response(sock)[0] == 200
        assert closed_by_server(sock)


def test_connections_over_the_cap_are_answered_503_and_the_server_recovers(reward):
    with serving_in_process(reward, max_connections=3, header_timeout=60) as server:
        idle = [connect(server) for _ in range(3)]
        wait_for(lambda: len(server._connections) == 3, "three connections")
        extra = connect(server)
        extra.sendall(http_request("/score", json.dumps({"hyps": ["a"], "refs": ["a"]}).encode()))
        try:
            status, body = read_response(extra)
            assert status == 503 and "max_connections" in body["error"]
        except (ConnectionError, OSError):
            pass  # the 503 may be lost to a reset: the request was sent before the close
        assert closed_by_server(extra)
        idle.pop().close()
        wait_for(lambda: len(server._connections) < 3, "a free connection")
        assert post(server.url + "/score", {"hyps": ["a"], "refs": ["a"]})[0] == 200
        assert health(server)["limits"]["max_connections"] == 3


def test_requests_whose_client_left_are_not_scored(reward):
    gate = Gate(reward)
    with serving_in_process(reward, max_batch_size=64) as server:
        first = ThreadPoolExecutor(1).submit(post, server.url + "/score", {"hyps": ["the gate"], "refs": ["a"]})
        assert gate.entered.wait(60)  # the worker is held: what comes next waits in the queue
        leaving = [connect(server) for _ in range(10)]
        for i, sock in enumerate(leaving):
            sock.sendall(http_request("/score", json.dumps({"hyps": [f"left {i} {k}" for k in range(32)],
                                                            "refs": ["a"] * 32}).encode()))
        wait_for(lambda: health(server)["in_flight"] == 11, "ten queued requests")
        for sock in leaving:
            sock.close()
        wait_for(lambda: health(server)["abandoned"] == 10, "ten abandoned requests")
        gate.release()
        assert first.result(60)[0] == 200
        assert post(server.url + "/score", {"hyps": ["after"], "refs": ["a"]})[0] == 200
        assert [h for batch in gate.batches for h in batch] == ["the gate", "after"]
        assert health(server)["pairs"] == 2


def test_a_large_request_is_scored_in_slices_that_let_small_requests_through(reward):
    gate = Gate(reward)
    large = {"hyps": [f"large {i}" for i in range(12)], "refs": ["a"] * 12}
    with serving_in_process(reward, max_batch_size=4) as server, ThreadPoolExecutor(2) as pool:
        large_answer = pool.submit(post, server.url + "/score", large)
        assert gate.entered.wait(60)  # the first slice is being scored
        small_answer = pool.submit(post, server.url + "/score", {"hyps": ["small"], "refs": ["a"]})
        wait_for(lambda: health(server)["in_flight"] == 2, "the small request to be queued")
        gate.release()
        assert small_answer.result(60)[0] == 200 and large_answer.result(60)[0] == 200
    assert gate.batches == [large["hyps"][:4], ["small"], large["hyps"][4:8], large["hyps"][8:]]
    torch.testing.assert_close(torch.tensor(large_answer.result()[1]["rewards"]),
                               reward.score(large["hyps"], large["refs"]), atol=ATOL, rtol=0)


def test_more_pairs_than_the_limit_are_refused_naming_it(reward):
    with serving_in_process(reward, max_pairs_per_request=16) as server:
        status, body = post(server.url + "/score", {"hyps": ["a"] * 17, "refs": ["a"] * 17})
        assert status == 413 and "17 pairs" in body["error"] and "at most 16 per request" in body["error"]
        status, body = post(server.url + "/get_reward", openrlhf_body([("a", "b")] * 17))
        assert status == 413 and "max_pairs_per_request" in body["error"]
        assert post(server.url + "/score", {"hyps": ["a"] * 16, "refs": ["a"] * 16})[0] == 200


def test_stop_answers_the_requests_in_flight_and_refuses_new_connections(reward):
    gate = Gate(reward)
    with serving_in_process(reward) as server, ThreadPoolExecutor(2) as pool:
        answer = pool.submit(post, server.url + "/score", {"hyps": ["in flight"], "refs": ["a"]})
        assert gate.entered.wait(60)
        stopping = pool.submit(server.stop)
        wait_for(lambda: _refused(server), "the server to stop listening")
        gate.release()
        stopping.result(60)
        assert answer.result(60)[0] == 200


def test_stop_cuts_off_what_is_still_running_at_the_drain_deadline(reward):
    gate = Gate(reward)
    with serving_in_process(reward, drain_timeout=0.5) as server, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, server.url + "/score", {"hyps": ["in flight"], "refs": ["a"]})
        assert gate.entered.wait(60)
        started = time.monotonic()
        server.stop()  # returns after the deadline, the request still held
        assert time.monotonic() - started < 0.5 + 1
        status, body = answer.result(60)[:2]  # answered, not dropped
        assert status == 503 and "shutting down" in body["error"]
        gate.release()


def _refused(server) -> bool:
    """Whether the server no longer listens: a connection is refused, or reset in the handshake (the
    listening socket was closed while the connection sat in its backlog, a race of the shutdown)."""
    try:
        socket.create_connection((server.host, server.port), timeout=5).close()
        return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True


def test_limits_are_validated(reward):
    with BatchedReward(reward) as batched:
        for name, value in [("max_pairs_per_request", 0), ("max_connections", -1), ("header_timeout", 0),
                            ("body_timeout", float("inf")), ("drain_timeout", True), ("max_request_bytes", 1.5)]:
            with pytest.raises(ValueError, match=name):
                RewardServer(batched, **{name: value})
        with pytest.raises(TypeError, match="unknown RewardServer options"):
            RewardServer(batched, max_pairs=3)


def start_cli_server(model_dir, *options: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "torchmover", "serve", "--model", str(model_dir), "--layer", "2", "--port", "0",
         "--centering", "none", "--no-progress", *options], stderr=subprocess.PIPE, text=True, env=env)
    line = ""
    while "serving on" not in line:
        line = process.stderr.readline()
        assert line, "the server exited before listening"
    return process, line.split("serving on ")[1].split()[0]


def test_sigterm_finishes_the_requests_in_flight_then_exits_0(tiny_model_dir):
    """The issue: 16 of 16 requests in flight got RemoteDisconnected, and the exit status was -15."""
    process, url = start_cli_server(tiny_model_dir, "--max-batch-size", "32")
    try:
        body = {"hyps": [f"the cat {i} sat on the mat" for i in range(64)], "refs": ["a dog barked"] * 64}
        with ThreadPoolExecutor(16) as pool:
            answers = [pool.submit(post, url + "/score", body) for _ in range(16)]
            wait_for(lambda: get(url + "/health")[1]["batches"] >= 1, "scoring to start")
            process.send_signal(signal.SIGTERM)
            results = [a.result(120) for a in answers]
        assert [status for status, _ in results] == [200] * 16 and all(len(b["rewards"]) == 64 for _, b in results)
        assert process.wait(timeout=120) == 0
        assert "stopping" in process.stderr.read()
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("option, value", [("--batch-size", "0"), ("--max-batch-size", "-3"), ("--max-wait-ms", "-1"),
                                           ("--cache-size", "-1"), ("--max-request-bytes", "0"), ("--port", "70000"),
                                           ("--max-pairs-per-request", "0"), ("--max-connections", "x"),
                                           ("--header-timeout", "0"), ("--drain-timeout", "nan"),
                                           ("--max-wait-ms", "inf"), ("--missing-score", "nan")])
def test_cli_serve_refuses_bad_sizes_at_start(tiny_model_dir, tmp_path, capsys, option, value):
    from torchmover.cli import main

    with pytest.raises(SystemExit) as exit_:  # (a missing --fit-references file stops a run that accepts the option)
        main(["serve", "--model", str(tiny_model_dir), "--layer", "2", "--fit-references", str(tmp_path / "none"),
              option, value])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and option in error and "none" not in error  # the option, not the missing file


def test_a_body_its_content_encoding_cannot_decode_is_400(server):
    sock = connect(server)
    sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 8\r\n\r\nnot gzip")
    status, body = read_response(sock)
    assert status == 400 and "the body cannot be read" in body["error"]


# --- bounded requests, refusals, drain deadline, descriptor exhaustion ------------------------------

def post_with_headers(url: str, body) -> tuple[int, dict, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def test_references_over_the_limits_are_refused_with_413_naming_the_limit(reward):
    """Before, the pair limit counted hypotheses only: 1 hypothesis x 400,000 references (6.7 MiB)
    took the server to 24 GB."""
    with serving_in_process(reward, max_references_per_hypothesis=5, max_references_per_request=8) as server:
        status, body = post(server.url + "/score", {"hyps": ["a cat"], "refs": [["a cat sat"] * 6]})
        assert status == 413 and "max_references_per_hypothesis" in body["error"] and "6 references" in body["error"]
        status, body = post(server.url + "/score", {"hyps": ["a cat", "a dog"], "refs": [["a cat"] * 5, ["a dog"] * 4]})
        assert status == 413 and "max_references_per_request" in body["error"] and "9 references" in body["error"]
        status, body = post(server.url + "/get_reward", openrlhf_body([("a cat", ["the cat"] * 6)]))
        assert status == 413 and "max_references_per_hypothesis" in body["error"]
        status, body = post(server.url + "/score", {"hyps": ["a cat", "a dog"], "refs": [["a cat"] * 5, ["a dog"] * 3]})
        assert status == 200 and len(body["rewards"]) == 2  # at the limits
        health = get(server.url + "/health")[1]
        assert health["limits"]["max_references_per_request"] == 8 and health["refused"] == 3


def test_a_refused_request_counts_no_failed_sample(reward):
    """Before, a /get_reward of more queries than max_pairs_per_request was refused (413) and its
    queries counted as failed samples in /health and in extra_logs."""
    with serving_in_process(reward, max_pairs_per_request=4) as server:
        status, body = post(server.url + "/get_reward", openrlhf_body([("a cat", "the cat")] * 5))
        assert status == 413 and "max_pairs_per_request" in body["error"]
        health = get(server.url + "/health")[1]
        assert health["failures"] == 0 and health["refused"] == 1
        status, body = post(server.url + "/get_reward", openrlhf_body([("a cat", "the cat")]))
        assert status == 200 and body["extra_logs"][FAILURES_LOG] == [0.0]


def test_the_drain_keeps_its_deadline_answering_in_arrival_order(reward):
    """More work in flight than the deadline allows: 6 requests of 4 slices each, 0.2 s a slice, and
    a 2 s drain (the first request's 0.8 s fit in it on a loaded machine too). Before, the batcher
    interleaved the requests so that none finished, and the server dropped the connections after the
    deadline without a status."""
    score = reward.score

    def slow(hyps, refs):
        time.sleep(0.2)
        return score(hyps, refs)

    reward.score = slow
    body = {"hyps": [f"the cat {i}" for i in range(8)], "refs": ["a cat sat"] * 8}
    with serving_in_process(reward, max_batch_size=2, drain_timeout=2.0) as server, ThreadPoolExecutor(6) as pool:
        answers = []
        for _ in range(6):  # in this arrival order
            answers.append(pool.submit(post_with_headers, server.url + "/score", body))
            wait_for(lambda: server.in_flight == len(answers), "the request to be in flight")
        started = time.monotonic()
        server.stop()
        took = time.monotonic() - started
        statuses = [a.result(10)[0] for a in answers]
    assert took <= 2.0 + 1, took
    assert set(statuses) <= {200, 503} and statuses == sorted(statuses), statuses  # answered first come, first served
    assert statuses[0] == 200 and statuses[-1] == 503
    assert all(a.result()[2].get("Retry-After") for a, s in zip(answers, statuses) if s == 503)


def test_refused_requests_log_one_line_each_without_a_traceback(server, caplog):
    """Before, every request aiohttp could not parse logged a full traceback at ERROR."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    caplog.set_level(logging.WARNING, logger="torchmover")
    for _ in range(3):  # framing attacks: a Content-Length that is not a number
        with connect(server) as sock:
            sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
            assert closed_by_server(sock)
    for _ in range(2):
        assert post(server.url + "/score", b"{not json")[0] == 400
    wait_for(lambda: len([r for r in caplog.records if "refused a request" in r.getMessage()]) == 5, "5 lines")
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], "a traceback was logged"
    lines = [r.getMessage() for r in caplog.records if "refused a request" in r.getMessage()]
    assert all("from 127.0.0.1: 400 " in line for line in lines), lines


def test_the_refusal_log_is_rate_limited(monkeypatch, caplog):
    from torchmover.integrations import server as server_module

    now = [100.0]
    monkeypatch.setattr(server_module.time, "monotonic", lambda: now[0])
    log = server_module._RefusalLog()
    with caplog.at_level(logging.WARNING, logger="torchmover"):
        for _ in range(25):
            log.refused(400, "bad", "10.0.0.1")
        now[0] += 1
        log.refused(413, "too big", "10.0.0.2")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == server_module.REFUSAL_LOG_PER_SECOND + 1
    assert lines[-1].endswith("413 too big (15 more refused request(s) not logged)") and "10.0.0.2" in lines[-1]


DESCRIPTOR_SERVER = """
import os, resource, sys
sys.path.insert(0, {tests!r})
from conftest import tiny_model, tiny_tokenizer
from torchmover import Encoder, MoverReward, Scorer
from torchmover.reward.batching import BatchedReward
from torchmover.integrations.server import RewardServer
scorer = Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), centering="none", device="cpu")
with BatchedReward(MoverReward(scorer)) as batched, RewardServer(batched, max_connections=1000) as server:
    open_now = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 16, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(server.port, flush=True)
    sys.stdin.read()
"""


def test_descriptor_exhaustion_answers_503_with_one_warning_and_no_traceback():
    """Before, at the descriptor limit the accept loop logged a "Too many open files" traceback each
    time it retried, and the clients waiting were never answered."""
    tests = os.path.dirname(os.path.abspath(__file__))
    process = subprocess.Popen([sys.executable, "-c", DESCRIPTOR_SERVER.format(tests=tests)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        held, statuses = [], []
        for _ in range(40):  # each holds a descriptor of the server until its header timeout
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            held.append(sock)
        for sock in held[-10:]:  # the last ones were not accepted: each gets a 503
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                statuses.append(int(sock.recv(65536).split()[1]))
            except (OSError, IndexError):
                statuses.append(None)
        time.sleep(2.5)  # the loop retries accepting every second
        for sock in held:
            sock.close()
    finally:
        stderr = process.communicate(timeout=60)[1]  # closes its stdin: the server stops
    assert 503 in statuses, statuses
    assert "Traceback" not in stderr, stderr
    assert stderr.count("out of file descriptors") == 1, stderr
