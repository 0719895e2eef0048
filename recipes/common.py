"""What the two training recipes share: one-line usage errors, the JSON-lines log, eval mode, the
learning-rate schedule, the run-directory rule, the resume rule for options, checkpoints, and the few
``torch.distributed`` helpers that neither torch nor :mod:`torchmover.runtime.distributed` offers.

Not part of the library: each recipe puts its own directory on ``sys.path`` and imports this file as
``common``, so ``python recipes/<recipe>.py`` works from anywhere, and so does loading a recipe from
its path (the tests do).
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from torchmover.runtime.checkpoint import atomic_write, latest_checkpoint, remove_abandoned, rng_state
from torchmover.runtime.distributed import is_distributed


# --- errors --------------------------------------------------------------------------------------

class UsageError(SystemExit):
    """A command that cannot run as given (an option, an input, the run directory), raised before the
    run writes anything: its message is one line. At the command line (:func:`run_command`) the line is
    printed and the process exits with status 2, as for argparse's own errors; called in-process it is
    a ``SystemExit`` whose ``str()`` is the line."""


def run_command(main: Callable[[], object]) -> int:
    """The exit status of a recipe's command line: ``main()``'s 0, or 2 after printing a
    :class:`UsageError`'s line to stderr (no traceback)."""
    try:
        main()
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


# --- log -------------------------------------------------------------------------------------------

class JsonLog:
    """Appends ``{"event": ..., "time": ..., **fields}`` lines to ``path``; writes nothing when not
    ``enabled`` (the processes other than rank 0)."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path, self.enabled = Path(path), enabled

    def __call__(self, event: str, **fields) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop events logged after ``step`` (written before an interruption, then redone on resume)."""
        self._keep(lambda lines: [line for line in lines if line.strip() and json.loads(line).get("step", -1) <= step])

    def count(self) -> int:
        """How many events the log holds (0 before the first): what a checkpoint records, so that a
        resume from it keeps those events and no others (:meth:`truncate_to`)."""
        if not self.path.is_file():
            return 0
        return len(self.path.read_text(encoding="utf-8").splitlines())

    def truncate_to(self, count: int) -> None:
        """Keep the first ``count`` events, those logged before the checkpoint that recorded
        :meth:`count`; drop what an interrupted run logged after it (redone on resume, so logged
        again), including a line that a kill cut short."""
        self._keep(lambda lines: lines[:count])

    def _keep(self, select) -> None:
        """Rewrite the log, atomically, with the lines ``select(lines)`` keeps (nothing to do where the
        log is off or not written yet)."""
        if not (self.enabled and self.path.is_file()):
            return
        kept = select(self.path.read_text(encoding="utf-8").splitlines())
        atomic_write(self.path, lambda fh: fh.write("".join(line + "\n" for line in kept).encode()))

    def events(self, kind: str) -> list[dict]:
        """Every logged event of type ``kind``, in order."""
        if not self.path.is_file():
            return []
        events = map(json.loads, self.path.read_text(encoding="utf-8").splitlines())
        return [e for e in events if e["event"] == kind]


# --- modes and schedule ----------------------------------------------------------------------------

@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode (no dropout) inside the block; its previous mode restored after it."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    kind: str = "linear") -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate of both recipes: a linear warm-up, then linear decay to 0 at ``total_steps``
    (``kind="linear"``) or the peak kept (``"constant"``).

    Step ``s < warmup_steps`` runs at ``(s + 1) / (warmup_steps + 1)`` of the peak, so the ramp never
    starts at 0 (a wasted step) and reaches the peak at step ``warmup_steps``, the first step after
    it; the decay starts from there, so no step but that one runs at the peak."""
    if kind not in ("linear", "constant"):
        raise ValueError(f"schedule must be 'linear' or 'constant', got {kind!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --- run directory and checkpoints -----------------------------------------------------------------

def claim_run_directory(directory: Path, outputs: Iterable[str], resume: bool, overwrite: bool,
                        main: bool = True) -> list[str]:
    """The rule of both recipes for a run directory that already holds a run (issue 32): never
    overwrite it silently. ``outputs`` are the files and folders a run writes in ``directory``; the
    ones found there are returned.

    With ``resume`` nothing changes: the recipe continues the run. Otherwise, if any of ``outputs``
    exists, raise ``SystemExit`` saying to pass ``--resume`` or ``--overwrite`` (before anything is
    written), or with ``overwrite`` delete them: only them (other files in ``directory`` stay), and
    only on the ``main`` process. Every process of a job may call it: the answer is the same on all,
    as the main process deletes only when none refuses.

    In every case the main process first removes the temporaries a killed run left among the outputs
    (:func:`remove_killed_temporaries`)."""
    directory = Path(directory)
    if main:
        remove_killed_temporaries(directory, outputs)
    existing = [name for name in outputs if (directory / name).exists() or (directory / name).is_symlink()]
    if resume or not existing:
        return existing
    if not overwrite:
        raise UsageError(f"{directory} already holds a run ({', '.join(existing)}): pass --resume to continue "
                         "it, --overwrite to delete its outputs and start over, or choose another output directory")
    if main:
        for name in existing:
            path = directory / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    return existing


def enclosing_run(directory: Path, markers: Iterable[str]) -> Path | None:
    """The directory above ``directory`` that holds a run or a published scorer, else ``None``: the
    nearest of ``directory`` itself and its parents that holds ``torchmover.json`` (a scorer saved by
    ``save_pretrained``), or the nearest of its parents (not itself: that is the run-directory rule of
    :func:`claim_run_directory`) that holds one of ``markers`` (the files a run writes)."""
    directory = Path(directory).resolve()
    for place in (directory, *directory.parents):
        if (place / "torchmover.json").is_file():
            return place
        if place != directory and any((place / name).exists() for name in markers):
            return place
    return None


def remove_killed_temporaries(directory: Path, outputs: Iterable[str]) -> list[Path]:
    """Remove the temporaries that a killed run left in ``directory``: a half-written file of an
    output (``.NAME.XXXXXXXX.tmp``, :func:`~torchmover.runtime.checkpoint.atomic_write`) or a save's
    staging directory (``.NAME.tmp-XXXXXXXX``), and the same inside every output folder (a
    checkpoint being written), whose writer no longer holds them
    (:func:`~torchmover.runtime.checkpoint.remove_abandoned`). Returns the paths removed."""
    directory, removed = Path(directory), []
    if not directory.is_dir():
        return removed
    for name in outputs:
        removed += remove_abandoned(directory, f".{glob.escape(name)}.*.tmp")
        removed += remove_abandoned(directory, f".{glob.escape(name)}.tmp-*")
        folder = directory / name
        if folder.is_dir() and not folder.is_symlink():
            for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink())]:
                removed += remove_abandoned(sub, ".*.tmp") + remove_abandoned(sub, ".*.tmp-*")
    return removed


def nothing_to_resume(resume: str | None, directory: Path, outputs: Iterable[str], main: bool = True) -> bool:
    """Whether ``--resume`` (``"latest"``) finds a run killed before its first checkpoint: then there
    is nothing to continue, so the run starts over, as the one line printed says; its outputs are
    deleted (on the ``main`` process) like ``--overwrite`` would. False without ``--resume``, with an
    explicit checkpoint, or where ``directory/checkpoints`` has one."""
    directory = Path(directory)
    if resume != "latest" or latest_checkpoint(directory / "checkpoints") is not None:
        return False
    if main:
        existing = claim_run_directory(directory, outputs, resume=False, overwrite=True)
        print(f"--resume: {directory} has no checkpoint (the run stopped before its first): starting it over"
              + (f", deleting {', '.join(existing)}" if existing else ""), flush=True)
    return True


def resume_path(resume: str, checkpoints: Path) -> Path:
    """The checkpoint that ``--resume [CHECKPOINT]`` names: a file, or ``"latest"`` in ``checkpoints``."""
    if resume != "latest":
        path = Path(resume)
    else:
        path = latest_checkpoint(checkpoints)
        if path is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {checkpoints} (no 'latest' file)")
    if not path.is_file():
        raise FileNotFoundError(f"--resume: checkpoint {path} not found")
    return path


# --- the options of a run ---------------------------------------------------------------------------

def options_record(args) -> dict:
    """The parsed options ``args`` as JSON values (paths as strings): what a run records of its options
    and what :func:`changed_options` compares."""
    return json.loads(json.dumps(vars(args), default=str))


def changed_options(recorded: dict, args, free: Iterable[str]) -> dict[str, tuple]:
    """``{name: (recorded value, value in args)}`` of every option of ``args`` that differs from the
    run's ``recorded`` options (:func:`options_record`; one it lacks counts as ``None``), the ``free``
    ones apart: those that cannot change a run's numbers."""
    current, free = options_record(args), set(free)
    return {name: (recorded.get(name), value) for name, value in current.items()
            if name not in free and recorded.get(name) != value}


def refuse_changed_options(prog: str, what: str, recorded: dict, args, free: Iterable[str]) -> None:
    """Raise :class:`UsageError` naming each option of ``args`` that differs from those ``recorded``
    for ``what`` (a checkpoint, a finished run) with its old and new value, in one line; nothing if
    none does (:func:`changed_options`)."""
    changed = changed_options(recorded, args, free)
    if changed:
        raise UsageError(f"{prog}: error: {what} was run with other options; run it with the same ones, or pass "
                         "--overwrite to start over: " + ", ".join(
                             f"--{name.replace('_', '-')} {old!r} -> {new!r}" for name, (old, new) in changed.items()))


def all_rng_states() -> list[dict]:
    """Every rank's :func:`~torchmover.runtime.checkpoint.rng_state`, on every rank, in rank order
    (a checkpoint keeps them all, so that each rank resumes its own dropout stream)."""
    state = rng_state()
    if not is_distributed():
        return [state]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


# --- distributed -----------------------------------------------------------------------------------

def local_device(requested: str | None) -> torch.device:
    """``requested`` (``--device``), else this process's GPU (``cuda:LOCAL_RANK``), else the CPU."""
    if requested:
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    return torch.device("cpu")


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of the process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def torchrun_process_group(device: torch.device) -> Iterator[None]:
    """Under ``torchrun`` (``WORLD_SIZE > 1``), the process group for the block, initialised from
    torchrun's environment variables: NCCL on GPUs, gloo on CPUs, with a long timeout because rank 0
    evaluates while the others wait. It is destroyed after the block (after a barrier); a group that
    already exists is the caller's, used and left alone; a plain ``python`` launch has none."""
    own = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized()
    if own:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=2))
    yield
    if own and dist.is_initialized():  # not after an error: a barrier would wait for the failed ranks
        barrier()
        dist.destroy_process_group()


def barrier() -> None:
    """``dist.barrier()`` under a process group of several ranks; nothing otherwise."""
    if is_distributed():
        dist.barrier()


def broadcast_object(value):
    """Rank 0's ``value`` (any picklable object) on every rank."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_parameters_(module: nn.Module) -> None:
    """Copy rank 0's parameters and buffers of ``module`` to every rank, in place."""
    if is_distributed():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)


def sum_gradients_(params: Iterable[nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over ranks, in place, with one all-reduce of their concatenation
    (the recipes sum rather than average: each rank's loss is already divided by the global batch)."""
    if not is_distributed():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def all_gather_cat(t: Tensor) -> Tensor:
    """``t`` of every rank concatenated along dim 0 in rank order; differentiable (the backward sends
    each rank its slice of the summed gradients). One process: ``t``."""
    if not is_distributed():
        return t
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(t))
