#!/usr/bin/env bash
# Headless Chromium for the browser tests of the web pages: Debian's chromium package, driven by
# the `playwright` Python package in .venv. Playwright's own browser downloads are never used.
# Safe to run again: it does nothing when both are present.
set -euo pipefail
cd "$(dirname "$0")/.."

CHROMIUM="${RM_CHROMIUM:-/usr/bin/chromium}"

if [ ! -x "$CHROMIUM" ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = "0" ]; then
    echo "==> installing chromium (Debian package)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  elif [ "${CI:-}" = "true" ]; then
    echo "chromium is missing at $CHROMIUM and cannot be installed (needs apt-get as root)" >&2
    exit 1
  else
    echo "==> chromium is missing at $CHROMIUM; the browser tests will be skipped" >&2
  fi
fi

if [ -x .venv/bin/python ] && ! .venv/bin/python -c "import playwright" 2>/dev/null; then
  echo "==> installing the playwright driver into .venv"
  .venv/bin/pip install -q "playwright>=1.45"
fi
