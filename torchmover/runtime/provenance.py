"""Describe the run that produced a file: the command line as it was run, the versions of Python and
of the packages, the commit of the code's git checkout and whether it had uncommitted changes, the
device, and the data files read (their size and SHA-256).

Everything here reads and nothing writes; every function answers (with ``None`` where it cannot
tell) rather than raising, so that describing a run never stops it. Example::

    from torchmover.runtime.provenance import run_provenance

    record = run_provenance(Path(__file__).resolve().parents[1], "cuda:0", ["data/train.tsv"])
    # {"command": "python recipes/x.py --flag", "versions": {"python": ..., "torchmover": ...},
    #  "code": {"commit": "<40 hex digits>" or None, "dirty": bool or None},
    #  "device": {"name": "cuda:0", "cpu": ..., "cores": ..., "gpu": {...}},
    #  "data": [{"path": "data/train.tsv", "bytes": 1234, "sha256": "..."}]}
"""
from __future__ import annotations

import hashlib
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterable

#: The packages whose versions :func:`run_provenance` records.
RUN_PACKAGES = ("torchmover", "torch", "transformers")


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None`` where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions(packages: Iterable[str] = RUN_PACKAGES) -> dict:
    """``{"python": ..., <package>: version or None, ...}`` for each of ``packages``, in order."""
    return {"python": platform.python_version(), **{name: package_version(name) for name in packages}}


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), name)
    except OSError:
        return name


def _gpu_driver() -> str | None:
    """The NVIDIA driver version that ``nvidia-smi`` reports, or ``None``."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[0] if out else None


def device_info() -> dict:
    """The CPU (``cpu``: model, ``cores``: logical cores) and, where the process imported torch,
    ``torch_threads`` and, when CUDA is available, ``gpu`` (name, memory in MiB, driver, CUDA)."""
    info: dict[str, object] = {"cpu": _cpu_name(), "cores": os.cpu_count()}
    if "torch" in sys.modules:  # a script that never imported torch did not use it
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = {"name": props.name, "memory_mib": props.total_memory // 2**20,
                           "driver": _gpu_driver(), "cuda": torch.version.cuda}
    return info


def command_line(argv: list[str] | None = None, root: Path | None = None) -> str:
    """The command that ran (``sys.argv`` unless ``argv``) as one shell-quoted line, ``python`` first;
    a script under ``root`` is named relative to it (``python recipes/x.py --flag``)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and root is not None:
        script = Path(argv[0]).resolve()
        if script.is_relative_to(Path(root).resolve()):
            argv[0] = str(script.relative_to(Path(root).resolve()))
    return shlex.join(["python", *argv])


def _git(root: Path, *args: str) -> str | None:
    """``git ARGS`` run in ``root``: its output, or ``None`` where git fails or is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def checkout_state(root: Path, exclude: Iterable[str] = ()) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout holding ``root``: the checked-out commit, and whether a
    tracked file under ``root`` differs from it (paths under ``exclude``, relative to ``root``, apart;
    untracked files never count). ``(None, None)`` outside a checkout or without git."""
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".",
                  *(f":(exclude){path}" for path in exclude))
    return commit, None if status is None else bool(status)


def file_record(path: Path) -> dict:
    """``{"path", "bytes", "sha256"}`` of the file ``path`` (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"path": str(path), "bytes": Path(path).stat().st_size, "sha256": digest.hexdigest()}


def data_records(paths: Iterable[str | os.PathLike]) -> list[dict]:
    """:func:`file_record` of every data file ``paths`` name: a file itself, a directory's files (all
    of them, recursively, in sorted order, hidden ones apart), and for anything else (a hub name such
    as ``hub:NAME``, a path that does not exist) ``{"path": ..., "bytes": None, "sha256": None}``."""
    records = []
    for given in paths:
        path = Path(given)
        if path.is_file():
            records.append(file_record(path))
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file()
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            records += [file_record(p) for p in files]
        else:
            records.append({"path": str(given), "bytes": None, "sha256": None})
    return records


def run_provenance(root: Path, device: str, data: Iterable[str | os.PathLike] = (),
                   argv: list[str] | None = None) -> dict:
    """What produced a run's files: ``command`` (:func:`command_line`, relative to ``root``),
    ``versions`` (Python, torchmover, torch, transformers), ``code`` (``commit`` and ``dirty`` of the
    checkout holding ``root``, both ``None`` outside one), ``device`` (``name``: the torch device the
    run resolved, e.g. ``"cuda:0"``, with :func:`device_info`) and ``data`` (:func:`data_records`)."""
    commit, dirty = checkout_state(root)
    return {"command": command_line(argv, root), "versions": versions(),
            "code": {"commit": commit, "dirty": dirty}, "device": {"name": str(device), **device_info()},
            "data": data_records(data)}
