"""The speed and memory goals of the scoring path and the reward call, where they stand: a table
computed from the stored results that measure them, each row naming the result, its commit, its
device and the versions it ran, so that the table is never typed by hand.

- CPU, end to end and memory: ``bench_corpus_memory`` (``python bench/bench_corpus.py --part memory``):
  torchmover's pairs/s against bert_score's (best of the rounds), the median growth of the resident set
  during the call against bert_score's, and the tokens the encoder runs over against the texts' own;
  ``bench_peers`` (``python bench/bench_peers.py``): the same ratio of speeds, measured apart.
- CPU, metric part on cached embeddings: ``bench_host`` (``python bench/bench_host.py``): the call with
  the encoding replayed, minus the transport terms (the host work; median of the rounds).
- GPU: ``bench_gpu_cuda_default`` and ``bench_gpu_cuda_base`` (``python bench/bench_gpu.py``, run by
  ``bash bench/gpu_suite.sh``): pairs/s against bert_score's in the same run, the base-size encoder's
  peak GPU memory against bert_score's, and the float32 reward calls' medians.

Command (from the repository root, after the benchmarks it reads)::

    python bench/performance_goals.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def source(res: dict | None) -> str:
    """``name @ commit`` of a stored result (``unknown`` where it was measured before results recorded
    their commit), with a mark if its tree had uncommitted changes."""
    if res is None:
        return "–"
    p = res["provenance"]
    commit = p.get("commit", "unknown")
    return f"`{res['name']}` @ {commit[:10]}{' (uncommitted changes)' if p.get('dirty') else ''}"


def device(res: dict | None) -> str:
    """The GPU's name, else the CPU and its logical cores, as the result recorded them."""
    d = (res or {}).get("provenance", {}).get("device") or {}
    if d.get("gpu"):
        return d["gpu"]["name"]
    if d.get("cpu"):
        return f"{d['cpu']}, {d.get('cores', '?')} logical cores"
    return "device not recorded"


def versions(res: dict | None) -> str:
    """The versions of torch, transformers and bert-score (what the ratios depend on) the result recorded."""
    v = (res or {}).get("provenance", {}).get("versions") or {}
    return ", ".join(f"{name} {v[name]}" for name in ("torch", "transformers", "bert-score") if v.get(name)) \
        or "versions not recorded"


def measured_on(res: dict | None) -> str:
    """Where and with what a result was measured: ``device; versions``."""
    return f"{device(res)}; {versions(res)}"


def pairs(res: dict) -> str:
    """How many WMT pairs a result measured on, as its provenance says."""
    n = ((res["provenance"].get("data") or {}).get("sample") or {}).get("n")
    return "?" if n is None else f"{n:,}"


def cpu_rows(memory: dict | None, peers: dict | None, host: dict | None) -> list[list[str]]:
    """The CPU rows: end to end (``bench_corpus_memory``, and ``bench_peers``: two measurements of one
    ratio, each in processes of its own) and memory growth against bert_score, padding, metric host
    work."""
    rows = []
    if memory is not None:
        runs = memory["figures"]
        tm, bs = runs["torchmover"], runs["bert_score"]
        speed = min(r["seconds"] for r in bs) / min(r["seconds"] for r in tm)
        growth = statistics.median(r["peak_growth_mb"] for r in tm) / statistics.median(r["peak_growth_mb"] for r in bs)
        n = pairs(memory)
        rows.append([f"CPU: {n} WMT pairs end to end, pairs/s vs bert_score (best of the rounds)",
                     f"{speed:.2f}×", "≥ 1.3×", "met" if speed >= 1.3 else "not met", source(memory),
                     measured_on(memory)])
        rows.append([f"CPU: {n} WMT pairs, growth of the resident set during the call vs bert_score's (median)",
                     f"{growth:.2f}×", "≤ 1.1×", "met" if growth <= 1.1 else "not met", source(memory),
                     measured_on(memory)])
        if "padded_tokens" in tm[0]:
            pad = [tm[0]["padded_tokens"] / tm[0]["real_tokens"], bs[0]["padded_tokens"] / bs[0]["real_tokens"]]
            rows.append(["CPU: tokens the encoder runs over / the texts' own (bert_score's)",
                         f"{pad[0]:.3f} ({pad[1]:.3f})", "near 1", "–", source(memory), measured_on(memory)])
    if peers is not None and "runs" in peers["figures"]:
        runs = peers["figures"]["runs"]
        speed = min(r["total_s"] for r in runs["bert_score"]) / min(r["total_s"] for r in runs["torchmover-twmd"])
        rows.append([f"CPU: {pairs(peers)} WMT pairs end to end, pairs/s vs bert_score (best of the rounds; "
                     "another benchmark)", f"{speed:.2f}×", "≥ 1.3×", "met" if speed >= 1.3 else "not met",
                     source(peers), measured_on(peers)])
    if host is not None and "metric_part" in host["figures"]:
        m = host["figures"]["metric_part"]
        rest = statistics.median(t - c for t, c in zip(m["times"]["twmd"], m["transport"]["twmd"]))
        rows.append(["CPU: metric part on cached embeddings, host work (all but the transport terms), "
                     f"{pairs(host)} pairs (median)", f"{rest:.3f} s", "≤ 0.035 s",
                     "met" if rest <= 0.035 else "not met", source(host), measured_on(host)])
    return rows


def gpu_rows(default: dict | None, base: dict | None) -> list[list[str]]:
    """The GPU rows from ``bench_gpu``'s results (``None``: not stored)."""
    rows = []
    for res, label, goal in ((default, "GPU: default model, 1,000 WMT pairs, pairs/s vs bert_score", "≥ 5×"),
                             (base, "GPU: base-size encoder, 5,344 pairs: pairs/s vs bert_score", "≥ 2×")):
        systems = None if res is None else next(iter(res["figures"].values()))["systems"]
        if not systems or "bert_score" not in systems:
            rows.append([label, "not measured against bert_score in this result", goal, "–", source(res),
                         measured_on(res)])
            continue
        speed = systems["bert_score"]["total_s"] / systems["torchmover"]["total_s"]
        rows.append([label, f"{speed:.2f}×", goal, "met" if speed >= float(goal[2:-1]) else "not met", source(res),
                     measured_on(res)])
        if res is base:
            peak = systems["torchmover"]["peak_gpu_mib"] / systems["bert_score"]["peak_gpu_mib"]
            rows.append(["GPU: base-size encoder, 5,344 pairs: peak GPU memory vs bert_score's", f"{peak:.2f}×",
                         "≤ 1.5×", "met" if peak <= 1.5 else "not met", source(res), measured_on(res)])
    calls = [] if default is None else [r for r in next(iter(default["figures"].values())).get("reward", [])
                                        if r.get("variant") == "fp32"]
    if calls:
        cells = ", ".join(f"{r['completions']}: {1e3 * r['call']:.1f} ms, "
                          f"non-encoder {1 - r['encoder'] / r['call']:.0%}" for r in calls)
        met = all(r["call"] <= (0.005 if r["completions"] <= 64 else 0.020) and r["encoder"] / r["call"] > 0.6
                  for r in calls)
        rows.append(["GPU: reward call, fp32, default model (completions: time, non-encoder share)", cells,
                     "≤ 5 ms (64), ≤ 20 ms (512); non-encoder < 40%", "met" if met else "not met", source(default),
                     measured_on(default)])
    return rows


def goals_table(results: dict[str, dict | None]) -> dict:
    return harness.table(["measure", "now", "goal", "", "result @ commit", "device; versions"],
                         cpu_rows(*map(results.get, ("bench_corpus_memory", "bench_peers", "bench_host")))
                         + gpu_rows(results.get("bench_gpu_cuda_default"), results.get("bench_gpu_cuda_base")),
                         "-rr---")


NAMES = ("bench_corpus_memory", "bench_peers", "bench_host", "bench_gpu_cuda_default", "bench_gpu_cuda_base")


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the results it reads are")
    args = parser.parse_args(argv)
    results = {n: harness.load(args.results / f"{n}.json") if (args.results / f"{n}.json").is_file() else None
               for n in NAMES}
    figures = {n: None if r is None else {"commit": r["provenance"].get("commit"), "date": r["provenance"].get("date")}
               for n, r in results.items()}
    body = ["Each row is computed from the result it names (its JSON holds the command, the versions and "
            "the device); `python bench/performance_goals.py` recomputes the table after the benchmarks ran.",
            {"table": "goals"}]
    harness.publish(args.out, "performance_goals", "The speed and memory goals, where they stand", figures,
                    {"goals": goals_table(results)}, body)


if __name__ == "__main__":
    main()
