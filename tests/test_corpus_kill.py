"""A run of ``torchrun --nproc-per-node 2 -m torchmover score ... --output`` (gloo) killed with SIGKILL in
the middle — one rank, then every process — resumes when the same command is run again, and the output
is one process's: every row once, in order."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import _ddp
from torchmover.cli import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the ranks' processes")

WORDS = "the a cat dog sat on mat barked sun is red moon blue they ran to city child eats food quick brown fox".split()
PAIRS = 600
CHUNK = 2


def corpus(tmp_path):
    import random

    rng = random.Random(0)
    for name in ("hyps.txt", "refs.txt"):
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(2, 25))) for _ in range(PAIRS)]
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def arguments(tmp_path, tiny_model_dir, output):
    return ["score", "--model", str(tiny_model_dir), "--layer", "2", "--centering", "batch", "--all",
            "--hyps", str(tmp_path / "hyps.txt"), "--refs", str(tmp_path / "refs.txt"), "--output", str(output),
            "--format", "jsonl", "--chunk-size", str(CHUNK), "--batch-size", "4", "--no-progress"]


def torchrun(tmp_path, tiny_model_dir, output):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_ddp.free_port()), "-m", "torchmover", *arguments(tmp_path, tiny_model_dir, output)]
    return subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def is_rank(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"torchmover" in command and b"torch.distributed.run" not in command


def parts(output) -> int:
    return len(list(Path(f"{output}.parts").glob("*.part")))


def kill_when(process, output, at_least: int, kill) -> int:
    """Wait until ``at_least`` chunks are written, ``kill`` the run, wait for it; the chunks written."""
    deadline = time.monotonic() + 240
    while parts(output) < at_least:
        assert process.poll() is None, f"the run ended before it was killed: {process.communicate()[1].decode()[-2000:]}"
        assert time.monotonic() < deadline, "no chunk written in time"
        time.sleep(0.005)
    kill(process)
    process.communicate(timeout=120)
    assert process.returncode != 0 and not Path(output).exists()
    return parts(output)


def kill_one_rank(process):
    ranks = [pid for pid in descendants(process.pid) if is_rank(pid)]
    assert len(ranks) == 2
    os.kill(ranks[-1], signal.SIGKILL)


def kill_everything(process):
    """SIGKILL to every rank and to torchrun (the ranks are not in torchrun's process group)."""
    for pid in [*descendants(process.pid), process.pid]:
        os.kill(pid, signal.SIGKILL)


def test_a_killed_sharded_run_resumes_without_loss_or_duplicates(tmp_path, tiny_model_dir, capsys):
    corpus(tmp_path)
    assert main(arguments(tmp_path, tiny_model_dir, tmp_path / "one.jsonl")) == 0  # one process, uninterrupted
    one = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    output = tmp_path / "sharded.jsonl"
    first = kill_when(torchrun(tmp_path, tiny_model_dir, output), output, 5, kill_one_rank)
    second = kill_when(torchrun(tmp_path, tiny_model_dir, output), output, first + 5, kill_everything)
    assert first < second < PAIRS // CHUNK  # the second run went on from the first's chunks
    last = torchrun(tmp_path, tiny_model_dir, output)
    err = last.communicate(timeout=300)[1].decode()
    assert last.returncode == 0, err[-3000:]
    assert "resumed" in err
    sharded = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["line"] for row in sharded] == list(range(1, PAIRS + 1))  # every row once, in order
    for a, b in zip(sharded, one):
        assert all(abs(a[k] - b[k]) <= 1e-6 for k in ("precision", "recall", "f1")), (a, b)
    assert json.loads(Path(f"{output}.manifest.json").read_text())["finished"]
