# The two commands a new machine needs:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: venv test demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/hetero-gpu plan --captures airflow_hetero_gpu/samples/cluster --gpus 4 --gpu-type A100

bench: $(STAMP)
	$(PY) benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) .pytest_cache
