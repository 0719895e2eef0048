"""recipes/finetune_wmt.py on the tiny random model and a 24-row TSV: training, checkpoints, exact
resume and the options it refuses changed, one-line errors before anything is written, the report's
set and the provenance of every output, the saved model, and one process vs two (gloo) with
synchronised batch centering."""
import hashlib
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import _ddp
from conftest import WORDS, load_file, tiny_model, tiny_tokenizer

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "finetune_wmt.py"


recipe = load_file(RECIPE, "finetune_wmt")


def write_model(path: Path, dropout: float = 0.1) -> Path:
    model = tiny_model()
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = dropout
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def write_ratings(path: Path, n: int = 24, seed: int = 0) -> Path:
    rng = random.Random(seed)
    sentence = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))  # noqa: E731
    lines = ["lp\tyear\tref\thyp\tscore"]
    for i in range(n):
        lines.append(f"{['de-en', 'cs-en'][i % 2]}\t2016\t{sentence()}\t{sentence()}\t{rng.gauss(0, 1):.4f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    return write_model(root / "tiny"), write_ratings(root / "ratings.tsv")


def argv(setup, output, *extra):
    model, data = setup
    return ["--model", str(model), "--layer", "2", "--train", str(data), "--dev-fraction", "0.25",
            "--output", str(output), "--batch-size", "4", "--epochs", "2", "--lr", "1e-3", "--n-boot", "20",
            "--log-every", "1", "--no-progress", "--no-plot", *extra]


def final_state(output: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(output / "final" / "encoder" / "model.safetensors"))


@pytest.fixture(scope="module")
def full_run(setup, tmp_path_factory):
    """2 epochs x 5 steps of 4 pairs, dropout on, uninterrupted; checkpoints every 2 steps."""
    out = tmp_path_factory.mktemp("full") / "run"
    return out, recipe.main(argv(setup, out, "--save-every", "2"))


def test_trains_checkpoints_and_saves_a_loadable_scorer(setup, full_run):
    import torchmover as tm

    out, result = full_run
    events = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == result["global_step"] == 10 and all(math.isfinite(x) for x in losses)
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == [0, 1, 2]
    assert {e["when"] for e in events if e["event"] == "eval"} == {"before", "after"}
    latest = (out / "checkpoints" / "latest").read_text().strip()
    assert latest == "step-0000010.pt" and len(list((out / "checkpoints").glob("step-*.pt"))) == 2
    state = torch.load(out / "checkpoints" / latest, weights_only=True)  # safe format
    assert state["global_step"] == 10 and state["epoch"] == 2 and set(state["calibration"]) == {"a", "b"}
    assert "τ before" in (out / "table.txt").read_text()

    # The final directory is the best dev epoch's scorer, centering on a fixed mean fitted on its
    # training texts: a pair's score does not depend on the pairs scored with it.
    loaded, calibration = recipe.load_finetuned(out / "final")
    assert calibration.to_dict() == pytest.approx(result["calibration"])
    assert loaded.config.centering == "fixed" and "center:fixed-" in loaded.signature
    # its signature says it was fine-tuned, on what (18 training pairs: 24 minus the dev split), and which weights
    assert loaded.finetuned.startswith("da:2016:cs-en+de-en:18-pairs@weights-")
    assert "|model:local-bert@weights-" in loaded.signature and f"|finetuned:{loaded.finetuned}|" in loaded.signature
    model, data = setup
    train, _ = recipe.split_dev(recipe.read_all([str(data)], None), 0.25, seed=0)
    texts = recipe.centering_texts(train, 1024, 0)
    refit = tm.Scorer.from_pretrained(out / "final")
    with recipe.fixed_centering(refit, texts, recipe.build_parser().parse_args([]), progress=False):
        torch.testing.assert_close(refit.centering.mean, loaded.centering.mean, rtol=0, atol=1e-6)
    hyps, refs = ["the cat sat on the mat", "a dog barked", ""], ["a cat sat", "the dog barked", "the sun"]
    together = loaded.score(hyps, refs, batch_size=3, progress=False)
    alone = torch.cat([loaded.score([h], [r], progress=False) for h, r in zip(hyps, refs)])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-6)
    assert together[2] == 0  # an empty hypothesis scores 0
    untuned = tm.Scorer(str(model), layer=2, centering="fixed").fit_centering(texts, progress=False)
    assert not torch.allclose(together, untuned.score(hyps, refs, progress=False))  # it moved
    dev = result["dev_history"]
    assert result["best_epoch"] == max((1, 2), key=lambda e: dev[str(e)]["pearson"])


def test_resume_continues_exactly(setup, full_run, tmp_path):
    """Stopped mid-epoch and resumed (dropout on, so RNG states matter) == uninterrupted."""
    full_out, full = full_run
    part = recipe.main(argv(setup, tmp_path / "part", "--save-every", "2", "--stop-after", "3"))
    assert part["stopped"] and part["global_step"] == 3 and not (tmp_path / "part" / "final").exists()
    resumed = recipe.main(argv(setup, tmp_path / "part", "--save-every", "2", "--resume"))
    assert resumed["global_step"] == full["global_step"] == 10
    assert resumed["calibration"] == full["calibration"]
    assert resumed["after"] == full["after"]  # the before/after table survives the interruption too
    epoch_losses = lambda out: [e["train_loss"] for e in map(json.loads, (out / "log.jsonl").read_text().splitlines())  # noqa: E731
                                if e["event"] == "epoch" and e["epoch"] > 0]
    assert epoch_losses(tmp_path / "part") == epoch_losses(full_out)
    a, b = final_state(full_out), final_state(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Killed(BaseException):
    """A hard kill of the recipe: nothing of it runs after this is raised."""


def events(out: Path) -> list[tuple]:
    """The log's events (but ``resume``), each by its kind, epoch, step and evaluation time."""
    logged = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [(e["event"], e.get("epoch"), e.get("step"), e.get("when")) for e in logged if e["event"] != "resume"]


def killed_then_resumed(setup, out: Path, monkeypatch, kind: str, at, *extra: str,
                        earlier_checkpoint: bool = False) -> dict:
    """Run the recipe in ``out`` until it logs the event ``kind`` of step (or evaluation time) ``at``,
    kill it there, then resume it (``earlier_checkpoint``: from a checkpoint of an earlier version of
    the recipe, without the log's event count); the resumed run's result."""
    log = recipe.common.JsonLog.__call__

    def killed_after(self, event, **fields):
        log(self, event, **fields)
        if event == kind and at in (fields.get("step"), fields.get("when"), "any"):
            raise Killed

    monkeypatch.setattr(recipe.common.JsonLog, "__call__", killed_after)
    with pytest.raises(Killed):
        recipe.main(argv(setup, out, *extra))
    monkeypatch.undo()
    if earlier_checkpoint:
        path = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
        state = torch.load(path, weights_only=True)
        del state["log_events"]
        torch.save(state, path)
    resumed = recipe.main(argv(setup, out, *extra, "--resume"))
    assert [e["event"] for e in map(json.loads, (out / "log.jsonl").read_text().splitlines())].count("resume") == 1
    return resumed


@pytest.mark.parametrize("kind, at, earlier_checkpoint", [("step", 3, False), ("eval", "after", False),
                                                         ("step", 3, True)])
def test_a_resumed_log_holds_each_event_once(setup, full_run, tmp_path, monkeypatch, kind, at, earlier_checkpoint):
    """Killed just after logging step 3 (its checkpoint is step 2's) or the final test evaluation
    (after the last checkpoint), then resumed: the log holds the uninterrupted run's events, each
    once. Before, what was logged after the checkpoint stayed in the log and was logged again. A
    checkpoint of an earlier version of the recipe, which has no event count, keeps the events up to
    its step."""
    resumed = killed_then_resumed(setup, tmp_path / "run", monkeypatch, kind, at, "--save-every", "2",
                                  earlier_checkpoint=earlier_checkpoint)
    assert resumed["calibration"] == full_run[1]["calibration"]
    assert events(tmp_path / "run") == events(full_run[0])


def test_a_run_resumed_after_its_early_stop_trains_no_further(setup, tmp_path, monkeypatch):
    """Killed after stopping early (while it saved and tested the final model), then resumed: it
    finishes as the uninterrupted run did. Before, it trained the epochs that early stopping had cut."""
    extra = ("--epochs", "4", "--patience", "1", "--lr", "3e-2", "--max-train-pairs", "12")
    full = recipe.main(argv(setup, tmp_path / "full", *extra))
    assert full["global_step"] < 12  # stopped early (3 steps an epoch)
    resumed = killed_then_resumed(setup, tmp_path / "run", monkeypatch, "early_stop", "any", *extra)
    assert resumed["global_step"] == full["global_step"] and resumed["after"] == full["after"]
    assert events(tmp_path / "run") == events(tmp_path / "full")


def files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_run_directory_is_never_overwritten_silently(setup, tmp_path, capsys):
    """Issue 32: run again without --resume over a run's directory, the recipe refuses, naming --resume
    and --overwrite, and leaves the run as it was; --resume continues it, --overwrite starts over."""
    out = tmp_path / "run"
    quick = ("--epochs", "1", "--max-train-pairs", "12", "--skip-baseline", "--dev-fraction", "0", "--save-every", "1")
    stopped = recipe.main(argv(setup, out, *quick, "--stop-after", "1"))
    assert stopped["stopped"] and stopped["global_step"] == 1
    before = files(out)
    with pytest.raises(SystemExit, match="--resume.*--overwrite"):
        recipe.main(argv(setup, out, *quick))
    assert files(out) == before  # the checkpoints and the log untouched
    resumed = recipe.main(argv(setup, out, *quick, "--resume"))
    assert resumed["global_step"] == 3 and not resumed["stopped"]
    finished = files(out)
    with pytest.raises(SystemExit, match="--resume.*--overwrite"):  # a finished run, too
        recipe.main(argv(setup, out, *quick))
    assert files(out) == finished
    (out / "notes.txt").write_text("mine")
    again = recipe.main(argv(setup, out, *quick, "--overwrite"))
    assert again["global_step"] == 3 and again["calibration"] == resumed["calibration"]
    events = [json.loads(line)["event"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert events.count("config") == 1 and "resume" not in events  # the old log went with the old run
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own outputs are deleted
    with pytest.raises(SystemExit):
        recipe.main(argv(setup, out, "--resume", "--overwrite"))
    assert "not allowed with argument" in capsys.readouterr().err


def test_identity_calibration_and_frozen_blocks(setup, tmp_path):
    result = recipe.main(argv(setup, tmp_path / "run", "--calibration-init", "identity", "--calibration-lr", "0",
                              "--freeze-below", "1", "--epochs", "1", "--skip-baseline", "--dev-fraction", "0",
                              "--max-train-pairs", "12"))
    assert result["calibration"] == {"a": 1.0, "b": 0.0}
    assert result["global_step"] == 3  # 12 of the 24 pairs, batches of 4
    import torchmover as tm

    before = tm.Scorer(str(setup[0]), layer=2).encoder.model.state_dict()
    after = tm.Scorer.from_pretrained(tmp_path / "run" / "final").encoder.model.state_dict()
    assert torch.equal(before["embeddings.word_embeddings.weight"], after["embeddings.word_embeddings.weight"])
    assert torch.equal(before["encoder.layer.0.output.dense.weight"], after["encoder.layer.0.output.dense.weight"])
    assert not torch.equal(before["encoder.layer.1.output.dense.weight"], after["encoder.layer.1.output.dense.weight"])


def test_least_squares_matches_polyfit():
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    a, b = recipe.least_squares(x.sum(), y.sum(), (x * x).sum(), (x * y).sum(), len(x))
    assert (a, b) == pytest.approx(tuple(np.polyfit(x, y, 1)))
    assert recipe.least_squares(3.0, 1.0, 3.0, 1.0, 3) == (1.0, pytest.approx(-2 / 3))  # constant scores


def test_bad_arguments_are_reported(setup, full_run, tmp_path):
    with pytest.raises(SystemExit, match="fp16 needs a GPU"):
        recipe.main(argv(setup, tmp_path / "x", "--precision", "fp16", "--device", "cpu"))
    with pytest.raises(SystemExit, match="--batch-size 4 -> 3"):  # the data order would change
        recipe.main(argv(setup, full_run[0], "--resume", "--batch-size", "3"))


def test_resume_refuses_every_option_that_changes_the_numbers_before_writing(setup, full_run, tmp_path):
    """--resume with another test set (the restored baseline would be another set's), or other
    optimisation options (applied or silently ignored before), is refused in one line naming each
    option with its old and new value, and nothing is written; the allow-listed options are not."""
    out = full_run[0]
    other = write_ratings(tmp_path / "other.tsv", seed=1)
    before = files(out)
    changed = ("--test", str(other), "--year", "2016", "--lr", "5e-2", "--weight-decay", "0.5", "--max-grad-norm",
               "1e-4", "--precision", "bf16", "--calibration-lr", "0", "--seed", "3")
    with pytest.raises(SystemExit) as refused:
        recipe.main(argv(setup, out, "--resume", "--stop-after", "1", "--keep-checkpoints", "3", *changed))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("finetune_wmt.py: error: --resume: ")
    for option in ("--test None -> ['", "--year None -> 2016", "--lr 0.001 -> 0.05", "--weight-decay 0.01 -> 0.5",
                   "--max-grad-norm 1.0 -> 0.0001", "--precision 'fp32' -> 'bf16'", "--calibration-lr None -> 0.0",
                   "--seed 0 -> 3"):
        assert option in message, option
    assert "--stop-after" not in message and "--keep-checkpoints" not in message  # they change no number
    assert files(out) == before


def test_errors_are_one_line_with_exit_status_2_at_the_command_line(setup, tmp_path):
    done = subprocess.run([sys.executable, str(RECIPE), "--model", str(setup[0]), "--train", str(setup[1]),
                           "--dev-fraction", "1", "--output", str(tmp_path / "run")], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "finetune_wmt.py: error: --dev-fraction must be in [0, 1), got 1.0"
    assert not (tmp_path / "run").exists()


def one_reference(path: Path, n: int = 8) -> Path:
    """Ratings that all share one reference: a dev split takes them all."""
    rows = [f"de-en\t2016\tthe cat sat\thyp {i}\t{i / n:.3f}" for i in range(n)]
    path.write_text("lp\tyear\tref\thyp\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("case, message", [
    ("no training left", "--dev-fraction 0.6 leaves no training rating (8 of 8 ratings in 1 language pair(s)"),
    ("test pair of one", "test_one.tsv: language pair cs-en/2016 has 1 rating; a correlation needs at least 2"),
    ("missing model", "--model ./no/such/model: no such directory"),
    ("dev fraction 1", "--dev-fraction must be in [0, 1), got 1.0"),
    ("output is a file", "is a file, not a directory"),
    ("missing test", "ratings file not found"),
    ("no dev rows", "--dev-fraction 0.01 holds out no rating (0 of 24 ratings in 2 language pair(s) held out"),
    ("dev pair of one", "--dev-fraction 0.05 puts 1 rating of"),
])
def test_bad_inputs_stop_in_one_line_before_anything_is_written(setup, tmp_path, case, message):
    """Before, the first two ended in a traceback after log.jsonl was written (so the corrected command
    was refused until --overwrite), the next three in a traceback, a missing --test path created the
    output directory, and a dev split of no rows turned model selection off silently."""
    out, extra = tmp_path / "run", []
    if case == "no training left":
        extra = ["--train", str(one_reference(tmp_path / "one_ref.tsv")), "--dev-fraction", "0.6"]
    elif case == "test pair of one":
        test = tmp_path / "test_one.tsv"
        test.write_text(setup[1].read_text(encoding="utf-8").splitlines()[0] + "\n"
                        + "\n".join(setup[1].read_text(encoding="utf-8").splitlines()[1:4]) + "\n", encoding="utf-8")
        extra = ["--test", str(test)]
    elif case == "missing model":
        extra = ["--model", "./no/such/model"]
    elif case == "dev fraction 1":
        extra = ["--dev-fraction", "1"]
    elif case == "output is a file":
        out.write_text("notes")
    elif case == "missing test":
        extra = ["--test", str(tmp_path / "missing.tsv")]
    elif case == "no dev rows":
        extra = ["--dev-fraction", "0.01"]
    elif case == "dev pair of one":
        extra = ["--dev-fraction", "0.05"]
    with pytest.raises(SystemExit) as refused:
        recipe.main(argv(setup, out, *extra))
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert out.is_file() if case == "output is a file" else not out.exists()


def test_output_inside_a_saved_scorer_or_another_run_is_refused(setup, full_run):
    """Before, --output RUN/final wrote a whole run (checkpoints, log) into the published scorer."""
    out = full_run[0]
    before = files(out)
    for inside, owner, what in ((out / "final", out / "final", "a saved scorer"),
                                (out / "final" / "more", out / "final", "a saved scorer"),
                                (out / "elsewhere", out, "another run")):
        with pytest.raises(SystemExit, match=re.escape(f"is inside {owner}, which holds {what}")):
            recipe.main(argv(setup, inside))
    assert files(out) == before


def test_empty_texts_are_counted_once_in_a_warning(setup, tmp_path, capsys):
    data = tmp_path / "ratings.tsv"
    lines = setup[1].read_text(encoding="utf-8").splitlines()
    lp, year, ref, hyp, score = lines[1].split("\t")
    lines[1] = "\t".join((lp, year, ref, "", score))
    lines[2] = "\t".join(lines[2].split("\t")[:2] + ["", *lines[2].split("\t")[3:]])
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    recipe.main(argv((setup[0], data), tmp_path / "run", "--dev-fraction", "0", "--epochs", "1", "--skip-baseline",
                     "--calibration-init", "identity"))
    err = capsys.readouterr().err
    assert err.count("finetune_wmt.py: warning:") == 1
    assert "2 of 24 training ratings have an empty hypothesis or reference" in err


def test_stop_after_counts_the_steps_of_each_invocation(setup, full_run, tmp_path):
    """A time-limited job resubmits the same command with --resume: each invocation runs up to 4 more
    steps, and the run ends as the uninterrupted one (before, every resume ran one step)."""
    out, steps = tmp_path / "run", []
    result = recipe.main(argv(setup, out, "--stop-after", "4"))
    while result["stopped"]:
        steps.append(result["global_step"])
        result = recipe.main(argv(setup, out, "--stop-after", "4", "--resume"))
    assert steps == [4, 8] and result["global_step"] == 10 and result["steps_run"] == 2
    assert result["calibration"] == full_run[1]["calibration"] and result["after"] == full_run[1]["after"]


def test_without_test_the_report_is_named_as_the_dev_split(full_run):
    """The dev split chose the epoch: its report is dev_report.json, result.json says it is not held
    out, and the table's title and the log say dev (before, test_report.json)."""
    out, result = full_run
    assert (out / "dev_report.json").is_file() and not (out / "test_report.json").exists()
    saved = json.loads((out / "result.json").read_text())
    assert saved["report"]["split"] == "dev" and saved["report"]["held_out"] is False
    assert saved["report"]["file"] == "dev_report.json" and result["report"] == saved["report"]
    assert (out / "table.txt").read_text().startswith("dev split (--dev-fraction 0.25 of the training ratings; "
                                                      "it chose the epoch, so it is not held out)")
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert {e["split"] for e in logged if e["event"] == "eval"} == {"dev"}


def check_provenance(record: dict, data: Path) -> None:
    assert record["command"].startswith("python ") and record["device"]["name"] == "cpu"
    assert set(record["versions"]) == {"python", "torchmover", "torch", "transformers"}
    assert record["code"]["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", record["code"]["commit"])
    assert record["data"] == [{"path": str(data), "bytes": data.stat().st_size,
                               "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}]


def test_every_output_records_its_provenance(setup, full_run):
    """result.json, the report, the log's config event carry the command, versions, commit, device
    and data files (before, result.json had none of them)."""
    out = full_run[0]
    result = json.loads((out / "result.json").read_text())
    check_provenance(result["provenance"], setup[1])
    assert result["args"]["lr"] == 1e-3 and result["args"]["train"] == [str(setup[1])]
    check_provenance(json.loads((out / "dev_report.json").read_text())["provenance"], setup[1])
    config = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert config["event"] == "config"
    check_provenance(config["provenance"], setup[1])


def test_the_curves_name_the_loss_that_was_trained(setup, full_run, monkeypatch):
    from matplotlib.figure import Figure

    labels = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, out, **kw: labels.append(fig.axes[0].get_ylabel()))
    recipe.plot_curves(full_run[0] / "log.jsonl", full_run[0] / "unused.png")
    assert labels == ["train loss (MSE + 1 × pearson term)"]  # the default --loss mse+pearson


def _ddp_worker(rank, world_size, model, data, output):
    recipe.main(["--model", model, "--layer", "2", "--train", data, "--dev-fraction", "0", "--output", output,
                 "--batch-size", "3", "--epochs", "1", "--lr", "1e-3", "--skip-baseline", "--no-progress",
                 "--no-plot", "--calibration-fit-size", "0", "--loss", "mse+pearson"])
    return {}


def test_two_processes_equal_one_with_the_global_batch(tmp_path):
    """W=2 processes with batch 3 == 1 process with batch 6: same pairs per step, batch centering over
    the global batch (differentiable all-reduce), the Pearson term on the gathered global batch,
    gradients summed over ranks. Dropout off."""
    model = str(write_model(tmp_path / "tiny", dropout=0.0))
    data = str(write_ratings(tmp_path / "ratings.tsv", n=24))
    _ddp.run(_ddp_worker, 2, tmp_path, model, data, str(tmp_path / "two"), timeout=90)
    recipe.main(["--model", model, "--layer", "2", "--train", data, "--dev-fraction", "0", "--output",
                 str(tmp_path / "one"), "--batch-size", "6", "--epochs", "1", "--lr", "1e-3", "--skip-baseline",
                 "--no-progress", "--no-plot", "--calibration-fit-size", "0", "--loss", "mse+pearson"])
    one, two = final_state(tmp_path / "one"), final_state(tmp_path / "two")
    assert one.keys() == two.keys()
    # Batch centering removes any shift common to all tokens, so the bias of the scored layer's last
    # LayerNorm has a zero gradient up to rounding, which Adam normalises to ±lr: not comparable.
    shift = "encoder.layer.1.output.LayerNorm.bias"
    for k in one.keys() - {shift}:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=1e-5)
    cal = [json.loads((tmp_path / r / "final" / "calibration.json").read_text()) for r in ("one", "two")]
    assert cal[0]["a"] == pytest.approx(cal[1]["a"], rel=1e-4) and cal[0]["b"] == pytest.approx(cal[1]["b"], rel=1e-4)


def test_correlation_losses_match_naive_definitions():
    import numpy as np

    gen = torch.Generator().manual_seed(0)
    pred, human = torch.randn(9, generator=gen, dtype=torch.float64), torch.randn(9, generator=gen, dtype=torch.float64)
    human[3] = human[5]  # a tie: not an ordered pair
    r = np.corrcoef(pred.numpy(), human.numpy())[0, 1]
    assert float(recipe.correlation_loss(pred, human, "pearson")) == pytest.approx(1 - r)
    assert float(recipe.correlation_loss(3 * pred - 2, human, "pearson")) == pytest.approx(1 - r)  # affine-invariant
    pairs = [(i, j) for i in range(9) for j in range(9) if human[i] > human[j]]
    naive = sum(math.log1p(math.exp(-(pred[i] - pred[j]).item())) for i, j in pairs) / len(pairs)
    assert float(recipe.correlation_loss(pred, human, "rank")) == pytest.approx(naive)
    assert float(recipe.correlation_loss(pred, torch.zeros(9, dtype=torch.float64), "rank")) == 0  # nothing ordered
    x = pred.clone().requires_grad_()
    for kind in ("pearson", "rank"):
        assert torch.autograd.gradcheck(lambda p: recipe.correlation_loss(p, human, kind), (x,))


def test_layer_decay_learning_rates(setup):
    import torchmover as tm

    scorer = tm.Scorer(str(setup[0]), layer=2)
    args = recipe.build_parser().parse_args(["--lr", "1e-3", "--layer-decay", "0.5", "--calibration-lr", "0"])
    groups = recipe.param_groups(scorer, recipe.Calibration(), args)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    named = dict(scorer.encoder.model.named_parameters())
    assert lr_of[id(named["encoder.layer.1.output.dense.weight"])] == pytest.approx(1e-3)  # the scored block
    assert lr_of[id(named["encoder.layer.0.output.dense.weight"])] == pytest.approx(5e-4)
    assert lr_of[id(named["embeddings.word_embeddings.weight"])] == pytest.approx(2.5e-4)
    assert sum(len(g["params"]) for g in groups) == sum(1 for p in scorer.parameters() if p.requires_grad)
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay[id(named["encoder.layer.0.output.LayerNorm.weight"])] == 0 < decay[id(named["encoder.layer.0.output.dense.weight"])]
    with pytest.raises(ValueError, match="--layer-decay"):
        recipe.param_groups(scorer, recipe.Calibration(), recipe.build_parser().parse_args(["--layer-decay", "0"]))


def test_seeds_table_is_written_and_finished_seeds_are_not_rerun(setup, tmp_path):
    """--seeds with the correlation loss, layer-wise decay, fixed training centering, early stopping."""
    import numpy as np

    out = tmp_path / "sweep"
    extra = ("--seeds", "0,1", "--epochs", "3", "--patience", "1", "--lr", "3e-2", "--loss", "mse+rank",
             "--loss-weight", "0.5", "--layer-decay", "0.8", "--centering", "fixed", "--max-train-pairs", "12")
    table = recipe.main(argv(setup, out, *extra))
    rows = {r["seed"]: r for r in table["seeds"]}
    assert set(rows) == {0, 1} and (out / "seeds.md").is_file()
    assert json.loads((out / "seeds.json").read_text())["stats"] == table["stats"]
    for seed in (0, 1):
        result = json.loads((out / f"seed-{seed}" / "result.json").read_text())
        assert rows[seed]["r_after"] == result["after"]["pearson"]
        assert rows[seed]["delta_r"] == pytest.approx(result["after"]["pearson"] - result["baseline"]["pearson"])
        dev = {int(e): d["pearson"] for e, d in result["dev_history"].items() if int(e) > 0}
        assert result["best_epoch"] == max(dev, key=dev.get)
        stop = next((e for e in sorted(dev) if e - max((k for k in dev if k <= e), key=dev.get) >= 1), 3)
        assert max(dev) == stop  # early stopping after one epoch without a better dev r
    best = max((0, 1), key=lambda seed: rows[seed]["dev_r"])  # the metric to keep: the best dev r
    assert table["final"]["seed"] == best and f"seed {best}, the best dev r" in (out / "seeds.md").read_text()
    kept, _ = recipe.load_finetuned(out / "final")
    assert kept.signature == recipe.load_finetuned(out / f"seed-{best}" / "final")[0].signature
    deltas = [rows[s]["delta_r"] for s in (0, 1)]
    assert table["stats"]["delta_r"]["mean"] == pytest.approx(np.mean(deltas))
    assert table["stats"]["delta_r"]["sd"] == pytest.approx(np.std(deltas, ddof=1))
    mtime = (out / "seed-0" / "log.jsonl").stat().st_mtime_ns
    again = recipe.main(argv(setup, out, *extra))
    assert again["stats"] == table["stats"] and (out / "seed-0" / "log.jsonl").stat().st_mtime_ns == mtime
    assert not (out / "seeds.png").exists()  # --no-plot
    recipe.main([a for a in argv(setup, out, *extra) if a != "--no-plot"])  # reads the seeds, draws the plot
    assert (out / "seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = (out / "seeds.json").read_text()
    with pytest.raises(SystemExit, match="seed 0 .*--lr 0.03 -> 0.05"):  # before: reused, and seeds.json said 0.05
        recipe.main(argv(setup, out, *extra, "--lr", "5e-2"))
    assert (out / "seeds.json").read_text() == saved
    saved = json.loads(saved)
    assert saved["options"]["0"]["lr"] == 3e-2 and saved["options"]["1"]["seed"] == 1
    assert "`lr=0.03`" in (out / "seeds.md").read_text() and saved["report"]["split"] == "dev"
    check_provenance(saved["provenance"], setup[1])
    with pytest.raises(SystemExit, match="--seeds"):
        recipe.main(argv(setup, out, "--seeds", "0,x"))


def test_stop_after_spans_the_seeds_of_an_invocation(setup, tmp_path, capsys):
    """--stop-after counts an invocation's steps over all its seeds: a job resubmitted with --resume
    (each time with the steps it has time for) stops inside a seed, and between two seeds when one
    ends on the last step allowed, and the seeds end as an uninterrupted --seeds run (5 steps each)."""
    extra = ("--seeds", "0,1", "--epochs", "1", "--max-train-pairs", "20")
    whole = recipe.main(argv(setup, tmp_path / "whole", *extra))
    out, stops = tmp_path / "parts", []
    for budget in ("3", "2", "4"):
        result = recipe.main(argv(setup, out, *extra, "--stop-after", budget, *(("--resume",) if stops else ())))
        stops.append((result["stopped"], result["seed"]))
    assert stops == [(True, 0), (True, 1), (True, 1)]
    assert "stopped after 2 steps (--stop-after), before seed 1" in capsys.readouterr().out
    table = recipe.main(argv(setup, out, *extra, "--resume"))
    for seed in (0, 1):
        logged = [json.loads(line) for line in (out / f"seed-{seed}" / "log.jsonl").read_text().splitlines()]
        assert [e["step"] for e in logged if e["event"] == "step"][-1] == 5
    assert table["seeds"] == whole["seeds"] and table["stats"] == whole["stats"]


@pytest.mark.parametrize("method, direction", [("trwmd", "recall"), ("bertscore", "f1"), ("sbert", "recall")])
def test_other_members_train(setup, tmp_path, method, direction):
    result = recipe.main(argv(setup, tmp_path / method, "--method", method, "--direction", direction,
                              "--epochs", "1", "--max-train-pairs", "8"))
    loaded, _ = recipe.load_finetuned(tmp_path / method / "final")
    assert loaded.config.method == method and loaded.config.centering == "fixed"
    assert math.isfinite(result["after"]["pearson"]) and result["best_epoch"] == 1


def test_a_self_contained_centering_is_evaluated_and_saved_as_trained(setup, tmp_path):
    """--centering none: no fixed mean at evaluation (each text's vectors depend on nothing else)."""
    result = recipe.main(argv(setup, tmp_path / "none", "--centering", "none", "--epochs", "1",
                              "--max-train-pairs", "8"))
    loaded, _ = recipe.load_finetuned(tmp_path / "none" / "final")
    assert loaded.config.centering == "none" and "|center:none|" in loaded.signature
    assert math.isfinite(result["after"]["pearson"])


def test_default_layer_is_the_top_one(setup, tmp_path):
    """Without --layer the recipe reads the top layer, so every transformer block is trained."""
    import torchmover as tm

    model, data = setup
    assert recipe.top_layer(str(model)) == 3  # the tiny model's blocks
    recipe.main(["--model", str(model), "--train", str(data), "--dev-fraction", "0", "--output", str(tmp_path / "run"),
                 "--batch-size", "4", "--max-train-pairs", "8", "--skip-baseline", "--no-progress", "--no-plot"])
    loaded = tm.Scorer.from_pretrained(tmp_path / "run" / "final")
    assert "|layer:3|" in loaded.signature and loaded.encoder.model.config.num_hidden_layers == 3


@pytest.mark.parametrize("name, content, message", [
    ("missing.tsv", None, "ratings file not found"),
    ("bad.tsv", "lp\tyear\tref\thyp\tscore\nde-en\t2016\ta\tb\tnot-a-number\n", "bad.tsv:2: score must be a number"),
])
def test_an_unreadable_ratings_path_is_a_one_line_error(setup, tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        recipe.main(["--model", str(setup[0]), "--layer", "2", "--train", str(path), "--output", str(tmp_path / "run"),
                     "--no-progress", "--no-plot"])
    assert str(exit_info.value).startswith("finetune_wmt.py: error: ") and message in str(exit_info.value)
    assert "\n" not in str(exit_info.value)
