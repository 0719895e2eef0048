"""Rewards for policy-gradient training: a scorer's similarity as a batched, cached reward
(:mod:`.rewards`), and a micro-batcher for frameworks that call one sample at a time (:mod:`.batching`)."""
from .batching import BatchedReward
from .rewards import (CacheInfo, GroupReward, GroupRewardResult, MoverReward, SelfCriticalResult, SelfCriticalReward,
                      group_advantages)

__all__ = ["BatchedReward", "CacheInfo", "GroupReward", "GroupRewardResult", "MoverReward", "SelfCriticalResult",
           "SelfCriticalReward", "group_advantages"]
