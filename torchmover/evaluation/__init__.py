"""Evaluating generated text: one call from texts to scores (:mod:`.scoring`), a torchmetrics metric
(:mod:`.metric`, needs ``torchmetrics``), human ratings (:mod:`.data`), their correlation with a
metric (:mod:`.correlation`), how much each preprocessing choice moves it (:mod:`.sensitivity`), and
every layer of a model from one forward pass, for sweeps over configurations (:mod:`.sweep`)."""
from .scoring import score

__all__ = ["score"]
