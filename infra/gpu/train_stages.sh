#!/usr/bin/env bash
# `webrl bench train --model` on one GPU: the SFT, critic and actor stages of a phase in bf16 (the functions the
# pipeline calls, on the bench's synthetic WebRL steps), per model shape and batch, each stage's tokens/s against
# the GPU's own matmul peak and copy bandwidth measured in the same run. The models are random-init folders built
# there from CONFIG_DIR (a model folder's config.json and tokenizer; no weights travel): a stage's speed at a shape
# does not depend on its weights. Default runs: the demo's shape (SmolLM2-135M-Instruct: 30 layers, top 12
# trained) with the demo's batches (actor 4, critic 8), the same with batches of 32, and a 1B Llama's shape
# (hidden 2048, MLP 8192, 16 layers, 32 heads, 8 KV heads; SmolLM2's tokenizer: 1.07B parameters) with all layers
# trained at batch 16. One JSON per run under OUT_DIR (benchmarks/train_model.py's result); the last lines are
# one per stage.
#
#   usage: bash infra/gpu/train_stages.sh CONFIG_DIR OUT_DIR [RUN ...]
#   RUN: label|episodes|config.json fields (k=v,...)|settings (section.key=value,...)   (4 steps an episode)
#   GPU_SETS (default "models.device=cuda models.dtype=bfloat16") go before each run's settings. PROFILE=1: each
#   stage under torch.profiler (the GPU time per kind of operator, the GPU's idle time, the top operators: `bench
#   train --profile`) and the run under cProfile (OUT_DIR/LABEL.cprofile.txt: where the host's time goes).
set -euo pipefail
src=$1 out=$2
shift 2
py=${PYTHON:-python3}
mkdir -p "$out"
runs=("$@")
if [[ ${#runs[@]} -eq 0 ]]; then
  runs=("demo|64||"
        "demo-batch32|64||actor.batch_size=32,critic.batch_size=32"
        "llama-1b|128|hidden_size=2048,intermediate_size=8192,num_hidden_layers=16,num_attention_heads=32,num_key_value_heads=8|models.train_layers=null,actor.batch_size=16,critic.batch_size=16")
fi
models=${MODELS:-/tmp/webrl-gpu-train-stages}
labels=()
for spec in "${runs[@]}"; do
  IFS='|' read -r label episodes fields sets <<<"$spec"
  labels+=("$label")
  "$py" - "$src" "$models/$label" "$out/$label.json" "$episodes" "$fields" "$sets" \
    "${GPU_SETS:-models.device=cuda models.dtype=bfloat16}" "${PROFILE:-0}" <<'PY'
import cProfile
import io
import pstats
import sys
from pathlib import Path

from benchmarks.train_model import random_init, run

src, folder, out, episodes, fields, sets, gpu_sets, profile = sys.argv[1:]
overrides = {k: int(v) for k, v in (f.split("=", 1) for f in fields.split(",") if f)}
random_init(src, folder, **overrides)
profiler = cProfile.Profile() if profile == "1" else None
if profiler:
    profiler.enable()
run(folder, "demo", [*gpu_sets.split(), *[s for s in sets.split(",") if s]], episodes=int(episodes), steps=4,
    official=False, out=out, profile=profile == "1")
if profiler:
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
    Path(out).with_suffix(".cprofile.txt").write_text(text.getvalue())
PY
done
"$py" - "$out" "${labels[@]}" <<'PY'
import json
import sys
from pathlib import Path

out, labels = Path(sys.argv[1]), sys.argv[2:]
for label in labels:
    r = json.loads((out / f"{label}.json").read_text())
    print(f"{label}: {r['cpu']}, {r['dtype']}, peak {r['peak_flops'] / 1e12:.1f} TFLOP/s, copy "
          f"{r['copy_bytes_per_s'] / 1e9:.0f} GB/s, {r['layers']} layers ({r['trained_layers']} trained)")
    for s in r["stages"]:
        mem = f"{s['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in s else f"RSS {s['peak_rss_mb']:.0f} MB"
        print(f"  {label} {s['stage']}: {s['tokens_per_s']:.0f} tokens/s, {s['peak_share']:.1%} of peak, "
              f"{s['limit_share']:.1%} of limit ({s['bound']}), {mem}")
PY
