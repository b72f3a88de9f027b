"""Run the simulator (Cloud TPU, Secret Manager, Cloud Build, Artifact Registry) as its own process:

    python -m ops.sim --state-dir DIR [--port P] [--control-port C] [--hooks MODULE:FACTORY]
                      [--gcs-endpoint URL]

Writes DIR/sim.json ({"pid", "port", "address", "control_url", "buckets_dir"}) once it serves, keeps its
state in DIR/state.json, secrets.json, artifacts.json, builds.json (reloaded on the next start), and
stops cleanly on SIGTERM or SIGINT (sim.json removed). Cloud Build's buckets (sources, logs) are
directories under DIR/buckets, or Cloud Storage at `--gcs-endpoint` (say fake-gcs-server).
`--hooks MODULE:FACTORY` imports FACTORY, calls it with DIR, and gives the simulator the object it returns
(`on_ready(node)`, `on_gone(node)`, see ops.sim.state.Hooks); e.g. what starts Ray workers on READY.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import threading
from pathlib import Path

from ops.gcp.objects import gcs_objects_at
from ops.sim.server import SimServer
from ops.sim.state import Hooks, Latency


def load_hooks(spec: str, state_dir: Path) -> Hooks:
    """`package.module:factory` -> factory(state_dir)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)(state_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0, help="gRPC port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--control-port", type=int, default=0, help="HTTP control port (0: a free one)")
    parser.add_argument("--queue-s", type=float, default=Latency().queue_s)
    parser.add_argument("--provision-s", type=float, default=Latency().provision_s)
    parser.add_argument("--hooks", default="", help="MODULE:FACTORY called with the state dir")
    parser.add_argument(
        "--gcs-endpoint", default="", help="Cloud Storage emulator URL for Cloud Build's buckets"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    state_dir: Path = args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    hooks = [load_hooks(args.hooks, state_dir)] if args.hooks else []
    latency = Latency(queue_s=args.queue_s, provision_s=args.provision_s)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = SimServer(
        port=args.port,
        latency=latency,
        hooks=hooks,
        state_path=state_dir / "state.json",
        control_port=args.control_port,
        objects=gcs_objects_at(args.gcs_endpoint) if args.gcs_endpoint else None,
    ).start()
    info = state_dir / "sim.json"
    try:
        assert server.control is not None
        tmp = info.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "port": server.port,
                    "address": server.address,
                    "control_url": server.control.url,
                    "buckets_dir": str(server.buckets_dir) if server.buckets_dir else None,
                }
            )
        )
        os.replace(tmp, info)
        logging.info("tpu-sim serving on %s, control %s", server.address, server.control.url)
        stop.wait()
    finally:
        server.stop()
        info.unlink(missing_ok=True)
        logging.info("tpu-sim stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
