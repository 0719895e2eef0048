"""From texts to token vectors: the Hugging Face encoder with its special-token policy
(:mod:`.encoder`), the token policy and IDF weights (:mod:`.weights`), and documents split into
sentences for the sentence movers (:mod:`.documents`)."""
from .encoder import DEFAULT_MODEL, Encoder

__all__ = ["DEFAULT_MODEL", "Encoder"]
