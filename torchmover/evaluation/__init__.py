"""Evaluating generated text: one call from texts to scores (:mod:`.scoring`), a torchmetrics metric
(:mod:`.metric`, needs ``torchmetrics``), human ratings (:mod:`.data`), their correlation with a
metric (:mod:`.correlation`), and how much each preprocessing choice moves it (:mod:`.sensitivity`)."""
from .scoring import score

__all__ = ["score"]
