"""Atomic files, checkpoints and RNG state for long jobs that must be able to resume (the recipes).

A file is written to a temporary file next to its target, flushed and fsync'ed, then renamed over it
(``os.replace``), so a reader — or a resumed job after a crash — sees the old file or the new one,
never half of one. Checkpoints are ``step-XXXXXXX.pt`` files with a ``latest`` pointer, read back with
``torch.load(weights_only=True)`` (no arbitrary code from a checkpoint file).

Temporaries of a killed writer. A process killed mid-write (``kill -9``, the out-of-memory killer, a
preempted job) leaves its temporary file, or a save's staging directory
(:func:`staging_directory`), behind. Each is held by its writer while it runs: an exclusive ``flock``
on the file (on a lock file inside a staging directory), which the system releases when the process
ends, however it ends. The next write removes the temporaries of its own kind whose lock is free
(:func:`remove_abandoned`): :func:`atomic_write` those of its target, :func:`save_checkpoint` every
checkpoint's, a scorer's save the staging directories of its target. A temporary file is known by
its name (``.NAME.XXXXXXXX.tmp``), a staging directory by its lock file (a directory without one is
not removed); one that is held (a write in progress in another thread or process) is left alone. Where ``flock`` is missing (Windows) or refused (some network filesystems), nothing is held and
nothing is removed.
"""
from __future__ import annotations

import contextlib
import glob
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, IO, Iterator

import torch

try:
    import fcntl
except ImportError:  # Windows: no flock (see the module docs)
    fcntl = None  # type: ignore[assignment]  # mypy has no optional module type for a failed import

HELD = ".torchmover-held"  # the lock file inside a staging directory


def file_mode() -> int:
    """The mode of a plain new file: ``0o666`` less the process's umask (read from ``/proc`` where
    there is one, so that no other thread sees the umask changed)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def exclusive(directory: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold ``directory`` (an exclusive ``flock`` on it) while the block runs; if another process or
    thread holds it, raise a ``BlockingIOError`` saying that ``what`` is in progress there. Where
    ``flock`` is missing or refused, nothing is held (see the module docs)."""
    if fcntl is None:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BlockingIOError(f"another {what} into {str(directory)!r} is in progress (it holds the "
                                  "directory's lock): wait for it to end, or choose another path") from None
        except OSError:  # locks refused (some network filesystems)
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def hold(fd: int) -> None:
    """Mark the open file ``fd`` as in use by this process until it is closed (an exclusive
    ``flock``; see the module docs). A filesystem that refuses locks leaves it unmarked."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)


def _abandoned(lock: Path) -> bool:
    """Whether no process holds ``lock`` (its writer is gone); False where that cannot be told."""
    if fcntl is None:
        return False
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:  # gone, not ours to write, or a staging directory without its lock file
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held by its writer, or locks refused
        return False
    finally:
        os.close(fd)  # releases the lock


def remove_abandoned(directory: str | os.PathLike, pattern: str) -> list[Path]:
    """Remove the temporaries matching the glob ``pattern`` in ``directory`` that their writer left
    behind: files of :func:`atomic_write` and directories of :func:`staging_directory` whose lock
    no process holds. Anything held, and any directory without the lock file, is left alone.
    Returns the paths removed."""
    removed = []
    for path in sorted(Path(directory).glob(pattern)):
        if path.is_symlink():
            continue
        is_dir = path.is_dir()
        if _abandoned(path / HELD if is_dir else path):
            if is_dir:
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def staging_directory(parent: str | os.PathLike, prefix: str) -> Iterator[Path]:
    """A new directory ``parent/<prefix><random>``, held (its lock file :data:`HELD` inside) while
    the block runs and removed after it, however the block ends. One left by a killed process is
    removed by the next :func:`remove_abandoned` of its pattern; the caller runs that first."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        with open(path / HELD, "wb") as lock:
            hold(lock.fileno())
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(file)`` on a temporary binary file next to ``path`` (``.NAME.XXXX.tmp``, held
    until it is renamed), fsync, then rename it to ``path``. First removes the temporaries of
    ``path`` that a killed writer left (:func:`remove_abandoned`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(path.parent, f".{glob.escape(path.name)}.*.tmp")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            hold(f.fileno())
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.chmod(tmp, file_mode())  # mkstemp's 0600 would ignore the umask
            os.replace(tmp, path)  # still held: never taken for abandoned before it is in place
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_savefig(figure, path: str | os.PathLike, **options) -> Path:
    """Save the matplotlib ``figure`` to ``path`` atomically (:func:`atomic_write`), in the format its
    suffix names (matplotlib's default, PNG, where it names none); ``options``: ``savefig``'s."""
    return atomic_write(path, lambda f: figure.savefig(f, format=Path(path).suffix[1:].lower() or None, **options))


def save_checkpoint(directory: str | os.PathLike, state: dict, step: int, keep: int = 2) -> Path:
    """Write ``state`` as ``directory/step-XXXXXXX.pt`` (atomically), point ``directory/latest`` at it,
    and delete the checkpoints of lower steps but the ``keep − 1`` highest (:func:`checkpoint_steps`),
    so that ``keep`` (at least 1) checkpoints of this run remain, the one just written among them.

    A checkpoint of a *higher* step is left alone: a run resumed from an earlier checkpoint meets
    the later ones of the run it left, which are not its to delete; each is replaced or pruned once
    this run's steps pass it. First removes the temporary checkpoint files that a killed writer left
    (:func:`remove_abandoned`)."""
    directory = Path(directory)
    remove_abandoned(directory, ".step-*.pt.*.tmp")
    path = atomic_write(directory / f"step-{step:07d}.pt", lambda f: torch.save(state, f))
    atomic_write_text(directory / "latest", path.name + "\n")
    earlier = sorted((s, p) for s, p in checkpoint_steps(directory).items() if s < step)
    for _, old in earlier[:max(0, len(earlier) - (max(1, keep) - 1))]:
        old.unlink(missing_ok=True)
    return path


def checkpoint_steps(directory: str | os.PathLike) -> dict[int, Path]:
    """The checkpoints in ``directory`` by step: every ``step-<digits>.pt`` (the step read as a number,
    whatever its width)."""
    named = ((re.fullmatch(r"step-(\d+)\.pt", p.name), p) for p in Path(directory).glob("step-*.pt"))
    return {int(m.group(1)): p for m, p in named if m}


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
