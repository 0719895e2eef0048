"""Atomic files, checkpoints and RNG state for long jobs that must be able to resume (the recipes).

A file is written to a temporary file next to its target, flushed and fsync'ed, then renamed over it
(``os.replace``), so a reader — or a resumed job after a crash — sees the old file or the new one,
never half of one. Checkpoints are ``step-XXXXXXX.pt`` files with a ``latest`` pointer, read back with
``torch.load(weights_only=True)`` (no arbitrary code from a checkpoint file).
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Callable, IO

import torch


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(file)`` on a temporary binary file next to ``path``, fsync, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def save_checkpoint(directory: str | os.PathLike, state: dict, step: int, keep: int = 2) -> Path:
    """Write ``state`` as ``directory/step-XXXXXXX.pt`` (atomically), point ``directory/latest`` at it,
    and delete all but the ``keep`` newest checkpoints."""
    directory = Path(directory)
    path = atomic_write(directory / f"step-{step:07d}.pt", lambda f: torch.save(state, f))
    atomic_write_text(directory / "latest", path.name + "\n")
    for old in sorted(directory.glob("step-*.pt"))[:-max(1, keep)]:
        old.unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint ``directory/latest`` names, or ``None`` if there is none yet."""
    pointer = Path(directory) / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    if not path.is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is missing")
    return path


def load_checkpoint(path: str | os.PathLike) -> dict:
    """A checkpoint's state, loaded safely (tensors and plain containers only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def rng_state() -> dict:
    """Python's and torch's (and CUDA's) random number generator states."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state` (also after a ``weights_only`` round trip, which turns tuples to lists)."""
    random.setstate(_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
