"""Browser environments for WebRL agents: observation, action grammar, environment, rollout engine.

Import from the submodules (``webrl_core.env.rollout``, ``webrl_core.env.web_env``, ...); this package
imports nothing heavy so that ``import webrl_core.env.actions`` stays cheap.
"""
