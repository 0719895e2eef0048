"""Where and how torchmover runs: devices and precisions (:mod:`.devices`), statistics over the ranks
of a ``torch.distributed`` job (:mod:`.distributed`), atomic files and checkpoints for jobs that
must resume (:mod:`.checkpoint`), and the C heap's free memory given back to the system
(:mod:`.heap`). Nothing here knows about texts or metrics."""
