"""Prefect task wrappers around webrl_core.stages: caching, retries, logging; no logic of their own."""
