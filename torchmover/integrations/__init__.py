"""Adapters for the RL frameworks that run rewards: TRL (:mod:`.trl`), verl (:mod:`.verl`) and OpenRLHF
(:mod:`.openrlhf`), the completion parsers they share (:mod:`.parsing`), and the process-wide reward
the verl and OpenRLHF adapters build from environment variables or a config file (:mod:`.config`).

Import the submodule you need (``from torchmover.integrations.trl import as_trl_reward``): none of
the frameworks is imported by torchmover.
"""
