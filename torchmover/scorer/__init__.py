"""The scorer: texts in, similarities out, as one ``nn.Module`` (:class:`Scorer`), with what pins it
down — its options (:class:`ScorerConfig`), its signature string, named presets, and saving/loading."""
from .module import PRF, Scorer, ScorerConfig
from .presets import PRESETS

__all__ = ["PRESETS", "PRF", "Scorer", "ScorerConfig"]
