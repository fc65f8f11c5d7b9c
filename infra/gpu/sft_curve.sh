#!/usr/bin/env bash
# `webrl bench sft-curve --folder` on one GPU: the phase-0 SFT of the demo's pretrained actor as a next-action curve
# for a larger budget than a CPU box affords, to see where the curve flattens. Reads the folder
# `webrl bench sft-curve-export` wrote (prompts already rendered: no browser, no sites, no trajectory store).
# MODEL is an HF folder or a GGUF file (imported first into an HF folder, as `webrl models setup` does).
# Each recipe stops at its training budget or its epochs, whichever comes first; points every quarter epoch.
# The trained actors go to $ACTORS (default /tmp/webrl-sft-curve-actors), outside OUT_DIR.
#
#   usage: bash infra/gpu/sft_curve.sh FOLDER MODEL OUT_DIR [RECIPE ...]
#   RECIPE: label:demos:batch:lr:epochs:budget_s[:section.key=value,...]   (default: the two below)
set -euo pipefail
folder=$1 model=$2 out=$3
shift 3
py=${PYTHON:-python3}
mkdir -p "$out"
recipes=("$@")
if [[ ${#recipes[@]} -eq 0 ]]; then
  # the demo's lr and batch on its 300 demonstrations, run on to 8 epochs; then 5x the demonstrations
  recipes=("demo-300:300:4:1e-4:8:150" "demo-1500-b16:1500:16:2e-4:4:200")
fi
if [[ $model == *.gguf ]]; then
  dest=${MODEL_DIR:-/tmp/webrl-sft-curve-model}
  "$py" -c 'import sys; from webrl_core.pretrained import import_gguf; print(import_gguf(sys.argv[1], sys.argv[2]))' \
    "$model" "$dest"
  model=$dest
fi
for recipe in "${recipes[@]}"; do
  IFS=: read -r label demos batch lr epochs budget extra <<<"$recipe"
  "$py" - "$folder" "$model" "$out/$label" "$label" "$demos" "$batch" "$lr" "$epochs" "$budget" "${extra:-}" \
    "${ACTORS:-/tmp/webrl-sft-curve-actors}/$label" <<'PY'
import sys

from benchmarks.sft_curve import run_folder

folder, model, out, label, demos, batch, lr, epochs, budget, extra, actor_dir = sys.argv[1:]
sets = ["models.device=cuda", "models.dtype=bfloat16", "policy.batch_size=128", f"actor.batch_size={batch}",
        f"bootstrap.sft_lr={lr}", f"bootstrap.sft_epochs={epochs}",
        *[s for s in extra.split(",") if s]]
run_folder(folder, out, sets, model=model, demos=int(demos), every_epochs=0.25, label=label, budget_s=float(budget),
           actor_dir=actor_dir)
PY
done
