"""The simulator's control endpoint on 127.0.0.1 (HTTP + JSON), for a simulator running as its own
process, and `SimControl`, its client. In-process, call the `SimServer`'s states directly.

  GET  /state                      names and states of nodes, queued resources, secret versions (never a
                                   payload), builds, pushed images' tags; armed faults
  POST /faults   {Fault fields}    arm a fault, e.g. {"kind": "stock_out", "zone": "local-sim-a"}
  POST /faults/clear               disarm all
  POST /preempt  {"name": ...}     preempt a node now (full name or node id)
  POST /latency  {Latency fields}  change the step delays (and `call_s`, the time every TPU RPC takes)
  POST /secrets  {"project": P, "values": {id: value}}   seed secrets (a new version unless unchanged)
  POST /cleanup                    run Artifact Registry's cleanup policies now; what they deleted
"""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ops.sim.faults import Fault, FaultKind
from ops.sim.state import Latency, SimError, TpuState

if TYPE_CHECKING:
    from ops.sim.server import SimServer


class ControlServer:
    def __init__(self, sim: SimServer, port: int = 0) -> None:
        self.state = sim.state
        handler = type("Handler", (_Handler,), {"state": sim.state, "sim": sim})
        self._http = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, name="tpu-sim-control", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._http.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    state: TpuState
    sim: SimServer

    def log_message(self, format: str, *args: Any) -> None:  # keep the test output quiet
        pass

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/state":
            self._reply(
                200,
                {
                    **self.state.summary(),
                    "secrets": self.sim.secrets.summary(),
                    "builds": self.sim.builds.summary(),
                    "images": self.sim.artifacts.summary(),
                },
            )
        else:
            self._reply(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/faults":
                self.state.add_fault(Fault.model_validate(body))
            elif self.path == "/faults/clear":
                self.state.faults.clear()
            elif self.path == "/preempt":
                self.state.preempt(body["name"])
            elif self.path == "/latency":
                update = Latency.model_validate(body).model_dump(exclude_unset=True)
                self.state.latency = self.state.latency.model_copy(update=update)
            elif self.path == "/secrets":
                self.sim.secrets.seed(str(body["project"]), dict(body["values"]))
            elif self.path == "/cleanup":
                self._reply(200, {"deleted": self.sim.artifacts.run_cleanup()})
                return
            else:
                self._reply(404, {"error": f"no route {self.path}"})
                return
        except (ValidationError, KeyError, ValueError, TypeError) as e:
            self._reply(400, {"error": str(e)})
            return
        except SimError as e:
            self._reply(404, {"error": e.message})
            return
        self._reply(200, {"ok": True})


class SimControl:
    """Client of a simulator's control endpoint (`control_url` in its sim.json)."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, path: str, body: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def state(self) -> dict:
        return self._call("/state")

    def add_fault(self, kind: FaultKind | str, **fields: Any) -> None:
        self._call("/faults", Fault(kind=FaultKind(kind), **fields).model_dump())

    def clear_faults(self) -> None:
        self._call("/faults/clear", {})

    def preempt(self, name: str) -> None:
        self._call("/preempt", {"name": name})

    def set_latency(self, **fields: float) -> None:
        self._call("/latency", fields)

    def seed_secrets(self, project: str, values: dict[str, str]) -> None:
        """Add each value as the secret's new version (creating the secret) unless it is the latest."""
        self._call("/secrets", {"project": project, "values": values})

    def run_cleanup(self) -> dict[str, list[str]]:
        return self._call("/cleanup", {})["deleted"]
