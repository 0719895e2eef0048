"""Bad options get an error naming the argument, in Python and on the command line (issue 13.4)."""
import re

import pytest

from torchmover import Encoder, Scorer, ScorerConfig
from torchmover.cli import main
from torchmover.text.encoder import looks_like_path


@pytest.mark.parametrize("max_length", [-5, 0, True, 2.5, "64"])
def test_max_length_must_be_a_positive_int(tiny_model_dir, max_length):
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        Scorer(str(tiny_model_dir), layer=2, max_length=max_length)


@pytest.mark.parametrize("option, value, match", [
    ("layer", -1, "layer must be an int >= 0"), ("layer", 2.0, "layer must be an int >= 0"),
    ("power_mean_layers", 0, "power_mean_layers must be an int >= 1"),  # was run as 1
    ("power_mean_layers", True, "power_mean_layers must be an int >= 1"),
])
def test_encoder_options_are_checked_before_the_model_is_loaded(option, value, match):
    with pytest.raises(ValueError, match=match):  # not the FileNotFoundError of the missing model
        Scorer("/no/such/model", **{option: value})


def test_max_length_must_fit_the_special_tokens_and_the_window(tiny_model_dir):
    from conftest import tiny_model, tiny_tokenizer

    window = Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny").max_length
    for bad in (2, window + 1):  # [CLS] and [SEP] leave no room for text / beyond the position embeddings
        with pytest.raises(ValueError, match=rf"max_length must be in \[3, {window}\]"):
            Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny", max_length=bad)
    assert Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny", max_length=3).max_length == 3
    scorer = Scorer(str(tiny_model_dir), layer=2, max_length=3)
    with pytest.warns(UserWarning, match="longer than 3 tokens were truncated"):
        scorer(["a b c"], ["a b"])


def test_max_length_that_differs_from_a_given_encoder_is_an_error(tiny_encoder):
    with pytest.raises(ValueError, match="max_length=7 differs"):
        Scorer(tiny_encoder, max_length=7)


@pytest.mark.parametrize("method, options, match", [
    ("wmd", {"temperature": 0.5}, "method='wmd' takes no temperature (it runs the exact solver at its fixed T)"),
    ("moverscore", {"temperature": 0.5}, "method='moverscore' takes no temperature"),
    ("bertscore", {"temperature": 0.5}, "method='bertscore' takes no temperature (it has none)"),
    ("sbert", {"direction": "f1"}, "method='sbert' has no directions"),
    ("sms", {"direction": "precision"}, "method='sms' has no directions"),
    ("cka", {"n_iter": 5}, "method='cka' runs no Sinkhorn iterations"),
    ("trwmd", {"n_iter": None}, "method='trwmd' runs no Sinkhorn iterations"),
    ("sms", {"n_iter": None}, "method='sms' runs no Sinkhorn iterations"),  # exact unless tempered
    ("twmd", {"subwords": "mean", "special_tokens": "keep"}, "subwords='mean' drops them"),
    ("sms", {"special_tokens": "cls"}, "the sentence movers drop them"),
])
def test_an_option_the_method_has_no_use_for_is_an_error(method, options, match):
    """Such an option changed nothing and the signature did not show it: refused, before loading."""
    with pytest.raises(ValueError, match=re.escape(match)):
        Scorer("/no/such/model", method=method, **options)


@pytest.mark.parametrize("method, options", [
    ("twmd", {"n_iter": None, "direction": "f1", "temperature": 0.5}), ("trwmd", {"temperature": 0.5}),
    ("sms", {"temperature": 1.0, "n_iter": None}), ("bertscore", {"direction": "precision"}),
    ("twmd", {"subwords": "mean"}), ("twmd", {"special_tokens": "keep", "subwords": "first"}),
])
def test_options_the_method_uses_are_accepted(method, options):
    assert ScorerConfig(method=method, **options).method == method


def test_a_temperature_is_kept_as_the_float_the_signature_prints(tiny_encoder):
    """An int (or NumPy) T printed as ``T:1`` was rebuilt by ``from_signature`` as ``T:1.0``."""
    scorer = Scorer(tiny_encoder, temperature=1)
    assert type(scorer.config.temperature) is float and "|T:1.0|" in scorer.signature
    assert Scorer.from_signature(scorer.signature, model=tiny_encoder).signature == scorer.signature


def test_the_cli_refuses_an_option_the_method_has_no_use_for(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "h.txt").write_text("a cat\n")
    (tmp_path / "r.txt").write_text("the cat\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["score", "--hyps", str(tmp_path / "h.txt"), "--refs", str(tmp_path / "r.txt"), "--no-progress",
              "--model", str(tiny_model_dir), "--layer", "2", "--method", "sbert", "--direction", "f1"])
    assert exit_info.value.code == 2 and "--method sbert has no directions" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["/nonexistent/path", "./no-such-model", "../no-such-model", "~/no-such-model",
                                   "some/deep/path"])
def test_a_missing_local_path_is_named_as_such_not_as_a_bad_hub_id(model):
    with pytest.raises(FileNotFoundError, match=f"model='{model}': no such local directory"):
        Scorer(model)


def test_a_file_is_not_a_model_directory(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no such local directory"):
        Scorer(str(tmp_path / "weights.bin"))


def test_hub_ids_are_not_paths():
    assert not looks_like_path("roberta-base")
    assert not looks_like_path("sentence-transformers/all-MiniLM-L6-v2")
    assert looks_like_path("/models/x") and looks_like_path("~/x") and looks_like_path("a/b/c")


@pytest.mark.parametrize("option, value, match", [
    ("--max-length", "-5", "max_length must be a positive int"),
    ("--max-length", "0", "max_length must be a positive int"),
    ("--model", "/nonexistent/path", "--model /nonexistent/path: no such local directory"),  # in option syntax
])
def test_the_cli_reports_bad_options_in_one_line_with_status_2(tmp_path, tiny_model_dir, capsys, option, value, match):
    (tmp_path / "h.txt").write_text("a cat\n")
    (tmp_path / "r.txt").write_text("the cat\n")
    args = ["score", "--hyps", str(tmp_path / "h.txt"), "--refs", str(tmp_path / "r.txt"), "--no-progress",
            "--model", str(tiny_model_dir), "--layer", "2", option, value]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("torchmover: error: ") and match in err
