"""torchmover: differentiable, batched Word Mover similarities on centered contextual embeddings."""
from . import functional
from ._version import __version__
from .centering import Centering, center
from .encoding import DEFAULT_MODEL, Encoder, TokenEmbeddings
from .evaluate import score
from .presets import PRESETS
from .scorer import PRF, Scorer, ScorerConfig, Units

__all__ = ["Centering", "DEFAULT_MODEL", "Encoder", "PRESETS", "PRF", "Scorer", "ScorerConfig", "TokenEmbeddings",
           "Units", "center", "functional", "score", "__version__"]
