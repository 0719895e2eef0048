"""GPU benchmark: torchmover against bert_score, and a reward call broken into its phases, on CUDA.

For each encoder — the default model (``sentence-transformers/all-MiniLM-L6-v2``, layer 4) and a
randomly initialised base-size encoder built from a config (12 layers, 768 wide, 12 heads, 3072 FFN:
``roberta-base``'s shapes, on the default model's vocabulary; layer 10, ``roberta-base``'s; random
weights cost what trained ones cost) — on ``--pairs`` WMT15-16 pairs of ``--data``:

1. **torchmover vs bert_score**, same encoder directory, same layer, same batch size: end to end and
   the metric part on recorded encoder outputs (``bench_common.measure``: the encoder's share is timed
   inside the call, then the call is replayed without it), peak GPU memory of each call, and the
   model's forward passes in the call and the tokens they ran over per real token (padding).
   ``--batch-sizes``: torchmover again at each of those batch sizes (what larger batches buy on the
   device, and cost in memory).
2. **a reward call** (``MoverReward``, references cached, centering fitted on them) of 64 and of 512
   completions (8 completions × 8 and × 64 prompts), split into tokenization
   (``Encoder.tokenize``), encoder (the model's forward), transport (centering + ``Scorer.score_pairs``)
   and host work (the rest of the call); the device is synchronised at each phase boundary, so the
   phases add up to the call (the synchronisations themselves are not free: the call without them is
   reported too). Peak GPU memory of the call.
3. **precision and compilation**: the 64-completion reward call with a bf16 and an fp16 encoder and
   with ``compile=True``: time per phase and the largest score difference from float32.
4. **the tokenizer's parallelism**: the reward calls' tokenization alone, wall time, with the Rust
   tokenizer's own parallelism off and on (``bench_common.tokenizer_parallelism``), on the processors
   the process may use; the report names the ``TOKENIZERS_PARALLELISM`` the run started with (the
   reward calls above ran under it).
5. **a profile of the reward call**: the float32 calls of 2. under ``torch.profiler``
   (``bench_common.profile_calls``): the aten ops the host issued per call, the kernels and memory
   copies the device ran and the time it was busy with them (the rest of the call, the device waited
   for the host: what CUDA graphs or fewer launches could win), and the ops with the most self time.

Without CUDA it prints why and exits with status 0 (nothing is measured). ``--device cpu`` runs the
same measurements on the CPU (the CPU-safe part: how the call splits when the encoder is not 30-100×
faster, as it is on a GPU).

Commands (from the repository root)::

    python bench/bench_gpu.py                                      # on a CUDA machine
    python bench/bench_gpu.py --models base --pairs 5344 --batch-sizes 64,256,1024
    python bench/bench_gpu.py --device cpu --pairs 200 --threads 2 --repeats 3

Publishes ``bench_gpu_<device>_<models>`` (e.g. ``bench_gpu_cuda_default``) into ``--out`` (default
``bench/results``), with the two tables of ``docs/guide/performance.md`` (``docs_scoring``, ``docs_reward``).
Needs ``bert-score`` (``pip install "torchmover[bench]"``); ``--skip-bert-score`` leaves it out.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import harness
from bench_common import (COMPLETIONS_PER_PROMPT, Timed, cuda_missing, default_layer, model_dir, profile_calls,
                          reward_inputs, run_bert_score, run_torchmover, synchronizer, tokenizer_parallelism,
                          tokenizer_table)

PROMPTS = (8, 64)  # 64 and 512 completions
BASE_SHAPE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                  max_position_embeddings=514)


def encoders(tmp: Path, names: list[str]) -> dict[str, tuple[str, int]]:
    """``{name: (local model directory, layer)}``; the base-size encoder is built and saved to ``tmp``."""
    from torchmover.text.encoder import DEFAULT_LAYERS

    out = {}
    for name in names:
        if name == "default":
            out[name] = (model_dir(), default_layer())
        elif name == "base":
            import torch
            from transformers import AutoTokenizer, BertConfig, BertModel

            tokenizer = AutoTokenizer.from_pretrained(model_dir())
            torch.manual_seed(0)
            model = BertModel(BertConfig(vocab_size=len(tokenizer), **BASE_SHAPE))
            path = tmp / "random-base"
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            out[name] = (str(path), DEFAULT_LAYERS["roberta-base"][0])
        else:
            raise SystemExit(f"--models: unknown encoder {name!r} (default, base)")
    return out


def peak_memory(device) -> tuple:
    """(reset, read) of the peak GPU memory in MiB; (no-op, None) on the CPU."""
    import torch

    if torch.device(device).type != "cuda":
        return (lambda: None), (lambda: None)
    return (lambda: torch.cuda.reset_peak_memory_stats(device)), (
        lambda: torch.cuda.max_memory_allocated(device) / 2**20)


def compare_systems(pairs, path, layer, device, batch_size, with_bert_score: bool) -> dict:
    """torchmover (default twmd, and the bertscore preset: bert_score's arithmetic) and bert_score F1 on
    the same pairs, encoder, layer and batch size."""
    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    reset, read = peak_memory(device)
    runs = {}
    for name, run in (("torchmover", lambda: run_torchmover(hyps, refs, layer, "twmd", batch_size, model=path,
                                                            device=device)),
                      ("torchmover bertscore preset", lambda: run_torchmover(hyps, refs, layer, "bertscore", batch_size,
                                                                             model=path, device=device,
                                                                             preset="bertscore")),
                      ("bert_score", lambda: run_bert_score(hyps, refs, layer, batch_size, model=path,
                                                            device=device))):
        if name == "bert_score" and not with_bert_score:
            continue
        reset()
        out = run()
        out.pop("scores", None), out.pop("precision", None), out.pop("recall", None)
        runs[name] = dict(out, peak_gpu_mib=read())
    return runs


def batch_size_sweep(pairs, path, layer, device, batch_sizes: list[int]) -> list[dict]:
    """torchmover (TWMD) end to end on the same pairs at each of ``batch_sizes`` (``Scorer.score``'s
    ``batch_size``: its batches' token budget): its time, encoder share, forward passes and peak GPU memory."""
    hyps, refs = [p["hyp"] for p in pairs], [p["ref"] for p in pairs]
    reset, read = peak_memory(device)
    rows = []
    for batch_size in batch_sizes:
        reset()
        out = run_torchmover(hyps, refs, layer, "twmd", batch_size, model=path, device=device)
        rows.append({key: out[key] for key in ("total_s", "encoder_s", "metric_cached_s", "encoder_passes",
                                               "encoder_padded_tokens", "encoder_tokens")}
                    | {"batch_size": batch_size, "peak_gpu_mib": read()})
    return rows


def reward_call(path, layer, pairs, device, n_prompts, dtype=None, compile=False):
    """``(reward, hyps, refs)``: a ``MoverReward`` of ``n_prompts`` cached references (centering fitted
    on them) and the completions of ``bench_common.reward_inputs`` to score."""
    from torchmover import Scorer
    from torchmover.reward.rewards import MoverReward

    hyps, refs, references = reward_inputs(pairs, n_prompts)
    reward = MoverReward(Scorer(path, layer=layer, device=device, dtype=dtype, compile=compile)).fit(references)
    return reward, hyps, refs


def reward_breakdown(path, layer, pairs, device, n_prompts, repeats, dtype=None, compile=False) -> dict:
    """Median wall time of a reward call and the mean time of each phase in it (module docs)."""
    import torch

    reward, hyps, refs = reward_call(path, layer, pairs, device, n_prompts, dtype, compile)
    scorer = reward.scorer
    sync = synchronizer(device)
    encoder, centering = scorer.encoder, reward.centering

    with torch.no_grad():
        scores = reward(hyps, refs)  # warm-up (and compilation)
        plain = harness.time_call(lambda: reward(hyps, refs), repeats, warmup=0, sync=sync).median
        phases = {"tokenization": (encoder, "tokenize"), "encoder": (encoder.model, "forward"),
                  "centering": (centering, "forward"), "transport": (scorer, "score_pairs")}
        timers = {}
        for name, (owner, attr) in phases.items():
            timers[name] = Timed(getattr(owner, attr), sync=sync)
            setattr(owner, attr, timers[name])  # instance attribute: calls go through the timer
        reset, read = peak_memory(device)
        reset()
        try:
            total = harness.time_call(lambda: reward(hyps, refs), repeats, warmup=0, sync=sync).runs
        finally:
            for owner, attr in phases.values():
                delattr(owner, attr)
    out = {name: timer.seconds / repeats for name, timer in timers.items()}
    out["transport"] += out.pop("centering")
    out["host"] = statistics.mean(total) - sum(out.values())
    out.update(call=statistics.mean(total), call_without_syncs=plain, peak_gpu_mib=read(),
               completions=len(hyps), scores=scores.float().cpu().tolist(), signature=scorer.signature)
    return out


def reward_profile(path, layer, pairs, device, n_prompts, repeats) -> dict:
    """The float32 reward call of :func:`reward_breakdown` under ``torch.profiler``
    (``bench_common.profile_calls``): ops, kernels, the device's busy time, the top ops."""
    import torch

    reward, hyps, refs = reward_call(path, layer, pairs, device, n_prompts)
    with torch.no_grad():
        reward(hyps, refs)  # warm-up
        return dict(profile_calls(lambda: reward(hyps, refs), repeats, device), completions=len(hyps))


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def mib(value) -> str:
    return "—" if value is None else f"{value:.0f}"


SYSTEM_LABELS = {"torchmover": "torchmover (TWMD)", "torchmover bertscore preset": "torchmover `bertscore` preset",
                 "bert_score": "bert_score F1"}
ENCODER_LABELS = {"default": "default (MiniLM, layer {layer})", "base": "base-size (layer {layer})"}


def docs_tables(results: dict, pairs: int) -> dict:
    """The tables of ``docs/guide/performance.md`` (``docs_scoring``, ``docs_reward``) from the figures."""
    scoring, reward = [], []
    for model, r in results.items():
        label = ENCODER_LABELS.get(model, model).format(layer=r["layer"])
        for k, (system, s) in enumerate(r["systems"].items()):
            name = SYSTEM_LABELS.get(system, system)
            if system == "torchmover" and "center:batch" in s["signature"]:
                name = name[:-1] + ", batch centering)"
            rate = f"{pairs / s['total_s']:,.0f}"
            scoring.append([label if k == 0 else "", f"{pairs:,}" if k == 0 else "", name,
                            f"**{rate}**" if k == 0 else rate, f"{s['total_s']:.2f}", f"{s['encoder_s']:.2f}",
                            f"{s['metric_cached_s']:.3f}", "—" if s["peak_gpu_mib"] is None else f"{s['peak_gpu_mib']:,.0f}"])
        for k, row in enumerate(r["reward"]):
            reward.append([(label.split(" (")[0] if k == 0 else ""), row["completions"], row["variant"],
                           *(f"{1000 * row[key]:.1f}" for key in ("tokenization", "encoder", "host", "transport", "call",
                                                                 "call_without_syncs")),
                           "0" if row["max_diff"] == 0 else f"{row['max_diff']:.1e}".replace("e-0", "e-"),
                           "—" if row["peak_gpu_mib"] is None else f"{row['peak_gpu_mib']:,.0f}"])
    return {"docs_scoring": harness.table(["encoder", "pairs", "system", "pairs/s", "end to end s", "encoder s",
                                           "metric part s", "peak GPU MiB"], scoring, "-r-rrrrr"),
            "docs_reward": harness.table(["encoder", "completions", "variant", "tokenization", "encoder", "host",
                                          "transport", "call", "call without syncs", "max \\|Δ score\\| vs fp32",
                                          "peak GPU MiB"], reward, "-r-rrrrrrrr")}


def profile_tables(profiles: list[dict]) -> tuple[dict, dict]:
    """The table of :func:`reward_profile`'s figures (a row per call size), and per call size the table
    of its top ops."""
    def idle(p):
        return "—" if p["device_busy_s"] is None else f"{1 - p['device_busy_s'] / p['wall_s']:.0%}"

    summary = harness.table(
        ["completions", "call ms (profiled)", "aten ops", "kernels", "memory copies", "device busy ms",
         "device idle"],
        [[p["completions"], ms(p["wall_s"]), f"{p['aten_ops']:.0f}",
          *("—" if p[k] is None else f"{p[k]:.0f}" for k in ("kernels", "copies")),
          "—" if p["device_busy_s"] is None else ms(p["device_busy_s"]), idle(p)] for p in profiles], "rrrrrrr")
    top = {p["completions"]: harness.table(
        ["op", "calls", "self host ms", "self device ms"],
        [[f"`{t['op']}`", f"{t['calls']:g}", f"{1000 * t['self_host_s']:.2f}",
          "—" if t["self_device_s"] is None else f"{1000 * t['self_device_s']:.2f}"] for t in p["top"]], "-rrr")
        for p in profiles}
    return summary, top


def report(args, device, results, started) -> tuple[str, dict, list]:
    """The title, the named tables and the body of the report."""
    name = torch_device_name(device)
    body = [f"{args.pairs} WMT15-16 pairs, batch size {args.batch_size}, {args.repeats} repeats; wall "
            f"{time.perf_counter() - started:.0f} s."]
    if device.type == "cpu":
        body.append("Run on the CPU (`--device cpu`): no GPU figure here.")
    tables = {}
    for model, r in results.items():
        body.append(f"## {model} encoder (layer {r['layer']})")
        if r["systems"]:
            tables[f"{model}_systems"] = harness.table(
                ["system", *RUN_COLUMNS], [[system, *run_cells(s, args.pairs)] for system, s in r["systems"].items()])
            body.append({"table": f"{model}_systems"})
        if r.get("batch_sizes"):  # results stored before this measurement have none
            tables[f"{model}_batch_sizes"] = harness.table(
                ["batch size", *RUN_COLUMNS], [[row["batch_size"], *run_cells(row, args.pairs)] for row in r["batch_sizes"]],
                "rrrrrrrr")
            body += ["torchmover (TWMD) by batch size (`--batch-sizes`: `Scorer.score`'s `batch_size`), the same "
                     "pairs:", {"table": f"{model}_batch_sizes"}]
        tables[f"{model}_reward"] = harness.table(
            ["completions", "variant", "tokenization", "encoder", "host", "transport", "call", "call without syncs",
             "max \\|Δ score\\| vs fp32", "peak GPU MiB"],
            [[row["completions"], row["variant"], ms(row["tokenization"]), ms(row["encoder"]), ms(row["host"]),
              ms(row["transport"]), ms(row["call"]), ms(row["call_without_syncs"]), f"{row['max_diff']:.1e}",
              mib(row["peak_gpu_mib"])] for row in r["reward"]])
        body += ["Reward call (`MoverReward`, references cached), ms per call; phases with the device "
                 "synchronised at their boundaries:", {"table": f"{model}_reward"}]
        if r.get("tokenizer"):  # results stored before this measurement have none
            tables[f"{model}_tokenizer"] = tokenizer_table(r["tokenizer"])
            body += [f"The reward calls' tokenization alone (`Encoder.tokenize(word_ids=False)`), wall time, the Rust "
                     f"tokenizer's parallelism off and on in turn (the calls above ran with TOKENIZERS_PARALLELISM "
                     f"{os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}):", {"table": f"{model}_tokenizer"}]
        if r.get("profile"):  # results stored before this measurement have none
            tables[f"{model}_profile"], top = profile_tables(r["profile"])
            body += ["The float32 reward calls under `torch.profiler` (`bench_common.profile_calls`), per call: the "
                     "aten ops the host issued (those not called by another), the kernels and memory copies the "
                     "device ran, and the time it was busy with any of them; the rest of the call the device "
                     "waited for the host. The profiler adds some microseconds to every op.",
                     {"table": f"{model}_profile"}]
            for completions, table in top.items():
                tables[f"{model}_top_{completions}"] = table
                body += [f"The ops with the most self time ({'device' if device.type == 'cuda' else 'host'}), "
                         f"{completions} completions, per call:", {"table": f"{model}_top_{completions}"}]
    tables.update(docs_tables(results, args.pairs))
    body += ["## Tables of the documentation", {"table": "docs_scoring"}, {"table": "docs_reward"}]
    return f"bench_gpu on {name}", tables, body


RUN_COLUMNS = ["pairs/s", "end to end s", "encoder s", "metric part s (cached embeddings)", "peak GPU MiB",
               "encoder passes", "tokens run / real"]


def run_cells(run: dict, pairs: int) -> list[str]:
    """The :data:`RUN_COLUMNS` of a scoring run of ``pairs`` pairs (``bench_common.measure``'s figures);
    its forward passes and the tokens they ran over per real token ``—`` where not counted."""
    passes = ["—", "—"] if "encoder_passes" not in run else [
        f"{run['encoder_passes']}", f"{run['encoder_padded_tokens'] / max(run['encoder_tokens'], 1):.3f}"]
    return [f"{pairs / run['total_s']:.1f}", f"{run['total_s']:.2f}", f"{run['encoder_s']:.2f}",
            f"{run['metric_cached_s']:.3f}", mib(run["peak_gpu_mib"]), *passes]


def torch_device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def main(argv=None) -> int:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu")
    parser.add_argument("--pairs", type=int, default=1000, help="WMT pairs for torchmover vs bert_score")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batch-sizes", default="",
                        help="comma-separated: torchmover end to end again at each of these batch sizes")
    parser.add_argument("--repeats", type=int, default=10, help="timed reward calls per variant")
    parser.add_argument("--models", default="default,base", help="comma-separated: default, base")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--skip-bert-score", action="store_true", help="leave the bert_score comparison out")
    args = parser.parse_args(argv)

    import torch

    device = torch.device(args.device)
    if cuda_missing("bench_gpu", device, "for the same breakdown on the CPU"):
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    from tqdm.auto import tqdm

    from torchmover import Encoder

    started = time.perf_counter()
    pairs = harness.wmt_sample(args.data, max(args.pairs, max(PROMPTS) * COMPLETIONS_PER_PROMPT), args.seed)
    variants = [("fp32", None, False), ("bf16", "bf16", False), ("fp16", "fp16", False), ("compile", None, True)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = encoders(Path(tmp), args.models.split(","))
        batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
        steps = len(models) * (1 + bool(batch_sizes) + 2 * len(PROMPTS) + len(variants) - 1)
        with tqdm(total=steps, desc="bench_gpu", unit="step") as bar:
            for model, (path, layer) in models.items():
                bar.set_postfix_str(f"{model}: torchmover vs bert_score")
                systems = compare_systems(pairs[:args.pairs], path, layer, args.device, args.batch_size,
                                          not args.skip_bert_score)
                bar.update()
                sweep = []
                if batch_sizes:
                    bar.set_postfix_str(f"{model}: torchmover by batch size")
                    sweep = batch_size_sweep(pairs[:args.pairs], path, layer, args.device, batch_sizes)
                    bar.update()
                rows, baseline = [], None
                for n_prompts in PROMPTS:
                    for variant, dtype, compile in variants if n_prompts == PROMPTS[0] else variants[:1]:
                        bar.set_postfix_str(f"{model}: reward {n_prompts * COMPLETIONS_PER_PROMPT} {variant}")
                        row = reward_breakdown(path, layer, pairs, args.device, n_prompts, args.repeats, dtype, compile)
                        baseline = row["scores"] if variant == "fp32" else baseline
                        row.update(variant=variant, max_diff=max(abs(a - b) for a, b in zip(row.pop("scores"), baseline)))
                        rows.append(row)
                        bar.update()
                profiles = []
                for n_prompts in PROMPTS:
                    bar.set_postfix_str(f"{model}: reward {n_prompts * COMPLETIONS_PER_PROMPT} under the profiler")
                    profiles.append(reward_profile(path, layer, pairs, args.device, n_prompts, args.repeats))
                    bar.update()
                batches = {f"{len(hyps)} completions": hyps for hyps in
                           (reward_inputs(pairs, n)[0] for n in PROMPTS)}
                tokenizer = tokenizer_parallelism(Encoder.from_pretrained(path, layer=layer), batches, args.repeats)
                results[model] = {"layer": layer, "systems": systems, "batch_sizes": sweep, "reward": rows,
                                  "tokenizer": tokenizer, "profile": profiles}
    title, tables, body = report(args, device, results, started)
    harness.publish(args.out, f"bench_gpu_{device.type}_{'_'.join(results)}", title, results, tables, body,
                    data=harness.data_provenance(args.data, len(pairs), args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
