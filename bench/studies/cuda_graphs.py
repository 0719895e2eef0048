"""What CUDA graphs would make of a reward call: its device work captured once and replayed.

A reward call of the default model on a GPU is bound by launching its work: under the profiler a
64-completion call issues ~280 aten ops while the device is busy for a small part of it
(``bench/bench_gpu.py``'s profile). A CUDA graph records the kernels of a piece of work once, for
fixed shapes and fixed input and output buffers, and replays them in one launch. This study measures
what that buys, on the reward call of ``bench/bench_gpu.py`` (``MoverReward`` of the default model at
its recorded layer, or ``--model`` at ``--layer``; references cached, centering fitted on them; 8
completions per prompt), for 64 and 512 completions, each variant in its own fresh ``MoverReward``:

- **one call repeated** (what a graph can win at best: every shape seen before). ``eager``: the call
  as the library makes it; ``graphs``: the same call with the encoder's forward
  (``Encoder._vectors``, every pass) and the transport (``Scorer.score_pairs``) each replayed from a
  graph captured at the first call of each shape (:class:`GraphedCall`). Tokenization, the host's
  preparation and the centering of the hypotheses stay eager.
- **calls that differ** (what training sees: new completions every step). ``--calls`` calls of
  different completions, cycled: ``eager`` against ``bucketed encoder graphs``, the encoder's inputs
  padded to a bucket (rows up to a multiple of ``--bucket-rows``, tokens up to a multiple of
  ``--bucket-tokens``: :func:`bucketed`), so that calls of similar length replay one graph; the
  transport stays eager (its shapes change with every call). The first cycle captures; the times are
  the mean call of the cycles after it.
- **scoring** (the goals' other GPU measure): ``Scorer.score`` of ``--pairs`` WMT pairs (the seeded
  sample of ``bench/bench_gpu.py``, ``--batch-size`` 64), eager against bucketed encoder graphs (the
  encoder's batches differ in width from batch to batch); the pair batches' transport stays eager. The
  median of ``--rounds`` calls after the one that captures.

Each variant reports its call (median wall time of ``--repeats`` calls, the device synchronised at the
end of each; for scoring, pairs per second), the largest score difference from ``eager``, the graphs
it captured and the seconds their captures took, and (one call repeated) a profile of the call under
``torch.profiler`` (``bench_common.profile_calls``: aten ops issued, kernels, the device's busy
time). A capture that fails (work in the captured code that a graph cannot hold, e.g. a read of the
device on the host) is reported with its error, and the variant is left out.

The graphs here are the study's own (nothing in torchmover captures graphs): a graph pins its input
and output buffers and a memory pool per captured shape, and its inputs are copied into those buffers
before each replay. Without CUDA it prints why and exits with status 0 (nothing is measured);
``--device cpu`` runs the same wiring with graphs stood in for by calls on the static buffers
(``backend="eager"``), to check it, and measures nothing about graphs.

Command (from the repository root)::

    python bench/studies/cuda_graphs.py --data ../shared/data/wmt15-16 --out bench/results

Publishes ``cuda_graphs_<device type>`` into ``--out``.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402
from bench_common import (COMPLETIONS_PER_PROMPT, cuda_missing, default_layer, model_dir,  # noqa: E402
                          profile_calls, reward_inputs, synchronizer)

PROMPTS = (8, 64)  # 64 and 512 completions


class Graph(NamedTuple):
    """One captured shape: the static input leaves (tensors the inputs are copied into; other leaves as
    they were), the static output, and ``replay()``."""

    inputs: list
    output: object
    replay: Callable[[], None]


class GraphedCall:
    """``fn``'s device work replayed from a graph captured once per input layout (the tree of the
    arguments, each tensor's shape, dtype and device, every other leaf's value).

    A call copies its tensor arguments into the graph's static inputs, replays the graph and returns a
    copy of its static output (a later replay overwrites the output). ``backend="cuda"`` captures a
    ``torch.cuda.CUDAGraph`` after ``warmup`` eager runs on a side stream (as PyTorch's documentation
    does); ``backend="eager"`` stands a graph in by running ``fn`` on the static inputs and copying its
    result into the static output (the same buffers and copies, no graph: to check the wiring on a
    CPU). ``captures`` counts the graphs made, ``capture_s`` the seconds they took."""

    def __init__(self, fn: Callable, backend: str = "cuda", warmup: int = 2):
        if backend not in ("cuda", "eager"):
            raise ValueError(f"backend must be 'cuda' or 'eager', got {backend!r}")
        self.fn, self.backend, self.warmup = fn, backend, warmup
        self.graphs: dict = {}
        self.capture_s = 0.0

    @property
    def captures(self) -> int:
        return len(self.graphs)

    def __call__(self, *args, **kwargs):
        import torch
        from torch.utils._pytree import tree_flatten, tree_map

        leaves, spec = tree_flatten((args, kwargs))
        key = (spec, tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in leaves))
        graph = self.graphs.get(key)
        if graph is None:
            start = time.perf_counter()
            graph = self.graphs[key] = self._capture(leaves, spec)
            self.capture_s += time.perf_counter() - start
        for static, x in zip(graph.inputs, leaves):
            if isinstance(x, torch.Tensor):
                static.copy_(x)
        graph.replay()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, graph.output)

    def _capture(self, leaves: list, spec) -> Graph:
        import torch
        from torch.utils._pytree import tree_flatten, tree_unflatten

        inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        args, kwargs = tree_unflatten(inputs, spec)
        if self.backend == "eager":
            output = self.fn(*args, **kwargs)
            static_out = tree_flatten(output)[0]

            def replay():
                for static, fresh in zip(static_out, tree_flatten(self.fn(*args, **kwargs))[0]):
                    if isinstance(static, torch.Tensor):
                        static.copy_(fresh)
            return Graph(inputs, output, replay)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self.fn(*args, **kwargs)
        return Graph(inputs, output, graph.replay)


def bucket(size: int, multiple: int) -> int:
    """``size`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    return max(1, math.ceil(size / multiple)) * multiple


def bucketed(vectors: Callable, rows: int, tokens: int) -> Callable:
    """The encoder's ``_vectors(inputs)`` (``inputs``: ``[N, L]`` tensors by name) on inputs padded to
    ``[bucket(N, rows), bucket(L, tokens)]`` (zeros: the pad id 0, attention 0, type 0; a padding row
    attends to its first position, so that no row is masked whole), cut back to ``[N, L, D]``. The
    added positions are masked keys or rows of their own: the real rows' vectors are what the
    unpadded forward gives, to rounding."""
    def forward(inputs):
        n, width = inputs["input_ids"].shape
        shape = (bucket(n, rows), bucket(width, tokens))
        padded = {}
        for name, t in inputs.items():
            padded[name] = t.new_zeros(shape)
            padded[name][:n, :width] = t
        padded["attention_mask"][n:, 0] = 1
        return vectors(padded)[:n, :width]
    return forward


def install(scorer, *, encoder: bool, transport: bool, backend: str, buckets: tuple[int, int] | None = None):
    """Route ``scorer``'s encoder forward and / or transport through :class:`GraphedCall` (instance
    attributes over the methods; ``buckets``: the encoder's inputs padded by :func:`bucketed`). Returns
    the graphed calls by name."""
    graphed = {}
    if encoder:
        enc = scorer.encoder
        graphed["encoder"] = GraphedCall(enc._vectors, backend)
        enc._vectors = graphed["encoder"] if buckets is None else bucketed(graphed["encoder"], *buckets)
    if transport:
        graphed["transport"] = GraphedCall(scorer.score_pairs, backend)
        scorer.score_pairs = graphed["transport"]
    return graphed


def new_reward(path: str, layer: int, device: str, references: list[str]):
    from torchmover import Scorer
    from torchmover.reward.rewards import MoverReward

    return MoverReward(Scorer(path, layer=layer, device=device)).fit(references)


def max_diff(scores, baseline) -> float:
    return float((scores.double() - baseline.double()).abs().max())


def compare(variants, row: dict, make: Callable, measure: Callable) -> list[dict]:
    """A row per ``(variant, graphs)`` of ``variants``, each on a fresh subject ``make()``: ``row`` with
    the variant, the figures of ``measure(subject, graphs)`` (which returns the scores, the graphed calls
    and the figures), the graphs captured and the largest score difference from the first variant; or,
    where a capture fails, its error (the variant left out)."""
    rows, baseline = [], None
    for variant, graphs in variants:
        subject = make()
        try:
            scores, graphed, figures = measure(subject, graphs)
        except Exception as error:  # a capture the graph cannot hold: reported, the variant left out
            rows.append(dict(row, variant=variant, failed=f"{type(error).__name__}: {error}"))
            continue
        baseline = scores if baseline is None else baseline
        rows.append(dict(row, variant=variant, **figures, **captured(graphed), max_diff=max_diff(scores, baseline)))
    return rows


def captured(graphed: dict) -> dict:
    """The graphs each :class:`GraphedCall` of ``graphed`` captured, and the seconds they took in all."""
    return {"captures": {k: g.captures for k, g in graphed.items()},
            "capture_s": sum(g.capture_s for g in graphed.values())}


def one_call(path, layer, device, pairs, n_prompts, repeats, backend) -> list[dict]:
    """The variants of one call repeated (module docs): a row per variant."""
    import torch

    hyps, refs, references = reward_inputs(pairs, n_prompts)
    sync = synchronizer(device)

    def measure(reward, graphs):
        with torch.no_grad():
            reward(hyps, refs)  # warm-up: the encoder learns which hidden state to read
            graphed = install(reward.scorer, encoder=graphs, transport=graphs, backend=backend)
            scores = reward(hyps, refs)  # captures
            return scores, graphed, {
                "call_s": harness.time_call(lambda: reward(hyps, refs), repeats, warmup=0, sync=sync).median,
                "profile": profile_calls(lambda: reward(hyps, refs), repeats, device, top=5)}
    return compare((("eager", False), ("graphs", True)), {"completions": len(hyps)},
                   lambda: new_reward(path, layer, device, references), measure)


def varying_calls(path, layer, device, pairs, n_prompts, calls, rounds, backend, buckets) -> list[dict]:
    """The variants of calls that differ (module docs): a row per variant."""
    import torch

    n = n_prompts * COMPLETIONS_PER_PROMPT
    batches = [reward_inputs(pairs[k * n:(k + 1) * n], n_prompts) for k in range(calls)]
    references = list(dict.fromkeys(r for _, _, refs in batches for r in refs))
    sync = synchronizer(device)

    def measure(reward, graphs):
        with torch.no_grad():
            reward(*batches[0][:2])  # warm-up
            graphed = install(reward.scorer, encoder=graphs, transport=False, backend=backend, buckets=buckets)
            scores = torch.cat([reward(hyps, refs) for hyps, refs, _ in batches])  # the first cycle captures
            cycles = harness.time_call(lambda: [reward(hyps, refs) for hyps, refs, _ in batches], rounds,
                                       warmup=0, sync=sync)
            return scores, graphed, {"call_s": cycles.median / calls}
    return compare((("eager", False), ("bucketed encoder graphs", True)), {"completions": n, "calls": calls},
                   lambda: new_reward(path, layer, device, references), measure)


def scoring(path, layer, device, pairs, batch_size, repeats, backend, buckets) -> list[dict]:
    """``Scorer.score`` of ``pairs`` (module docs), eager and with bucketed encoder graphs: a row each."""
    from torchmover import Scorer

    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    sync = synchronizer(device)

    def measure(scorer, graphs):
        scorer.score(hyps, refs, batch_size, progress=False)  # warm-up
        graphed = install(scorer, encoder=graphs, transport=False, backend=backend, buckets=buckets)
        scores = scorer.score(hyps, refs, batch_size, progress=False)  # captures
        call = harness.time_call(lambda: scorer.score(hyps, refs, batch_size, progress=False), repeats,
                                 warmup=0, sync=sync)
        return scores, graphed, {"call_s": call.median}
    return compare((("eager", False), ("bucketed encoder graphs", True)),
                   {"pairs": len(pairs), "batch_size": batch_size},
                   lambda: Scorer(path, layer=layer, device=device), measure)


def ms(seconds) -> str:
    return "—" if seconds is None else f"{1000 * seconds:.1f}"


def one_call_cells(row: dict) -> list:
    p = row["profile"]
    busy = p["device_busy_s"]
    return [row["completions"], row["variant"], ms(row["call_s"]), f"{p['aten_ops']:.0f}",
            "—" if p["kernels"] is None else f"{p['kernels']:.0f}", ms(busy),
            "—" if busy is None else f"{1 - busy / p['wall_s']:.0%}"]


SECTIONS = {  # each section's size column, and its row's own cells (before the score drift and the graphs)
    "one_call": ("completions", one_call_cells),
    "varying_calls": ("completions", lambda row: [row["completions"], row["variant"], row["calls"], ms(row["call_s"])]),
    "scoring": ("pairs", lambda row: [row["pairs"], row["variant"], row["batch_size"],
                                      f"{row['pairs'] / row['call_s']:.1f}", f"{row['call_s']:.3f}"])}


def report(figures: dict) -> tuple[dict, list]:
    cells, failures = {name: [] for name in SECTIONS}, []
    for name, (size, own) in SECTIONS.items():
        for row in figures[name]:
            if "failed" in row:
                failures.append([row[size], row["variant"], row["failed"]])
                continue
            cells[name].append([*own(row), harness.short(row["max_diff"]),
                                ", ".join(f"{k} {v}" for k, v in row["captures"].items()) or "—",
                                f"{row['capture_s']:.2f}"])
    tables = {
        "one_call": harness.table(["completions", "variant", "call ms", "aten ops", "kernels", "device busy ms",
                                   "device idle", "max |Δ score| vs eager", "graphs", "capture s"],
                                  cells["one_call"], "r-rrrrrr-r"),
        "varying_calls": harness.table(["completions", "variant", "calls", "call ms (mean)", "max |Δ score| vs eager",
                                        "graphs", "capture s"], cells["varying_calls"], "r-rrr-r"),
        "scoring": harness.table(["pairs", "variant", "batch size", "pairs/s", "end to end s (median)",
                                  "max |Δ score| vs eager", "graphs", "capture s"], cells["scoring"], "r-rrrr-r")}
    body = ["One call repeated: the call's median wall time, and under the profiler per call the aten ops "
            "issued, the kernels the device ran and its busy time:", {"table": "one_call"},
            f"Calls that differ: {figures['calls']} calls of different completions, cycled; the encoder's inputs "
            f"padded to multiples of {figures['buckets'][0]} rows and {figures['buckets'][1]} tokens; the mean call "
            "after the first cycle (which captures):", {"table": "varying_calls"},
            f"`Scorer.score` of {figures['scoring_pairs']} WMT pairs, the encoder's inputs padded as above: "
            "median of the calls after the one that captures:", {"table": "scoring"}]
    if failures:
        tables["failures"] = harness.table(["completions or pairs", "variant", "capture failed"], failures, "r--")
        body += ["Captures that failed:", {"table": "failures"}]
    if figures["backend"] == "eager":
        body.insert(0, "**No graphs: `--device cpu` stands each graph in by a call on its static buffers (the "
                       "wiring checked, nothing about graphs measured).**")
    return tables, body


def main(argv=None) -> int:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (the wiring only)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls of one call repeated")
    parser.add_argument("--calls", type=int, default=8, help="different calls cycled")
    parser.add_argument("--rounds", type=int, default=3, help="timed cycles of the different calls")
    parser.add_argument("--bucket-rows", type=int, default=64)
    parser.add_argument("--bucket-tokens", type=int, default=16)
    parser.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="comma-separated prompts per call")
    parser.add_argument("--pairs", type=int, default=1000, help="WMT pairs of the Scorer.score call")
    parser.add_argument("--batch-size", type=int, default=64, help="its batch_size")
    parser.add_argument("--model", help="a local model directory (default: the default model)")
    parser.add_argument("--layer", type=int, help="its layer (default: the default model's recorded layer)")
    args = parser.parse_args(argv)

    import torch

    device = torch.device(args.device)
    if cuda_missing("cuda_graphs", device, "to check the wiring"):
        return 0
    from tqdm.auto import tqdm

    prompts = [int(p) for p in args.prompts.split(",")]
    buckets = (args.bucket_rows, args.bucket_tokens)
    backend = "cuda" if device.type == "cuda" else "eager"
    path = args.model or model_dir()
    layer = args.layer if args.layer is not None else default_layer()
    pairs = harness.wmt_sample(args.data, max(prompts) * COMPLETIONS_PER_PROMPT * args.calls, args.seed)
    figures = {"backend": backend, "calls": args.calls, "buckets": buckets, "scoring_pairs": args.pairs,
               "one_call": [], "varying_calls": []}
    with tqdm(total=2 * len(prompts) + 1, desc="cuda_graphs", unit="step") as bar:
        for n_prompts in prompts:
            figures["one_call"] += one_call(path, layer, args.device, pairs, n_prompts, args.repeats, backend)
            bar.update()
            figures["varying_calls"] += varying_calls(path, layer, args.device, pairs, n_prompts, args.calls,
                                                      args.rounds, backend, buckets)
            bar.update()
        scored = harness.wmt_sample(args.data, args.pairs, args.seed)  # the goals' sample (bench_gpu.py's)
        figures["scoring"] = scoring(path, layer, args.device, scored, args.batch_size, args.rounds, backend, buckets)
        bar.update()
    tables, body = report(figures)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    harness.publish(args.out, f"cuda_graphs_{device.type}", f"CUDA graphs and the reward call on {name}", figures,
                    tables, body, data=harness.data_provenance(args.data, len(pairs), args.seed,
                                                                 scoring_sample={"n": args.pairs, "seed": args.seed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
