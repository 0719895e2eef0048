"""bench/studies/cuda_graphs.py on the CPU: its graphs stood in for by calls on static buffers
(``backend="eager"``), so that everything but the capture itself is checked: the buffers a call is
copied into and read back from, the keys that decide when a new graph is needed, the encoder's
bucketed padding, and the reward and scoring calls the study routes through them."""
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from conftest import WORDS, load_file

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "studies" / "cuda_graphs.py"

study = load_file(SCRIPT, "cuda_graphs_study")


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor | None


def test_a_call_replays_on_its_new_inputs_and_returns_a_copy():
    def fn(pair, scale, *, shift):
        return {"out": pair.x * scale + shift}

    graphed = study.GraphedCall(fn, backend="eager")
    a, b = torch.arange(4.0), torch.ones(4)
    first = graphed(Pair(a, None), 2.0, shift=b)
    assert torch.equal(first["out"], a * 2 + 1)
    second = graphed(Pair(a + 10, None), 2.0, shift=b * 3)  # same layout: the same graph, new inputs
    assert torch.equal(second["out"], (a + 10) * 2 + 3) and graphed.captures == 1
    second["out"].zero_()  # the caller's copy, not the graph's output buffer
    assert torch.equal(graphed(Pair(a, None), 2.0, shift=b)["out"], a * 2 + 1)
    assert not torch.equal(first["out"], second["out"])


@pytest.mark.parametrize("change", ["shape", "dtype", "scalar", "none field"])
def test_a_new_layout_captures_a_new_graph(change):
    graphed = study.GraphedCall(lambda pair, scale: pair.x * scale, backend="eager")
    graphed(Pair(torch.ones(3), None), 2.0)
    args = {"shape": (Pair(torch.ones(5), None), 2.0), "dtype": (Pair(torch.ones(3, dtype=torch.float64), None), 2.0),
            "scalar": (Pair(torch.ones(3), None), 3.0), "none field": (Pair(torch.ones(3), torch.ones(3)), 2.0)}[change]
    out = graphed(*args)
    assert graphed.captures == 2
    assert torch.equal(out, args[0].x * args[1])


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        study.GraphedCall(lambda: None, backend="cpu")


@pytest.mark.parametrize("n, width, rows, tokens, shape", [(5, 7, 4, 8, (8, 8)), (8, 8, 4, 8, (8, 8)),
                                                         (1, 9, 64, 16, (64, 16))])
def test_bucketed_inputs_pad_to_the_bucket_and_give_the_real_rows_their_own_vectors(tiny_encoder, n, width, rows,
                                                                                     tokens, shape):
    texts = [" ".join(WORDS[i:i + 1 + (i * 3) % (width - 2)]) for i in range(n)]
    batch = tiny_encoder.tokenize(texts)
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, row in enumerate(batch["input_ids"]):
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    seen = []

    def vectors(padded):
        seen.append({k: v.clone() for k, v in padded.items()})
        return tiny_encoder._vectors(padded)

    with torch.no_grad():
        out = study.bucketed(vectors, rows, tokens)(inputs)
        plain = tiny_encoder._vectors(inputs)
    assert seen[0]["input_ids"].shape == shape
    assert torch.equal(seen[0]["input_ids"][:n, :width], ids) and not seen[0]["input_ids"][n:].any()
    assert (seen[0]["attention_mask"][n:, 0] == 1).all() and not seen[0]["attention_mask"][n:, 1:].any()
    assert out.shape == plain.shape
    real = mask.bool()
    assert torch.allclose(out[real], plain[real], atol=1e-5, rtol=0)  # float32: only the matmuls' shapes differ


def pairs_of(n: int) -> list[dict]:
    import random

    rng = random.Random(0)
    return [{"hyp": " ".join(rng.choices(WORDS, k=rng.randint(2, 9))),
             "ref": " ".join(rng.choices(WORDS, k=rng.randint(2, 9)))} for _ in range(n)]


def test_calls_through_the_stand_in_graphs_score_what_eager_calls_score(tiny_model_dir):
    rows = study.one_call(str(tiny_model_dir), 2, "cpu", pairs_of(16), 2, 1, "eager")
    assert [r["variant"] for r in rows] == ["eager", "graphs"] and not any("failed" in r for r in rows)
    eager, graphs = rows
    assert graphs["max_diff"] == 0.0  # the same shapes, the same arithmetic
    assert graphs["captures"]["encoder"] >= 1 and graphs["captures"]["transport"] == 1
    assert eager["captures"] == {} and graphs["profile"]["aten_ops"] > 0

    varying = study.varying_calls(str(tiny_model_dir), 2, "cpu", pairs_of(32), 1, 3, 1, "eager", (4, 8))
    assert [r["variant"] for r in varying] == ["eager", "bucketed encoder graphs"]
    assert varying[1]["max_diff"] <= 1e-5 and varying[1]["captures"]["encoder"] >= 1
    scored = study.scoring(str(tiny_model_dir), 2, "cpu", pairs_of(24), 4, 1, "eager", (4, 8))
    assert [r["variant"] for r in scored] == ["eager", "bucketed encoder graphs"]
    assert scored[1]["max_diff"] <= 1e-5 and scored[1]["captures"]["encoder"] >= 2  # batches of several widths
    tables, body = study.report({"backend": "eager", "calls": 3, "buckets": (4, 8), "scoring_pairs": 24,
                                 "one_call": rows, "varying_calls": varying, "scoring": scored})
    assert [len(t["rows"]) for t in tables.values()] == [2, 2, 2]
    assert "nothing about graphs measured" in body[0]


def test_a_failed_capture_is_reported_and_the_variant_left_out(tiny_model_dir, monkeypatch):
    def refuse(self, leaves, spec):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(study.GraphedCall, "_capture", refuse)
    rows = study.one_call(str(tiny_model_dir), 2, "cpu", pairs_of(16), 1, 1, "eager")
    assert "failed" not in rows[0] and "stream is capturing" in rows[1]["failed"]
    tables, body = study.report({"backend": "eager", "calls": 1, "buckets": (4, 8), "scoring_pairs": 0,
                                 "one_call": rows, "varying_calls": [], "scoring": []})
    assert tables["failures"]["rows"][0][1] == "graphs" and {"table": "failures"} in body


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the study would run")
def test_without_cuda_it_says_so_and_exits_cleanly(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert "no CUDA device on this machine" in done.stdout and "nothing measured" in done.stdout
    assert not any(tmp_path.iterdir())
