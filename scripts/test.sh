#!/usr/bin/env bash
# The test command: install what the tests need, make sure the services they use are up, then
# lint, type-check and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh dev
scripts/install-test-tools.sh
scripts/install-browser.sh
scripts/install-llama-server.sh

# Redis: the tests use database 15 of the server on 127.0.0.1:6379; start one if none answers.
# The binary is needed even when a server answers: fault tests start private ones to restart.
if ! command -v redis-server >/dev/null; then
  echo "==> installing redis-server"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  echo "==> starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi
# PostgreSQL on 127.0.0.1:5432 (trust auth, database test): start the local cluster if it is down.
if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null && command -v pg_ctlcluster >/dev/null; then
  echo "==> starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
# RabbitMQ on 127.0.0.1:5672 (guest/guest): the judge queue's other broker. The binary is needed
# even when a server answers: the broker-restart test starts a private node to kill.
if ! command -v rabbitmq-server >/dev/null; then
  echo "==> installing rabbitmq-server"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
  echo "==> starting rabbitmq-server on 127.0.0.1:5672"
  rabbitmq-server -detached
  for _ in $(seq 1 150); do (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && break; sleep 0.2; done
fi

echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> mypy"
.venv/bin/mypy service workers deploy tests client/retrieval_monitor_client
echo "==> pytest"
# The load test at 20,000 events keeps the command well inside CI's time; the full 100,000 runs
# with RM_LOAD_EVENTS=100000 (docs/reliability.md). The slowest tests are listed at the end.
export RM_LOAD_EVENTS="${RM_LOAD_EVENTS:-20000}"
.venv/bin/pytest --durations=25 "$@"
