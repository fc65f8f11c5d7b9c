# The README's two commands: `make demo` and `make test`. Both set everything up first (idempotent).
.PHONY: setup demo test bench clean

setup:
	bash infra/setup.sh

demo: setup  # `make demo CONFIG=demo-full`: another packaged config
	.venv/bin/webrl demo $(if $(CONFIG),--config $(CONFIG))

test:  # both environments, installed side by side; vLLM's own serves a phase's actor in tests/agent/test_serving.py
	bash infra/setup_vllm.sh & vllm=$$!; bash infra/setup.sh; status=$$?; wait $$vllm && exit $$status
	.venv/bin/python -m pytest -q -n 2 tests  # two workers: tests/conftest.py says how they share the suite

bench: setup
	.venv/bin/webrl bench store
	.venv/bin/webrl bench rollout
	.venv/bin/webrl bench score
	.venv/bin/webrl bench train

clean:
	rm -rf runs .pytest_cache
