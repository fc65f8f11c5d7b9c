#!/usr/bin/env bash
# `webrl bench copy` on one GPU: the CPU demo's model size (lr 1e-3, the demo recipe) and larger embedded Llamas
# (lr 3e-4; LARGE_SIZES, default the 59M one) trained on the same exported folder (`webrl bench copy-export`),
# bf16 autocast over float32 master weights, then checked on the folder's validation steps. Needs no browser and
# no Prefect: the folder holds the tokenizer, the demonstrations and the validation steps.
# Measured on one H200 with 1,500 demonstrations (25,480 swapped pairs, 12.3M tokens): demo size 117 s, 59M 135 s
# (SFT + check); a 206M model (1024,2816,16,16) ran 2.4 optimizer steps/s, about 11 minutes for the same data.
#
#   usage: [LARGE_SIZES="768,2048,8,12 1024,2816,16,16"] bash infra/gpu/copy_check.sh FOLDER OUT_DIR [section.key=value ...]
set -euo pipefail
folder=$1 out=$2
shift 2
py=${PYTHON:-python3}
mkdir -p "$out"
sets=(models.device=cuda models.dtype=bfloat16 actor.batch_size=16 policy.batch_size=64
      bootstrap.sft_entity_swap=0.75 bootstrap.sft_loss=completion "$@")

run() {  # run OUT_JSON LR SIZE...
  local json=$1 lr=$2
  shift 2
  "$py" - "$folder" "$json" "$lr" "$@" "--" "${sets[@]}" <<'PY'
import sys
from benchmarks.copy import parse_size, run
folder, out, lr, *rest = sys.argv[1:]
cut = rest.index("--")
run(folder, [parse_size(s) for s in rest[:cut]], [f"bootstrap.sft_lr={lr}", *rest[cut + 1:]], out)
PY
}

run "$out/copy_demo_size.json" 1e-3 128,352,4,4
# shellcheck disable=SC2086  # one word per size
run "$out/copy_large.json" 3e-4 ${LARGE_SIZES:-768,2048,8,12}
