"""The encoder's precision measured: how far a bf16 (or fp16) encoder moves the scores, the correlation with human ratings and the speed.

For each encoder precision of ``--dtypes`` (default ``float32,bf16``; ``fp16`` where the device has
it) and each of two scorers on ``--model`` (default: the default model at its recorded layer) — the
default scorer (``torchmover.Scorer``: TWMD, recall) and the ``bertscore`` preset
(``Scorer.from_preset("bertscore", model=...)``: BERTScore F1, special tokens as targets) — this study
scores every WMT15-16 pair (``harness.wmt_sample``, every row; ``--n`` for a sample) with
``Scorer(..., dtype=..., device=...).score(hyps, refs)`` and reports:

- **drift** against the first precision (float32): max and mean ``|Δ score|``, the share of pairs whose
  score moves by more than 1e-3, Kendall's τ-b between the two score lists (how much the pairs' order
  changes: the share of pairs of pairs whose order flips is about ``(1 − τ) / 2``), and how many scores
  are not finite (:func:`drift`);
- **correlation** with the human DA ratings: Pearson r per language pair and year and their average
  (``torchmover.evaluation.correlation.correlate``), and the difference of the averages against float32
  with a paired bootstrap interval (``correlation.paired_bootstrap_difference``, 1,000 resamples);
- **speed**: end-to-end pairs/s on the same pairs, on ``--device`` (default ``cpu``; ``cuda`` on a GPU):
  each precision's scorer first makes one untimed warm-up call on every pair (its scores are the ones
  compared), then ``--rounds`` timed calls, the precisions interleaved round by round; the best round
  counts (wall time; the process's CPU time of that round beside it). Memory: the encoder's weights,
  and the growth of memory during the warm-up call — on a GPU ``torch.cuda.max_memory_allocated``
  over what was allocated before the call, on the CPU the process's resident set sampled every 5 ms
  over its size before, the C heap's free memory returned to the system first (:class:`PeakMemory`).

Only the encoder runs in the chosen precision: the centering mean and the transport stay float32
(``torchmover.runtime.devices``). Command (from the repository root)::

    python bench/studies/precision.py [--device cpu|cuda] [--dtypes float32,bf16[,fp16]] [--rounds 3]

Writes ``precision_<device type>.md`` and ``.json`` (``precision_<device type>_<model>`` for another
model) into ``--out``.
"""
from __future__ import annotations

import ctypes
import gc
import math
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402

SYSTEMS = {"twmd": "default scorer (TWMD, recall)", "bertscore": "`bertscore` preset (F1)"}
MOVED = 1e-3  # a score "moves" when it changes by more than this


# --- figures --------------------------------------------------------------------------------------

def drift(reference, other, moved: float = MOVED) -> dict:
    """How far ``other`` scores are from the ``reference`` scores of the same pairs: ``max_abs`` and
    ``mean_abs`` of ``|other − reference|`` over the pairs where both are finite, ``moved``: the share
    of pairs with ``|Δ| > moved``, ``kendall``: Kendall's τ-b between the two lists
    (``evaluation.correlation.correlate``; 1 when no two pairs swap order), and ``non_finite``: how many
    of ``other``'s scores are NaN or infinite."""
    from torchmover.evaluation.correlation import correlate

    a, b = np.asarray(reference, np.float64), np.asarray(other, np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"reference and other must be equally long, non-empty lists of scores, got shapes "
                         f"{a.shape} and {b.shape}")
    finite = np.isfinite(a) & np.isfinite(b)
    out = {"max_abs": math.nan, "mean_abs": math.nan, "moved": math.nan, "kendall": math.nan,
           "non_finite": int((~np.isfinite(b)).sum())}
    if finite.sum() > 1:  # NaN where fewer than two pairs have two finite scores
        d = np.abs(b - a)[finite]
        out.update(max_abs=float(d.max()), mean_abs=float(d.mean()), moved=float((d > moved).mean()),
                   kendall=float(correlate(a[finite], b[finite], n_boot=0).average.kendall.value))
    return out


def trim_heap() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim(0)``; nothing elsewhere), so
    that the resident set no longer holds what an earlier call freed."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """The growth of memory during a ``with`` block, in MiB (``.growth_mib``): on a CUDA device the peak
    of ``torch.cuda.max_memory_allocated`` over what was allocated at the start; elsewhere the peak of
    the process's resident set, sampled every ``interval`` seconds, over the resident set at the start
    (after :func:`trim_heap`, so that memory freed before the block and kept by the allocator does not
    hide the block's growth)."""

    def __init__(self, device: torch.device, interval: float = 0.005):
        self.device, self.interval, self.growth_mib = torch.device(device), interval, None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
            return self
        from bench_common import rss_mb

        gc.collect()
        trim_heap()
        self.start, self.peak, self.done = rss_mb(), rss_mb(), threading.Event()

        def sample():
            while not self.done.wait(self.interval):
                self.peak = max(self.peak, rss_mb())
        self.sampler = threading.Thread(target=sample, daemon=True)
        self.sampler.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.growth_mib = (torch.cuda.max_memory_allocated(self.device) - self.start) / 2**20
            return
        from bench_common import rss_mb

        self.done.set()
        self.sampler.join()
        self.growth_mib = max(self.peak, rss_mb()) - self.start


# --- measurement ----------------------------------------------------------------------------------

def make_scorer(system: str, model: str, layer: int | None, dtype: str, device: str):
    """The scorer of ``system`` (a key of ``SYSTEMS``) on ``model`` with its encoder in ``dtype``."""
    from torchmover import Scorer

    options = dict(model=model, device=device, dtype=dtype, **({"layer": layer} if layer is not None else {}))
    return Scorer.from_preset("bertscore", **options) if system == "bertscore" else Scorer(**options)


def measure(pairs: list[dict], model: str, layer: int | None, dtypes: list[str], device: str,
            rounds: int) -> dict:
    """Every system's scores, timings and memory per precision (module docs), as figures."""
    from bench_common import synchronizer

    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    sync = synchronizer(device)
    out = {}
    for system in SYSTEMS:
        scorers = {dtype: make_scorer(system, model, layer, dtype, device) for dtype in dtypes}
        runs = {dtype: {"signature": s.signature, "layer": s.config.layer, "runs_s": [], "cpu_s": [],
                        "weights_mib": sum(p.numel() * p.element_size() for p in s.encoder.parameters()) / 2**20}
                for dtype, s in scorers.items()}
        for dtype, scorer in scorers.items():  # warm-up: the scores compared, and the memory
            with PeakMemory(torch.device(device)) as memory:
                runs[dtype]["scores"] = scorer.score(hyps, refs, progress=False).tolist()
            runs[dtype]["memory_growth_mib"] = memory.growth_mib
        last = {}  # each precision's scores of its last timed call
        for _ in range(rounds):
            for dtype, scorer in scorers.items():
                def call(dtype=dtype, scorer=scorer):
                    last[dtype] = scorer.score(hyps, refs, progress=False)
                timing = harness.time_call(call, repeats=1, warmup=0, sync=sync)
                runs[dtype]["runs_s"] += timing.runs
                runs[dtype]["cpu_s"] += timing.cpu
        for dtype in dtypes:  # a timed call scores as the warm-up call did
            runs[dtype]["repeat_max_abs"] = float(np.max(np.abs(last[dtype].numpy() - np.asarray(runs[dtype]["scores"]))))
        out[system] = runs
        del scorers
    return out


def analyse(figures: dict, pairs: list[dict], dtypes: list[str], n_boot: int, seed: int) -> None:
    """Adds to each system's precisions their drift, correlations and speed against ``dtypes[0]``."""
    from torchmover.evaluation.correlation import correlate, paired_bootstrap_difference

    human = [p["score"] for p in pairs]
    groups = [f"{p['lp']}/{p['year']}" for p in pairs]
    base = dtypes[0]
    for runs in figures.values():
        for dtype in dtypes:
            run = runs[dtype]
            report = correlate(run["scores"], human, groups, n_boot=0)
            run["pearson"] = {g.name: g.pearson.value for g in report.groups}
            run["pearson_avg"] = report.average.pearson.value
            best = int(np.argmin(run["runs_s"]))
            run["best_s"], run["best_cpu_s"] = run["runs_s"][best], run["cpu_s"][best]
            run["pairs_per_s"] = len(pairs) / run["best_s"]
            run["speedup"] = runs[base]["best_s"] / run["best_s"]
            run["drift"] = drift(runs[base]["scores"], run["scores"])
            run["range"] = [float(np.nanmin(run["scores"])), float(np.nanmax(run["scores"]))]
            if dtype != base:
                d = paired_bootstrap_difference(run["scores"], runs[base]["scores"], human, groups,
                                                n_boot=n_boot, seed=seed)
                run["pearson_diff"] = {"value": d.value, "low": d.low, "high": d.high, "p_le_0": d.p_le_0}


# --- tables ---------------------------------------------------------------------------------------

def _signed(x: float) -> str:
    """A difference of correlations with its sign and two significant digits: ``+1.6e-5``, ``−0.012``."""
    return ("−" if x < 0 else "+") + harness.short(abs(x))


def docs_table(figures: dict) -> dict:
    """The table of ``docs/guide/performance.md`` (``docs_precision``): per scorer and precision, pairs/s
    and the speed-up over the first precision, the largest and mean score drift against it, the
    average Pearson r with the human ratings and its difference from the first precision's, with the
    paired bootstrap's 95% interval."""
    rows = []
    for system, runs in figures["systems"].items():
        for dtype, run in runs.items():
            d, diff = run["drift"], run.get("pearson_diff")
            rows.append([SYSTEMS[system], dtype, f"{run['pairs_per_s']:,.0f}", f"{run['speedup']:.2f}×",
                         harness.short(d["max_abs"]) if diff else "–", harness.short(d["mean_abs"]) if diff else "–",
                         f"{run['pearson_avg']:.4f}",
                         f"{_signed(diff['value'])} [{_signed(diff['low'])}, {_signed(diff['high'])}]" if diff else "–"])
    return harness.table(["scorer", "encoder", "pairs/s", "speed-up", "largest score change", "mean score change",
                          "avg Pearson r", "Δ r [95% CI]"], rows, "--rrrrrr")


def drift_table(figures: dict) -> dict:
    rows = []
    for system, runs in figures["systems"].items():
        for dtype, run in list(runs.items())[1:]:
            d = run["drift"]
            rows.append([SYSTEMS[system], dtype, harness.short(d["max_abs"]), harness.short(d["mean_abs"]),
                         f"{100 * d['moved']:.1f}%", f"{d['kendall']:.4f}", str(d["non_finite"]),
                         f"[{run['range'][0]:.4f}, {run['range'][1]:.4f}]"])
    return harness.table(["scorer", "encoder", "largest change", "mean change", f"changed by > {MOVED:g}",
                          "Kendall τ-b with the first", "not finite", "scores' range"], rows, "--rrrrrr")


def correlation_table(figures: dict) -> dict:
    columns = [(system, dtype) for system, runs in figures["systems"].items() for dtype in runs]
    groups = list(next(iter(figures["systems"].values()))[columns[0][1]]["pearson"])
    rows = [[g, *(f"{figures['systems'][s][t]['pearson'][g]:.4f}" for s, t in columns)] for g in groups]
    rows.append(["**average**", *(f"**{figures['systems'][s][t]['pearson_avg']:.4f}**" for s, t in columns)])
    return harness.table(["group", *(f"{s} {t}" for s, t in columns)], rows, "-" + "r" * len(columns))


def speed_table(figures: dict) -> dict:
    rows = []
    for system, runs in figures["systems"].items():
        for dtype, run in runs.items():
            rows.append([SYSTEMS[system], dtype, f"{run['best_s']:.2f}", f"{run['best_cpu_s']:.2f}",
                         f"{run['pairs_per_s']:,.0f}", f"{run['speedup']:.2f}×", f"{run['weights_mib']:.1f}",
                         f"{run['memory_growth_mib']:.0f}"])
    return harness.table(["scorer", "encoder", "best wall s", "its CPU s", "pairs/s", "speed-up", "weights MiB",
                          "memory growth MiB (first call)"], rows, "--rrrrrr")


# --- command line ---------------------------------------------------------------------------------

def main(argv=None) -> None:
    from torchmover.runtime.devices import resolve_device, resolve_dtype
    from torchmover.text.encoder import DEFAULT_MODEL

    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--dtypes", default="float32,bf16",
                        help="encoder precisions, the first the reference (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per precision (default: %(default)s)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="encoder (default: %(default)s)")
    parser.add_argument("--layer", type=int, help="layer (default: the model's recorded one)")
    parser.add_argument("--n", type=int, help="pairs (default: every row)")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for dtype in dtypes:
        try:
            resolve_dtype(dtype)
        except ValueError as error:
            parser.error(f"--dtypes: {error}")
    if len(dtypes) < 2 or len(set(map(resolve_dtype, dtypes))) < len(dtypes):
        parser.error(f"--dtypes must name at least two different precisions, got {args.dtypes!r}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = harness.wmt_sample(args.data, args.n, args.seed)
    t0 = time.perf_counter()
    systems = measure(pairs, args.model, args.layer, dtypes, str(device), args.rounds)
    analyse(systems, pairs, dtypes, args.n_boot, args.seed)
    for runs in systems.values():  # the figures keep what was computed from the scores, not the scores
        for run in runs.values():
            del run["scores"]
    figures = {"n_pairs": len(pairs), "dtypes": dtypes, "device": str(device), "rounds": args.rounds,
               "n_boot": args.n_boot, "moved": MOVED, "threads": torch.get_num_threads(),
               "wall_s": time.perf_counter() - t0, "systems": systems}
    tables = {"docs_precision": docs_table(figures), "drift": drift_table(figures),
              "correlation": correlation_table(figures), "speed": speed_table(figures)}
    where = f"{harness.device_info().get('gpu', {}).get('name', 'GPU')}" if device.type == "cuda" else \
        f"the CPU ({harness.device_info()['cpu']}, torch with {torch.get_num_threads()} thread(s))"
    body = [
        f"Every one of {len(pairs):,} WMT15–16 pairs scored by the default scorer and the `bertscore` preset of "
        f"`{args.model}`, with the encoder in {', '.join(dtypes)} (the centering mean and the transport stay "
        f"float32), on {where}. Differences are against {dtypes[0]}.",
        "## Summary", {"table": "docs_precision"},
        f"Δ r: the difference of the average Pearson r over the language-pair × year groups, with the 95% paired "
        f"bootstrap interval ({args.n_boot} resamples of the pairs within each group, the same for both precisions).",
        "## Score drift",
        f"Against {dtypes[0]}: the largest and the mean absolute change of a score, the share of pairs whose score "
        f"moves by more than {MOVED:g}, Kendall's τ-b between the two lists of scores (about (1 − τ)/2 of the "
        "pairs of pairs swap order), the scores that are not finite, and the smallest and largest score.",
        {"table": "drift"},
        "## Pearson r with the human ratings, per language pair and year", {"table": "correlation"},
        "## Speed and memory",
        f"End to end (`Scorer.score` on every pair), best of {args.rounds} rounds, the precisions interleaved "
        "round by round after one untimed warm-up call each. Memory growth: during the warm-up call, "
        + ("`torch.cuda.max_memory_allocated` over what was allocated before." if device.type == "cuda" else
           "the resident set sampled every 5 ms over its size before, the C heap's free memory returned to the "
           "system first (`malloc_trim`), so that a precision measured after another does not reuse the heap "
           "the earlier one grew."),
        {"table": "speed"},
    ]
    name = f"precision_{device.type}" + harness.model_suffix(args.model)
    harness.publish(args.out, name, f"The encoder's precision: score drift, correlation with humans and speed "
                    f"({device.type})", figures, tables, body,
                    data=harness.data_provenance(args.data, args.n, args.seed))


if __name__ == "__main__":
    main()
