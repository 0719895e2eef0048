"""torchmover's default, bert_score and MoverScore v2 on the same encoder, untuned and fine-tuned (WMT15-16).

For one encoder (``--model``: the default ``all-MiniLM-L6-v2`` or a local directory, e.g. of the
base-size ``all-mpnet-base-v2``), every system scores all of ``--data`` (5,344 WMT15-16 DA pairs)
and is reported as its segment-level Pearson r with the human scores, averaged over the 10
language-pair × year groups, and over the 6 WMT16 groups (the test year of the fine-tuning recipe):

- **torchmover default**: ``Scorer(model).score(hyps, refs)``, the model's recorded defaults
  (``DEFAULT_LAYERS`` / ``MODEL_DEFAULTS``, chosen by ``bench/studies/select_defaults.py``);
- **bert_score F1**: ``bert_score.BERTScorer(model_type=<dir>, num_layers=--bert-score-layer)`` — the
  layer chosen the same way, by the best average r on WMT15-16 (``bench/studies/robustness.py``'s
  ``bert_score F1 (special=target)`` row, which computes bert_score's rule at every layer);
- **MoverScore v2**: ``moverscore_v2.word_mover_score`` as its README runs it (its last layer, IDF
  dictionaries of the references and of the hypotheses, ``n_gram=1``, subwords removed, no
  stopwords), run unmodified through ``bench/bench_peers.py``'s run-time shim on the local model;
- **fine-tuned** (``--finetuned DIR``, a ``recipes/finetune_wmt.py`` run's ``final/``, trained on
  WMT15): ``Scorer.from_pretrained(DIR).score`` on WMT16.

Each system runs in its own subprocess (MoverScore's shim replaces ``transformers`` while it is
imported). Command (from the repository root)::

    python bench/studies/base_encoder.py --data ../shared/data/wmt15-16 --model <dir> --bert-score-layer L \\
        [--finetuned runs/.../final ...] --out bench/results/

Writes ``base_encoder[_<name>].md`` and ``.json`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402
from harness import package_version, wmt_parser  # noqa: E402

SYSTEMS = ("torchmover", "bert_score", "moverscore", "finetuned")


def group_pearson(rows: list[dict], scores: list[float]) -> dict[str, float]:
    """Pearson r per ``lp year`` group (``torchmover.evaluation.correlation.correlate``)."""
    from torchmover.evaluation.correlation import correlate

    report = correlate(scores, [r["score"] for r in rows], [f"{r['lp']} {r['year']}" for r in rows], n_boot=0)
    return {g.name: g.pearson.value for g in report.groups}


# --- one system (in a subprocess) -------------------------------------------------------------------

def score_torchmover(model: str, hyps, refs) -> tuple[list[float], str]:
    from torchmover import Scorer

    scorer = Scorer(model, device="cpu")
    return scorer.score(hyps, refs, batch_size=64).tolist(), scorer.signature


def score_bert_score(model: str, layer: int, hyps, refs) -> tuple[list[float], str]:
    import bert_score

    from torchmover.text.encoder import resolve_model_path

    path = resolve_model_path(model)  # the default model's offline directory
    scorer = bert_score.BERTScorer(model_type=path, num_layers=layer, batch_size=64, device="cpu", nthreads=0)
    _, _, f = scorer.score(hyps, refs, batch_size=64)
    return f.tolist(), scorer.hash.replace(path, "<dir>")


def score_moverscore(model: str, hyps, refs) -> tuple[list[float], str]:
    from bench_peers import import_moverscore

    from torchmover.text.encoder import resolve_model_path

    ms = import_moverscore(resolve_model_path(model))  # the full model: hidden_states[-1] is its last layer, as MoverScore reads
    idf_ref, idf_hyp = ms.get_idf_dict(refs, nthreads=1), ms.get_idf_dict(hyps, nthreads=1)
    scores = []
    for i in range(0, len(refs), 256):
        scores += ms.word_mover_score(refs[i:i + 256], hyps[i:i + 256], idf_ref, idf_hyp, stop_words=[], n_gram=1,
                                      remove_subwords=True, batch_size=256, device="cpu")
    return [float(s) for s in scores], f"moverscore_v2 {package_version('moverscore')}, IDF refs/hyps, last layer"


def score_finetuned(path: str, hyps, refs) -> tuple[list[float], str]:
    from torchmover import Scorer

    scorer = Scorer.from_pretrained(path, device="cpu")
    return scorer.score(hyps, refs, batch_size=64).tolist(), scorer.signature


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    rows = harness.wmt_sample(args.data, None, args.seed)  # every row (the order does not change a score)
    if args.worker == "finetuned":
        rows = [r for r in rows if r["year"] == 2016]
    hyps, refs = [r["hyp"] for r in rows], [r["ref"] for r in rows]
    t = time.perf_counter()
    if args.worker == "torchmover":
        scores, signature = score_torchmover(args.model, hyps, refs)
    elif args.worker == "bert_score":
        scores, signature = score_bert_score(args.model, args.bert_score_layer, hyps, refs)
    elif args.worker == "moverscore":
        scores, signature = score_moverscore(args.model, hyps, refs)
    else:
        scores, signature = score_finetuned(args.finetuned_path, hyps, refs)
    result = {"system": args.worker, "signature": signature, "seconds": time.perf_counter() - t,
              "groups": group_pearson(rows, scores)}
    Path(args.result).write_text(json.dumps(result))


# --- driver -----------------------------------------------------------------------------------------

def run_system(args, system: str, result: Path, finetuned: str | None = None) -> dict:
    """Run ``system`` in a subprocess, unless ``result`` already holds its output (resumable)."""
    if not result.is_file():
        command = [sys.executable, __file__, "--worker", system, "--result", str(result), "--data", str(args.data),
                   "--model", args.model, "--threads", str(args.threads), "--seed", str(args.seed)]
        if args.bert_score_layer:
            command += ["--bert-score-layer", str(args.bert_score_layer)]
        if finetuned:
            command += ["--finetuned-path", finetuned]
        subprocess.run(command, check=True)
    return json.loads(result.read_text())


def averages(groups: dict[str, float]) -> dict[str, float]:
    out = {"wmt16": float(np.mean([r for g, r in groups.items() if g.endswith("2016")]))}
    if len(groups) > len([g for g in groups if g.endswith("2016")]):
        out["wmt15-16"] = float(np.mean(list(groups.values())))
    return out


def report(args, results: dict[str, dict], name: str) -> str:
    """The report's body (Markdown)."""
    lines = ["Segment-level Pearson r with the human DA scores, averaged over the language-pair × year groups "
             "(WMT15-16: 10 groups; WMT16: its 6, the fine-tuning recipe's test year). Fine-tuned: trained on "
             "WMT15 (minus its dev split) by `recipes/finetune_wmt.py`, so only WMT16 is held out for it.", "",
             "| system | WMT15-16 r | WMT16 r | signature / setting |", "|---|---|---|---|"]
    for label, res in results.items():
        avg = averages(res["groups"])
        wmt1516 = f"{avg['wmt15-16']:.4f}" if "wmt15-16" in avg else "–"
        signature = res["signature"].replace("|", "\\|")  # a table cell
        lines.append(f"| {label} | {wmt1516} | {avg['wmt16']:.4f} | `{signature}` |")
    return "\n".join(lines + [""])


def main(argv=None) -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2",
                        help="encoder: the default model or a local directory (default: %(default)s)")
    parser.add_argument("--bert-score-layer", type=int, help="bert_score's num_layers (chosen on WMT15-16)")
    parser.add_argument("--finetuned", nargs="*", help="fine-tuned scorers (the recipe's final/ directories)")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS[:3], default=list(SYSTEMS[:3]),
                        help="the untuned systems to run (default: all three)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--work", type=Path, help="keep each system's result here, to resume (default: a folder "
                                                  "in the temporary directory)")
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--finetuned-path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if "bert_score" in args.systems and not args.bert_score_layer:
        raise SystemExit("--bert-score-layer is needed (bench/studies/robustness.py chooses it on WMT15-16)")
    import tempfile

    from torchmover import Scorer

    name = Scorer(args.model, device="cpu").config.model
    work = args.work or Path(tempfile.gettempdir()) / f"base_encoder_{name.rsplit('/', 1)[-1]}"
    work.mkdir(parents=True, exist_ok=True)
    labels = {"torchmover": "torchmover default (untuned)", "bert_score": f"bert_score F1, layer {args.bert_score_layer}",
              "moverscore": "MoverScore v2"}
    results = {labels[system]: run_system(args, system, work / f"{system}.json") for system in args.systems}
    for k, path in enumerate(args.finetuned or []):
        results[f"torchmover fine-tuned ({Path(path).parent.name})"] = run_system(
            args, "finetuned", work / f"finetuned-{k}.json", path)
    harness.publish(args.out, "base_encoder" + harness.model_suffix(name),
                    f"torchmover, bert_score and MoverScore v2 on `{name}` (WMT15-16 DA)", results,
                    body=[report(args, results, name)], data=harness.data_provenance(args.data))


if __name__ == "__main__":
    main()
