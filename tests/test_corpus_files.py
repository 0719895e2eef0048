"""Scoring files (torchmover.evaluation.corpus.score_files, ``torchmover score --hyps ... --output ...``):
every input format, bad input named before any work, resuming an interrupted run without loss or
duplicates, refusing to resume another run, statistics fitted on the stream."""
import codecs
import json
import os

import pytest
import torch

import torchmover.evaluation.corpus as job
from torchmover import Encoder, Scorer
from torchmover.evaluation.corpus import Column, InputError, RunError, score_files
from torchmover.evaluation.scoring import fit_to_call

HYPS = ["the cat sat on the mat", "a dog barked", "the quick brown fox jumps over the lazy dog", "the sun",
        "a small child eats good food in the city", "they ran", "the cat sat on the mat", "", "a man", "the moon"]
REFS = [["a cat was on the mat", "the cat sat"], ["the dog barked", "a dog"], ["a fox jumps over the dog", "fox"],
        ["the moon is blue", "a red sun"], ["the child eats", "a child"], ["we ran to the old house", "they ran"],
        ["the cat sat", "a cat was on the mat"], ["nothing", "the sun"], ["a woman", "the man"], ["the moon", "moon"]]


def tiny_scorer(**options):
    from conftest import tiny_model, tiny_tokenizer

    return Scorer(Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert"), **options)


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def text_inputs(tmp_path, hyps=HYPS, refs=REFS):
    return (Column(write_lines(tmp_path / "hyps.txt", hyps)),
            [Column(write_lines(tmp_path / f"refs{k}.txt", [g[k] for g in refs])) for k in range(2)])


def read_scores(path, columns=("score",)):
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert [row["line"] for row in rows] == list(range(1, len(rows) + 1))  # every row once, in order
    return torch.tensor([[row[c] for c in columns] for row in rows], dtype=torch.float64).t()


def expected(scorer, hyps=HYPS, refs=REFS, return_all=False):
    fit_to_call(scorer, [r for g in refs for r in g], hyps, progress=False)
    scores = scorer.score(hyps, refs, progress=False, return_all=return_all)
    return torch.stack(list(scores)) if return_all else scores[None]


PRF_COLUMNS = ("precision", "recall", "f1")


@pytest.mark.parametrize("kind", ["text", "jsonl", "json", "parquet", "arrow"])
def test_every_format_scores_the_pairs_as_score_does(tmp_path, kind):
    """A ``.json`` file is JSON lines, as the ratings reader reads it (before, it was read as text)."""
    if kind == "text":
        hyps, refs = text_inputs(tmp_path)
    elif kind in ("jsonl", "json"):
        path = write_lines(tmp_path / f"pairs.{kind}", [json.dumps({"hyp": h, "ref": g}) for h, g in zip(HYPS, REFS)])
        hyps, refs = Column(path, "hyp"), [Column(path, "ref")]
    else:
        pa = pytest.importorskip("pyarrow")
        table = pa.table({"hyp": HYPS, "ref": REFS})
        path = str(tmp_path / ("pairs.parquet" if kind == "parquet" else "pairs.arrow"))
        if kind == "parquet":
            import pyarrow.parquet as pq
            pq.write_table(table, path, row_group_size=3)
        else:
            import pyarrow.feather as feather
            feather.write_feather(table, path, chunksize=3)
        hyps, refs = Column(path, "hyp"), [Column(path, "ref")]
    out = tmp_path / "scores.jsonl"
    result = score_files(tiny_scorer(centering="batch"), hyps, refs, out, format="jsonl", return_all=True,
                         chunk_pairs=3, batch_size=2, progress=False)
    want = expected(tiny_scorer(centering="batch"), return_all=True)
    torch.testing.assert_close(read_scores(out, PRF_COLUMNS), want.double(), rtol=0, atol=1e-6)
    assert result.rows == len(HYPS) and result.means["f1"] == pytest.approx(float(want[2].double().mean()))
    assert not (tmp_path / "scores.jsonl.parts").exists()  # the parts are gone once the output is whole


def test_standard_output_streams_the_text_format(tmp_path, capsys):
    hyps, refs = text_inputs(tmp_path)
    score_files(tiny_scorer(centering="none"), hyps, refs, None, chunk_pairs=4, progress=False)
    printed = [float(line) for line in capsys.readouterr().out.splitlines()]
    torch.testing.assert_close(torch.tensor(printed), expected(tiny_scorer(centering="none"))[0], rtol=0, atol=1e-6)


def bad_inputs(tmp_path, case):
    """The inputs of each kind of bad input, and what the error must say."""
    hyps, refs = text_inputs(tmp_path)
    if case == "line counts":
        write_lines(tmp_path / "refs1.txt", [g[1] for g in REFS][:-1])
        return hyps, refs, f"refs1.txt has {len(HYPS) - 1} lines but .*hyps.txt has {len(HYPS)}"
    if case == "undecodable":
        (tmp_path / "refs0.txt").write_bytes(b"a cat\nthe \xff dog\n" + b"x\n" * (len(HYPS) - 2))
        return hyps, refs, r"refs0.txt line 2: not valid UTF-8 \(byte 0xff at column 5\)"
    if case == "empty":
        (tmp_path / "hyps.txt").write_bytes(b"")
        return hyps, refs, "hyps.txt is empty"
    if case == "missing":
        return Column(str(tmp_path / "nope.txt")), refs, "no such file: .*nope.txt"
    if case == "json":
        lines = [json.dumps({"hyp": h, "ref": g}) for h, g in zip(HYPS, REFS)]
        lines[3] = '{"hyp": "a", "ref": '
        path = write_lines(tmp_path / "pairs.jsonl", lines)
        return Column(path, "hyp"), [Column(path, "ref")], "pairs.jsonl line 4: not a JSON record"
    if case == "field":
        lines = [json.dumps({"hyp": h, "refs": g}) for h, g in zip(HYPS, REFS)]
        path = write_lines(tmp_path / "pairs.jsonl", lines)
        return Column(path, "hyp"), [Column(path, "ref")], "pairs.jsonl line 1: no field 'ref'"
    if case == "type":
        lines = [json.dumps({"hyp": h, "ref": g}) for h, g in zip(HYPS, REFS)]
        lines[6] = json.dumps({"hyp": 7, "ref": "x"})
        path = write_lines(tmp_path / "pairs.jsonl", lines)
        return Column(path, "hyp"), [Column(path, "ref")], "pairs.jsonl line 7: the 'hyp' value must be a text, got 7"
    if case in ("lone surrogate", "lone surrogate in a list"):  # a JSON escape holds what UTF-8 cannot
        lines = [json.dumps({"hyp": h, "ref": g}) for h, g in zip(HYPS, REFS)]
        lines[1] = ('{"hyp": "a dog \\ud800 barked", "ref": "x"}' if case == "lone surrogate"
                    else '{"hyp": "a dog", "ref": ["x", "the \\udc80 dog"]}')
        path = write_lines(tmp_path / "pairs.jsonl", lines)
        position = 6 if case == "lone surrogate" else 4
        return (Column(path, "hyp"), [Column(path, "ref")],
                rf"pairs.jsonl line 2 is not valid Unicode: lone surrogate '\\ud[8c]\d\d' at position {position}")
    if case == "field of a text file":  # before, the field was ignored and each whole line read as text
        return (Column(hyps.path, "hyp"), refs,
                r"hyps.txt is read as text, one text per line, which has no field 'hyp': fields are read from "
                r"\.jsonl, \.ndjson, \.json, \.parquet, \.arrow, \.feather, \.ipc files")
    if case == "pipe":
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        return Column(str(fifo)), refs, r"fifo is not a regular file \(a pipe\?\): torchmover reads each input more"
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    if case in ("repeated column, arrow", "repeated column, parquet"):  # before: the last (or first) of them
        table = pa.Table.from_arrays([pa.array(HYPS), pa.array(HYPS), pa.array([g[0] for g in REFS])],
                                     names=["hyp", "hyp", "ref"])
        path = str(tmp_path / ("pairs.arrow" if "arrow" in case else "pairs.parquet"))
        (feather_write if "arrow" in case else pq.write_table)(table, path)
        return Column(path, "hyp"), [Column(path, "ref")], "pairs.* 2 columns are named 'hyp': which holds the texts"
    if case == "bytes":  # before: "Object of type bytes is not JSON serializable"
        path = str(tmp_path / "pairs.parquet")
        pq.write_table(pa.table({"hyp": [h.encode() for h in HYPS], "ref": [g[0] for g in REFS]}), path)
        return (Column(path, "hyp"), [Column(path, "ref")],
                "pairs.parquet row 1: the 'hyp' value must be a text, got bytes b'the cat sat on the mat'")
    path = str(tmp_path / "pairs.parquet")  # a null in a Parquet column
    pq.write_table(pa.table({"hyp": HYPS, "ref": [g[0] if k != 4 else None for k, g in enumerate(REFS)]}), path)
    return Column(path, "hyp"), [Column(path, "ref")], "pairs.parquet row 5: the 'ref' value is null"


def feather_write(table, path):
    import pyarrow.feather as feather

    feather.write_feather(table, path)


@pytest.mark.parametrize("case", ["line counts", "undecodable", "empty", "missing", "json", "field", "type", "null",
                                  "lone surrogate", "lone surrogate in a list", "field of a text file", "pipe",
                                  "repeated column, arrow", "repeated column, parquet", "bytes"])
def test_bad_input_is_named_before_any_work(tmp_path, case):
    hyps, refs, message = bad_inputs(tmp_path, case)
    scorer = tiny_scorer(centering="batch")
    scorer.encoder.forward = lambda *a, **k: pytest.fail("the encoder ran before the input was checked")
    with pytest.raises(InputError, match=message):
        score_files(scorer, hyps, refs, tmp_path / "scores.txt", progress=False)
    assert not (tmp_path / "scores.txt").exists() and not (tmp_path / "scores.txt.manifest.json").exists()


class Crash(Exception):
    pass


def crashing_on(call: int, calls: list):
    """``score_chunk`` that raises :class:`Crash` at its ``call``-th call; ``calls`` records the
    hypotheses of every chunk it is given."""
    score_chunk = job.score_chunk

    def crashing(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == call:
            raise Crash
        return score_chunk(*args, **kwargs)
    return crashing


@pytest.mark.parametrize("centering", ["batch", "fixed"])
def test_an_interrupted_run_resumes_from_its_last_chunk(tmp_path, monkeypatch, centering):
    hyps, refs = text_inputs(tmp_path)
    out = tmp_path / "scores.jsonl"
    calls = []
    monkeypatch.setattr(job, "score_chunk", crashing_on(3, calls))  # the third chunk never finishes
    with pytest.raises(Crash):
        score_files(tiny_scorer(centering=centering), hyps, refs, out, format="jsonl", chunk_pairs=3, progress=False)
    assert not out.exists() and sorted(p.name for p in (tmp_path / "scores.jsonl.parts").glob("*.part")) == [
        "00000000.part", "00000001.part"]
    calls.clear()
    scorer = tiny_scorer(centering=centering)
    encoded = []
    forward = scorer.encoder.forward
    scorer.encoder.forward = lambda texts, **kw: encoded.extend(texts) or forward(texts, **kw)
    result = score_files(scorer, hyps, refs, out, format="jsonl", chunk_pairs=3, progress=False)
    assert result.resumed == 2 and [c[0] for c in calls] == [HYPS[6], HYPS[9]]  # chunks 2 and 3 only
    # the fitted statistics were kept: only the two chunks' texts were encoded, no pass over the corpus
    assert set(encoded) == set(HYPS[6:]) | {r for g in REFS[6:] for r in g}
    torch.testing.assert_close(read_scores(out), expected(tiny_scorer(centering=centering)).double(), rtol=0, atol=1e-6)


def test_a_mean_that_is_one_texts_own_is_kept_across_a_resume(tmp_path, monkeypatch):
    """``batch`` centering of each side apart, ``ngram=2``: the hypotheses' mean is that of their one
    text with tokens ("a dog"), whose one bigram, the sum of its centered tokens, is then 0: it scores
    0 in the chunks before an interruption and, from the saved statistics, in those after it."""
    lines = ["a dog", "", " ", "a dog", "", "a dog"]
    hyps, refs = text_inputs(tmp_path, lines, [["the cat sat on the mat", "a cat"]] * len(lines))
    out = tmp_path / "scores.jsonl"
    options = dict(centering="batch", center_scope="separate", ngram=2)
    with monkeypatch.context() as m:
        m.setattr(job, "score_chunk", crashing_on(2, []))  # the second chunk never finishes
        with pytest.raises(Crash):
            score_files(tiny_scorer(**options), hyps, refs, out, format="jsonl", chunk_pairs=2, progress=False)
    result = score_files(tiny_scorer(**options), hyps, refs, out, format="jsonl", chunk_pairs=2, progress=False)
    assert result.resumed == 1 and read_scores(out).tolist() == [[0.0] * len(lines)]


@pytest.mark.parametrize("output", ["scores.txt", None])
def test_an_input_rewritten_during_the_run_is_refused_at_the_end(tmp_path, monkeypatch, output):
    """Before, an input rewritten in place while the run went on was scored partly on its new text,
    and the manifest kept the old SHA-256."""
    hyps, refs = text_inputs(tmp_path)
    out = None if output is None else tmp_path / output
    score_chunk = job.score_chunk

    def rewriting(*args, **kwargs):  # after the first chunk, the second reference file changes in place
        write_lines(tmp_path / "refs1.txt", ["rewritten"] * len(HYPS))
        return score_chunk(*args, **kwargs)
    monkeypatch.setattr(job, "score_chunk", rewriting)
    with pytest.raises(RunError, match="refs1.txt changed while the run scored it"):
        score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False)
    if out is not None:
        assert not out.exists()  # not finished
        assert json.loads((tmp_path / "scores.txt.manifest.json").read_text())["finished"] is False
        monkeypatch.setattr(job, "score_chunk", score_chunk)
        with pytest.raises(RunError, match="with other inputs"):  # and on resume
            score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False)


def test_another_run_is_refused_and_a_finished_one_is_left_as_it_is(tmp_path):
    hyps, refs = text_inputs(tmp_path)
    out = tmp_path / "scores.txt"
    score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False)
    first = out.read_text()
    scorer = tiny_scorer(centering="none")
    scorer.encoder.forward = lambda *a, **k: pytest.fail("a finished run was scored again")
    assert score_files(scorer, hyps, refs, out, chunk_pairs=4, progress=False).already_finished
    with pytest.raises(RunError, match="other options"):
        score_files(tiny_scorer(centering="none", method="bertscore"), hyps, refs, out, chunk_pairs=4, progress=False)
    with pytest.raises(RunError, match="other output"):
        score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=5, progress=False)
    write_lines(tmp_path / "refs1.txt", ["changed"] * len(HYPS))
    with pytest.raises(RunError, match="with other inputs \\("):
        score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False)
    assert out.read_text() == first  # nothing was lost
    score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False, overwrite=True)
    assert out.read_text() != first
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("keep me\n")
    with pytest.raises(RunError, match="no torchmover run recorded it"):
        score_files(tiny_scorer(centering="none"), hyps, refs, foreign, progress=False)
    assert foreign.read_text() == "keep me\n"


@pytest.mark.parametrize("options", [{"idf": True, "centering": "fixed", "rescale": True},
                                     {"centering": "running", "method": "bertscore", "idf": True},
                                     {"centering": "batch", "center_scope": "separate", "rescale": True}])
def test_statistics_fitted_on_the_stream_are_fit_to_calls(tmp_path, options):
    hyps, refs = text_inputs(tmp_path)
    out = tmp_path / "scores.jsonl"
    scorer = tiny_scorer(**options)
    score_files(scorer, hyps, refs, out, format="jsonl", chunk_pairs=3, progress=False)
    reference = tiny_scorer(**options)
    want = expected(reference)
    assert scorer.signature == reference.signature  # IDF, centering mean and baseline digests included
    torch.testing.assert_close(read_scores(out), want.double(), rtol=0, atol=1e-6)


def test_a_baseline_corpus_is_used_as_given(tmp_path):
    hyps, refs = text_inputs(tmp_path)
    corpus = ["the cat", "a dog barked", "the sun is red", "a man"]
    scorer = tiny_scorer(centering="none", rescale=True)
    score_files(scorer, hyps, refs, tmp_path / "s.txt", baseline_corpus=corpus, progress=False)
    reference = tiny_scorer(centering="none", rescale=True).fit_baseline(corpus, progress=False)
    assert scorer.baseline == reference.baseline


def input_among_run_files(tmp_path, case):
    """Inputs, and an output one of whose run files (itself, its manifest, its parts directory) is one
    of them: ``(hyps, refs, output, the input's option)``."""
    hyps, refs = text_inputs(tmp_path)
    out = tmp_path / "scores.txt"
    if case == "output":
        return hyps, refs, refs[1].path, "--refs"
    if case == "manifest":
        return Column(write_lines(tmp_path / "scores.txt.manifest.json", HYPS)), refs, out, "--hyps"
    (tmp_path / "scores.txt.parts").mkdir()
    inside = Column(write_lines(tmp_path / "scores.txt.parts" / "refs1.txt", [g[1] for g in REFS]))
    return hyps, [refs[0], inside], out, "--refs"


@pytest.mark.parametrize("case", ["output", "manifest", "parts"])
def test_an_output_that_is_an_input_is_refused_before_anything_is_touched(tmp_path, case):
    """Before, ``overwrite=True`` removed the input (or the directory holding it) before reading it."""
    hyps, refs, out, option = input_among_run_files(tmp_path, case)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RunError, match=f"^--output {out} is also an input \\({option} "):
        score_files(tiny_scorer(centering="none"), hyps, refs, out, overwrite=True, progress=False)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_directory_as_output_is_refused_whatever_overwrite_says(tmp_path):
    hyps, refs = text_inputs(tmp_path)
    (tmp_path / "out").mkdir()
    for overwrite in (False, True):
        with pytest.raises(RunError, match="out is a directory: give the path of a file$"):
            score_files(tiny_scorer(centering="none"), hyps, refs, tmp_path / "out", overwrite=overwrite,
                        progress=False)
    assert (tmp_path / "out").is_dir()


@pytest.mark.parametrize("change", ["deleted", "rewritten"])
def test_a_finished_run_whose_output_is_gone_or_changed_is_refused(tmp_path, change):
    """Before, such a run was reported complete, with nothing to do, and its output stayed gone or wrong."""
    hyps, refs = text_inputs(tmp_path)
    out = tmp_path / "scores.txt"
    score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False)
    first = out.read_text()
    out.unlink() if change == "deleted" else out.write_text("garbage\n")
    message = "is missing, though the run" if change == "deleted" else "changed since the run"
    with pytest.raises(RunError, match=f"scores.txt {message} recorded in .*finished.*give --overwrite"):
        score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False)
    result = score_files(tiny_scorer(centering="none"), hyps, refs, out, chunk_pairs=4, progress=False, overwrite=True)
    assert not result.already_finished and out.read_text() == first


def test_a_run_killed_before_its_manifest_was_written_starts_afresh(tmp_path, monkeypatch):
    """Before, the run made its parts directory before its manifest: killed in between, it left the
    directory, and rerunning the command was refused ("scores.txt exists", though it did not)."""
    hyps, refs = text_inputs(tmp_path)
    out = tmp_path / "scores.txt"
    write = job.atomic_write_text

    def killed_at_the_manifest(path, text):
        if str(path).endswith(".manifest.json"):
            raise Crash
        return write(path, text)
    with monkeypatch.context() as m:
        m.setattr(job, "atomic_write_text", killed_at_the_manifest)
        with pytest.raises(Crash):
            score_files(tiny_scorer(centering="none"), hyps, refs, out, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyps.txt", "refs0.txt", "refs1.txt"]
    (tmp_path / "scores.txt.parts").mkdir()  # what the run left when it made the directory first
    result = score_files(tiny_scorer(centering="none"), hyps, refs, out, progress=False)
    assert result.rows == len(HYPS) and not result.resumed and out.is_file()
    out.unlink()
    (tmp_path / "scores.txt.manifest.json").unlink()
    (tmp_path / "scores.txt.parts").write_text("not a directory\n")
    with pytest.raises(RunError, match="scores.txt.parts exists and is not a run's parts directory"):
        score_files(tiny_scorer(centering="none"), hyps, refs, out, progress=False)


def test_a_byte_order_mark_that_starts_a_file_is_not_text(tmp_path):
    """Some Windows editors start a UTF-8 file with U+FEFF. A JSON lines file's reader dropped it
    already; a text file's kept it in the first text (one more token for a byte-level BPE tokenizer,
    which ``strip`` leaves: U+FEFF is no whitespace). Only the file's start is a mark."""
    from torchmover.evaluation.corpus import read_column, read_lines

    marked = tmp_path / "marked.txt"
    marked.write_bytes(codecs.BOM_UTF8 + "the cat\r\n\ufeffa dog\n".encode())
    assert read_lines(marked) == list(read_column(Column(str(marked)))) == ["the cat", "\ufeffa dog"]
    records = tmp_path / "marked.jsonl"
    records.write_bytes(codecs.BOM_UTF8 + b'{"text": "the cat"}\n')
    assert list(read_column(Column(str(records), "text"))) == ["the cat"]
