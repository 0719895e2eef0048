"""Progress output: one rule for every entry point (a bar when standard error is a terminal, unless
``progress=False`` / ``--no-progress``), one bar per call, moved by the work done."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchmover.runtime.progress as progress
import torchmover.scorer.corpus as corpus
from torchmover import Encoder, Scorer

HYPS = ["the cat sat on the mat", "a dog barked", "the quick brown fox jumps over the lazy dog", "the sun",
        "a small child eats good food in the city", "they ran"]
REFS = ["a cat was on the mat", "the dog barked", "a fox jumps over the dog", "the moon is blue",
        "the child eats", "we ran to the old house"]


class Terminal:
    def __init__(self, stream):
        self.stream = stream

    def isatty(self):
        return True

    def __getattr__(self, name):
        return getattr(self.stream, name)


def test_the_rule_shows_a_bar_only_where_standard_error_is_a_terminal(monkeypatch):
    assert not progress.show_progress(None)  # pytest captures standard error: not a terminal
    assert progress.show_progress(True) and not progress.show_progress(False)
    monkeypatch.setattr(sys, "stderr", Terminal(sys.stderr))
    assert progress.show_progress(None)
    with progress.silenced():  # --no-progress: nothing, whatever is asked
        assert not progress.show_progress(None) and not progress.show_progress(True)
    assert progress.show_progress(None)  # and only for the command it is given to


def test_score_draws_one_bar_in_pairs(tiny_encoder, capsys):
    Scorer(tiny_encoder, centering="batch").score(HYPS, REFS, batch_size=2, progress=True)
    err = capsys.readouterr().err
    assert "scoring" in err and f"{len(HYPS)}/{len(HYPS)}" in err
    assert "encoding" not in err  # no second bar nested in it
    Scorer(tiny_encoder).score(HYPS, REFS, batch_size=2)  # the default: not a terminal, no bar
    assert capsys.readouterr().err == ""


def bar_at_each_encoder_batch(scorer, monkeypatch):
    """Run ``scorer.score`` with a bar; returns ``[(tokens encoded in the batch, bar position before
    it)]`` and the bar."""
    bars, seen = [], []

    class Recording(progress.PairProgress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(corpus, "PairProgress", Recording)
    embed = scorer.embed_with_spans

    def recording_embed(texts, tokenized):
        seen.append((sum(map(len, tokenized["input_ids"])), bars[0].bar.n))
        return embed(texts, tokenized)
    monkeypatch.setattr(scorer, "embed_with_spans", recording_embed)
    scorer.score(HYPS, REFS, batch_size=2, progress=True)
    return seen, bars[0]


@pytest.mark.parametrize("centering", ["batch", "none"])
def test_the_bar_stands_where_the_encoder_is_from_the_first_batch(tiny_encoder, monkeypatch, centering):
    """Pairs/s and the time left are right from the first update when the bar's position is the
    share of the call's encoder work done (each text's tokens its work), the first pass of
    batch centering (the call's mean) included: the encoder is nearly all of a call's time."""
    seen, bar = bar_at_each_encoder_batch(Scorer(tiny_encoder, centering=centering), monkeypatch)
    work, done = sum(w for w, _ in seen), 0
    assert len(seen) >= 4 and bar.bar.n == len(HYPS)
    for batch, shown in seen:  # rounded down to a whole pair
        assert len(HYPS) * done / work - 1 < shown <= len(HYPS) * done / work + 1e-9
        done += batch
    assert seen[2][1] > 0  # it moves during the first pass, before any pair is scored


def test_a_call_of_several_chunks_encoded_twice_moves_the_bar_through_both_passes(tiny_encoder, monkeypatch):
    monkeypatch.setattr(corpus, "SCORE_CHUNK", 3)  # two chunks: the first is encoded for the mean, then again
    seen, bar = bar_at_each_encoder_batch(Scorer(tiny_encoder, centering="batch"), monkeypatch)
    shown = [n for _, n in seen]
    assert shown == sorted(shown) and bar.bar.n == len(HYPS)
    assert 0 < shown[len(shown) // 2] < len(HYPS)  # halfway through the encoder's batches, halfway along


def test_a_model_loads_quietly_where_no_one_watches(tiny_model_dir, capsys):
    Encoder.from_pretrained(str(tiny_model_dir), layer=2)
    assert "Loading weights" not in capsys.readouterr().err


def run_cli(tmp_path, tiny_model_dir, *extra):
    (tmp_path / "h.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "r.txt").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "torchmover", "score", "--model", str(tiny_model_dir), "--layer", "2",
                           "--hyps", str(tmp_path / "h.txt"), "--refs", str(tmp_path / "r.txt"), *extra],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_the_command_line_prints_no_bar_to_a_pipe_or_with_no_progress(tmp_path, tiny_model_dir, flag):
    done = run_cli(tmp_path, tiny_model_dir, "--centering", "batch", *flag)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == len(HYPS)
    lines = done.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["mean", "signature"], done.stderr  # no bar, no "Loading weights"
