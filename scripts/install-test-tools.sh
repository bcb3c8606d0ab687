#!/usr/bin/env bash
# Install what the monitoring tests need, only when it is missing:
#   - Prometheus, promtool, Alertmanager and amtool from Debian's packages;
#   - wrk (Debian's package), which the benchmark suite's smoke test drives the API with;
#   - the npm packages of tests/deploy/grafana_schema (Grafana's schema types and TypeScript),
#     from its package-lock.json.
# Fast when everything is in place; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_updated=""
apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-test-tools: need root to apt-get install $*" >&2
    return 1
  fi
  if [ -z "$apt_updated" ]; then
    apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
for tool in prometheus promtool; do
  command -v "$tool" >/dev/null || missing+=(prometheus)
done
for tool in prometheus-alertmanager amtool; do
  command -v "$tool" >/dev/null || missing+=(prometheus-alertmanager)
done
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
  packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  echo "==> installing ${packages}"
  # shellcheck disable=SC2086  # one word per package
  apt_install $packages
fi

if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "==> installing nodejs and npm"
  apt_install nodejs npm
fi

schema_dir=tests/deploy/grafana_schema
stamp="$schema_dir/node_modules/.cache/installed-lock.sha256"
want=$(sha256sum "$schema_dir/package-lock.json" | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> npm ci in $schema_dir"
  (cd "$schema_dir" && npm ci --no-audit --no-fund --loglevel=error)
  mkdir -p "$(dirname "$stamp")"
  echo "$want" >"$stamp"
fi
