"""`tokenmill operator` (or `python -P -m tokenmill.operator`): run the operator with kopf.

Watches every namespace unless --namespace is given; runs with kopf peering (one active
replica among several) unless --standalone; serves a liveness endpoint for the kubelet and its
own Prometheus metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill operator", description=__doc__.split("\n")[0])
    p.add_argument("-n", "--namespace", action="append", default=[],
                   help="Namespace (or glob) to watch; repeat for several. Default: all.")
    p.add_argument("--standalone", action="store_true",
                   help="Run without peering (a single operator replica).")
    p.add_argument("--peering", default="tokenmill-operator",
                   help="Name of the KopfPeering/ClusterKopfPeering object for HA.")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                   help="Liveness endpoint URL, or '' for none.")
    p.add_argument("--engine-image", default=None,
                   help="Image of engine pods whose spec names none (env TOKENMILL_ENGINE_IMAGE).")
    p.add_argument("--metrics-port", type=int, default=9090,
                   help="Port of the operator's own /metrics; 0 for none.")
    p.add_argument("--autoscale-interval", type=float, default=None,
                   help="Seconds between built-in autoscaler decisions (default 5; env "
                        "TOKENMILL_AUTOSCALE_INTERVAL).")
    p.add_argument("--cluster-domain", default=None,
                   help="The cluster's DNS domain, for status.url (env TOKENMILL_CLUSTER_DOMAIN; "
                        "default: read from the pod's /etc/resolv.conf, else cluster.local).")
    p.add_argument("--platform-assigned-ids", action="store_true",
                   help="Engine pods name no runAsUser, runAsGroup or fsGroup: the platform "
                        "assigns them (OpenShift's restricted-v2 SCC; env "
                        "TOKENMILL_PLATFORM_ASSIGNED_IDS=1).")
    p.add_argument("--verbose", action="store_true", help="Debug logging.")
    return p


def export_settings(args: argparse.Namespace) -> None:
    """The flags that stand for environment variables, set as those: the handlers read them
    (a deployment may set either)."""
    if args.engine_image:
        os.environ["TOKENMILL_ENGINE_IMAGE"] = args.engine_image
    if args.autoscale_interval:
        os.environ["TOKENMILL_AUTOSCALE_INTERVAL"] = str(args.autoscale_interval)
    if args.cluster_domain:
        os.environ["TOKENMILL_CLUSTER_DOMAIN"] = args.cluster_domain
    if args.platform_assigned_ids:
        os.environ["TOKENMILL_PLATFORM_ASSIGNED_IDS"] = "1"


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    export_settings(args)
    import kopf

    from . import handlers, metrics  # noqa: F401  (importing handlers registers them)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # kopf reports every handler and timer run per object at INFO
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    asyncio.run(kopf.operator(
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        liveness_endpoint=args.liveness or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
    ))


if __name__ == "__main__":
    main()
