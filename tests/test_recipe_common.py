"""recipes/common.py, the helpers both training recipes share: the JSON-lines log, eval mode, the
warm-up schedule, the run-directory rule, checkpoint paths and RNG states, and the distributed helpers
(one process and two gloo processes)."""
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import _ddp

RECIPES = str(Path(__file__).resolve().parents[1] / "recipes")
if RECIPES not in sys.path:
    sys.path.insert(0, RECIPES)
import common  # noqa: E402

from torchmover.runtime.checkpoint import rng_state, save_checkpoint  # noqa: E402


def test_json_log_appends_reads_and_truncates(tmp_path):
    log = common.JsonLog(tmp_path / "log.jsonl")
    assert log.events("step") == []  # no file yet
    log("config", step=0, lr=0.1)
    for step in (1, 2, 3):
        log("step", step=step, loss=1.0 / step)
    log("eval", step=3, reward=0.5)
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["config", "step", "step", "step", "eval"]
    assert all(isinstance(e["time"], float) for e in lines) and lines[0]["lr"] == 0.1
    assert [e["step"] for e in log.events("step")] == [1, 2, 3]
    log.truncate_after(1)  # a resume from step 1 redoes steps 2 and 3
    assert [(e["event"], e["step"]) for e in map(json.loads, log.path.read_text().splitlines())] == [
        ("config", 0), ("step", 1)]
    log("step", step=2, loss=0.25)
    assert [e["loss"] for e in log.events("step")] == [1.0, 0.25]


def test_json_log_truncates_to_the_events_a_checkpoint_counted(tmp_path):
    """What was logged after a checkpoint is dropped on resume whatever its step (an evaluation after
    the last checkpoint has that checkpoint's step, or none), and so is a line that a kill cut short."""
    log = common.JsonLog(tmp_path / "log.jsonl")
    assert log.count() == 0  # no file yet
    log("step", step=1)
    log("epoch", epoch=1, step=1)
    saved = log.count()  # the checkpoint at the end of epoch 1
    log("early_stop", epoch=1)
    log("eval", when="after")
    log("done", step=1)
    with open(log.path, "a", encoding="utf-8") as fh:
        fh.write('{"event": "st')
    log.truncate_to(saved)
    assert saved == 2 and [e["event"] for e in map(json.loads, log.path.read_text().splitlines())] == ["step", "epoch"]
    log("eval", when="after")
    assert log.count() == 3 and log.events("eval")[0]["when"] == "after"


def test_disabled_json_log_writes_nothing(tmp_path):
    log = common.JsonLog(tmp_path / "log.jsonl", enabled=False)  # a rank other than 0
    log("step", step=1)
    log.truncate_after(0)
    log.truncate_to(0)
    assert not (tmp_path / "log.jsonl").exists()


def test_eval_mode_restores_the_previous_mode():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    with common.eval_mode(model) as inside:
        assert inside is model and not model.training and not model[1].training
    assert model.training and model[1].training
    model.eval()
    with common.eval_mode(model):
        pass
    assert not model.training and not model[1].training  # not switched to training on the way out
    model.train()
    with pytest.raises(RuntimeError), common.eval_mode(model):
        raise RuntimeError
    assert model.training  # restored after an error too


def learning_rates(warmup: int, total: int, kind: str) -> list[float]:
    """The factor of the peak at every step of :func:`common.warmup_schedule` (peak lr 1)."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(()))], lr=1.0)
    scheduler = common.warmup_schedule(optimizer, warmup, total, kind)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_warmup_schedule():
    # warm-up over 3 steps at 1/4, 2/4, 3/4 of the peak, the peak at step 3, then linear decay to 0 at step 10
    assert learning_rates(3, 10, "linear") == pytest.approx(
        [1 / 4, 2 / 4, 3 / 4, 1, 6 / 7, 5 / 7, 4 / 7, 3 / 7, 2 / 7, 1 / 7])
    assert learning_rates(3, 6, "constant") == pytest.approx([1 / 4, 2 / 4, 3 / 4, 1, 1, 1])
    assert learning_rates(0, 4, "linear") == pytest.approx([1, 3 / 4, 2 / 4, 1 / 4])  # no warm-up
    assert learning_rates(0, 3, "constant") == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="cosine"):
        learning_rates(1, 3, "cosine")


def test_claim_run_directory(tmp_path):
    outputs = ("checkpoints", "log.jsonl", "final")
    assert common.claim_run_directory(tmp_path / "new", outputs, resume=False, overwrite=False) == []  # nothing yet
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", {"step": 1}, 1)
    (run / "log.jsonl").write_text("{}\n")
    (run / "notes.txt").write_text("not the run's")
    snapshot = lambda: sorted(str(p.relative_to(run)) for p in run.rglob("*"))  # noqa: E731
    before = snapshot()
    with pytest.raises(SystemExit, match=r"holds a run \(checkpoints, log.jsonl\): pass --resume .* --overwrite"):
        common.claim_run_directory(run, outputs, resume=False, overwrite=False)
    assert common.claim_run_directory(run, outputs, resume=True, overwrite=False) == ["checkpoints", "log.jsonl"]
    assert common.claim_run_directory(run, outputs, resume=False, overwrite=True, main=False) == [
        "checkpoints", "log.jsonl"]  # a rank other than 0: no refusal, nothing deleted
    assert snapshot() == before
    assert common.claim_run_directory(run, outputs, resume=False, overwrite=True) == ["checkpoints", "log.jsonl"]
    assert snapshot() == ["notes.txt"]  # the run's outputs only
    assert common.claim_run_directory(run, outputs, resume=False, overwrite=False) == []


def killed_while_writing_the_first_checkpoint(run):
    """What a run killed while writing its first checkpoint leaves: its log, a checkpoint folder with
    the half-written temporary only (no 'latest'), a save's staging directory with its lock file."""
    (run / "checkpoints").mkdir(parents=True)
    (run / "log.jsonl").write_text('{"event": "config"}\n')
    (run / "checkpoints" / ".step-0000001.pt.k3x9q2z1.tmp").write_bytes(b"\0" * 1024)
    (run / ".final.tmp-abcd1234").mkdir()
    (run / ".final.tmp-abcd1234" / ".torchmover-held").touch()


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_over(tmp_path, capsys):
    """Before, rerunning said "pass --resume" and --resume ended in a traceback (no 'latest' file),
    the temporary left in place."""
    outputs = ("checkpoints", "log.jsonl", "final")
    run = tmp_path / "run"
    killed_while_writing_the_first_checkpoint(run)
    (run / "notes.txt").write_text("not the run's")
    assert common.nothing_to_resume("latest", run, outputs, main=False) is True  # every rank agrees
    assert (run / "log.jsonl").exists()  # only the main process deletes
    assert common.nothing_to_resume("latest", run, outputs) is True
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "no checkpoint" in said[0] and "starting it over" in said[0], said
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # no temporary left
    save_checkpoint(run / "checkpoints", {"step": 1}, 1)
    assert common.nothing_to_resume("latest", run, outputs) is False  # a checkpoint: resume it
    assert common.nothing_to_resume(None, run, outputs) is False
    assert common.nothing_to_resume(str(run / "checkpoints" / "step-0000001.pt"), run, outputs) is False


def test_every_temporary_of_a_killed_run_is_removed_by_the_next_run(tmp_path):
    """Before, a 259 MiB checkpoint temporary stayed until --overwrite."""
    import fcntl

    outputs = ("checkpoints", "log.jsonl", "final")
    run = tmp_path / "run"
    killed_while_writing_the_first_checkpoint(run)
    held = run / "checkpoints" / ".step-0000002.pt.inflight.tmp"  # written now by another process: kept
    with open(held, "wb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        with pytest.raises(SystemExit, match="pass --resume"):  # the rerun refuses, and still cleans up
            common.claim_run_directory(run, outputs, resume=False, overwrite=False)
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [held.name]
        assert not (run / ".final.tmp-abcd1234").exists()


def test_resume_path(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        common.resume_path("latest", checkpoints)
    save_checkpoint(checkpoints, {"step": 1}, 1)
    newest = save_checkpoint(checkpoints, {"step": 2}, 2)
    assert common.resume_path("latest", checkpoints) == newest
    assert common.resume_path(str(checkpoints / "step-0000001.pt"), checkpoints) == checkpoints / "step-0000001.pt"
    with pytest.raises(FileNotFoundError, match="step-0000009.pt not found"):
        common.resume_path(str(checkpoints / "step-0000009.pt"), checkpoints)


def test_one_process_helpers(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not dist.is_initialized()
    with common.torchrun_process_group(torch.device("cpu")):  # a plain launch: no process group
        assert not dist.is_initialized() and common.rank_and_world() == (0, 1)
    assert common.local_device("cpu") == torch.device("cpu")
    common.barrier()
    assert common.broadcast_object({"epoch": 3}) == {"epoch": 3}
    t = torch.arange(3.0)
    assert common.all_gather_cat(t) is t
    param = nn.Parameter(torch.ones(2))
    param.grad = torch.full((2,), 2.0)
    common.sum_gradients_([param])
    assert torch.equal(param.grad, torch.full((2,), 2.0))
    states = common.all_rng_states()
    assert len(states) == 1 and torch.equal(states[0]["torch"], rng_state()["torch"])


def _helpers_worker(rank, world_size):
    out = {"rank_and_world": list(common.rank_and_world())}
    with common.torchrun_process_group(torch.device("cpu")):  # the caller's group: used, left alone
        out["broadcast"] = common.broadcast_object(rank * 10 + 7)
    out["still_initialized"] = dist.is_initialized()

    torch.manual_seed(rank)  # different weights on every rank, then rank 0's everywhere
    module = nn.Linear(3, 2)
    module.register_buffer("count", torch.tensor([float(rank)]))
    common.broadcast_parameters_(module)
    out["weight"], out["count"] = module.weight.detach().clone(), module.count.clone()

    params = [nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(1))]
    params[0].grad, params[1].grad = torch.full((2, 2), rank + 1.0), torch.arange(3.0) * (rank + 1)
    common.sum_gradients_(params)  # params[2] has no gradient: skipped
    out["grads"] = [params[0].grad.clone(), params[1].grad.clone()]
    out["no_grad"] = params[2].grad is None

    t = torch.tensor([float(rank), float(rank)], requires_grad=True)
    gathered = common.all_gather_cat(t)
    (gathered * torch.arange(4.0) * (rank + 1)).sum().backward()
    out["gathered"], out["t_grad"] = gathered.detach(), t.grad.clone()

    torch.manual_seed(100 + rank)
    out["rng"] = [s["torch"] for s in common.all_rng_states()]
    out["own_rng"] = rng_state()["torch"]
    return out


def test_distributed_helpers_on_two_processes(tmp_path):
    ranks = _ddp.run(_helpers_worker, 2, tmp_path, timeout=60)
    for rank, out in enumerate(ranks):
        assert out["rank_and_world"] == [rank, 2] and out["still_initialized"]
        assert out["broadcast"] == 7  # rank 0's value
        torch.testing.assert_close(out["weight"], ranks[0]["weight"], rtol=0, atol=0)
        assert out["count"].item() == 0.0
        torch.testing.assert_close(out["grads"][0], torch.full((2, 2), 3.0))  # 1 + 2
        torch.testing.assert_close(out["grads"][1], torch.arange(3.0) * 3)
        assert out["no_grad"]
        torch.testing.assert_close(out["gathered"], torch.tensor([0.0, 0.0, 1.0, 1.0]))
        # Σ_s ∂L_s/∂t_r with L_s = Σ_i (s + 1) · i · gathered_i: (1 + 2) · (2r, 2r + 1)
        torch.testing.assert_close(out["t_grad"], 3 * torch.tensor([2.0 * rank, 2.0 * rank + 1]))
        assert len(out["rng"]) == 2
        for other in (0, 1):
            assert torch.equal(out["rng"][other], ranks[other]["own_rng"])
    assert not torch.equal(ranks[0]["own_rng"], ranks[1]["own_rng"])
    assert not dist.is_initialized()


def test_changed_options_name_each_difference_but_the_free_ones():
    import argparse

    recorded = common.options_record(argparse.Namespace(lr=0.1, out=Path("/r"), files=["a"], resume=None))
    assert recorded == {"lr": 0.1, "out": "/r", "files": ["a"], "resume": None}  # JSON values
    now = argparse.Namespace(lr=0.2, out=Path("/r"), files=["a", "b"], resume="latest", new=1)
    assert common.changed_options(recorded, now, free=("resume",)) == {
        "lr": (0.1, 0.2), "files": (["a"], ["a", "b"]), "new": (None, 1)}
    with pytest.raises(common.UsageError) as refused:
        common.refuse_changed_options("x.py", "run R", recorded, now, free=("resume", "new"))
    assert str(refused.value).startswith("x.py: error: run R was run with other options")
    assert str(refused.value).endswith("--lr 0.1 -> 0.2, --files ['a'] -> ['a', 'b']")
    common.refuse_changed_options("x.py", "run R", recorded, argparse.Namespace(**{**recorded, "resume": "latest"}),
                                  free=("resume",))  # only a free option changed: accepted


def test_a_usage_error_is_one_line_and_exit_status_2(capsys):
    def refused():
        raise common.UsageError("x.py: error: bad --flag")

    assert common.run_command(refused) == 2
    assert capsys.readouterr().err == "x.py: error: bad --flag\n"
    assert common.run_command(lambda: {"done": True}) == 0
    assert issubclass(common.UsageError, SystemExit)  # in-process callers see a SystemExit


def test_enclosing_run_finds_a_saved_scorer_or_another_run_above(tmp_path):
    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "run" / "log.jsonl").write_text("")
    (tmp_path / "run" / "final" / "torchmover.json").write_text("{}")
    markers = ("log.jsonl",)
    assert common.enclosing_run(tmp_path / "run", markers) is None  # a run's own directory: claim_run_directory's
    assert common.enclosing_run(tmp_path / "run" / "final", markers) == (tmp_path / "run" / "final").resolve()
    assert common.enclosing_run(tmp_path / "run" / "final" / "x", markers) == (tmp_path / "run" / "final").resolve()
    assert common.enclosing_run(tmp_path / "run" / "other", markers) == (tmp_path / "run").resolve()
    assert common.enclosing_run(tmp_path / "elsewhere", markers) is None
