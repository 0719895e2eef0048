"""Adapters for the RL frameworks that run rewards: TRL (:mod:`.trl`), verl (:mod:`.verl`) and OpenRLHF
(:mod:`.openrlhf`), the completion parsers they share (:mod:`.parsing`), the reward server
(:mod:`.server`, ``torchmover serve``), the settings the verl and OpenRLHF files and the server all read
(:mod:`.config`), and the configured reward they all call (:mod:`.configured`).

Import the submodule you need (``from torchmover.integrations.trl import as_trl_reward``): none of
the frameworks is imported by torchmover.
"""
