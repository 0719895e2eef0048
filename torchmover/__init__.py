"""torchmover: differentiable, batched Word Mover similarities on centered contextual embeddings.

The package is layered; each layer imports only the ones below it:

- :mod:`torchmover.functional` — tensor math: the TWMD family on token vectors (no texts);
- :mod:`torchmover.text` — texts to token vectors: the encoder, the token policy, IDF weights;
- :mod:`torchmover.scorer` — the :class:`Scorer` module, its config, signature, presets and saving;
- :mod:`torchmover.reward`, :mod:`torchmover.evaluation` — its uses: rewards for RL, and evaluation;
- :mod:`torchmover.integrations` — RL frameworks and the reward server; then the command line.

(:mod:`torchmover.runtime` — devices, collectives, checkpoints — sits under all of them.)
"""
from . import functional
from ._version import __version__
from .evaluation.scoring import score
from .functional.centering import Centering, center
from .reward import BatchedReward, GroupReward, MoverReward, SelfCriticalReward
from .scorer import PRESETS, PRF, Scorer, ScorerConfig
from .text.encoder import DEFAULT_MODEL, Encoder

__all__ = ["BatchedReward", "Centering", "DEFAULT_MODEL", "Encoder", "GroupReward", "MoverMetric", "MoverReward",
           "PRESETS", "PRF", "Scorer", "ScorerConfig", "SelfCriticalReward", "center", "functional", "score",
           "__version__"]


def __getattr__(name: str):
    """``torchmover.MoverMetric``, imported on first use (it needs the optional ``torchmetrics``)."""
    if name == "MoverMetric":
        from .evaluation.metric import MoverMetric

        return MoverMetric
    raise AttributeError(f"module 'torchmover' has no attribute {name!r}")
