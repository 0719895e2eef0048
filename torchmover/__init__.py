"""torchmover: differentiable, batched Word Mover similarities on centered contextual embeddings."""
from . import functional
from ._version import __version__
from .centering import Centering, center
from .encoding import DEFAULT_MODEL, Encoder, TokenEmbeddings
from .presets import PRESETS
from .scorer import Scorer, ScorerConfig, Units

__all__ = ["Centering", "DEFAULT_MODEL", "Encoder", "PRESETS", "Scorer", "ScorerConfig", "TokenEmbeddings",
           "Units", "center", "functional", "__version__"]
