"""Where and how torchmover runs: devices and precisions (:mod:`.devices`), statistics over the ranks
of a ``torch.distributed`` job (:mod:`.distributed`), and atomic files and checkpoints for jobs that
must resume (:mod:`.checkpoint`). Nothing here knows about texts or metrics."""
