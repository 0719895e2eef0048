"""Command line: ``torchmover score --hyps H --refs R [--refs R2] [options]``.

Reads one text per line (or one literal hypothesis ``--hyp TEXT`` with its references ``--ref TEXT``),
writes one score per line (``--all``: ``P R F1``; text or JSON lines) to ``--output`` (default:
standard output) and prints the mean and the signature to standard error.

``torchmover correlate --data RATINGS [options]`` scores human ratings (any layout of
:mod:`torchmover.evaluation.data`) and prints their correlation table (:mod:`torchmover.evaluation.correlation`), segment
level and, where the ratings name the systems, system level.

The command line is a thin layer: argparse options in, library calls, text out. Library modules never
import it.

``torchmover sensitivity --data RATINGS [--factors ...] [options]`` varies one preprocessing or metric
choice at a time and reports how much the correlation moves (:mod:`torchmover.evaluation.sensitivity`).

``torchmover show --hyp TEXT --ref TEXT --output plan.png [options]`` draws what one pair matched: the
token x token plan (or similarities) with each token's contribution (:mod:`torchmover.evaluation.show`).

``torchmover stress (--hyps H --refs R | --data RATINGS) [--sample N] [options]`` scores the degenerate
outputs a policy drifts to (padded, repeated, shuffled, truncated, empty) against the originals
(:mod:`torchmover.evaluation.stress`).

``torchmover serve [--port P] [--fit-references FILE] [options]`` serves the reward over HTTP
(OpenRLHF's remote reward protocol and ``POST /score``; :mod:`torchmover.integrations.server`), with
the settings the verl and OpenRLHF adapter files read (:mod:`torchmover.integrations.config`): the
``TORCHMOVER_CONFIG`` file, the ``TORCHMOVER_*`` variables, then its flags.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any, Callable, cast

from ._version import __version__
import torch
import torch.distributed as dist

from .evaluation.corpus import (FORMATS, Column, InputError, check_field_applies, check_output, format_rows, on_rank0,
                                read_lines, same_path, score_files)
from .evaluation.correlation import score_and_correlate
from .evaluation.data import HUB_PREFIX, read_ratings
from .evaluation.scoring import fit_to_call
from .evaluation.sensitivity import FACTORS, STATISTICS, run_sensitivity, select_per_group
from .integrations.config import RewardConfig, build_reward
from .integrations.server import RewardServer, ServerLimits, require_aiohttp
from .reward import BatchedReward
from .runtime.distributed import destroy_distributed, init_distributed_from_environment, is_distributed, is_rank0
from .runtime.checkpoint import atomic_write_text
from .runtime.progress import silenced
from .scorer import PRESETS, Scorer, ScorerConfig
from .scorer.config import SCORER_OPTIONS, RunOptions
from .scorer.corpus import SCORE_CHUNK
from .scorer.presets import preset_options, signature_options


class CLIError(Exception):
    """A user error: printed as ``torchmover: error: ...`` with exit status 2."""


def positive_int(value: str) -> int:
    """An argparse type: an int >= 1."""
    return _int_at_least(value, 1, "a positive integer")


def non_negative_int(value: str) -> int:
    """An argparse type: an int >= 0."""
    return _int_at_least(value, 0, "a non-negative integer")


def _int_at_least(value: str, low: int, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = low - 1
    if n < low:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}")
    return n


def at_least_two(value: str) -> int:
    """An argparse type: an int >= 2 (a correlation needs two segments)."""
    return _int_at_least(value, 2, "an integer >= 2 (a correlation needs two segments)")


def open_unit_interval(value: str) -> float:
    """An argparse type: a float strictly between 0 and 1 (a coverage)."""
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not 0 < x < 1:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1 (e.g. 0.95), got {value!r}")
    return x


def positive_number(value: str) -> float:
    """An argparse type: a finite float > 0."""
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value!r}")
    return x


def port_number(value: str) -> int:
    """An argparse type: a TCP port (0: a free one)."""
    n = non_negative_int(value)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"must be a port in [0, 65535], got {value!r}")
    return n


def _pass_cost(value: str) -> int | str | None:
    if value in ("auto", "none"):
        return None if value == "none" else value
    return _int_at_least(value, 0, "'auto', 'none' or an integer >= 0")


def _n_iter(value: str) -> int | None:
    return None if value == "converged" else _int_at_least(value, 1, "a positive integer or 'converged'")


def add_scorer_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that configure a :class:`~torchmover.Scorer`: ``--preset`` / ``--signature``, then one
    option per field of :class:`~torchmover.ScorerConfig` and :class:`~torchmover.scorer.config.RunOptions`,
    with the field's help text, in its group. Options left out take the preset's value (``--preset``),
    the signature's (``--signature``) or the Scorer's default: they are absent from the parsed
    arguments (a value read as None, ``--n-iter converged`` say, is given)."""
    groups = {"metric": parser.add_argument_group("metric")}
    groups["metric"].add_argument("--preset", choices=sorted(PRESETS), help="start from a named preset")
    groups["metric"].add_argument("--signature", help="start from the options a printed signature pins")
    for field in [*dataclasses.fields(ScorerConfig), *dataclasses.fields(RunOptions)]:
        meta = field.metadata
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        flag, kind = "--" + field.name.replace("_", "-"), str(field.type)
        if kind == "bool":
            group.add_argument(flag, action="store_const", const=True, default=argparse.SUPPRESS, help=meta["help"])
            continue
        readers: dict[str | None, Callable[[str], Any]] = {"iterations": _n_iter, "pass_cost": _pass_cost}
        reader = readers.get(meta.get("cli_type")) or (
            int if kind.startswith("int") else float if kind.startswith("float") else str)
        choices = meta.get("choices")
        group.add_argument(flag, type=reader, choices=choices() if choices else None, default=argparse.SUPPRESS,
                           help=meta["help"])
    groups["metric"].add_argument("--baseline-corpus", metavar="FILE",
                                  help="file, one text per line, for --rescale's baseline (default: the references)")
    groups["running"].add_argument("--batch-size", type=positive_int, default=64, metavar="N",
                                   help="texts encoded at once; scoring also pads a batch to at most N x twice "
                                        "the median length, and moves about 2N pairs of the median length at once "
                                        "(default: %(default)s)")
    groups["running"].add_argument("--no-progress", action="store_true",
                                   help="no progress bars (default: bars where standard error is a terminal)")


def given_scorer_options(args: argparse.Namespace, stopwords: list[str] | None = None) -> dict:
    """The Scorer options given as flags, a ``--stopwords`` file as its words: ``stopwords`` where given
    (read already), else read from it now (:func:`stopwords_of`)."""
    if args.preset and args.signature:
        raise CLIError("give --preset or --signature, not both")
    given = {k: getattr(args, k) for k in SCORER_OPTIONS if hasattr(args, k)}
    if stopword_file(args) is not None:
        given["stopwords"] = stopwords_of(args) if stopwords is None else stopwords
    return given


def stopwords_of(args: argparse.Namespace) -> list[str] | None:
    """The words of the ``--stopwords`` file, one a line (None: no file given)."""
    path = stopword_file(args)
    return None if path is None else [w.strip() for w in read_lines(path) if w.strip()]


def stopword_file(args: argparse.Namespace) -> str | None:
    """The file ``--stopwords`` names (None: no ``--stopwords``, or a named list such as ``english``)."""
    stopwords = getattr(args, "stopwords", None)
    return stopwords if isinstance(stopwords, str) and stopwords != "english" else None


def scorer_from_args(args: argparse.Namespace, references: list[str], hypotheses: list[str]):
    """The Scorer the options describe (:func:`build_scorer`), with its corpus statistics fitted on the
    call's texts (:func:`torchmover.evaluation.scoring.fit_to_call`): IDF on the references and
    hypotheses, a fixed/running centering mean on the references, the rescaling baseline on
    ``--baseline-corpus`` or the references."""
    scorer = build_scorer(args)
    return fit_to_call(scorer, references, hypotheses, batch_size=args.batch_size, progress=progress_of(args),
                       baseline_corpus=baseline_corpus_of(args))


def build_scorer(args: argparse.Namespace, stopwords: list[str] | None = None, encoder=None) -> Scorer:
    """The Scorer the options describe (:meth:`Scorer.from_config <torchmover.Scorer.from_config>`), its
    statistics not fitted yet. ``stopwords``: the words of the ``--stopwords`` file, read already (default:
    read now); ``encoder``: the options' encoder, loaded already (default: loaded now)."""
    given = given_scorer_options(args, stopwords)
    options = (preset_options(args.preset, **given) if args.preset
               else {**signature_options(args.signature, given.get("stopwords")), **given} if args.signature
               else given)
    run = {k: options.pop(k) for k in list(options) if k in RunOptions.__dataclass_fields__}
    scorer = Scorer.from_config(ScorerConfig(**options), encoder, **run)
    if getattr(args, "baseline_corpus", None) is not None and not scorer.config.rescale:
        raise CLIError("--baseline-corpus needs --rescale")
    return scorer


def baseline_corpus_of(args: argparse.Namespace) -> list[str] | None:
    """The texts of the ``--baseline-corpus`` file (None: none given)."""
    path = getattr(args, "baseline_corpus", None)
    return None if path is None else read_lines(path)


def encoder_scorer(args: argparse.Namespace) -> Scorer:
    """A scorer of the options, for its encoder, loaded before any file is read (:func:`run_score` loads
    it before joining the process group, where only rank 0 reads files): a ``--stopwords`` file, which
    chooses no encoder, is taken as no stopwords, and so is a ``--signature``'s stopword field.
    :func:`build_scorer` then makes the scorer of the file's words on its encoder."""
    if stopword_file(args) is None:
        return build_scorer(args)
    signature = args.signature and "|".join(f for f in args.signature.split("|") if not f.startswith("stop:"))
    return build_scorer(argparse.Namespace(**{**vars(args), "signature": signature}), stopwords=[])


def rank0_files(args: argparse.Namespace, device) -> tuple[list[str] | None, list[str] | None]:
    """The words of the ``--stopwords`` file and the texts of ``--baseline-corpus`` (None where not given),
    read by rank 0 of a ``torch.distributed`` job and sent to every rank, so that every rank uses rank
    0's (:func:`~torchmover.evaluation.corpus.on_rank0`: a file rank 0 cannot read is the same error on
    every rank); read here outside one. ``device``: where the broadcast travels."""
    group = dist.group.WORLD if is_distributed() else None
    return on_rank0(lambda: (stopwords_of(args), baseline_corpus_of(args)), device, group)


def progress_of(args: argparse.Namespace) -> bool | None:
    """``--no-progress``: no bar (and :func:`main` silences transformers' own); else the rule of
    :mod:`torchmover.runtime.progress` (bars where standard error is a terminal, on rank 0)."""
    return False if args.no_progress else None


def literal_texts(args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    """One literal hypothesis (``--hyp``) and its literal references (``--ref`` ...)."""
    if args.refs or not args.ref:
        raise CLIError("--hyp TEXT takes its references as --ref TEXT (one or more), not --refs FILE")
    return [args.hyp], [list(args.ref)]


def inputs_of(args: argparse.Namespace) -> dict[str, list[str]]:
    """The files (or directories) a command reads, by option: ``--hyps``, ``--refs`` (one or several),
    ``--data`` (not ``hub:NAME``), a ``--stopwords`` file and ``--baseline-corpus``."""
    refs, data = getattr(args, "refs", None), getattr(args, "data", None)
    options = {"--hyps": [getattr(args, "hyps", None)], "--refs": refs if isinstance(refs, list) else [refs],
               "--data": [None if data is None or data.startswith(HUB_PREFIX) else data],
               "--stopwords": [stopword_file(args)], "--baseline-corpus": [getattr(args, "baseline_corpus", None)]}
    return {option: [path for path in paths if path is not None] for option, paths in options.items()}


def input_column(path: str, field: str | None, option: str, default: str) -> Column:
    """The column of ``--hyps`` / ``--refs`` ``path``: the ``field`` given as ``option``, else ``default`` for
    a file with fields (JSON lines, Parquet, Arrow) and none for a text file. A field given for a file read
    as text is refused now, before the model loads (:func:`~torchmover.evaluation.corpus.check_field_applies`)."""
    if field is None:
        return Column(path, None if Column(path).format == "text" else default)
    try:
        check_field_applies(Column(path, field))
    except InputError as error:
        raise CLIError(f"{option} {field}: {error}") from None
    return Column(path, field)


def output_format(args: argparse.Namespace) -> str:
    """``--format``, else the format the ``--output`` suffix names: JSON lines for a suffix read as JSON lines
    (``.jsonl``, ``.ndjson``, ``.json``), else text."""
    if args.format is not None:
        return args.format
    return "jsonl" if args.output and FORMATS.get(Path(args.output).suffix.lower()) == "jsonl" else "text"


def run_score(args: argparse.Namespace) -> None:
    """``--hyp``: one literal pair, scored in memory (:func:`run_literal_score`). ``--hyps FILE``: the
    files, streamed, sharded under ``torchrun`` and resumable with ``--output``
    (:func:`torchmover.evaluation.corpus.score_files`); under ``torchrun`` only rank 0 reads the files,
    the ``--stopwords`` file and ``--baseline-corpus`` included (:func:`rank0_files`). An ``--output``
    that is a directory or one of the inputs is refused first."""
    if args.output:
        check_output(args.output, inputs_of(args))
    if args.hyp is not None:
        run_literal_score(args)
        return
    if args.ref:
        raise CLIError("--hyps FILE takes reference files as --refs FILE (one or more), not --ref TEXT")
    if not args.refs:
        raise CLIError("--hyps FILE needs its references: --refs FILE (one reference per hypothesis line; "
                       "repeat --refs for several)")
    hyps = input_column(args.hyps, args.hyp_field, "--hyp-field", "hyp")
    refs = [input_column(path, args.ref_field, "--ref-field", "ref") for path in args.refs]
    progress = progress_of(args)
    scorer = encoder_scorer(args)  # before joining the process group: loading a model in one leaves it referenced
    launched = init_distributed_from_environment(scorer.encoder.device)
    try:
        stopwords, baseline_corpus = rank0_files(args, scorer.encoder.device)
        if stopwords is not None:
            scorer = build_scorer(args, stopwords, encoder=scorer.encoder)
        result = score_files(scorer, hyps, refs, args.output, format=output_format(args), return_all=args.all,
                             chunk_pairs=args.chunk_size, batch_size=args.batch_size, progress=progress,
                             overwrite=args.overwrite, baseline_corpus=baseline_corpus)
        if is_rank0():
            if result.already_finished:
                print(f"torchmover: {args.output} is complete (run recorded in {args.output}.manifest.json): "
                      "nothing to do", file=sys.stderr)
            elif result.resumed:
                print(f"torchmover: resumed: {result.resumed} chunk(s) were already written", file=sys.stderr)
            print_summary(result.rows, result.means, result.signature)
    except BaseException:
        if launched:
            destroy_distributed(barrier=False)
        raise
    if launched:
        destroy_distributed()


def run_literal_score(args: argparse.Namespace) -> None:
    """Score one literal pair (``--hyp``, ``--ref``) in memory; an existing ``--output`` is replaced
    only with ``--overwrite`` (checked before scoring)."""
    hyps, refs = literal_texts(args)
    if args.output and Path(args.output).exists() and not args.overwrite:
        raise CLIError(f"{args.output} exists: give --overwrite to replace it, or another --output")
    scorer = scorer_from_args(args, refs[0], hyps)
    scores = scorer.score(hyps, refs, batch_size=args.batch_size, progress=progress_of(args), return_all=args.all)
    columns = list(scores._fields) if args.all else ["score"]
    scores = torch.stack(list(scores) if args.all else [scores]).double()
    text = format_rows(scores, 0, output_format(args), columns)
    if args.output:
        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)
    print_summary(1, dict(zip(columns, scores.mean(1).tolist())), scorer.signature)


def print_summary(rows: int, means: dict[str, float], signature: str) -> None:
    """The mean of each column and the signature, on standard error; with the three columns of ``--all``,
    the signature's direction is ``all`` (:func:`all_directions`)."""
    every_direction = len(means) == 3
    print(f"mean{' P R F1' if every_direction else ''}: {' '.join(f'{m:.6f}' for m in means.values())} (n={rows})",
          file=sys.stderr)
    print(f"signature: {all_directions(signature) if every_direction else signature}", file=sys.stderr)


def all_directions(signature: str) -> str:
    """The signature of ``--all``'s output: ``direction:all`` where the scorer has a direction, since the
    columns are its precision, recall and F1 (a member without directions prints its score thrice)."""
    return "|".join("direction:all" if field.startswith("direction:") else field for field in signature.split("|"))


def require(module: str, extra: str, option: str) -> None:
    """Refuse, before any work, an option whose optional dependency cannot be imported."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise CLIError(f"{option} needs {module}, which is not installed: pip install \"torchmover[{extra}]\"") from None


def prepare_outputs(args: argparse.Namespace, outputs: dict[str, str | None]) -> None:
    """Before any work, for each output file given (``outputs``: the path of each option, None where not
    given): refuse a directory or one of the command's inputs (:func:`inputs_of`,
    :func:`~torchmover.evaluation.corpus.check_output`), create its folder, and refuse a folder that
    cannot be written, so that a path that cannot be written fails now, not after the scoring."""
    inputs = inputs_of(args)
    for option, path in outputs.items():
        if path is None:
            continue
        check_output(path, inputs, option, holds=functools.partial(same_path, path))
        folder = Path(path).parent
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise CLIError(f"{option} {path}: cannot write in {folder} (permission denied)")


def add_ratings_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the human ratings come from (``correlate``, ``sensitivity``)."""
    parser.add_argument("--data", required=True,
                        help="ratings: a .tsv file or directory, a .jsonl file, a WMT17 directory "
                             "(DA-seglevel.csv), a WMT DAseg directory, a .parquet file in COMET's DA schema, or "
                             "hub:NAME, a DA dataset on the model hub (e.g. hub:RicardoRei/wmt-da-human-evaluation; "
                             "needs torchmover[hub])")
    add_rating_filters(parser)


def add_rating_filters(parser) -> None:
    """``--year`` and ``--lp``: which ratings to keep."""
    parser.add_argument("--year", type=int, help="keep only this year's ratings (JSON lines: the year of the records "
                                                 "without a 'year' key)")
    parser.add_argument("--lp", metavar="PAIR", help="keep only this language pair's ratings, e.g. de-en")


def ratings_of(args: argparse.Namespace) -> list:
    """The ratings of ``--data``, those of ``--year`` and ``--lp`` where given; none is an error."""
    records = read_ratings(args.data, args.year, args.lp)
    if not records:
        kept = " ".join(f"--{name} {getattr(args, name)}" for name in ("year", "lp") if getattr(args, name) is not None)
        raise CLIError(f"no ratings in {args.data}" + (f" with {kept}" if kept else ""))
    return records


def add_correlate_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``torchmover correlate``: the ratings, the metric (as for ``score``), the report."""
    add_ratings_arguments(parser)
    add_scorer_arguments(parser)
    g = parser.add_argument_group("report")
    g.add_argument("--n-boot", type=non_negative_int, default=1000,
                   help="bootstrap resamples; 0: no intervals (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    g.add_argument("--confidence", type=open_unit_interval, default=0.95,
                   help="interval coverage, between 0 and 1 (default: %(default)s)")
    g.add_argument("--json", metavar="OUT", help="also write the report as JSON here")
    g.add_argument("--plot", metavar="OUT.png", help="also write scatter plots here (needs matplotlib)")


def run_correlate(args: argparse.Namespace) -> None:
    """Read ratings, score them, print the correlation table; write ``--json`` / ``--plot``."""
    if args.plot:
        require("matplotlib", "plot", "--plot")
    prepare_outputs(args, {"--json": args.json, "--plot": args.plot})
    records = ratings_of(args)
    scorer = scorer_from_args(args, [r.ref for r in records], [r.hyp for r in records])
    report = score_and_correlate(scorer, records, args.batch_size, n_boot=args.n_boot, seed=args.seed,
                                 confidence=args.confidence, progress=progress_of(args))
    print(report.to_table())
    if report.system_level is None:
        print("system level: not reported (the ratings do not name every segment's system)", file=sys.stderr)
    if args.json:
        atomic_write_text(args.json, report.to_json() + "\n")
    if args.plot:
        report.plot(args.plot)


def add_sensitivity_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``torchmover sensitivity``: the ratings, the base metric (as for ``score``), the
    factors and the outputs."""
    add_ratings_arguments(parser)
    parser.add_argument("--factors", help=f"comma-separated, from {','.join(FACTORS)} "
                                          "(default: every factor that applies to the method)")
    parser.add_argument("--max-per-group", type=at_least_two, metavar="N",
                        help="use the first N records of each lp/year group (bounds the cost)")
    add_scorer_arguments(parser)
    parser.set_defaults(batch_size=32)  # the TWMD paper's batch size, fixed across variants
    g = parser.add_argument_group("report")
    g.add_argument("--statistic", choices=STATISTICS, default="pearson",
                   help="for the printed table and the plot (default: %(default)s)")
    g.add_argument("--json", metavar="OUT", help="also write the report as JSON here")
    g.add_argument("--plot", metavar="OUT.png", help="also write the plot here (needs matplotlib)")


def run_sensitivity_command(args: argparse.Namespace) -> None:
    """Read ratings, run :func:`~torchmover.evaluation.sensitivity.run_sensitivity` from the options' base Scorer,
    print the table and write ``--json`` / ``--plot``."""
    if args.plot:
        require("matplotlib", "plot", "--plot")
    prepare_outputs(args, {"--json": args.json, "--plot": args.plot})
    records = select_per_group(ratings_of(args), args.max_per_group)
    progress = progress_of(args)  # one bar, run_sensitivity's (it refits every variant)
    base = build_scorer(args)
    base = fit_to_call(base, [r.ref for r in records], [r.hyp for r in records], batch_size=args.batch_size,
                       progress=False, baseline_corpus=baseline_corpus_of(args))
    report = run_sensitivity(records, base, factors=args.factors, batch_size=args.batch_size, progress=progress)
    print(report.to_table(args.statistic))
    if args.json:
        atomic_write_text(args.json, report.to_json() + "\n")
    if args.plot:
        report.plot(args.plot, statistic=args.statistic)


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``torchmover show``: the pair, the picture, the metric (as for ``score``)."""
    parser.add_argument("--hyp", metavar="TEXT", required=True, help="the hypothesis, as literal text")
    parser.add_argument("--ref", metavar="TEXT", required=True, help="its reference, as literal text")
    parser.add_argument("--output", metavar="OUT.png", required=True,
                        help="the picture to write: .png, .svg or .pdf (needs matplotlib: torchmover[plot])")
    add_scorer_arguments(parser)


def run_show(args: argparse.Namespace) -> None:
    """Draw the pair's token match (:func:`torchmover.evaluation.show.show`) and print its score, the
    path written and the signature."""
    from .evaluation.show import picture_path, show

    require("matplotlib", "plot", "show")
    try:
        picture_path(args.output)
    except ValueError:
        raise CLIError(f"--output must end in .png, .svg or .pdf, got {args.output!r}") from None
    prepare_outputs(args, {"--output": args.output})
    scorer = scorer_from_args(args, [args.ref], [args.hyp])
    match = show(scorer, args.hyp, args.ref, args.output)
    print(f"{match.score:.6f}")
    print(f"torchmover: wrote {args.output}", file=sys.stderr)
    print(f"signature: {match.signature}", file=sys.stderr)


def add_stress_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``torchmover stress``: the pairs (files or ratings), the sample, the metric, the report."""
    pairs = parser.add_argument_group("pairs", "files of hypotheses and references, or the pairs of human ratings")
    pairs.add_argument("--hyps", metavar="FILE", help="one hypothesis per line (with --refs)")
    pairs.add_argument("--refs", metavar="FILE", help="one reference per line, aligned with --hyps")
    pairs.add_argument("--data", metavar="RATINGS", help="the (hyp, ref) pairs of ratings in any layout "
                                                         "correlate reads (instead of --hyps / --refs)")
    add_rating_filters(pairs)
    pairs.add_argument("--sample", type=positive_int, metavar="N",
                       help="score N pairs drawn at random with --seed (default: every pair)")
    pairs.add_argument("--seed", type=int, default=0, help="seed of the sample and of the variants (default: 0)")
    add_scorer_arguments(parser)
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON here")


def run_stress(args: argparse.Namespace) -> None:
    """Score every pair and its degenerate variants; print the table (with the flags and their fixes)."""
    import random

    from .evaluation.stress import stress_test

    prepare_outputs(args, {"--json": args.json})
    if args.data is not None:
        if args.hyps or args.refs:
            raise CLIError("give --data RATINGS or --hyps FILE --refs FILE, not both")
        records = ratings_of(args)
        hyps, refs = [r.hyp for r in records], [r.ref for r in records]
    elif args.hyps and args.refs:
        hyps, refs = read_lines(args.hyps), read_lines(args.refs)
        if len(hyps) != len(refs):
            raise CLIError(f"{args.hyps} has {len(hyps)} lines, {args.refs} has {len(refs)}: give one reference per "
                           "hypothesis")
    else:
        raise CLIError("give the pairs: --hyps FILE --refs FILE, or --data RATINGS")
    if not hyps:
        raise CLIError("no pairs to score")
    if args.sample is not None and args.sample < len(hyps):
        chosen = random.Random(args.seed).sample(range(len(hyps)), args.sample)
        hyps, refs = [hyps[i] for i in chosen], [refs[i] for i in chosen]
    scorer = scorer_from_args(args, refs, hyps)
    report = stress_test(scorer, hyps, refs, seed=args.seed)
    print(report.to_table())
    if args.json:
        atomic_write_text(args.json, report.to_json() + "\n")


# Reward settings given by the scorer's own flags (--model, --device, --preset, --layer, ...)
_SCORER_SETTINGS = SCORER_OPTIONS | {"preset", "options"}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``torchmover serve``: the server's, the scorer's, then one flag per reward setting
    (:class:`~torchmover.integrations.config.RewardConfig`) that the scorer's flags do not give."""
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0: all)")
    g.add_argument("--port", type=port_number, default=8000, help="default: 8000; 0: a free port (printed)")
    add_limit_arguments(parser)
    add_scorer_arguments(parser)
    r = parser.add_argument_group("reward settings", "each is also the variable TORCHMOVER_<NAME> or the key "
                                  "<name> of the TORCHMOVER_CONFIG file, as for the verl and OpenRLHF adapters; "
                                  "a flag wins over a variable, a variable over the file")
    for setting in dataclasses.fields(RewardConfig):
        if setting.name in _SCORER_SETTINGS:
            continue
        # a field without a default has a default_factory (every setting has a default)
        default = cast(Callable[[], Any], setting.default_factory)() if setting.default is dataclasses.MISSING \
            else setting.default
        const = setting.metadata.get("flag_const")
        r.add_argument("--" + setting.name.replace("_", "-"), dest=setting.name, nargs="?" if const else None,
                       const=const, help=setting.metadata["help"] + ("" if default is None else f" (default: {default})"))


def serve_config(args: argparse.Namespace) -> RewardConfig:
    """The reward settings: the config file and variables (:meth:`RewardConfig.from_env`), then the flags."""
    if args.baseline_corpus is not None:
        raise CLIError("serve fits the rescaling baseline on --fit-references; --baseline-corpus does not apply")
    options = given_scorer_options(args)
    if args.signature:
        options = {**signature_options(args.signature, options.get("stopwords")), **options}
    flags = {name: options.pop(name) for name in ("model", "device") if name in options}
    flags.update({s.name: getattr(args, s.name) for s in dataclasses.fields(RewardConfig)
                  if s.name not in _SCORER_SETTINGS and getattr(args, s.name) is not None})
    if args.preset:
        flags["preset"] = args.preset
    if options:
        flags["options"] = options
    return RewardConfig.from_env(flags=flags)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The "limits" group of ``torchmover serve``: one option per field of
    :class:`~torchmover.integrations.server.ServerLimits`, with its help text; left out, its default."""
    g = parser.add_argument_group("limits", "what one request or client may take of the server (timeouts in seconds)")
    defaults = ServerLimits()
    for field in dataclasses.fields(ServerLimits):
        default = getattr(defaults, field.name) if field.name != "max_connections" else None
        g.add_argument("--" + field.name.replace("_", "-"), type=positive_int if field.type == "int" else positive_number,
                       default=default, help=field.metadata["help"] + ("" if default is None else f" (default: {default})"))


def limits_from_args(args: argparse.Namespace) -> dict:
    """The :class:`~torchmover.integrations.server.ServerLimits` fields the options give (those left
    at None take their default)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerLimits) if getattr(args, f.name) is not None}


class _Terminated(Exception):
    """Raised in the main thread by SIGTERM while serving."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise _Terminated


def run_serve(args: argparse.Namespace) -> None:
    try:
        require_aiohttp()
    except ImportError as error:
        raise CLIError(str(error)) from None
    config = serve_config(args)
    reward = build_reward(config, batch_size=args.batch_size, progress=not args.no_progress)
    with BatchedReward(reward, max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms) as batched:
        server = RewardServer(batched, config=config, host=args.host, port=args.port, **limits_from_args(args))
        previous = signal.signal(signal.SIGTERM, _terminate)  # as SIGINT: drain, then exit 0
        try:
            with server:
                print(f"torchmover: serving on {server.url} (POST /get_reward, /score; GET /health)", file=sys.stderr, flush=True)
                print(f"signature: {server.reward.signature}", file=sys.stderr, flush=True)
                try:
                    server.wait()
                except (KeyboardInterrupt, _Terminated):
                    print(f"torchmover: stopping: answering the requests in flight (at most "
                          f"{server.limits.drain_timeout:g} s)", file=sys.stderr, flush=True)
        finally:
            signal.signal(signal.SIGTERM, previous)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchmover", description="Score generated text against references by moving contextual word "
                                       "embeddings (TWMD and its family); each subcommand has its own --help.")
    parser.add_argument("--version", action="version", version=f"torchmover {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    score = commands.add_parser("score", help="score hypotheses against references, one text per line")
    hyps = score.add_mutually_exclusive_group(required=True)
    hyps.add_argument("--hyps", help="file with one hypothesis per line (with --refs FILE)")
    hyps.add_argument("--hyp", metavar="TEXT", help="one hypothesis given as literal text (with --ref TEXT)")
    score.add_argument("--refs", action="append", default=[],
                       help="file with one reference per line; repeat for several references")
    score.add_argument("--ref", metavar="TEXT", action="append", default=[],
                       help="a reference of --hyp as literal text; repeat for several references")
    score.add_argument("--hyp-field", metavar="NAME",
                       help="the field (column) of the hypotheses in a JSON lines (.jsonl, .ndjson, .json), Parquet or "
                            "Arrow file (default: hyp); a file of another suffix is text and has none")
    score.add_argument("--ref-field", metavar="NAME",
                       help="the field (column) of the references in a JSON lines, Parquet or Arrow file: a text or "
                            "a list of texts (default: ref)")
    score.add_argument("--all", action="store_true", help="print precision, recall and F1 per line (P R F1)")
    score.add_argument("--output", help="write scores here (default: standard output); a run writing a file "
                                        "resumes where it stopped when rerun")
    score.add_argument("--format", choices=("text", "jsonl"),
                       help="text: one score per line (--all: P R F1); jsonl: one JSON object per line with its "
                            "line number (default: jsonl for an --output ending in .jsonl, .ndjson or .json, "
                            "else text)")
    score.add_argument("--chunk-size", type=positive_int, default=SCORE_CHUNK, metavar="PAIRS",
                       help=f"pairs read, scored and written at once: memory grows with it (default: {SCORE_CHUNK})")
    score.add_argument("--overwrite", action="store_true",
                       help="replace --output (and the record of an earlier run) instead of refusing or resuming")
    add_scorer_arguments(score)
    score.set_defaults(run=run_score)

    correlate = commands.add_parser("correlate", help="correlate the metric with human ratings, per language pair")
    add_correlate_arguments(correlate)
    correlate.set_defaults(run=run_correlate)

    sensitivity = commands.add_parser("sensitivity", help="how much each choice moves the correlation with humans")
    add_sensitivity_arguments(sensitivity)
    sensitivity.set_defaults(run=run_sensitivity_command)

    show = commands.add_parser("show", help="draw what one pair matched: the token x token plan and each token's "
                                            "contribution to the score")
    add_show_arguments(show)
    show.set_defaults(run=run_show)

    stress = commands.add_parser("stress", help="would a policy gain by padding, repeating, shuffling or truncating "
                                                "its outputs? (degenerate outputs against the reward)")
    add_stress_arguments(stress)
    stress.set_defaults(run=run_stress)

    serve = commands.add_parser("serve", help="serve the reward over HTTP (OpenRLHF remote reward protocol, /score)")
    add_serve_arguments(serve)
    serve.set_defaults(run=run_serve)
    return parser


_PYTHON_OPTION = re.compile(r"\b([a-z_]+)=('([^']*)'|\"([^\"]*)\"|(-?[0-9][0-9.e+-]*))")


def cli_syntax(message: str) -> str:
    """A library message's ``option='value'`` hints (Python keyword syntax) as ``--option value``, for
    the options the command line has (:data:`~torchmover.scorer.config.SCORER_OPTIONS`)."""
    def option(match: re.Match) -> str:
        name = match[1]
        if name not in SCORER_OPTIONS:
            return match[0]
        value = next(v for v in match.groups()[2:] if v is not None)
        return f"--{name.replace('_', '-')} {value}"
    return _PYTHON_OPTION.sub(option, message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with silenced(getattr(args, "no_progress", False)):  # --no-progress: every bar, transformers' too
            args.run(args)
    except BrokenPipeError:
        return stdout_closed()
    except (CLIError, ValueError, TypeError, OSError, ImportError) as error:
        parser.exit(2, f"torchmover: error: {cli_syntax(str(error))}\n")
    return 0


def stdout_closed() -> int:
    """What a Unix tool does when the reader of its standard output goes away (``torchmover score ... | head``):
    stop quietly, with the status of a process ended by SIGPIPE (128 + 13). Standard output is pointed at
    the null device first, so that flushing it at exit raises nothing (Python's documentation of SIGPIPE)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141  # 128 + SIGPIPE
