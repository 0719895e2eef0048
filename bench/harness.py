"""What every benchmark and study shares: its command line, the one seeded sample of WMT pairs, the
timer, and the publisher that writes a result's JSON (its figures with their provenance) and renders
its Markdown report from that JSON.

A result is one JSON file ``bench/results/<name>.json``::

    {"schema": "torchmover-bench/1", "name": ..., "title": ...,
     "provenance": {"commit", "dirty", "command", "date", "versions", "device", "data"},
     "figures": {...},                       # the numbers, as the script measured them
     "tables": {"<table>": {"columns": [...], "align": "-r..", "rows": [[cell, ...], ...]}},
     "body": ["markdown paragraph", {"table": "<table>"}, ...]}

and ``<name>.md`` is :func:`render` of it, never written by hand. The tables of ``docs/`` are copies of
named tables of these files, kept equal by ``bench/docs_tables.py``. Use from a script::

    import harness
    parser = harness.wmt_parser(__doc__)                  # --data, --out, --seed
    args = parser.parse_args(argv)
    pairs = harness.wmt_sample(args.data, 1000, args.seed)
    timing = harness.time_call(lambda: scorer.score(hyps, refs), repeats=5)   # .median, .min, .cpu
    harness.publish(args.out, "my_bench", "What it measures", figures={...},
                    tables={"main": harness.table(["system", "s"], [["torchmover", "1.23"]], align="-r")},
                    body=["A paragraph.", {"table": "main"}],
                    data=harness.data_provenance(args.data, n=1000, seed=args.seed))
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def _load_provenance():
    """``torchmover.runtime.provenance`` read from this checkout by its path, without importing the
    ``torchmover`` package (which imports torch): a script that never imports torch (one that runs
    others as subprocesses) records no torch threads, and importing the harness stays cheap."""
    path = REPO / "torchmover" / "runtime" / "provenance.py"
    spec = importlib.util.spec_from_file_location("_bench_provenance", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_provenance = _load_provenance()
device_info, package_version = _provenance.device_info, _provenance.package_version
SCHEMA = "torchmover-bench/1"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "wmt15-16"
PEERS = ("bert-score", "moverscore", "pyemd", "POT", "geomloss", "torchmetrics")


# --- command line and data ------------------------------------------------------------------------

def wmt_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc``, with ``--data`` (the WMT15-16 ``*.tsv``
    directory, by default ``../shared/data/wmt15-16`` next to the repository), ``--out`` (the results
    directory, by default ``bench/results``) and ``--seed`` (of :func:`wmt_sample`, default 0)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="WMT15-16 *.tsv directory (default: ../shared/data/wmt15-16 next to the repository)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of the WMT sample (default: %(default)s)")
    return parser


def wmt_sample(data_dir: Path, n: int | None, seed: int = 0, distinct: bool = False) -> list[dict]:
    """The seeded sample of ``n`` rows (``None``: every row, in seeded order) (``lp year ref hyp score``) of every ``*.tsv`` in ``data_dir``:
    ``random.Random(seed).sample`` of all rows in file order (with ``distinct``, of the first row of each
    distinct (hyp, ref) pair). Every script draws its WMT pairs here, so "1,000 pairs, seed 0" names
    the same pairs in every table."""
    from torchmover.evaluation.data import read_tsv_dir  # here, not at import: the MoverScore shim stubs transformers

    rows = [dataclasses.asdict(r) for r in read_tsv_dir(Path(data_dir))]
    if distinct:
        rows = list({(r["hyp"], r["ref"]): r for r in reversed(rows)}.values())[::-1]
    if n is not None and len(rows) < n:
        raise SystemExit(f"--data {data_dir}: {len(rows)} rows found, {n} requested")
    return random.Random(seed).sample(rows, len(rows) if n is None else n)


def data_provenance(data_dir: Path | None, n: int | None = None, seed: int | None = None, **more) -> dict:
    """What a result was measured on: the data directory (relative to the repository's parent when
    under it), its ``*.tsv`` files, and the sample (``n`` pairs of :func:`wmt_sample` with ``seed``)."""
    if data_dir is None:
        return {"path": None, **more}
    path = Path(data_dir).resolve()
    try:
        shown = str(Path("..") / path.relative_to(REPO.parent))
    except ValueError:
        shown = str(data_dir)
    sample = None if n is None else {"n": n, "seed": seed, "sampler": "bench/harness.py:wmt_sample"}
    return {"path": shown, "files": sorted(p.name for p in path.glob("*.tsv")), "sample": sample, **more}


# --- timing ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class Timing:
    """Wall seconds of each timed run (``runs``) and this process's CPU seconds (``cpu``, less sensitive
    to other processes on a shared machine), with their medians and minima."""
    runs: list[float]
    cpu: list[float] = dataclasses.field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def min(self) -> float:
        return min(self.runs)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    def figures(self) -> dict:
        return {"median_s": self.median, "min_s": self.min, "runs_s": self.runs, "cpu_s": self.cpu}


def time_call(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
              sync: Callable[[], None] = lambda: None) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed (wall and process CPU time).
    ``sync`` (e.g. ``torch.cuda.synchronize``) runs before the clocks start and before they stop, so
    that on a GPU a run is its kernels' time, not their launch."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    timing = Timing([], [])
    for _ in range(repeats):
        sync()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        sync()
        timing.runs.append(time.perf_counter() - wall)
        timing.cpu.append(time.process_time() - cpu)
    return timing


# --- provenance -----------------------------------------------------------------------------------

def versions() -> dict:
    """Python, torch, transformers, tokenizers, torchmover and the peers (None: not installed)."""
    return _provenance.versions(("torch", "transformers", "tokenizers", "torchmover", *PEERS))


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran, from the repository root (``python bench/x.py --flag ...``)."""
    return _provenance.command_line(argv, REPO)


def tree_state() -> tuple[str, bool | None]:
    """The checked-out commit and whether tracked files differ from it (None outside git), the
    results under ``bench/results/`` apart: a benchmark run after another has written its result
    measures the same code. Outside git (a copy of the tree, e.g. on a machine the repository was
    sent to), the commit the environment variable ``BENCH_COMMIT`` names, else ``"unknown"``."""
    commit, dirty = _provenance.checkout_state(REPO, exclude=("bench/results",))
    return commit or os.environ.get("BENCH_COMMIT", "unknown"), dirty


STARTED_ON = tree_state()  # when the script imported the harness: the code that runs


def provenance(data: dict | None = None, command: str | None = None) -> dict:
    """The commit the run started on (and whether tracked files had uncommitted changes then, or the
    tree changed during the run), the command, the date (UTC), the versions, the device and ``data``
    (see :func:`data_provenance`)."""
    commit, dirty = STARTED_ON
    return {"commit": commit, "dirty": dirty if tree_state() == STARTED_ON else True,
            "command": command or command_line(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": versions(), "device": device_info(), "data": data,
            "load_average": list(os.getloadavg())}


# --- tables, rendering, publishing ----------------------------------------------------------------

_ALIGN = {"-": "---", "r": "---:", "l": ":---", "c": ":---:"}


def table(columns: list[str], rows: list[list], align: str | None = None) -> dict:
    """A named table's content: ``columns``, rows of cells (written as strings) and an alignment per
    column (``-`` default, ``r`` right, ``l`` left, ``c`` centre)."""
    align = align or "-" * len(columns)
    if len(align) != len(columns) or set(align) - set(_ALIGN):
        raise ValueError(f"align {align!r} must have one of '-rlc' per column ({len(columns)})")
    rows = [[str(cell) for cell in row] for row in rows]
    bad = [row for row in rows if len(row) != len(columns)]
    if bad:
        raise ValueError(f"a row has {len(bad[0])} cells for {len(columns)} columns: {bad[0]}")
    return {"columns": list(columns), "align": align, "rows": rows}


def render_table(t: dict) -> str:
    """A table of :func:`table` as Markdown."""
    line = lambda cells: "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"  # noqa: E731
    return "\n".join([line(t["columns"]), "|" + "|".join(_ALIGN[a] for a in t["align"]) + "|",
                      *(line(row) for row in t["rows"])])


def render_provenance(p: dict) -> list[str]:
    """The provenance as a Markdown list."""
    commit = p.get("commit", "unknown")
    if commit == "unknown":
        lines = ["Commit: unknown (measured before results recorded their commit; "
                 + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in (p.get("legacy") or {}).items()) + ")"]
    else:
        lines = [f"Commit: `{commit}`" + (" with uncommitted changes" if p.get("dirty") else "")]
    if p.get("date"):
        lines.append(f"Date: {p['date']}")
    device = p.get("device") or {}
    if device:
        text = f"{device.get('cpu', '?')}, {device.get('cores', '?')} logical cores"
        if "torch_threads" in device:
            text += f", torch with {device['torch_threads']} thread(s)"
        if device.get("gpu"):
            g = device["gpu"]
            text += f"; GPU {g['name']} ({g['memory_mib']:,} MiB, driver {g['driver']}, CUDA {g['cuda']})"
        lines.append(f"Device: {text}")
    if p.get("versions"):
        lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in p["versions"].items() if v))
    data = p.get("data")
    if data and data.get("path"):
        sample = data.get("sample")
        lines.append(f"Data: `{data['path']}` ({len(data.get('files', []))} files)" +
                     (f"; {sample['n']} pairs drawn by `{sample['sampler']}` with seed {sample['seed']}" if sample else ""))
    if p.get("load_average"):
        lines.append("Load average (1/5/15 min) at the end: " + "/".join(f"{x:.2f}" for x in p["load_average"])
                     + " (the machine is shared when it is high)")
    return [f"- {line}" for line in lines]


def render(result: dict) -> str:
    """A result's Markdown report: its title, command, provenance, then its body (paragraphs and
    named tables in order)."""
    p = result["provenance"]
    parts = [f"# {result['title']}", f"`{p['command']}`", "\n".join(render_provenance(p))]
    for block in result["body"]:
        parts.append(render_table(result["tables"][block["table"]]) if isinstance(block, dict) else block)
    return "\n\n".join(parts) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def result(name: str, title: str, figures, tables: dict | None = None, body: list | None = None,
           data: dict | None = None, command: str | None = None) -> dict:
    """A result (see the module's docstring) with this run's :func:`provenance`; ``body`` defaults to
    every table in order."""
    tables = tables or {}
    body = [{"table": k} for k in tables] if body is None else body
    missing = [b["table"] for b in body if isinstance(b, dict) and b["table"] not in tables]
    if missing:
        raise ValueError(f"the body names tables that do not exist: {missing}")
    return {"schema": SCHEMA, "name": name, "title": title, "provenance": provenance(data, command),
            "figures": figures, "tables": tables, "body": body}


def write(out: Path, res: dict) -> Path:
    """Write ``res`` as ``out/<name>.json`` and its rendering as ``out/<name>.md`` (each atomically);
    print the rendering; return the JSON's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{res['name']}.json"
    _write_atomic(path, json.dumps(res, indent=1, default=str) + "\n")
    text = render(res)
    _write_atomic(out / f"{res['name']}.md", text)
    print(text)
    return path


def publish(out: Path, name: str, title: str, figures, tables: dict | None = None, body: list | None = None,
            data: dict | None = None, command: str | None = None) -> Path:
    """:func:`result` then :func:`write`: the one way a script publishes what it measured."""
    return write(out, result(name, title, figures, tables, body, data, command))


def short(x: float) -> str:
    """A figure with two significant digits, as the tables print differences: ``0.070``, ``3.6e-7``."""
    return f"{x:#.2g}" if x >= 0.01 else f"{x:.1e}".replace("e-0", "e-")


def counts_body(figures) -> list[str]:
    """A report's body that shows its figures as they are: a probe's counts, as JSON."""
    return ["Every probe's counts (the figures, as JSON):", "```json\n" + json.dumps(figures, indent=1) + "\n```"]


def model_suffix(model: str | None) -> str:
    """``_<model's last path part>`` for any model but the default one (a result's name suffix)."""
    return "" if model is None or model.endswith("all-MiniLM-L6-v2") else "_" + str(model).rstrip("/").rsplit("/", 1)[-1]


def load(path: Path) -> dict:
    """A result file, checked to be of this schema."""
    res = json.loads(Path(path).read_text(encoding="utf-8"))
    if res.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} result (schema {res.get('schema')!r})")
    return res
