"""How often the toy summarizer's sampled summaries name the right person and city.

Reads the final models of a ``recipes/self_critical_summarization.py --model tiny --compare-mle`` run
(``warmstart``, ``mle``, ``mixed``) and samples ``--samples`` summaries for each of the 40 held-out
documents of the shipped toy data (fixed seed); prints, per phase, the share whose first word is the
reference's name and whose last word is its city; publishes ``self_critical_names`` into ``--out``.
``self_critical_toy.py`` counts the same for its runs (bench/results/self_critical_toy.md)::

    python bench/studies/self_critical_names.py runs/toy_scst runs/toy_scst_seed1 ...
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "recipes"), str(REPO / "bench")]

import harness  # noqa: E402
import self_critical_summarization as recipe  # noqa: E402

PHASES = ("warmstart", "mle", "mixed")


def name_and_city_rates(run_dir: Path, phase: str, rows: list[dict], samples: int) -> tuple[float, float]:
    from transformers import AutoModelForSeq2SeqLM, PreTrainedTokenizerFast

    path = run_dir / phase / "final"
    model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    options = recipe.build_parser().parse_args(["--output-dir", "unused", "--max-target-length", "24"])
    options.source_prefix = ""
    torch.manual_seed(12345)
    names = cities = n = 0
    for start in range(0, len(rows), options.batch_size):
        chunk = rows[start:start + options.batch_size]
        batch = recipe.Batch(chunk, tokenizer, options)
        for _ in range(samples):
            _, texts = recipe.decode(model, tokenizer, batch.inputs, options.max_target_length, sample=True)
            for text, row in zip(texts, chunk):
                reference, words = row["summary"].rstrip(".").lower().split(), text.replace(" .", "").split()
                names += bool(words) and words[0] == reference[0]
                cities += bool(words) and words[-1] == reference[-1]
                n += 1
    return names / n, cities / n


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="--output-dir of recipe runs")
    parser.add_argument("--samples", type=int, default=8, help="samples per document (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    args = parser.parse_args(argv)
    held_out = recipe.make_toy_dataset()[-40:]
    rates = {str(run_dir): {phase: name_and_city_rates(run_dir, phase, held_out, args.samples) for phase in PHASES}
             for run_dir in args.runs}
    table = harness.table(["run", *(f"{p}: name / city" for p in PHASES)],
                          [[run, *(f"{a:.2f} / {b:.2f}" for a, b in r.values())] for run, r in rates.items()])
    harness.publish(args.out, "self_critical_names", "Sampled toy summaries that name the right person and city",
                    rates, {"rates": table}, [f"{args.samples} samples for each of the 40 held-out documents.",
                                              {"table": "rates"}])


if __name__ == "__main__":
    main()
