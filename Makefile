.PHONY: demo test lint bench

demo:  ## install and run on embedded defaults, replaying a generated workload
	scripts/demo.sh

test:  ## install the test tools and run lint, type checks and every test
	scripts/test.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy service workers deploy tests client/retrieval_monitor_client

bench:  ## every benchmark figure with its baseline (needs scripts/install-bench-tools.sh once)
	.venv/bin/python -m tests.benchmarks
