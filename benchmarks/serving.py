"""`webrl bench serving`: the serving stage's engines on one checkpoint, started exactly as a rollout starts them
(``webrl_core.agent.serving.served_actor``): startup seconds, then generated tokens per second for a fixed set of
prompts sent ``concurrency`` at a time through the OpenAI ``/completions`` API (greedy, ``max_tokens`` each)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from webrl_core.artifacts import ArtifactRef
from webrl_core.agent.serving import served_actor


async def _drive(base_url: str, model_name: str, prompts: list[str], max_tokens: int, concurrency: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=600.0, max_retries=0)
    sem = asyncio.Semaphore(concurrency)
    tokens = []

    async def one(p: str) -> None:
        async with sem:
            r = await client.completions.create(model=model_name, prompt=p, max_tokens=max_tokens, temperature=0.0)
            tokens.append(r.usage.completion_tokens if r.usage else 0)

    await one(prompts[0])  # warm-up, not timed
    tokens.clear()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    await client.close()
    return {"requests": len(prompts), "completion_tokens": sum(tokens), "wall_s": round(wall, 2),
            "tokens_per_s": round(sum(tokens) / wall, 1)}


def bench_engine(settings, model: str, prompts: list[str], max_tokens: int, concurrency: int, run_dir: str | Path
                 ) -> dict:
    """Start ``settings.serving.engine`` for ``model``, time its startup, drive it with ``prompts``."""
    ref = ArtifactRef.of(model, "model")
    t0 = time.perf_counter()
    with served_actor(settings, ref, run_dir) as ep:
        startup = time.perf_counter() - t0
        out = asyncio.run(_drive(ep.base_url, ep.model_name, prompts, max_tokens, concurrency))
    return {"engine": settings.serving.engine, "startup_s": round(startup, 1), **out}
