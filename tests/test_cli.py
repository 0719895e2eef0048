import json
import re

import pytest

from torchmover.cli import main


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def run(tmp_path, tiny_model_dir, *extra):
    hyps = write(tmp_path / "hyps.txt", ["the cat sat", "", "a dog barked"])
    refs = write(tmp_path / "refs.txt", ["a cat sat", "the sun", "the dog barked"])
    return main(["score", "--hyps", hyps, "--refs", refs, "--model", str(tiny_model_dir), "--layer", "2",
                 "--no-progress", *extra])


def test_text_output_mean_and_signature(tmp_path, tiny_model_dir, capsys):
    assert run(tmp_path, tiny_model_dir) == 0
    out, err = capsys.readouterr()
    scores = [float(line) for line in out.splitlines()]
    assert len(scores) == 3 and scores[1] == 0.0 and scores[0] > 0
    mean = float(next(line for line in err.splitlines() if line.startswith("mean: ")).split()[1])
    assert mean == pytest.approx(sum(scores) / 3, abs=2e-6) and "(n=3)" in err
    assert "signature: twmd|model:" in err and "layer:2" in err


def test_jsonl_output_to_file_with_two_reference_files(tmp_path, tiny_model_dir, capsys):
    refs2 = write(tmp_path / "refs2.txt", ["the cat sat", "the sun", "dogs bark"])
    output = tmp_path / "scores.jsonl"
    assert run(tmp_path, tiny_model_dir, "--refs", refs2, "--format", "jsonl", "--output", str(output)) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert rows[0]["score"] == pytest.approx(1.0, abs=1e-5)  # identical second reference wins (max)


def test_fixed_centering_is_fitted_on_the_references(tmp_path, tiny_model_dir, capsys):
    assert run(tmp_path, tiny_model_dir, "--centering", "fixed") == 0
    assert "center:fixed-" in capsys.readouterr().err


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["score", "--hyps", str(tmp_path / "missing.txt"), "--refs", str(tmp_path / "missing.txt")])
    assert exit_info.value.code == 2
    assert "no such file" in capsys.readouterr().err


def test_mismatched_line_counts_are_a_clear_error(tmp_path, tiny_model_dir, capsys):
    short = write(tmp_path / "short.txt", ["one line"])
    with pytest.raises(SystemExit) as exit_info:
        run(tmp_path, tiny_model_dir, "--refs", short)
    assert exit_info.value.code == 2
    assert "short.txt has 1 lines" in capsys.readouterr().err


def test_bad_n_iter_is_rejected(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        run(tmp_path, tiny_model_dir, "--n-iter", "zero")
    assert "n-iter" in capsys.readouterr().err


def signature_of(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("signature: ")).removeprefix("signature: ")


def test_a_printed_signature_reproduces_the_scores(tmp_path, tiny_model_dir, capsys):
    assert run(tmp_path, tiny_model_dir, "--idf", "--subwords", "first", "--stopwords", "english",
               "--method", "wmd", "--ngram", "2") == 0
    out, err = capsys.readouterr()
    signature = signature_of(err)
    assert "weights:idf-" in signature and "stop:english" in signature and "ngram:2" in signature
    assert str(tiny_model_dir) not in signature  # a local model is named, never by its path
    hyps, refs = str(tmp_path / "hyps.txt"), str(tmp_path / "refs.txt")
    assert main(["score", "--hyps", hyps, "--refs", refs, "--signature", signature, "--model", str(tiny_model_dir),
                 "--no-progress"]) == 0
    out2, err2 = capsys.readouterr()
    assert out2 == out and signature_of(err2) == signature


def test_preset_with_overrides_and_a_stopword_file(tmp_path, tiny_model_dir, capsys):
    stop = write(tmp_path / "stop.txt", ["the", "a"])
    assert run(tmp_path, tiny_model_dir, "--preset", "trwmd-b", "--stopwords", stop) == 0
    signature = signature_of(capsys.readouterr().err)
    assert signature.startswith("trwmd|") and "T:0.15" in signature and "stop:custom-" in signature
    with pytest.raises(SystemExit):
        run(tmp_path, tiny_model_dir, "--preset", "trwmd-b", "--signature", signature)
    assert "not both" in capsys.readouterr().err


def test_all_prints_precision_recall_f1_per_line(tmp_path, tiny_model_dir, capsys):
    assert run(tmp_path, tiny_model_dir, "--all") == 0
    out, err = capsys.readouterr()
    header, *lines = out.splitlines()
    rows = [[float(v) for v in line.split()] for line in lines]
    assert header == "# precision recall f1"
    assert len(rows) == 3 and all(len(r) == 3 for r in rows) and rows[1] == [0.0, 0.0, 0.0]
    assert "mean P R F1: " in err
    assert run(tmp_path, tiny_model_dir) == 0
    recall = [float(line) for line in capsys.readouterr().out.splitlines()]
    assert [r[1] for r in rows] == pytest.approx(recall, abs=2e-6)  # the default direction is recall
    assert run(tmp_path, tiny_model_dir, "--all", "--format", "jsonl") == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert set(first) == {"line", "precision", "recall", "f1"}


def test_literal_hypothesis_and_references(tmp_path, tiny_model_dir, capsys):
    args = ["score", "--model", str(tiny_model_dir), "--layer", "2", "--no-progress"]
    assert main([*args, "--hyp", "the cat sat", "--ref", "a cat sat", "--ref", "the cat sat"]) == 0
    assert float(capsys.readouterr().out) == pytest.approx(1.0, abs=1e-5)  # max over the two references
    hyps = write(tmp_path / "h.txt", ["the cat sat"])
    refs = write(tmp_path / "r.txt", ["a cat sat"])
    assert main([*args, "--hyp", "the cat sat", "--ref", "a cat sat"]) == 0
    literal = capsys.readouterr().out
    assert main([*args, "--hyps", hyps, "--refs", refs]) == 0
    assert capsys.readouterr().out == literal
    for wrong in (["--hyp", "x", "--refs", refs], ["--hyps", hyps, "--ref", "x"], ["--hyp", "x"]):
        with pytest.raises(SystemExit):
            main([*args, *wrong])
        assert "--ref" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--hyp", "x", "--hyps", hyps, "--ref", "y"])  # one source of hypotheses
    capsys.readouterr()


def test_rescale_fits_the_baseline_on_the_references_or_a_given_corpus(tmp_path, tiny_model_dir, capsys):
    assert run(tmp_path, tiny_model_dir, "--rescale") == 0
    out, err = capsys.readouterr()
    assert "|rescale:b=" in err
    corpus = write(tmp_path / "corpus.txt", ["the red car", "a small child runs", "we eat food", "the moon"])
    assert run(tmp_path, tiny_model_dir, "--rescale", "--baseline-corpus", corpus) == 0
    out2, err2 = capsys.readouterr()
    assert out2 != out and signature_of(err2) != signature_of(err)
    with pytest.raises(SystemExit):
        run(tmp_path, tiny_model_dir, "--baseline-corpus", corpus)
    assert "--rescale" in capsys.readouterr().err


def test_literal_pair_writes_its_score_to_output(tmp_path, tiny_model_dir, capsys):
    output = tmp_path / "score.txt"
    assert main(["score", "--hyp", "the cat sat", "--ref", "a cat sat", "--model", str(tiny_model_dir), "--layer", "2",
                 "--no-progress", "--output", str(output)]) == 0
    assert 0 < float(output.read_text()) <= 1 and capsys.readouterr().out == ""


def test_an_option_read_as_none_is_given_not_dropped(tmp_path, tiny_model_dir, capsys):
    """``--n-iter converged`` reads as None (the converged solver): it is an option given, not the
    default of one iteration."""
    assert run(tmp_path, tiny_model_dir, "--n-iter", "converged") == 0
    assert "|iter:converged|" in capsys.readouterr().err
    assert run(tmp_path, tiny_model_dir) == 0
    assert "|iter:1|" in capsys.readouterr().err


@pytest.mark.parametrize("flag, expected", [(None, "auto"), ("auto", "auto"), ("none", None), ("0", 0), ("300", 300)])
def test_pass_cost_is_read_into_the_encoder(flag, expected, tiny_model_dir):
    from torchmover.cli import build_parser, build_scorer

    argv = ["score", "--hyp", "a", "--ref", "b", "--model", str(tiny_model_dir), "--layer", "2", "--device", "cpu"]
    scorer = build_scorer(build_parser().parse_args(argv + ([] if flag is None else ["--pass-cost", flag])))
    assert scorer.encoder.pass_cost == expected


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_a_bad_pass_cost_is_refused_naming_the_option(value, tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        run(tmp_path, tiny_model_dir, "--pass-cost", value)
    assert "--pass-cost: must be 'auto', 'none' or an integer >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_server_timeout_must_be_a_finite_positive_number(value, capsys):
    from torchmover.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["serve", "--header-timeout", value])
    assert done.value.code == 2
    assert f"--header-timeout: must be a finite number > 0, got '{value}'" in capsys.readouterr().err
    assert build_parser().parse_args(["serve", "--header-timeout", "2.5"]).header_timeout == 2.5


def literal_score(tiny_model_dir, *extra):
    return main(["score", "--hyp", "the cat sat", "--ref", "a cat sat", "--model", str(tiny_model_dir), "--layer", "2",
                 "--no-progress", *extra])


def test_a_literal_pair_replaces_an_existing_output_only_with_overwrite(tmp_path, tiny_model_dir, capsys,
                                                                         monkeypatch):
    """Before, ``--hyp ... --output FILE`` replaced a FILE that no run wrote, which ``--hyps`` refuses."""
    import torchmover.cli as cli

    output = write(tmp_path / "notes.txt", ["my notes"])
    with monkeypatch.context() as m:
        m.setattr(cli, "scorer_from_args", lambda *a, **k: pytest.fail("scored before the output was checked"))
        with pytest.raises(SystemExit) as done:
            literal_score(tiny_model_dir, "--output", output)
    assert done.value.code == 2 and f"{output} exists: give --overwrite to replace it" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert literal_score(tiny_model_dir, "--output", output, "--overwrite") == 0
    assert 0 < float((tmp_path / "notes.txt").read_text()) <= 1


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_directory_as_output_is_a_clear_error_on_both_paths(tmp_path, tiny_model_dir, capsys, overwrite):
    """Before, ``--hyps`` suggested ``--overwrite``, which then failed with "[Errno 21] Is a directory"."""
    folder = tmp_path / "scores"
    folder.mkdir()
    for literal in (True, False):
        with pytest.raises(SystemExit) as done:
            if literal:
                literal_score(tiny_model_dir, "--output", str(folder), *overwrite)
            else:
                run(tmp_path, tiny_model_dir, "--output", str(folder), *overwrite)
        assert done.value.code == 2 and capsys.readouterr().err == (
            f"torchmover: error: --output {folder} is a directory: give the path of a file\n")
    assert folder.is_dir() and not any(folder.iterdir())


@pytest.mark.parametrize("option", ["--hyps", "--stopwords", "--baseline-corpus"])
def test_an_output_naming_an_input_is_refused_before_anything_is_touched(tmp_path, tiny_model_dir, capsys, option):
    """Before, with ``--overwrite`` the input was removed (``--hyps``: before it was read) or replaced."""
    stop = write(tmp_path / "stop.txt", ["the", "a"])
    corpus = write(tmp_path / "corpus.txt", ["the red car", "a small child runs"])
    given = {"--hyps": str(tmp_path / "hyps.txt"), "--stopwords": stop, "--baseline-corpus": corpus}[option]
    extra = {"--hyps": [], "--stopwords": ["--stopwords", stop], "--baseline-corpus": ["--rescale", option, corpus]}
    with pytest.raises(SystemExit) as done:
        run(tmp_path, tiny_model_dir, *extra[option], "--output", given, "--overwrite")
    assert done.value.code == 2
    assert f"--output {given} is also an input ({option} {given})" in capsys.readouterr().err
    if option == "--stopwords":  # a literal pair's output too
        with pytest.raises(SystemExit):
            literal_score(tiny_model_dir, "--stopwords", stop, "--output", stop, "--overwrite")
        assert "is also an input (--stopwords" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "hyps.txt", "refs.txt", "stop.txt"]
    texts = {"hyps.txt": "the cat sat\n\na dog barked\n", "stop.txt": "the\na\n",
             "corpus.txt": "the red car\na small child runs\n"}
    assert {name: (tmp_path / name).read_text() for name in texts} == texts


def test_stress_splits_its_files_into_lines_as_score_does(tmp_path, tiny_model_dir, capsys):
    """Only ``\\n`` or ``\\r\\n`` ends a line: before, ``stress`` also split at a form feed or U+2028."""
    hyps = tmp_path / "hyps.txt"
    hyps.write_bytes(b"the cat sat on the mat\x0cand slept\na dog barked\n")
    refs = tmp_path / "refs.txt"
    refs.write_bytes("a cat sat on a mat\na dog barked\u2028loudly\r\n".encode())
    report = tmp_path / "stress.json"
    assert main(["stress", "--hyps", str(hyps), "--refs", str(refs), "--model", str(tiny_model_dir), "--layer", "2",
                 "--no-progress", "--json", str(report)]) == 0
    capsys.readouterr()
    assert json.loads(report.read_text())["n_pairs"] == 2


def test_every_file_of_lines_names_an_undecodable_line_as_score_does(tmp_path, tiny_model_dir, capsys):
    """Before, ``stress``, ``--stopwords``, ``--baseline-corpus`` and ``--fit-references`` failed with
    Python's codec message, naming neither the file nor the line."""
    from torchmover.evaluation.corpus import InputError
    from torchmover.integrations.config import RewardConfig, build_reward

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat sat\na d\xffog\n")
    ok = write(tmp_path / "ok.txt", ["the cat sat", "a dog"])
    message = f"{bad} line 2: not valid UTF-8 (byte 0xff at column 4)"
    model = ["--model", str(tiny_model_dir), "--layer", "2", "--no-progress"]
    for argv in (["stress", "--hyps", str(bad), "--refs", ok, *model],
                 ["score", "--hyps", ok, "--refs", ok, "--stopwords", str(bad), *model],
                 ["score", "--hyps", ok, "--refs", ok, "--rescale", "--baseline-corpus", str(bad), *model]):
        with pytest.raises(SystemExit):
            main(argv)
        assert capsys.readouterr().err == f"torchmover: error: {message}\n"
    config = RewardConfig(model=str(tiny_model_dir), fit_references=str(bad), options={"layer": 2, "centering": "none"})
    with pytest.raises(InputError, match=re.escape(message)):
        build_reward(config)


def score_on_rank(rank: int, world_size: int, argv_by_rank: list[list[str]]) -> dict:
    """``main(argv)`` with this rank's ``argv`` inside a process group: its exit status and standard error."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv_by_rank[rank])
        except SystemExit as exit_:
            code = exit_.code
    return {"code": code, "err": err.getvalue()}


def test_under_torchrun_only_rank_0_reads_the_stopword_file_and_the_baseline_corpus(tmp_path, tiny_model_dir, capsys):
    """Every other rank is given paths that exist nowhere (as on a second machine): the run scores with rank 0's
    files, as one process does; a file rank 0 cannot read is the same one-line error on every rank."""
    import _ddp

    write(tmp_path / "hyps.txt", ["the cat sat", "", "a dog barked", "the sun is red"])
    write(tmp_path / "refs.txt", ["a cat sat", "the sun", "the dog barked", "a red sun"])
    write(tmp_path / "stop.txt", ["the", "a"])
    write(tmp_path / "base.txt", ["the moon is blue", "a small child", "she eats food", "we ran"])
    nowhere = tmp_path / "nowhere"
    (tmp_path / "ranks").mkdir()
    (tmp_path / "missing").mkdir()

    def argv(folder, output, stopwords="stop.txt"):
        return ["score", "--hyps", str(folder / "hyps.txt"), "--refs", str(folder / "refs.txt"),
                "--stopwords", str(folder / stopwords), "--rescale", "--baseline-corpus", str(folder / "base.txt"),
                "--output", str(folder / output), "--model", str(tiny_model_dir), "--layer", "2", "--no-progress"]

    assert main(argv(tmp_path, "single.txt")) == 0
    one_process = capsys.readouterr().err
    ranks = _ddp.run(score_on_rank, 2, tmp_path / "ranks", [argv(tmp_path, "out.txt"), argv(nowhere, "out.txt")],
                     timeout=120)
    assert [r["code"] for r in ranks] == [0, 0], ranks
    assert (tmp_path / "out.txt").read_text() == (tmp_path / "single.txt").read_text()
    assert ranks[0]["err"] == one_process and "stop:custom-" in one_process and "rescale:b=" in one_process
    missing = _ddp.run(score_on_rank, 2, tmp_path / "missing", [argv(tmp_path, "x.txt", "gone.txt")] * 2, timeout=120)
    for rank in missing:
        assert rank == {"code": 2, "err": f"torchmover: error: no such file: {tmp_path / 'gone.txt'}\n"}


# --- fields, report outputs, option values, closed pipes --------------------------------------------

NO_MODEL = ["--model", "/nonexistent/model"]  # an error that only loading the model would report


def refused(argv, capsys) -> str:
    """The one-line error of ``main(argv)``, which must exit with status 2."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("option", ["--hyp-field", "--ref-field"])
def test_a_field_given_for_a_text_file_is_refused_before_the_model_loads(tmp_path, capsys, option):
    """Before, the field was ignored and a JSON-lines ``pairs.tsv`` given as both inputs scored each whole
    line against itself: 1.0 for every pair."""
    pairs = write(tmp_path / "pairs.tsv", [json.dumps({"hyp": "the cat sat", "ref": "a dog"})])
    err = refused(["score", "--hyps", pairs, "--refs", pairs, option, "hyp", *NO_MODEL], capsys)
    assert err == (f"torchmover: error: {option} hyp: {pairs} is read as text, one text per line, which has no field "
                   "'hyp': fields are read from .jsonl, .ndjson, .json, .parquet, .arrow, .feather, .ipc files\n")


def test_a_json_file_is_read_as_json_lines_with_the_default_fields(tmp_path, tiny_model_dir, capsys):
    """Before, ``pairs.json`` was read as text: each JSON line scored against itself, 1.0 every pair."""
    assert run(tmp_path, tiny_model_dir) == 0
    from_text = capsys.readouterr().out
    hyps, refs = (tmp_path / "hyps.txt").read_text().splitlines(), (tmp_path / "refs.txt").read_text().splitlines()
    pairs = write(tmp_path / "pairs.json", [json.dumps({"hyp": h, "ref": r}) for h, r in zip(hyps, refs)])
    assert main(["score", "--hyps", pairs, "--refs", pairs, "--model", str(tiny_model_dir), "--layer", "2",
                 "--no-progress"]) == 0
    assert capsys.readouterr().out == from_text


def test_an_output_ending_in_jsonl_gets_json_lines_unless_format_says_otherwise(tmp_path, tiny_model_dir, capsys):
    """Before, ``--output scores.jsonl`` without ``--format`` (the README's torchrun line) held bare numbers."""
    assert run(tmp_path, tiny_model_dir, "--output", str(tmp_path / "scores.jsonl")) == 0
    assert [json.loads(line)["line"] for line in (tmp_path / "scores.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert run(tmp_path, tiny_model_dir, "--output", str(tmp_path / "plain.jsonl"), "--format", "text") == 0
    assert all(float(line) >= 0 for line in (tmp_path / "plain.jsonl").read_text().splitlines())


def report_commands(tmp_path) -> dict[str, list[str]]:
    """Each command that writes a report or a picture, its inputs in ``tmp_path``."""
    hyps, refs = write(tmp_path / "hyps.txt", ["the cat sat"]), write(tmp_path / "refs.txt", ["a cat sat"])
    ratings = write(tmp_path / "ratings.tsv", ["lp\tyear\tref\thyp\tscore", "de-en\t2016\ta cat\tthe cat\t0.5",
                                               "de-en\t2016\ta dog\tthe sun\t-0.5"])
    stop = write(tmp_path / "stop.txt", ["the"])
    return {"correlate": ["correlate", "--data", ratings], "sensitivity": ["sensitivity", "--data", ratings],
            "stress": ["stress", "--hyps", hyps, "--refs", refs, "--stopwords", stop],
            "show": ["show", "--hyp", "the cat", "--ref", "a cat", "--stopwords", stop]}


@pytest.mark.parametrize("command, option, target", [
    ("correlate", "--json", "ratings.tsv"), ("correlate", "--plot", "ratings.tsv"),
    ("sensitivity", "--json", "ratings.tsv"), ("stress", "--json", "hyps.txt"), ("stress", "--json", "refs.txt"),
    ("stress", "--json", "stop.txt"),
])
def test_a_report_naming_an_input_is_refused_before_any_work(tmp_path, capsys, command, option, target):
    """Before, ``correlate --json ratings.tsv`` and ``stress --json hyps.txt`` replaced their input."""
    argv = report_commands(tmp_path)[command]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    path = str(tmp_path / target)
    err = refused([*argv, option, path, *NO_MODEL], capsys)
    given = next(argv[k] for k in range(len(argv) - 1) if argv[k + 1] == path)
    assert err == (f"torchmover: error: {option} {path} is also an input ({given} {path}): the run would replace "
                   f"or remove it; give another {option}\n")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_report_inside_the_ratings_directory_or_a_directory_is_refused_before_scoring(tmp_path, capsys):
    """Before, ``--json DIR`` failed with "[Errno 21] Is a directory" once every record was scored."""
    ratings = tmp_path / "ratings"
    ratings.mkdir()
    report_commands(ratings)
    err = refused(["correlate", "--data", str(ratings), "--json", str(ratings / "report.json"), *NO_MODEL], capsys)
    assert err == (f"torchmover: error: --json {ratings / 'report.json'} is inside an input directory (--data "
                   f"{ratings}): the run would write among the files it reads; give another --json\n")
    err = refused(["correlate", "--data", str(ratings / "ratings.tsv"), "--json", str(ratings), *NO_MODEL], capsys)
    assert err == f"torchmover: error: --json {ratings} is a directory: give the path of a file\n"


@pytest.mark.parametrize("command, option, value, expected", [
    ("correlate", "--confidence", "95", "must be a number between 0 and 1 (e.g. 0.95), got '95'"),
    ("correlate", "--confidence", "nan", "must be a number between 0 and 1 (e.g. 0.95), got 'nan'"),
    ("correlate", "--n-boot", "-1", "must be a non-negative integer, got '-1'"),
    ("sensitivity", "--max-per-group", "1", "must be an integer >= 2 (a correlation needs two segments), got '1'"),
    ("score", "--chunk-size", "0", "must be a positive integer, got '0'"),
])
def test_option_values_are_checked_as_they_are_read(tmp_path, capsys, command, option, value, expected):
    """Before, these were refused after the model loaded (``correlate``: after scoring every record),
    named as the library's arguments (``confidence must be in (0, 1)``)."""
    argv = {**report_commands(tmp_path), "score": ["score", "--hyps", str(tmp_path / "hyps.txt"),
                                                   "--refs", str(tmp_path / "refs.txt")]}[command]
    assert f"argument {option}: {expected}\n" in refused([*argv, option, value, *NO_MODEL], capsys)


def failing_writes_over(limit: int):
    """A context in which writing a file past ``limit`` bytes fails with EFBIG, as a full disk fails."""
    import contextlib
    import resource
    import signal

    @contextlib.contextmanager
    def limited():
        previous, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, previous[1]))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, previous)
            signal.signal(signal.SIGXFSZ, handler)
    return limited()


@pytest.mark.parametrize("command", ["correlate", "show"])
def test_a_report_whose_write_fails_leaves_the_previous_one_whole(tmp_path, tiny_model_dir, capsys, command):
    """Before, ``correlate --json`` truncated the previous report and left a part of the new one."""
    if command == "show":
        pytest.importorskip("matplotlib")
    option = "--json" if command == "correlate" else "--output"
    report = tmp_path / ("report.json" if command == "correlate" else "a.png")
    report.write_bytes(b"the previous report\n")
    argv = [*report_commands(tmp_path)[command], option, str(report), "--model", str(tiny_model_dir), "--layer", "2",
            "--no-progress"]
    with failing_writes_over(512):
        err = refused(argv, capsys)
    assert "File too large" in err and report.read_bytes() == b"the previous report\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path, tiny_model_dir):
    """Before: ``torchmover: error: [Errno 32] Broken pipe``, exit status 2."""
    import subprocess
    import sys

    hyps = write(tmp_path / "hyps.txt", ["the cat sat"] * 200)
    command = [sys.executable, "-m", "torchmover", "score", "--hyps", hyps, "--refs", hyps, "--model",
               str(tiny_model_dir), "--layer", "2", "--no-progress", "--chunk-size", "50"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader goes away before the first score is written
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141 and "rror" not in err and "Traceback" not in err
