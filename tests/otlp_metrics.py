"""A metrics collector on loopback for the tests: an OTLP/HTTP endpoint that Airflow's own
OpenTelemetry metrics exporter (``[metrics] otel_on``) sends to, each data point kept as
``(metric name, {attribute: value})``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest


class OtlpMetrics:
    """``with OtlpMetrics() as otlp:`` run Airflow with ``otlp.airflow_env``; read ``otlp.points``."""

    def __init__(self) -> None:
        self.points: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()
        received = self._received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _received(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points if kind else ():
                        attrs = {a.key: a.value.string_value for a in point.attributes}
                        with self._lock:
                            self.points.append((metric.name, attrs))

    @property
    def airflow_env(self) -> dict[str, str]:
        """Airflow's settings that send its metrics here, every second and when the process ends."""
        return {"AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__OTEL_PORT": str(self.server.server_address[1]),
                "AIRFLOW__METRICS__OTEL_SSL_ACTIVE": "False", "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "1000"}

    def named(self, name: str) -> list[dict[str, str]]:
        """The attributes of every data point of the metric ``name`` received so far."""
        with self._lock:
            return [attrs for got, attrs in self.points if got == name]

    def __enter__(self) -> "OtlpMetrics":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp():
    """An :class:`OtlpMetrics` listening for the test's length."""
    with OtlpMetrics() as collector:
        yield collector
