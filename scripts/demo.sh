#!/usr/bin/env bash
# Install retrieval-monitor and run it on embedded defaults (SQLite, embedded Redis, the local
# judge), replaying a generated workload so the measures move. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/retrieval-monitor serve --demo "$@"
