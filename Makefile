# The README's two commands: `make demo` and `make test`. Both set everything up first (idempotent).
.PHONY: setup demo test bench clean

setup:
	bash infra/setup.sh

demo: setup  # `make demo CONFIG=demo-full`: another packaged config
	.venv/bin/webrl demo $(if $(CONFIG),--config $(CONFIG))

test: setup
	bash infra/setup_vllm.sh  # vLLM in its own environment: tests/agent/test_serving.py serves a phase's actor with it
	.venv/bin/python -m pytest -q -n 2 tests  # two workers: tests/conftest.py says how they share the suite

bench: setup
	.venv/bin/webrl bench store
	.venv/bin/webrl bench rollout
	.venv/bin/webrl bench score
	.venv/bin/webrl bench train

clean:
	rm -rf runs .pytest_cache
