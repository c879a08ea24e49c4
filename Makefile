# The two commands a new machine needs:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: venv test demo demo-ui bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# the retraining DAG on an emulated five-host cluster (real sshd, real torchrun on CPU)
demo: $(STAMP)
	$(PY) -m airflow_hetero_gpu.demo --dags-folder dags

# the same cluster behind `airflow standalone` (http://localhost:8080); Ctrl-C stops it all
demo-ui: $(STAMP)
	$(PY) -m airflow_hetero_gpu.demo --dags-folder dags --ui

bench: $(STAMP)
	$(PY) benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) .pytest_cache
