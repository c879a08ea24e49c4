"""Airflow sensors of the provider: :class:`~airflow_hetero_gpu.sensors.gpu_health.GpuHealthSensor`."""
