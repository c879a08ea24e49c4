"""Trace-driven simulator: replay a GPU job trace on a cluster under several placement policies.

The pipeline, one module each:

* :mod:`~airflow_hetero_gpu.sim.trace` / :mod:`~airflow_hetero_gpu.sim.sources`: jobs from Alibaba's
  cluster-trace-gpu-v2023 or a plain CSV; arrival compression to an offered load
* :mod:`~airflow_hetero_gpu.sim.fleet`: the cluster from a node list, hosts wired like real servers,
  racks of leaf/spine switches; a planner :class:`~airflow_hetero_gpu.core.cluster.Cluster`
* :mod:`~airflow_hetero_gpu.sim.state`: the live allocation a policy sees
* :mod:`~airflow_hetero_gpu.sim.policies`: ``seed`` (the planner's own :func:`plan`) and the baselines
* :mod:`~airflow_hetero_gpu.sim.engine`: the discrete-event loop (FIFO, optional backfill, gang jobs)
* :mod:`~airflow_hetero_gpu.sim.metrics`, :mod:`~airflow_hetero_gpu.sim.report`,
  :mod:`~airflow_hetero_gpu.sim.plots`: numbers, comparison, JSON and PNG
* :mod:`~airflow_hetero_gpu.cli.simulate`: ``hetero-gpu simulate``
"""

#: the queue disciplines of :mod:`~airflow_hetero_gpu.sim.disciplines` (here: the command line lists
#: them without importing the simulator)
QUEUES = ("admission", "fifo", "greedy")
