"""How much each undocumented choice moves the metric's correlation with human judgements: the library's
sensitivity analysis (``torchmover sensitivity``, :func:`torchmover.evaluation.sensitivity.run_sensitivity`:
one factor at a time from a base configuration, Pearson r and Kendall τ-b per language pair and year),
published with its provenance.

The figures are the report's JSON (``SensitivityReport.to_dict``); the tables are computed from them:
the CV (%) of Pearson r per factor and group (``cv``) and the documentation's summary (``docs_cv``, the
average CV per factor, largest first). The result in ``docs/results.md`` was measured around TWMD-b
(layer 4, T = 0.15, batch centering; 2,000 pairs, 99 s on the 2-core CPU)::

    python bench/studies/sensitivity.py --max-per-group 200 --options '{"centering": "batch", "temperature": 0.15}'
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

LABELS = {"idf": "IDF corpus"}  # a factor's name in the documentation's table, where it differs


def cv_table(figures: dict) -> dict:
    """The CV (%) of Pearson r across each factor's levels, per group and their average."""
    groups = figures["groups"]
    return harness.table(["factor", *(g[:-4] + g[-2:] for g in groups), "**avg**"],  # cs-en/2015 as cs-en/15
                         [[f["factor"], *(f"{f['cv_pearson'][g]:.2f}" for g in groups),
                           f"**{f['cv_pearson']['average']:.2f}**"] for f in figures["factors"]],
                         "-" + "r" * (len(groups) + 1))


def docs_table(figures: dict) -> dict:
    """The table of ``docs/results.md`` (``docs_cv``): each factor's average CV (%) of Pearson r, the
    largest first."""
    factors = sorted(figures["factors"], key=lambda f: -f["cv_pearson"]["average"])
    return harness.table([LABELS.get(f["factor"], f["factor"]) for f in factors],
                         [[f"{f['cv_pearson']['average']:.2f}" for f in factors]])


def main(argv=None) -> None:
    parser = harness.wmt_parser(__doc__)
    parser.add_argument("--max-per-group", type=int, default=200,
                        help="the first N ratings of each language pair and year (default: %(default)s)")
    parser.add_argument("--factors", help="comma-separated (default: every factor that applies)")
    parser.add_argument("--options", default="{}", help="the base configuration's Scorer options, a JSON object "
                                                        "(default: {}, the default scorer)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per batch (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    args = parser.parse_args(argv)
    import torch

    from torchmover.evaluation.data import read_tsv_dir
    from torchmover.evaluation.sensitivity import run_sensitivity, select_per_group

    if args.threads:
        torch.set_num_threads(args.threads)
    options = json.loads(args.options)
    records = select_per_group(read_tsv_dir(args.data), args.max_per_group)
    report = run_sensitivity(records, options, factors=args.factors, batch_size=args.batch_size)  # a bar on a terminal
    figures = report.to_dict()
    harness.publish(args.out, "sensitivity" + harness.model_suffix(options.get("model")),
                    "Sensitivity of the correlation with humans to each choice", figures,
                    {"cv": cv_table(figures), "docs_cv": docs_table(figures)}, [
                        f"`run_sensitivity` around `{figures['base']}`, {figures['n_records']} ratings (the first "
                        f"{args.max_per_group} of each language pair and year), batch size {figures['batch_size']}; "
                        f"{figures['seconds']:.0f} s. CV (%) of Pearson r across each factor's levels:",
                        {"table": "cv"}, "## The table of the documentation", {"table": "docs_cv"}],
                    data=harness.data_provenance(args.data, max_per_group=args.max_per_group))


if __name__ == "__main__":
    main()
