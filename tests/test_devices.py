"""Device and dtype resolution (the CUDA branches by monkeypatching torch.cuda), and that nothing on the
scoring paths creates a tensor on the default device by accident."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import torchmover
from torchmover import Scorer
from torchmover.runtime.devices import resolve_device, resolve_dtype

HYPS = ["the cat sat on the mat", "a dog ran", "", "the quick brown fox"]
REFS = ["a cat was on the mat", ["the dog barked", "a dog runs"], "the sun", "a fox jumps over the lazy dog"]


@pytest.fixture
def cuda(monkeypatch):
    """Pretend this machine has ``n`` CUDA devices (resolution only: no tensor goes there)."""
    def fake(n: int, current: int = 0):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return fake


def test_auto_is_cpu_without_cuda(cuda):
    cuda(0)
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")


def test_auto_is_the_current_gpu_or_the_local_ranks(cuda, monkeypatch):
    cuda(4, current=2)
    assert resolve_device("auto") == torch.device("cuda", 2)
    monkeypatch.setenv("LOCAL_RANK", "3")  # torchrun / accelerate
    assert resolve_device("auto") == torch.device("cuda", 3)
    cuda(1)  # one GPU visible per process
    assert resolve_device("auto") == torch.device("cuda", 0)
    cuda(2)
    with pytest.raises(ValueError, match="LOCAL_RANK=3 .* 2 CUDA devices"):
        resolve_device("auto")
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        resolve_device("auto")


def test_explicit_devices(cuda):
    cuda(2)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"device='cuda:2' .* 2 CUDA device"):
        resolve_device("cuda:2")
    with pytest.raises(ValueError, match="device must be 'auto'"):
        resolve_device("gpu")
    with pytest.raises(TypeError, match="device must be"):
        resolve_device(0.5)


def test_cuda_without_cuda_is_a_clear_error(cuda, tiny_encoder):
    cuda(0)
    with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
        Scorer(tiny_encoder, device="cuda")


@pytest.mark.parametrize("name, dtype", [("float32", torch.float32), ("fp32", torch.float32),
                                         ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16),
                                         ("float16", torch.float16), ("fp16", torch.float16),
                                         ("torch.float64", torch.float64), (torch.bfloat16, torch.bfloat16),
                                         (None, None)])
def test_dtype_names(name, dtype):
    assert resolve_dtype(name) == dtype


@pytest.mark.parametrize("bad", ["int8", "auto", torch.int64, 3])
def test_bad_dtype_names_the_argument(bad, tiny_encoder):
    with pytest.raises(ValueError, match="dtype must be"):
        Scorer(tiny_encoder, dtype=bad)


def test_scorer_takes_dtype_strings(tiny_encoder):
    scorer = Scorer(tiny_encoder, dtype="bf16", centering="fixed")
    assert next(scorer.encoder.parameters()).dtype == torch.bfloat16
    assert scorer.centering.mean.dtype == torch.float32


def test_cli_reports_a_bad_device_in_one_line(tiny_model_dir, tmp_path, capsys, cuda):
    from torchmover.cli import main

    cuda(0)
    (tmp_path / "h.txt").write_text("the cat\n")
    (tmp_path / "r.txt").write_text("a cat\n")
    for option, value in (("--device", "cuda"), ("--dtype", "int8")):
        with pytest.raises(SystemExit) as exit_:
            main(["score", "--hyps", str(tmp_path / "h.txt"), "--refs", str(tmp_path / "r.txt"),
                  "--model", str(tiny_model_dir), "--layer", "2", option, value, "--no-progress"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and option.removeprefix("--") in err, err


# --- no tensor on the default device by accident -----------------------------------------------------

PACKAGE = str(Path(torchmover.__file__).resolve().parent)
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange,
             torch.eye, torch.linspace, torch.rand, torch.randn, torch.randint}


class DefaultDeviceGuard(TorchFunctionMode):
    """Records every factory call made *by torchmover code* that does not say where the tensor goes
    (no ``device=``; ``as_tensor`` of a tensor keeps its device and is fine). On a GPU such a tensor
    lands on the default device (the CPU) and costs a copy, or an error, later."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None and not (
                func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(str(Path(torch.__file__).parent)):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(PACKAGE):
                self.calls.append(f"{func.__name__} at {Path(frame.f_code.co_filename).name}:{frame.f_lineno}")
        return func(*args, **kwargs)


def test_the_guard_catches_a_factory_without_device():
    """The control: the guard has teeth (it sees torchmover's own calls, and only those)."""
    from torchmover.text import weights

    with DefaultDeviceGuard() as guard:
        torch.zeros(3)  # the test's own call: not torchmover's
        weights.ngrams(torch.randn(1, 3, 2), torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 3), 2)
    assert guard.calls == []
    with DefaultDeviceGuard() as guard:
        torchmover.functional.centering.Centering("fixed", dim=4)  # registers torch.zeros(dim): no device given
    assert guard.calls and guard.calls[0].startswith("zeros at centering.py"), guard.calls


@pytest.mark.parametrize("options", [
    dict(centering="fixed"),
    dict(centering="batch", method="bertscore", direction="f1", multi_ref="mean"),
    dict(centering="fixed", idf=True, subwords="first", stopwords="english", punctuation="drop", ngram=2),
    dict(centering="fixed", subwords="mean", method="trwmd"),
    dict(centering="none", method="sms"),
])
def test_scoring_paths_say_where_every_tensor_goes(tiny_encoder, options):
    from torchmover.evaluation.metric import MoverMetric
    from torchmover.reward.rewards import GroupReward, MoverReward, SelfCriticalReward

    scorer = Scorer(tiny_encoder, **options)
    refs = [r if isinstance(r, str) else r[0] for r in REFS]
    if scorer.config.idf:
        scorer.fit_idf(refs, HYPS)
    if scorer.config.centering == "fixed":
        scorer.fit_centering(refs, progress=False)
    reward, group, self_critical = MoverReward(scorer), GroupReward(scorer), SelfCriticalReward(scorer)
    if scorer.config.centering == "batch":
        reward.fit(refs)
        group.fit(refs)
        self_critical.fit(refs)
    metric = MoverMetric(scorer)
    with DefaultDeviceGuard() as guard:
        scorer(HYPS, REFS)
        scorer.score(HYPS, REFS, batch_size=2, progress=False)
        scorer([], [])
        reward(HYPS, REFS)
        reward(HYPS, REFS)  # cached references
        reward([], [])
        self_critical(HYPS, HYPS[::-1], REFS)
        group([HYPS[:2], HYPS[2:]], [refs[0], refs[1]])
        metric.update(HYPS, REFS)
        metric.compute()
        with pytest.warns(UserWarning, match="before the ``update``"):
            MoverMetric(scorer).compute()
    assert guard.calls == [], "factory calls without device=: " + "; ".join(dict.fromkeys(guard.calls))


def test_from_pretrained_takes_device_and_dtype_names(tiny_encoder, tmp_path):
    scorer = Scorer(tiny_encoder, centering="fixed").fit_centering(["the cat sat", "a dog ran"], progress=False)
    scorer.save_pretrained(tmp_path / "saved")
    loaded = Scorer.from_pretrained(tmp_path / "saved", device="cpu", dtype="bf16")
    assert next(loaded.encoder.parameters()).dtype == torch.bfloat16
    assert loaded.centering.mean.dtype == torch.float32 and torch.equal(loaded.centering.mean, scorer.centering.mean)
    with pytest.raises(ValueError, match="dtype must be"):
        Scorer.from_pretrained(tmp_path / "saved", dtype="int4")
