"""What a new user meets in the first hour: the README's quick start and its expected output, the
command line's messages (through the real `torchmover` entry point, in a subprocess), a model the hub
cannot deliver, `fit` on a scorer that does not center, and the documentation of every option."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import torchmover as tm
from torchmover.scorer.config import RunOptions, ScorerConfig

REPO = Path(__file__).resolve().parents[1]
LIBRARY_FIELDS = ("torchmover:", "torch:", "transformers:", "geomloss:")


def torchmover(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The installed `torchmover` command (its console script; `python -m torchmover` where there is
    none), run in a subprocess."""
    script = Path(sys.executable).with_name("torchmover")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "torchmover"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def readme_block(after: str, language: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start:text.index("```", start)]


def test_the_quick_start_prints_what_the_readme_shows():
    command = readme_block("## Two commands", "bash").strip()
    score = command[command.index("torchmover score"):].split()[1:]  # score --hyps ... --refs ...
    result = torchmover(*score, "--no-progress")
    assert result.returncode == 0, result.stderr
    expected = readme_block("Expected output", "text").splitlines()
    # The eight scores, to one unit of the printed digit: a CPU's vector kernels can move the seventh
    # decimal (0.9032455 prints 0.903245 on one x86 machine, 0.903246 on another).
    printed = [float(line) for line in result.stdout.splitlines()]
    assert printed == pytest.approx([float(line) for line in expected[:8]], abs=1.01e-6, rel=0)
    mean, signature = [line for line in result.stderr.splitlines() if line.startswith(("mean:", "signature:"))]
    value, count = mean.split()[1], mean.split()[2]
    assert (float(value), count) == (pytest.approx(float(expected[8].split()[1]), abs=1.01e-6, rel=0),
                                     expected[8].split()[2])
    fields = [f for f in signature.split("|") if not f.startswith(LIBRARY_FIELDS)]  # versions move with installs
    assert fields == [f for f in expected[9].split("|") if not f.startswith(LIBRARY_FIELDS)]


def test_hyps_without_refs_says_that_refs_is_missing(tmp_path):
    hyps = tmp_path / "h.txt"
    hyps.write_text("a cat\n", encoding="utf-8")
    result = torchmover("score", "--hyps", str(hyps))
    assert result.returncode == 2
    assert "--hyps FILE needs its references: --refs FILE" in result.stderr and "--ref TEXT" not in result.stderr


def test_all_labels_its_columns_and_its_signature(tmp_path, tiny_model_dir):
    hyps, refs = tmp_path / "h.txt", tmp_path / "r.txt"
    hyps.write_text("the cat sat\na dog barked\n", encoding="utf-8")
    refs.write_text("a cat sat\nthe dog barked\n", encoding="utf-8")
    result = torchmover("score", "--hyps", str(hyps), "--refs", str(refs), "--model", str(tiny_model_dir), "--all",
                        "--no-progress")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "# precision recall f1"
    assert np.loadtxt(result.stdout.splitlines(), ndmin=2).shape == (2, 3)
    signature = result.stderr.split("signature: ")[1].strip()
    assert "direction:all" in signature.split("|") and "direction:recall" not in signature
    assert tm.Scorer.from_signature(signature, model=str(tiny_model_dir)).config.direction == "recall"


def test_help_states_the_default_models_centering():
    result = torchmover("score", "--help")
    assert "none for the default model" in re.sub(r"\s+", " ", result.stdout)


def test_a_missing_plot_dependency_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "blocked" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    result = torchmover("correlate", "--data", str(tmp_path / "no-such-ratings"), "--plot", str(tmp_path / "p.png"),
                        env={"PYTHONPATH": f"{blocker.parent}{os.pathsep}{REPO}"})
    assert result.returncode == 2
    assert result.stderr.strip() == ('torchmover: error: --plot needs matplotlib, which is not installed: '
                                     'pip install "torchmover[plot]"')  # before the ratings were read


def test_a_hub_model_that_is_not_cached_fails_at_once_in_one_line():
    result = torchmover("score", "--hyp", "a", "--ref", "b", "--model", "roberta-base", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--model roberta-base is not in the local Hugging Face cache" in lines[0]
    assert "`hf download roberta-base`" in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]


def test_an_unreachable_hub_is_named_without_loading_anything(monkeypatch):
    from huggingface_hub import constants
    from transformers import AutoModel

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setattr(AutoModel, "from_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(OSError, match=r"hub \(http://127.0.0.1:9\) cannot be reached"):
        tm.Encoder.from_pretrained("someone/not-cached-model")


def test_fit_leaves_a_scorer_that_does_not_center_alone(tiny_encoder):
    refs = ["a cat sat on a mat", "the dog barked", "the red house"]
    hyps = ["the cat sat", "a dog barked loudly", "a house"]
    scorer = tm.Scorer(tiny_encoder, centering="none")
    reward = tm.MoverReward(scorer)
    before, signature = reward(hyps, refs), reward.signature
    reward.fit(refs)
    assert torch.equal(reward(hyps, refs), before) and reward.signature == signature
    assert reward.cache_info().currsize == 3  # the references were cached
    reward.fit(refs, centering="fixed")  # explicit: visible in the signature
    assert "center:fixed-" in reward.signature and not torch.equal(reward(hyps, refs), before)
    with pytest.raises(ValueError, match="centering must be None"):
        reward.fit(refs, centering="batch")


def test_fit_still_centers_a_batch_scorer(tiny_encoder):
    reward = tm.MoverReward(tm.Scorer(tiny_encoder, centering="batch"))
    with pytest.raises(RuntimeError, match="centering='batch'"):
        reward(["a"], ["b"])
    reward.fit(["a cat sat", "the dog barked"])
    assert "center:fixed-" in reward.signature and reward(["a"], ["b"]).shape == (1,)


def test_per_sample_scores_are_always_one_dimensional():
    pytest.importorskip("torchmetrics")
    metric = tm.MoverMetric(device="cpu", return_per_sample=True)
    metric.update("the cat sat", "a cat sat")
    assert metric.compute()["per_sample"].shape == (1,)


def test_the_documentation_names_every_option_and_every_choice():
    page = (REPO / "docs" / "guide" / "evaluation.md").read_text(encoding="utf-8")
    table = page[page.index("### Options"):page.index("### Behaviour")]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `")}
    fields = [*dataclasses.fields(ScorerConfig), *dataclasses.fields(RunOptions)]
    assert sorted(rows) == sorted(f.name for f in fields)
    for field in fields:
        choices = field.metadata.get("choices")
        for choice in choices() if choices else ():
            assert f"`{choice}`" in rows[field.name], f"{field.name}: {choice} is not documented"
