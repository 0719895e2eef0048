"""Tensor math, no texts: the TWMD family on padded token vectors.

One function per member, all with one signature (:mod:`.scores`):
``f(hyp, ref, hyp_mask=None, ref_mask=None, *, ...) -> Tensor[B]``. Below them, in the order a score
is computed: centering of token vectors (:mod:`.centering`), the family's normalisation
``Sim(X1, X2) = C(X1, X2) / sqrt(C(X1, X1) C(X2, X2))`` and its members' transport terms
(:mod:`.family`, traits in :mod:`.members`), the log-domain Sinkhorn solvers (:mod:`.transport`),
the sentence movers (:mod:`.sentences`) and compiled terms (:mod:`.compiled`).
"""
from .centering import center
from .scores import bertscore, cka, moverscore, sbert, tempered_rwmd, tempered_wmd, wmd
from .sentences import sentence_movers

__all__ = ["tempered_wmd", "tempered_rwmd", "wmd", "moverscore", "bertscore", "sbert", "cka", "sentence_movers",
           "center"]
