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


def test_rng_state_survives_a_safe_round_trip(tmp_path):
    save_checkpoint(tmp_path, {"rng": rng_state()}, 1)
    expected = (random.random(), torch.rand(3))
    set_rng_state(load_checkpoint(latest_checkpoint(tmp_path))["rng"])
    got = (random.random(), torch.rand(3))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])
