import random

import pytest
import torch

from torchmover.runtime.checkpoint import (
    atomic_write, atomic_write_text, latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state,
)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = atomic_write_text(tmp_path / "f.txt", "old")

    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_checkpoints_rotate_and_latest_points_at_the_newest(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, {"step": step, "w": torch.full((2,), float(step))}, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-0000002.pt", "step-0000003.pt"]
    state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state["step"] == 3 and state["w"].tolist() == [3.0, 3.0]
    (tmp_path / "step-0000003.pt").unlink()
    with pytest.raises(FileNotFoundError, match="missing"):
        latest_checkpoint(tmp_path)


def _saved_steps(directory):
    return sorted(int(p.name[5:-3]) for p in directory.glob("step-*.pt"))


@pytest.mark.parametrize("keep", [1, 2])
def test_a_run_resumed_from_an_earlier_checkpoint_keeps_what_it_writes(tmp_path, keep):
    """Resumed from step 100 while the left run's step 200 is there, the run's new checkpoints are kept
    (pruning by name once deleted the one just written under keep=1), and the left run's later one
    stays until this run passes it."""
    for step in (100, 200):
        save_checkpoint(tmp_path, {"step": step}, step, keep=keep)
    for step in (150, 160):
        save_checkpoint(tmp_path, {"step": step}, step, keep=keep)
        assert load_checkpoint(latest_checkpoint(tmp_path))["step"] == step
    assert _saved_steps(tmp_path) == ([160, 200] if keep == 1 else [150, 160, 200])
    save_checkpoint(tmp_path, {"step": 210}, 210, keep=keep)
    assert _saved_steps(tmp_path) == ([210] if keep == 1 else [200, 210])


def test_checkpoints_are_pruned_by_their_step_as_a_number(tmp_path):
    """Steps past 9,999,999 take an eighth digit: the pruning orders them by number, not by name."""
    for step in (9_999_999, 10_000_000, 10_000_001):
        save_checkpoint(tmp_path, {"step": step}, step, keep=2)
    assert _saved_steps(tmp_path) == [10_000_000, 10_000_001]
    assert load_checkpoint(latest_checkpoint(tmp_path))["step"] == 10_000_001


def test_rng_state_survives_a_safe_round_trip(tmp_path):
    save_checkpoint(tmp_path, {"rng": rng_state()}, 1)
    expected = (random.random(), torch.rand(3))
    set_rng_state(load_checkpoint(latest_checkpoint(tmp_path))["rng"])
    got = (random.random(), torch.rand(3))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])


def killed_mid_write(directory, step: int) -> None:
    """Run ``save_checkpoint(directory, ..., step)`` in a process that is killed (SIGKILL: no cleanup
    runs) once half the checkpoint is written to its temporary file."""
    import subprocess
    import sys

    code = (
        "import os, signal, torch\n"
        "from torchmover.runtime import checkpoint\n"
        "def half_then_killed(state, f):\n"
        "    f.write(b'x' * 4096); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "torch.save = half_then_killed\n"
        f"checkpoint.save_checkpoint({str(directory)!r}, {{'w': torch.zeros(2)}}, {step})\n")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == -9


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="flock: POSIX only")
def test_the_next_checkpoint_removes_the_temporaries_of_killed_writes_and_only_those(tmp_path):
    import os

    save_checkpoint(tmp_path, {"w": torch.zeros(2)}, 1)
    killed_mid_write(tmp_path, 2)
    assert [p.name[:17] for p in tmp_path.glob(".step-*.pt.*.tmp")] == [".step-0000002.pt."]
    killed_mid_write(tmp_path, 3)  # removed step 2's before it was killed too
    assert [p.name[:17] for p in tmp_path.glob(".step-*.pt.*.tmp")] == [".step-0000003.pt."]
    (tmp_path / "notes.tmp").write_text("mine")
    held = tmp_path / ".step-0000009.pt.inprogress.tmp"  # a write in progress elsewhere: its writer holds it
    with open(held, "wb") as writer:
        from torchmover.runtime.checkpoint import hold

        hold(writer.fileno())
        save_checkpoint(tmp_path, {"w": torch.ones(2)}, 4)
        assert sorted(os.listdir(tmp_path)) == sorted(
            ["latest", "step-0000001.pt", "step-0000004.pt", "notes.tmp", held.name])
    assert load_checkpoint(latest_checkpoint(tmp_path))["w"].tolist() == [1.0, 1.0]
