"""Probes saving and loading from outside: ``kill -9`` during saves and checkpoint
writes, and flipped bits in a saved scorer.

- ``kills``: ``--kills`` times, a process that saves the default scorer (``Scorer().save_pretrained``) is
  killed with SIGKILL at a random moment of the save; then the directory is loaded as it is (it must
  hold the previous complete save, or no ``torchmover.json``), and saved again by this process: a clean
  recovery leaves no staging directory (``.NAME.tmp-*``) or pending record, and the save loads with
  verification and scores as the scorer in memory;
- ``checkpoints``: ``--kills`` times, a process writing 64 MiB checkpoints (``save_checkpoint``) is
  killed at a random moment; the next ``save_checkpoint`` must leave no ``.step-*.pt.*.tmp``;
- ``flips``: ``--flips`` single-bit flips at random positions of ``torchmover.json``, then of the other
  files, each loaded with verification (the error must name the flipped file) and without (an error
  must name the flipped file, or the scorer loads).

    python bench/studies/probe_saves.py                    # every probe
    python bench/studies/probe_saves.py --only kills --kills 30
    python bench/studies/probe_saves.py --repo ../old-checkout   # the same probes on another checkout's code
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402
from harness import REPO  # noqa: E402

PROBES = ("kills", "checkpoints", "flips")
HYPS = ["the cat sat on the mat", "a dog barked at night", "the sun is red"]
REFS = ["a cat was on the mat", "the dog barked", "the moon is blue"]

SAVER = """
import sys
from torchmover import Scorer
scorer = Scorer(device="cpu")
print("ready", flush=True)
sys.stdin.readline()
scorer.save_pretrained(sys.argv[1])
print("saved", flush=True)
"""

CHECKPOINTER = """
import sys, torch
from torchmover.runtime.checkpoint import save_checkpoint
state = {"w": torch.randn(16 * 2**20)}  # 64 MiB
print("ready", flush=True)
for step in range(1, 1000):
    save_checkpoint(sys.argv[1], state, step)
"""


def spawn(repo: Path, code: str, *args: str) -> subprocess.Popen:
    """A Python process running ``code`` on the checkout ``repo``, once it printed "ready"."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env, cwd=repo)
    assert process.stdout.readline().strip() == "ready"
    return process


def leftovers(parent: Path, pattern: str) -> tuple[int, int]:
    """How many paths match ``pattern`` in ``parent``, and their size in bytes."""
    paths = list(parent.glob(pattern))
    size = sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    return len(paths), size


def probe_kills(kills: int, work: Path, repo: Path) -> dict:
    import torch
    from torchmover import Scorer

    scorer = Scorer(device="cpu")
    target = work / "scorer"
    start = time.perf_counter()
    scorer.save_pretrained(target)
    save_seconds = time.perf_counter() - start
    want = scorer(HYPS, REFS)
    counts = {"kills": 0, "killed mid-save": 0, "after the kill: loads": 0, "after the kill: no torchmover.json": 0,
              "after the kill: other error": [], "clean recoveries": 0, "most staging on disk after a kill (MiB)": 0.0}
    for _ in range(kills):
        saver = spawn(repo, SAVER, str(target))
        saver.stdin.write("go\n")
        saver.stdin.flush()
        time.sleep(random.uniform(0, 1.2 * save_seconds))
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        counts["kills"] += 1
        staged, size = leftovers(work, ".scorer.tmp-*")
        counts["killed mid-save"] += bool(staged or (target / ".torchmover-saving.json").exists())
        counts["most staging on disk after a kill (MiB)"] = max(counts["most staging on disk after a kill (MiB)"], size / 2**20)
        try:
            Scorer.from_pretrained(target, device="cpu")
            counts["after the kill: loads"] += 1
        except FileNotFoundError as error:
            if "torchmover.json is missing" in str(error):
                counts["after the kill: no torchmover.json"] += 1
            else:
                counts["after the kill: other error"].append(str(error))
        except Exception as error:  # noqa: BLE001 — counted: a kill must never leave a save that fails otherwise
            counts["after the kill: other error"].append(f"{type(error).__name__}: {error}")
        scorer.save_pretrained(target)
        clean = (leftovers(work, ".scorer.tmp-*")[0] == 0 and not (target / ".torchmover-saving.json").exists())
        with torch.no_grad():
            clean = clean and torch.equal(Scorer.from_pretrained(target, device="cpu")(HYPS, REFS), want)
        counts["clean recoveries"] += clean
    counts["save seconds"] = save_seconds
    return counts


def probe_checkpoints(kills: int, work: Path, repo: Path) -> dict:
    import torch
    from torchmover.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    directory = work / "checkpoints"
    counts = {"kills": 0, "temporaries left by the kill": 0, "left after the next save": 0, "latest loads": 0}
    for _ in range(kills):
        writer = spawn(repo, CHECKPOINTER, str(directory))
        time.sleep(random.uniform(0.2, 3.0))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        counts["kills"] += 1
        counts["temporaries left by the kill"] += leftovers(directory, ".step-*.pt.*.tmp")[0]
        save_checkpoint(directory, {"w": torch.zeros(4)}, 10_000)
        counts["left after the next save"] += leftovers(directory, ".*.tmp")[0]
        counts["latest loads"] += load_checkpoint(latest_checkpoint(directory))["w"].tolist() == [0.0] * 4
        shutil.rmtree(directory)
    return counts


def probe_flips(flips: int, work: Path) -> dict:
    from torchmover import Scorer

    base = work / "saved"
    Scorer(device="cpu").save_pretrained(base)
    files = sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
    others = [f for f in files if f != "torchmover.json"]
    counts = {}
    for group, names in (("torchmover.json", ["torchmover.json"]), ("other files", others)):
        for verify in (True, False):
            key = f"{group}, verify={verify}"
            counts[key] = {"flips": 0, "error naming the file": 0, "loaded": 0, "error not naming it": []}
            for _ in range(flips):
                name = random.choice(names)
                copy = work / "flipped"
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(base, copy)
                data = bytearray((copy / name).read_bytes())
                data[random.randrange(len(data))] ^= 1 << random.randrange(8)
                (copy / name).write_bytes(bytes(data))
                counts[key]["flips"] += 1
                try:
                    Scorer.from_pretrained(copy, device="cpu", verify=verify)
                    counts[key]["loaded"] += 1
                except Exception as error:  # noqa: BLE001 — every load error is counted
                    named = str(copy / name) in str(error) or (
                        name.startswith("encoder/") and str(copy / "encoder") in str(error) and Path(name).name in str(error))
                    if named:
                        counts[key]["error naming the file"] += 1
                    else:
                        counts[key]["error not naming it"].append(f"{name}: {type(error).__name__}: {str(error)[:200]}")
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(PROBES), help=f"comma-separated, from {','.join(PROBES)}")
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--flips", type=int, default=30, help="flips per group and verify setting")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose code is probed (default: this one)")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    sys.path.insert(0, str(repo))  # torchmover from the probed checkout, here as in the subprocesses
    only = args.only.split(",")
    if set(only) - set(PROBES):
        parser.error(f"unknown probes {sorted(set(only) - set(PROBES))}")
    random.seed(args.seed)
    import transformers

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="probe-saves-") as work:
        probes = {"kills": lambda: probe_kills(args.kills, Path(work), repo),
                  "checkpoints": lambda: probe_checkpoints(args.kills, Path(work), repo),
                  "flips": lambda: probe_flips(args.flips, Path(work))}
        results = {}
        for name in only:
            results[name] = probes[name]()
            print(f"{name}: {json.dumps(results[name], indent=1)}", flush=True)
    harness.publish(args.out, "probe_saves", "Saving and loading probed from outside", results,
                    body=harness.counts_body(results))


if __name__ == "__main__":
    main()
