"""Benchmark programs behind `webrl bench ...`; each prints its numbers and says what a ratio compares."""
