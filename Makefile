# The two commands a new machine needs:  `make demo`  and  `make test`.
# Both bring in what they need first (scripts/bootstrap.sh, also used by .ci/run): as root on
# Debian/Ubuntu the missing system packages, then .venv with the package and its test extra.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
PORT   ?= 8080

.PHONY: venv system-demo system-test test test-fast demo demo-ui bench clean

$(STAMP): pyproject.toml
	@scripts/bootstrap.sh venv $(PYTHON) $(VENV)

venv: $(STAMP)

system-demo:
	@scripts/bootstrap.sh system demo

system-test:
	@scripts/bootstrap.sh system test

# two test processes (pytest-xdist; TEST_WORKERS=0 runs in one), then the tests marked serial
# alone: they stop every orphaned training process on the machine, other tests' jobs among them
# (the 30 longest tests are listed at the end: where the time goes)
TEST_WORKERS ?= 2
test: system-test $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not serial" --durations=30
	$(PY) -m pytest -q -m serial

# the inner loop: every test but the slow ones (tests/slow_tests.txt, measured; 2.5 s or more)
# and the serial ones, in two processes
test-fast: system-test $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow and not serial"

# the retraining DAG on an emulated five-host cluster (real sshd, or the embedded SSH server
# where sshd cannot be installed; real torchrun on CPU)
demo: system-demo $(STAMP)
	@$(PY) -m airflow_hetero_gpu.demo --dags-folder dags

# the same cluster behind `airflow standalone` (http://localhost:$(PORT)); Ctrl-C or SIGTERM stops it all
demo-ui: system-demo $(STAMP)
	@$(PY) -m airflow_hetero_gpu.demo --dags-folder dags --ui --port $(PORT)

bench: $(STAMP)
	$(PY) benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) .pytest_cache
