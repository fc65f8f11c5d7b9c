"""HFPolicy batched generation and OpenAIPolicy against a real local HTTP server serving the embedded model."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import torch
import uvicorn

from webrl_core.agent_api import Policy
from webrl_core.config import EmbeddedModelConfig, ModelsConfig, PolicyConfig
from webrl_core.models import build_embedded_model, load_tokenizer, train_embedded_tokenizer
from webrl_core.policy import HFPolicy, OpenAIPolicy, openai_app
from webrl_core.prompts import build_prompt

ACTION = 'do(action="Click", element="3")'


def prompts(n: int) -> list[str]:
    return [build_prompt(f"Open item {i}", [ACTION] * (i % 3), f'<a id="3">item {i}</a>' * (1 + 7 * i))
            for i in range(n)]


@pytest.fixture(scope="module", params=["llama", "gpt_neox"])
def model_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    train_embedded_tokenizer(prompts(6), 350, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=350, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                              max_length=256, arch=request.param)
    return build_embedded_model(root / "tok", cfg, root / "model", seed=0)


def test_hf_policy_batch_one_response_each_and_stops(model_dir):
    pol = HFPolicy(model_dir, PolicyConfig(max_new_tokens=12, batch_size=3), ModelsConfig(max_length=256),
                   temperature=0)
    assert isinstance(pol, Policy)
    ps = prompts(5) + ["x" * 3000]  # the last one is far longer than the model: cut at the observation
    out = asyncio.run(pol.act(ps))
    assert len(out) == len(ps) and all(isinstance(o, str) for o in out)
    # greedy: batched == one at a time (left padding + position ids are right)
    assert out[:3] == [pol.generate([p])[0] for p in ps[:3]]
    # stop token: a forward hook on the LM head makes <|eot_id|> win every step -> every response is empty
    eot = load_tokenizer(model_dir).convert_tokens_to_ids("<|eot_id|>")

    def favour_eot(module, inputs, output):
        output = output.clone()
        output[..., eot] += 1e4
        return output

    handle = pol.model.get_output_embeddings().register_forward_hook(favour_eot)
    try:
        assert pol.generate(ps[:2], temperature=0) == ["", ""]
        assert pol.generate(ps[:2], temperature=1.0) == ["", ""]
    finally:
        handle.remove()
    assert pol.generate(ps[:1]) == out[:1]


def test_hf_policy_sampling_varies(model_dir):
    pol = HFPolicy(model_dir, PolicyConfig(max_new_tokens=16, batch_size=4, top_p=1.0), ModelsConfig(max_length=256),
                   temperature=1.0)
    torch.manual_seed(0)
    outs = {pol.generate([prompts(1)[0]])[0] for _ in range(4)}
    assert len(outs) > 1  # random tiny model at T=1 samples different strings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_policy_against_real_server(model_dir):
    hf = HFPolicy(model_dir, PolicyConfig(max_new_tokens=10, batch_size=8), ModelsConfig(max_length=256),
                  temperature=0)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(openai_app(hf, model_name="tiny"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started
        client = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "tiny", PolicyConfig(max_new_tokens=10, concurrency=4),
                              temperature=0)
        ps = prompts(6)
        got = asyncio.run(client.act(ps))
        assert got == hf.generate(ps)  # same greedy text over real HTTP
        chat = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "tiny", PolicyConfig(max_new_tokens=10), temperature=0,
                            style="chat")
        assert asyncio.run(chat.act(ps[:1])) == hf.generate(ps[:1])  # no chat template: last user turn is the prompt
        bad = OpenAIPolicy(f"http://127.0.0.1:{port}/v1/nope", "tiny", PolicyConfig(), retries=1)
        with pytest.raises(RuntimeError, match="failed"):
            asyncio.run(bad.act(ps[:1]))
    finally:
        server.should_exit = True
        th.join(timeout=10)
    with pytest.raises(ValueError, match="base_url"):
        OpenAIPolicy("localhost", "tiny")
