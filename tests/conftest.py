"""Shared fixtures: a tiny randomly initialised BERT with a word-level vocabulary, built in-process."""
from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:  # property-based tests: a bounded number of examples, no deadline
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", max_examples=25, deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=1000)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is in the test extra; only the property-based tests need it
    pass


def load_file(path, name: str | None = None):
    """The Python file ``path`` imported as module ``name`` (default: its stem), as a script or recipe
    outside the package is loaded (and as verl and OpenRLHF load a reward file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name or Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WORDS = (
    "the a an cat dog mat sat on is was in of and to it he she they we you this that with for "
    "barked sleeps runs ran house red blue green big small quick brown fox jumps over lazy day "
    "night sun moon tree car road city man woman child eats food water good bad new old"
).split()


def tiny_tokenizer(single: str = "[CLS] $A [SEP]", pad_token: str | None = "[PAD]"):
    """A fast BERT WordPiece tokenizer over a small vocabulary (plus characters for anything else);
    ``single`` is the template of one text (e.g. ``"[CLS]:0 $A:1 [SEP]:1"`` for token type ids 1)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(specials + WORDS + chars + ["##" + c for c in chars]))}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token=pad_token, cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=64,
    )


def tiny_model(seed: int = 0, num_hidden_layers: int = 3):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tiny_tokenizer()), hidden_size=32, num_hidden_layers=num_hidden_layers,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
    )
    return BertModel(config).eval()


# ChatML, as Qwen's tokenizers carry it (verl and TRL apply a tokenizer's chat template to prompts)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_tokenizer(*corpus: str):
    """A byte-level BPE tokenizer with ChatML special tokens and template, trained in-process on
    ``corpus`` and a little English (as Qwen/Llama-3 tokenizers are byte-level BPE)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    text = [*corpus, "A cat sat on the mat. The dog barked all day long; we ate food."] * 20
    backend.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=specials[1:])
    tokenizer.chat_template = CHATML
    return tokenizer


@pytest.fixture
def tiny_encoder():
    """A fresh tiny :class:`torchmover.Encoder` (layer 2 of 3) — safe to train or modify in a test."""
    from torchmover import Encoder

    return Encoder(tiny_model(), tiny_tokenizer(), layer=2, name="tiny-bert")


@pytest.fixture
def tiny_scorer(tiny_encoder):
    """A :class:`torchmover.Scorer` on the tiny encoder with default options."""
    from torchmover import Scorer

    return Scorer(tiny_encoder)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny model and tokenizer saved as a local model directory (for ``--model PATH``)."""
    path = tmp_path_factory.mktemp("tiny-bert")
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def configure_reward_env(monkeypatch, model_dir, fit_path, references, **settings):
    """The process-wide reward of the adapter files configured through TORCHMOVER_* variables, as a
    user's job configures it: ``model_dir`` at layer 2, fitted on ``references`` (written to
    ``fit_path``), plus ``settings`` (``strip_reasoning="1"`` sets TORCHMOVER_STRIP_REASONING); every
    other TORCHMOVER_* variable removed. Returns the variables set."""
    import os

    from torchmover.integrations.configured import reset_process_reward

    fit_path.write_text("\n".join(references) + "\n")
    variables = {"TORCHMOVER_MODEL": str(model_dir), "TORCHMOVER_OPTIONS": '{"layer": 2}',
                 "TORCHMOVER_FIT_REFERENCES": str(fit_path), "TORCHMOVER_MAX_WAIT_MS": "20",
                 **{"TORCHMOVER_" + k.upper(): v for k, v in settings.items()}}
    for name in [n for n in os.environ if n.startswith("TORCHMOVER_")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    reset_process_reward()
    return variables
