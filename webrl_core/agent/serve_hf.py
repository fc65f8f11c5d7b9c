"""The project's own OpenAI-compatible server for one HF checkpoint: ``python -m webrl_core.agent.serve_hf --model DIR``.

The CPU default of ``serving.engine`` (``webrl``): ``policy.openai_app`` (``/v1/completions``,
``/v1/chat/completions`` with the tokenizer's chat template, ``/v1/models`` reporting the checkpoint's digest) under
uvicorn, in a process of its own as vLLM or SGLang would be. Binds to loopback only.
"""

from __future__ import annotations

import argparse

import uvicorn

from webrl_core.config import ModelsConfig, PolicyConfig
from webrl_core.agent.policy import HFPolicy, openai_app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m webrl_core.agent.serve_hf", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF checkpoint folder")
    ap.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "localhost", "::1"])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default="webrl-actor")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-size", type=int, default=16, help="prompts generated together")
    args = ap.parse_args(argv)
    policy = HFPolicy(args.model, PolicyConfig(batch_size=args.batch_size),
                      ModelsConfig(dtype=args.dtype, device=args.device))
    app = openai_app(policy, model_name=args.served_model_name)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, lifespan="off")


if __name__ == "__main__":
    main()
