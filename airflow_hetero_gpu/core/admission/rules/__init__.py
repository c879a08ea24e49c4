"""The admission pass's rules, one per module, consulted by the one walk
(:mod:`airflow_hetero_gpu.core.admission.walk`) through :class:`~.base.Rule`.

* :mod:`.queue_order`: the walk in queue order (always);
* :mod:`.quota`: team quotas with borrowing and lending (with teams);
* :mod:`.fair_share`: the borrowers' walk, team by team, lowest fair-share value first (with teams);
* :mod:`.max_jobs`: at most ``max_jobs`` running jobs per team (teams that set it);
* :mod:`.preemption`: preemption by priority and by reclaim of lent quota (preemption on).

A pass without teams and with preemption off has only the queue order: the other rules are
absent, not switched off.
"""
