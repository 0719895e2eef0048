"""Scoring one data set under many configurations: every layer of a model from one forward pass.

A sweep over configurations (``bench/studies/select_defaults.py``: layer × centering × member ×
temperature × direction × special-tokens policy) scores the same pairs with one
:class:`~torchmover.Scorer` per configuration. An :class:`~torchmover.Encoder` is cut at its layer,
so a scorer per layer would run the model once per layer; :class:`AllLayers` loads the model once,
whole, and hands out encoders at any layer and special-tokens policy (:meth:`AllLayers.encoder`)
that share one memo: the model runs once per batch of model inputs, every hidden state of that
batch is kept, and each encoder reads its layer from them. The special-tokens policy changes the
mask, never the model's inputs, so the encoders of every policy share the memo too::

    layers = AllLayers("sentence-transformers/all-MiniLM-L6-v2")
    for layer in range(1, layers.n_layers + 1):
        scores = Scorer(layers.encoder(layer), centering="none", device="cpu").score(hyps, refs)

A scorer on ``layers.encoder(k)`` scores as one on ``Encoder.from_pretrained(model, layer=k)``: the
blocks above layer ``k`` do not change ``hidden_states[k]``. The memo is used when grad is off and
the encoder is in eval mode (as in :meth:`Scorer.score <torchmover.Scorer.score>`, or a call under
``torch.no_grad()``); otherwise the model runs as usual. Its key is the batch's model inputs, so a
batch of the same texts is looked up, whatever scorer asks.

Memory: the memo keeps, for every batch encoded, ``len(keep)`` hidden states of ``[N, L, D]``
floats — about ``len(keep) × tokens × hidden_size × 4`` bytes over the distinct texts of each way
of batching them (padding to each batch's longest included). :meth:`AllLayers.clear` frees it.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

from ..text.encoder import Encoder, resolve_model_path

__all__ = ["AllLayers"]


class AllLayers:
    """One model, loaded once with all its layers, and encoders at each of its layers that run the
    model once per batch (module docs).

    Args:
        model: hub name or local path (as :meth:`Encoder.from_pretrained`).
        keep: the layers whose hidden states the memo keeps (default: the blocks' outputs
            ``1 … n_layers``; 0 is the embeddings); an encoder at another layer raises ``ValueError``.
        max_length, model_name: as :meth:`Encoder.from_pretrained`.

    Attributes: ``n_layers`` (the model's hidden layers), ``name`` (its name in a signature).
    """

    def __init__(self, model: str, *, keep: Iterable[int] | None = None, max_length: int | None = None,
                 model_name: str | None = None):
        from transformers import AutoConfig

        self.n_layers = int(AutoConfig.from_pretrained(resolve_model_path(model)).num_hidden_layers)
        self._full = Encoder.from_pretrained(model, layer=self.n_layers, max_length=max_length, model_name=model_name)
        self.name = self._full.name
        self.keep = tuple(range(1, self.n_layers + 1)) if keep is None else tuple(sorted(set(keep)))
        bad = [k for k in self.keep if not (isinstance(k, int) and 0 <= k <= self.n_layers)]
        if bad or not self.keep:
            raise ValueError(f"keep must name layers in [0, {self.n_layers}], got {keep!r}")
        self._states: dict[tuple, dict[int, Tensor]] = {}

    def encoder(self, layer: int, special_tokens: str = "drop") -> Encoder:
        """An :class:`~torchmover.Encoder` at ``layer`` under ``special_tokens`` that reads the memo."""
        if layer not in self.keep:
            raise ValueError(f"layer {layer!r} is not among the layers kept {self.keep}")
        return _LayerOfAll(self, layer, special_tokens)

    def hidden_states(self, inputs: dict[str, Tensor]) -> dict[int, Tensor]:
        """The kept hidden states ``{layer: [N, L, D]}`` of the model on ``inputs`` (memoised)."""
        key = tuple((name, tuple(t.shape), t.cpu().numpy().tobytes()) for name, t in sorted(inputs.items()))
        if key not in self._states:
            states = self._full.model(**inputs, output_hidden_states=True, return_dict=True).hidden_states
            self._states[key] = {k: states[k] for k in self.keep}
        return self._states[key]

    def clear(self) -> None:
        """Forget every batch encoded."""
        self._states.clear()

    @property
    def batches(self) -> int:
        """How many batches the memo holds."""
        return len(self._states)


class _LayerOfAll(Encoder):
    """An encoder at one layer of an :class:`AllLayers` model: its own mask (special-tokens policy),
    the shared model's hidden state of its layer, from the memo when grad is off in eval mode."""

    def __init__(self, shared: AllLayers, layer: int, special_tokens: str):
        full = shared._full
        # Built at the model's top layer (nothing cut from the shared model), then set to ``layer``.
        super().__init__(full.model, full.tokenizer, full.layer, full.name, full.revision, full.max_length,
                         special_tokens, 1, full.source)
        self.layer, self.last_state_is_layer = layer, False
        self._shared = shared

    def _vectors(self, inputs: dict[str, Tensor]) -> Tensor:
        if torch.is_grad_enabled() or self.training:
            return super()._vectors(inputs)
        return self._shared.hidden_states(inputs)[self.layer]
