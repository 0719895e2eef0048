"""ScorerConfig: one place for every option and its defaults; Scorer.from_config; the command line and
the metric built from the same fields; host plans sent in one transfer."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from torchmover import Scorer, ScorerConfig
from torchmover.scorer.config import DEFAULT_CENTERING, MODEL_DEFAULTS, RunOptions

HYPS = ["the cat sat on the mat", "a dog barked", ""]
REFS = ["a cat sat on a mat", "the dog barked", "the red house"]


def test_fields_left_none_take_the_models_defaults_when_resolved(tiny_encoder):
    config = ScorerConfig(method="trwmd")
    assert (config.layer, config.centering, config.temperature, config.special_tokens) == (None,) * 4
    resolved = config.resolve(tiny_encoder)
    assert (resolved.model, resolved.layer, resolved.special_tokens, resolved.power_mean_layers) == (
        "tiny-bert", 2, "drop", 1)
    assert (resolved.centering, resolved.temperature) == (DEFAULT_CENTERING, 0.15)
    assert Scorer(tiny_encoder, method="trwmd").config == resolved


def test_a_measured_model_default_is_resolved_from_the_table(tiny_encoder):
    from torchmover import Encoder

    renamed = Encoder(tiny_encoder.model, tiny_encoder.tokenizer, layer=2, name="sentence-transformers/all-MiniLM-L6-v2")
    tuned = MODEL_DEFAULTS["sentence-transformers/all-MiniLM-L6-v2"]
    resolved = ScorerConfig().resolve(renamed)
    assert (resolved.centering, resolved.temperature) == (tuned["centering"], tuned["temperatures"]["twmd"])
    assert ScorerConfig(centering="batch", temperature=0.3).resolve(renamed).centering == "batch"


def test_from_config_rebuilds_the_same_scorer(tiny_encoder):
    scorer = Scorer(tiny_encoder, method="bertscore", direction="f1", stopwords="english", centering="none")
    again = Scorer.from_config(scorer.config, tiny_encoder)
    assert again.config == scorer.config and again.signature == scorer.signature
    with torch.no_grad():
        assert torch.equal(again(HYPS, REFS), scorer(HYPS, REFS))
    with pytest.raises(ValueError, match="differs from the given encoder"):
        Scorer.from_config(dataclasses.replace(scorer.config, layer=1), tiny_encoder)
    with pytest.raises(TypeError, match="config must be a ScorerConfig"):
        Scorer.from_config({"method": "twmd"})


def test_from_config_loads_the_model_it_names(tiny_model_dir):
    config = ScorerConfig(model=str(tiny_model_dir), layer=1, centering="none")
    scorer = Scorer.from_config(config, name="tiny", device="cpu")
    assert scorer.config.layer == 1 and scorer.config.model == "tiny" and scorer.encoder.device.type == "cpu"


def test_the_command_line_has_an_option_for_every_field():
    from torchmover.cli import build_parser

    parser = build_parser()
    score = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith("score"))
    flags = {flag for action in score._actions for flag in action.option_strings}
    fields = [f.name for cls in (ScorerConfig, RunOptions) for f in dataclasses.fields(cls)]
    assert {"--" + name.replace("_", "-") for name in fields} <= flags


def test_the_command_line_passes_every_field_through(tiny_model_dir, tmp_path):
    from torchmover.cli import build_parser, scorer_from_args

    args = build_parser().parse_args([
        "score", "--hyp", "a cat", "--ref", "the cat", "--model", str(tiny_model_dir), "--layer", "1",
        "--method", "trwmd", "--direction", "f1", "--temperature", "0.2", "--centering", "none",
        "--multi-ref", "mean", "--max-length", "32", "--power-mean-layers", "2", "--subwords", "first",
        "--stopwords", "english", "--punctuation", "drop", "--ngram", "2", "--name", "tiny", "--device", "cpu",
        "--compile", "--no-progress"])
    config = scorer_from_args(args, ["the cat"], ["a cat"]).config
    assert (config.layer, config.method, config.direction, config.temperature, config.multi_ref, config.max_length,
            config.power_mean_layers, config.subwords, config.punctuation, config.ngram, config.model) == (
        1, "trwmd", "f1", 0.2, "mean", 32, 2, "first", "drop", 2, "tiny")


def test_the_metric_takes_every_option(tiny_model_dir):
    pytest.importorskip("torchmetrics")
    from torchmover import MoverMetric

    metric = MoverMetric(model=str(tiny_model_dir), layer=1, centering="none", method="sbert", name="tiny",
                         device="cpu", compile=True)
    assert metric.scorer.config.method == "sbert" and metric.scorer.compile_transport
    with pytest.raises(ValueError, match="either scorer or Scorer options"):
        MoverMetric(metric.scorer, device="cpu")


def test_host_plans_are_sent_in_one_transfer(monkeypatch):
    from torchmover._internal import transfer
    from torchmover.scorer.plan import CallPlan, PairIndex

    sends = []
    real_send = transfer.send
    monkeypatch.setattr(transfer, "send", lambda host, device: sends.append(host.numel()) or real_send(host, device))
    plans = [CallPlan(2, [0, 3], PairIndex([0, 1], None, [0, 0]), 2), CallPlan(1, np.array([5]), PairIndex(None, None, None), 1)]
    sent = transfer.send_plans(plans, "cpu")
    assert sends == [7]  # 2 + 2 + 2 + 1 integers, one transfer
    assert sent[0].n_hyp_texts == 2 and sent[0].index.ref is None and sent[1].n_hyps == 1
    assert sent[0].ref_rows.tolist() == [0, 3] and sent[0].index.owner.tolist() == [0, 0]
    assert sent[1].ref_rows.tolist() == [5] and sent[1].ref_rows.dtype == torch.long
    assert plans[0].to_device("cpu").index.hyp.tolist() == [0, 1]
