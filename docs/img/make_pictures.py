"""Draw the demo cluster's pictures for the documentation from a real collection.

    python docs/img/make_pictures.py [--out docs/img]

Run from the repository root with the package importable (``make venv`` then
``.venv/bin/python docs/img/make_pictures.py``, or ``PYTHONPATH=.``). It needs ``sshd`` and
``ssh-keygen`` (``apt-get install openssh-server``), like the demo, and takes a few seconds:

1. starts the demo's emulated cluster (``demo_hosts()``: five hosts on 127.0.0.x, real sshd,
   emulated ``nvidia-smi``), see docs/emulated-cluster.md;
2. collects it over SSH with host keys verified (``collect_captures``, what ``hetero-gpu collect``
   runs) into a temporary capture directory, then stops the cluster;
3. adds the demo's ``cluster.yaml`` and ``topology.conf`` (``airflow_hetero_gpu.demo``);
4. reads the directory back (``load_cluster``), plans the demo's request (4 GPUs, any card type,
   no ledger) and draws ``Cluster.graph`` with the cluster page's renderer
   (``airflow_hetero_gpu.plugins.topology_svg.topology_svg``):

   * ``demo-topology.svg``: hosts, GPUs coloured by state, NVLink/PCIe links, switch tiers;
   * ``demo-placement.svg``: the same, the decision's GPUs highlighted.

It prints the decision, which is the one the demo's DAG run logs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="where to write the SVG files (default: this script's folder)")
    parser.add_argument("--gpus", type=int, default=4, help="GPUs of the request to plan (the demo's: 4)")
    args = parser.parse_args(argv)

    from airflow_hetero_gpu.collect.ssh import collect_captures, paramiko_client_factory
    from airflow_hetero_gpu.collect.targets import parse_hosts_arg
    from airflow_hetero_gpu.core.inventory import load_cluster
    from airflow_hetero_gpu.core.model import PlanRequest
    from airflow_hetero_gpu.core.planner import plan
    from airflow_hetero_gpu.demo_setup import CLUSTER_YAML, TOPOLOGY_CONF
    from airflow_hetero_gpu.plugins import model, topology_svg
    from airflow_hetero_gpu.testing import sshd_available
    from airflow_hetero_gpu.testing.cluster import EmulatedCluster
    from airflow_hetero_gpu.testing.demo import demo_hosts

    if not sshd_available():
        print("error: OpenSSH server not installed (apt-get install openssh-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hetero-gpu-pictures-") as tmp:
        captures = Path(tmp) / "captures"
        with EmulatedCluster(Path(tmp) / "cluster", demo_hosts()) as cluster:
            factory = paramiko_client_factory(cluster.identity_file, cluster.known_hosts_path)
            report = collect_captures(parse_hosts_arg(cluster.hosts_arg()), captures, factory)
        if report.failed:
            for host in report.failed:
                print(f"error: collecting {host.host} failed: {host.reason}", file=sys.stderr)
            return 1
        (captures / "cluster.yaml").write_text(CLUSTER_YAML, encoding="utf-8")
        (captures / "topology.conf").write_text(TOPOLOGY_CONF, encoding="utf-8")
        demo = load_cluster(captures)

    result = plan(demo, PlanRequest(args.gpus))
    decision = result.decision
    if decision is None:
        print(f"error: no pool can host {args.gpus} GPUs", file=sys.stderr)
        return 1
    chosen = [(g.host, g.index) for g in decision.gpus]
    where = "; ".join(f"{h} GPU {','.join(str(i) for hh, i in chosen if hh == h)}" for h in decision.hosts)
    statuses = model.gpu_statuses(demo)
    args.out.mkdir(parents=True, exist_ok=True)
    pictures = {
        "demo-topology.svg": topology_svg.topology_svg(
            demo.graph, statuses, title="The demo cluster: five hosts, their GPUs, NVLink/PCIe links and switch tiers"),
        "demo-placement.svg": topology_svg.topology_svg(
            demo.graph, statuses, highlight=chosen,
            highlight_label=f"the decision for {args.gpus} GPUs: pool {decision.pool}, {where} "
                            f"(E = {decision.score.total:.4f})",
            title=f"The demo cluster with the GPUs chosen for a {args.gpus}-GPU job"),
    }
    for name, svg in pictures.items():
        (args.out / name).write_text(svg + "\n", encoding="utf-8")
        print(f"wrote {args.out / name}")
    print(f"{len(demo.gpus)} GPUs on {len(demo.hosts)} hosts, {len(demo.pools)} pools; "
          f"decision: pool {decision.pool!r} -> {where}, E = {decision.score.total:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
