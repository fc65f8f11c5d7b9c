"""Prefect flows: webrl-bootstrap, webrl-phase, webrl-train, webrl-eval."""
