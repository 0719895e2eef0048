"""The paired before/after table of ``bench/gpu_before_after.sh``: for each encoder, each tree's
torchmover against bert_score in the same run, and its float32 reward calls, every figure from one
device in one session.

RUNS is the OUT folder of ``gpu_before_after.sh`` (``RUNS/<label>_<models>/bench_gpu_cuda*.json``,
the earlier trees' JSON in their own older layout); ``--commit LABEL=COMMIT`` names the commit of each
label, in the order the table lists them. An earlier tree's JSON does not record how many pairs it
scored: ``--pairs MODELS=N`` says so (the ``--pairs`` its step ran with; a run of this tree reads it
from its provenance). The per-run figures are kept in the published JSON, so the run folders need not
be. Command (from the repository root)::

    python bench/gpu_before_after.py RUNS --commit memprev=<commit> --commit issue=<commit> \\
        --commit head=<commit> --pairs default=1000 --pairs base=5344
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

ENCODERS = {"default": "default (MiniLM, layer 4)", "base": "base-size (layer 10)"}


def read_run(path: Path) -> tuple[dict, dict | None]:
    """One run's figures for its encoder (``{layer, systems, reward, ...}``) and its provenance, from
    either layout: this tree's results (``{provenance, figures: {model: ...}}``) or an earlier tree's
    bare ``{model: ...}`` (no provenance)."""
    res = json.loads(path.read_text(encoding="utf-8"))
    if "figures" in res:
        return next(iter(res["figures"].values())), res["provenance"]
    return next(iter(res.values())), None


def row(encoder: str, label: str, commit: str, run: dict) -> list[str]:
    """A table row: the tree, torchmover's and bert_score's pairs/s and their ratio, both peaks, and the
    float32 reward calls' medians."""
    systems, n = run["systems"], run["pairs"]
    tm, bs = systems["torchmover"], systems.get("bert_score")
    calls = {r["completions"]: r["call"] for r in run.get("reward", []) if r["variant"] == "fp32"}
    return [ENCODERS[encoder], f"{label} ({commit[:7]})", f"{n / tm['total_s']:,.0f}",
            "–" if bs is None else f"{n / bs['total_s']:,.0f}",
            "–" if bs is None else f"{bs['total_s'] / tm['total_s']:.2f}×",
            f"{tm['peak_gpu_mib']:,.0f}", "–" if bs is None else f"{bs['peak_gpu_mib']:,.0f}",
            *(f"{1e3 * calls[c]:.1f}" if c in calls else "–" for c in (64, 512))]


def collect(runs: Path, commits: dict[str, str], pairs: dict[str, int]) -> tuple[dict, dict | None]:
    """Every run under ``runs`` whose label ``commits`` names: ``{encoder: {label: figures}}`` with the
    sample size added as ``pairs`` (from the run's provenance, else ``pairs[encoder]``), and the
    provenance of a run of this tree (for the device)."""
    found, device_of = {}, None
    for folder in sorted(p for p in runs.iterdir() if p.is_dir()):
        label, _, encoder = folder.name.rpartition("_")
        paths = sorted(folder.glob("bench_gpu_cuda*.json"))
        if label not in commits or encoder not in ENCODERS or not paths:
            continue
        run, prov = read_run(paths[0])
        if prov is not None:
            device_of = prov
        n = (prov or {}).get("data", {}).get("sample", {}).get("n") or pairs.get(encoder)
        if n is None:
            raise SystemExit(f"{paths[0]} does not record how many pairs it scored: give --pairs {encoder}=N")
        run["pairs"] = n
        found.setdefault(encoder, {})[label] = run
    return found, device_of


def before_after_table(found: dict, commits: dict[str, str]) -> dict:
    rows = [row(encoder, label, commits[label], found[encoder][label])
            for encoder in ENCODERS if encoder in found for label in commits if label in found[encoder]]
    return harness.table(["encoder", "tree (commit)", "torchmover pairs/s", "bert_score pairs/s",
                          "ratio", "torchmover peak GPU MiB", "bert_score peak GPU MiB",
                          "reward call 64 ms (fp32)", "reward call 512 ms (fp32)"], rows, "--rrrrrrr")


def parse_commit(text: str) -> tuple[str, str]:
    label, sep, commit = text.partition("=")
    if not sep or not label or not commit:
        raise ValueError(f"--commit takes LABEL=COMMIT, got {text!r}")
    return label, commit


def parse_pairs(text: str) -> tuple[str, int]:
    encoder, sep, n = text.partition("=")
    if not sep or encoder not in ENCODERS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"--pairs takes MODELS=N ({' or '.join(ENCODERS)}, N a positive int), got {text!r}")
    return encoder, int(n)


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("runs", type=Path, help="the OUT folder of bench/gpu_before_after.sh")
    parser.add_argument("--commit", action="append", type=parse_commit, required=True,
                        help="LABEL=COMMIT, once per tree, in the order of the table")
    parser.add_argument("--pairs", action="append", type=parse_pairs, default=[],
                        help="MODELS=N: the pairs an earlier tree's runs of MODELS scored (their JSON does not say)")
    args = parser.parse_args(argv)
    commits = dict(args.commit)
    found, prov = collect(args.runs, commits, dict(args.pairs))
    if not found:
        raise SystemExit(f"no run of the labels {sorted(commits)} under {args.runs}")
    gpu = ((prov or {}).get("device") or {}).get("gpu") or {}
    there = ", ".join(f"{k} {v}" for k, v in ((prov or {}).get("versions") or {}).items()
                      if k in ("torch", "transformers", "tokenizers", "bert-score") and v)
    body = [f"Each tree's own `bench/bench_gpu.py` on {gpu.get('name', 'one CUDA device')} ({there}), one "
            "after another in one session (`bash bench/gpu_before_after.sh`), each measured once; pairs/s end to "
            "end with batch size 64, the ratio within the same run, the reward calls' medians (references "
            "cached, 8 completions per prompt; the base-size runs 3 calls each, the default 10).",
            {"table": "before_after"}]
    figures = {"commits": commits, "device": prov.get("device") if prov else None,
               "versions": prov.get("versions") if prov else None, "runs": found}
    harness.publish(args.out, "bench_gpu_cuda_before_after", "bench_gpu before and after, paired on one GPU",
                    figures, {"before_after": before_after_table(found, commits)}, body)


if __name__ == "__main__":
    main()
