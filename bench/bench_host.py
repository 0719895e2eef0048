"""Host overhead: the time of a call that is neither the encoder forward nor the transport kernels.

On a GPU the encoder and the transport get 30-100x faster; what the host does around them (texts
de-duplicated, indices built, cache lookups, tokenization, Python) does not. Three measurements, each
over ``--repeats`` runs, medians quoted (the machine may be shared):

Times are the process's CPU time (``harness.time_call``'s ``cpu``) with one torch thread and the
tokenizer's work in the calling thread, and sections inside a call (``Timed``) the calling thread's
CPU time: on a shared machine the wall time of a call also counts the time other processes hold the
CPU, its CPU time does not.

(a) ``Scorer.score`` on ``--pairs`` WMT15-16 pairs (``harness.wmt_sample``, as ``bench/bench_peers.py``: same seed,
    same default model and layer, ``batch_size=64``), "metric part on cached embeddings": the call with
    the encoding function replaced by a replay of its recorded outputs (torchmover ``Encoder.forward``,
    bert_score ``get_bert_embedding``, both including their tokenization), as ``bench_peers.py`` does,
    for torchmover's TWMD (one iteration) and its ``bertscore`` preset (greedy matching, F1: the
    arithmetic bert_score does), the time in their transport terms ``_cross`` shown apart, and for
    bert_score (F1, no idf). torchmover tokenizes a chunk's texts once before encoding them
    (``Encoder.tokenize``, to batch them by token count), so its replay covers both. Also counted:
    the call's minor page faults, each the first touch of a 4 KiB page the allocator newly mapped
    (zeroed by the kernel; a huge page counts one): a replay hands back outputs already touched, so
    what the call writes into new memory (its pair batches, and a chunk's block of token vectors, which
    asks for huge pages) is what they count. Then (a)
    again, the same rounds, in a process of its own with ``THP_MEM_ALLOC_ENABLE=1`` (PyTorch's switch,
    read at its first allocation, that backs allocations of 2 MiB or more by transparent huge pages:
    one fault maps 2 MiB), where the kernel's transparent huge pages are on: what the remaining first
    touches of new memory cost the call, as the difference between the two.
(b) ``MoverReward`` calls of 64 completions (8 prompts x 8) and 512 completions (64 prompts x 8),
    references cached, with a tiny randomly initialised BERT (1 layer, hidden size 32, built from a
    config) behind the default model's tokenizer, so that the forward costs almost nothing. The call
    is split by timing, inside it, the model's forward, the tokenizer (``Encoder.tokenize``, which
    also frees the tokenizer's Rust encodings before it returns) and the transport terms
    (``torchmover.functional.family._cross``: every C(X, Y)); host work = call - forward - transport, quoted
    with and without the tokenizer. "All replayed": the whole call again with the tokenizer's output,
    the model's outputs and the transport terms' results replayed from a recorded call, which leaves
    torchmover's own host work alone (without the freeing of the tokenizer's Python lists, and with
    the caches as torchmover's own work leaves them).
(c) The tokenization of (b)'s calls (``Encoder.tokenize(word_ids=False)``, what a reward call runs),
    wall time, with the Rust tokenizer's own parallelism off and on (``TOKENIZERS_PARALLELISM=false``
    and ``true``, in turn; ``bench_common.tokenizer_parallelism``), on the processors this process
    may use. (a) and (b) run with it off, so that its work is in the timed thread.

Command (from the repository root)::

    python bench/bench_host.py --data ../shared/data/wmt15-16
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer's work in the timed thread

import torch  # noqa: E402

import harness  # noqa: E402
from bench_common import (Recorded, Recordings, Timed, default_layer, faults_mib, install_encoder,  # noqa: E402
                          install_function, minor_faults, model_dir, reward_inputs, tokenizer_parallelism,
                          tokenizer_table)


CLOCK = time.thread_time
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # the kernel's transparent huge pages


def metric_part(pairs: list[dict], repeats: int) -> dict:
    """The metric part of TWMD (the default) and of the ``bertscore`` preset (BERTScore F1, the same
    arithmetic as bert_score's) on the default model, and of bert_score's F1: each system's encoding
    function replays its recorded outputs; the three run in turn, ``repeats`` rounds after a warm-up
    round, so that a drift of the machine's speed hits them alike. Returns per system the rounds'
    times (s) and, for torchmover, the time in its transport terms (``family._cross``) per round."""
    import bert_score
    import bert_score.utils

    import torchmover.functional.family as family
    from torchmover import Scorer

    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    recordings = Recordings()
    runs = {}
    for name, scorer in (("twmd", Scorer(layer=default_layer())),
                         ("bertscore", Scorer.from_preset("bertscore", model=model_dir(), layer=default_layer()))):
        install_encoder(scorer.encoder, recordings.wrap)
        runs[name] = functools.partial(scorer.score, hyps, refs, batch_size=64, progress=False)
    bert = bert_score.BERTScorer(model_type=model_dir(), num_layers=default_layer(), batch_size=64, device="cpu",
                                 idf=False, use_fast_tokenizer=True)
    restore_bert_score = install_function(bert_score.utils, "get_bert_embedding", recordings.wrap)
    runs["bert_score"] = functools.partial(bert.score, hyps, refs, batch_size=64)
    cross = family._cross = Timed(family._cross, CLOCK)
    times = {name: [] for name in runs}
    transport = {name: [] for name in runs}
    faults = {name: [] for name in runs}
    try:
        for run in runs.values():  # recording runs
            run()
        recordings.replay()
        for round_ in range(repeats + 1):  # a warm-up round, then the timed ones (the systems in turn)
            for name, run in runs.items():
                cross.seconds = 0.0
                first_touches = minor_faults()
                cpu = harness.time_call(run, repeats=1, warmup=0).cpu[0]
                if round_:
                    times[name].append(cpu)
                    transport[name].append(cross.seconds)
                    faults[name].append(minor_faults() - first_touches)
    finally:
        family._cross = cross.fn
        restore_bert_score()
    return {"times": times, "transport": transport, "minor_faults": faults}


def metric_table(m: dict, faults_column: str, show_faults) -> dict:
    """The table of a :func:`metric_part`: per system the medians of its rounds, its transport terms
    and the rest, its minor page faults (``show_faults`` of their median) and its ratio to bert_score's."""
    times, transport, bert = m["times"], m["transport"], m["times"]["bert_score"]
    faults = {name: show_faults(statistics.median(f)) for name, f in m["minor_faults"].items()}
    rows = []
    for name, label in (("twmd", "torchmover TWMD (default)"), ("bertscore", "torchmover `bertscore` preset (F1)")):
        ratio = statistics.median(t / b for t, b in zip(times[name], bert))
        rest = statistics.median(t - c for t, c in zip(times[name], transport[name]))
        rows.append([label, f"{statistics.median(times[name]):.3f}", f"{statistics.median(transport[name]):.3f}",
                     f"{rest:.3f}", faults[name], f"{ratio:.2f}x"])
    rows.append(["bert_score F1", f"{statistics.median(bert):.3f}", "", "", faults["bert_score"], "1.00x"])
    return harness.table(["system", "metric part", "of which transport terms", "the rest (host work)", faults_column,
                          "metric part / bert_score's (median of the rounds' ratios)"], rows, "-rrrrr")


def metric_part_with_huge_pages(args) -> dict | None:
    """:func:`metric_part` in a child process with ``THP_MEM_ALLOC_ENABLE=1`` (read by torch once, at
    its first allocation: hence a process of its own), where the kernel's transparent huge pages are
    on (``always`` or ``madvise``); else None."""
    if not THP_MODE.exists() or "[never]" in THP_MODE.read_text():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "metric.json"
        subprocess.run([sys.executable, __file__, "--data", str(args.data), "--pairs", str(args.pairs), "--seed",
                        str(args.seed), "--repeats", str(args.repeats), "--metric-only", str(out)], check=True,
                       env={**os.environ, "THP_MEM_ALLOC_ENABLE": "1"})
        return json.loads(out.read_text())


def tiny_default_tokenizer_scorer():
    """A Scorer on a 1-layer, 32-wide random BERT behind the default model's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from torchmover import Encoder, Scorer

    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    return Scorer(Encoder(BertModel(config).eval(), tokenizer, layer=1, name="tiny-random-bert"), centering="none")


def reward_call(pairs: list[dict], n_prompts: int, group: int, repeats: int) -> dict:
    """Medians over ``repeats`` calls: the whole call, and inside it the forward, tokenizer and transport."""
    import torchmover.functional.family as family
    from torchmover.reward.rewards import MoverReward

    scorer = tiny_default_tokenizer_scorer()
    hyps, targets, _ = reward_inputs(pairs, n_prompts, group)
    reward = MoverReward(scorer)
    reward(hyps, targets)  # fills the reference cache
    encoder = scorer.encoder
    forward, tokenize, cross = (Timed(f, CLOCK) for f in (encoder.model.forward, encoder.tokenize, family._cross))
    encoder.model.forward, encoder.tokenize, family._cross = forward, tokenize, cross
    sections = []  # per timed call: (forward, tokenizer, transport)

    def call():
        forward.seconds = tokenize.seconds = cross.seconds = 0.0
        reward(hyps, targets)
        sections.append((forward.seconds, tokenize.seconds, cross.seconds))
    try:
        timing = harness.time_call(call, repeats=repeats, warmup=1)
    finally:
        del encoder.model.forward, encoder.tokenize
        family._cross = cross.fn
    rows = [(total, *parts) for total, parts in zip(timing.cpu, sections[1:])]
    total, fwd, tok, transport = (statistics.median(r[k] for r in rows) for k in range(4))
    host = statistics.median(r[0] - r[1] - r[3] for r in rows)
    return {"completions": len(hyps), "prompts": n_prompts, "call_ms": 1e3 * total, "forward_ms": 1e3 * fwd,
            "tokenizer_ms": 1e3 * tok, "transport_ms": 1e3 * transport, "host_ms": 1e3 * host,
            "host_without_tokenizer_ms": 1e3 * (host - tok),
            "replayed_ms": 1e3 * replayed_call(reward, hyps, targets, repeats)}


def replayed_call(reward, hyps: list[str], targets: list[str], repeats: int) -> float:
    """Median time of the reward call with the tokenizer's output, the model's outputs and the
    transport terms' results replayed (recorded on one call): torchmover's own host work alone,
    without the freeing of the tokenizer's Python lists and whatever else the real tokenizer and
    encoder leave behind (cold caches)."""
    import torchmover.functional.family as family

    encoder = reward.scorer.encoder
    order = [itertools.count(), itertools.count()]  # the model's passes and the transport terms of a call, by position
    replays = (Recorded(encoder.tokenize, key=lambda texts, *a, **k: tuple(texts)),
               Recorded(encoder.model.forward, key=lambda **inputs: next(order[0])),
               Recorded(family._cross, key=lambda *args: next(order[1])))
    encoder.tokenize, encoder.model.forward, family._cross = replays
    def call():
        order[:] = itertools.count(), itertools.count()
        reward(hyps, targets)
    try:
        reward(hyps, targets)  # records
        for replay in replays:
            replay.replaying = True
        timing = harness.time_call(call, repeats=repeats, warmup=0)
    finally:
        del encoder.model.forward, encoder.tokenize
        family._cross = replays[2].fn
    return statistics.median(timing.cpu)


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=1000, help="WMT pairs for (a) (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of (a); (b) runs 10x more (default: %(default)s)")
    parser.add_argument("--skip-metric", action="store_true", help="only (b)")
    parser.add_argument("--metric-only", type=Path, metavar="JSON",
                        help="only (a), its figures written to JSON (the run with huge pages: a child process)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # thread CPU time is the call's CPU time
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    if args.metric_only:
        args.metric_only.write_text(json.dumps(metric_part(pairs, args.repeats)))
        return
    calls = [reward_call(pairs, n_prompts, 8, 10 * args.repeats) for n_prompts in (8, 64)]
    tables = {"reward": harness.table(
        ["completions", "call", "model forward", "transport", "host work", "of which tokenizer",
         "host work without tokenizer", "host work, all replayed"],
        [[f"{r['completions']} ({r['prompts']} prompts x 8)", *(f"{r[k]:.2f}" for k in (
            "call_ms", "forward_ms", "transport_ms", "host_ms", "tokenizer_ms", "host_without_tokenizer_ms",
            "replayed_ms"))] for r in calls], align="rrrrrrrr")}
    batches = {f"{8 * n} completions ({n} prompts x 8)": reward_inputs(pairs, n, 8)[0] for n in (8, 64)}
    tokenizer = tokenizer_parallelism(tiny_default_tokenizer_scorer().encoder, batches, 10 * args.repeats)
    tables["tokenizer"] = tokenizer_table(tokenizer)
    body = ["- 1 torch thread, the process's CPU time (harness.time_call); sections inside a call: the calling thread's CPU time\n"
            "- tokenizer: TOKENIZERS_PARALLELISM=false in (a) and (b), so its Rust work is in the calling thread",
            f"(b) reward call, references cached, tiny random encoder, medians over {10 * args.repeats} calls, ms",
            {"table": "reward"},
            f"(c) the tokenization of (b)'s completions (`Encoder.tokenize(word_ids=False)`), wall time, medians over "
            f"{10 * args.repeats} calls, the Rust tokenizer's parallelism off and on in turn",
            {"table": "tokenizer"}]
    figures = {"reward_calls": calls, "tokenizer_parallelism": tokenizer}
    if not args.skip_metric:
        m = figures["metric_part"] = metric_part(pairs, args.repeats)
        tables["metric"] = metric_table(m, "new memory touched, MiB (minor page faults)",
                                        lambda faults: f"{faults_mib(faults):.0f}")
        body += [f"(a) metric part on cached embeddings, {args.pairs} WMT pairs, medians over {args.repeats} "
                 "rounds (the three systems in turn in each round), s", {"table": "metric"}]
        huge = figures["metric_part_huge_pages"] = metric_part_with_huge_pages(args)
        if huge is None:
            body.append("(a) with huge pages: not measured (this kernel's transparent huge pages are off)")
        else:
            tables["metric_huge_pages"] = metric_table(huge, "minor page faults (a huge page: one)", lambda f: f"{f:,.0f}")
            body += ["(a) again in a process of its own whose torch allocations of 2 MiB or more are backed by "
                     "transparent huge pages (`THP_MEM_ALLOC_ENABLE=1`, PyTorch's switch: one page fault maps "
                     "2 MiB instead of 4 KiB): the same rounds, s", {"table": "metric_huge_pages"}]
    harness.publish(args.out, "bench_host", "Host overhead: what a call does besides the encoder and the transport",
                    figures, tables, body, data=harness.data_provenance(args.data, args.pairs, args.seed))


if __name__ == "__main__":
    main()
