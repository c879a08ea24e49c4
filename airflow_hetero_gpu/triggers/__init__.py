"""Airflow triggers of the provider: :class:`~airflow_hetero_gpu.triggers.gpu_health.GpuHealthTrigger`."""
