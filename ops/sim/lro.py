"""Long-running operations as the clients poll them (google.longrunning.Operations/GetOperation), for
every service of the simulator (they share one server, so one Operations service).

A TPU operation is named `projects/P/locations/Z/operations/operation-<ms>-<hex>-<hex>-<hex>`
(GCP_API_FACTS 1.1) and its metadata is the API version's OperationMetadata (`start`); other services
name theirs and give their own metadata message (`begin`). The result is an `Any` packed from the result
message, so the client's type-URL check applies (a v2alpha1 delete answered with Empty -> TypeError).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import grpc
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, empty_pb2, timestamp_pb2
from google.rpc import status_pb2

from ops.sim import versions


def _pack(msg: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(type(msg).pb(msg) if hasattr(type(msg), "pb") else msg)
    return packed


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


class Operations:
    """Every operation the simulator started, by name; finished ones are kept for later polls."""

    def __init__(self) -> None:
        self._ops: dict[str, operations_pb2.Operation] = {}
        self._meta: dict[str, tuple[str, str, str, timestamp_pb2.Timestamp]] = {}  # TPU operations only
        self._lock = threading.Lock()

    def start(self, parent: str, verb: str, target: str, api: str) -> str:
        """A new pending operation under `parent` (projects/P/locations/Z); returns its name."""
        name = (
            f"{parent}/operations/operation-{int(time.time() * 1000)}-{secrets.token_hex(7)[:13]}"
            f"-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
        )
        with self._lock:
            self._meta[name] = (verb, target, api, _now())
            self._ops[name] = operations_pb2.Operation(name=name, done=False, metadata=self._metadata(name))
        return name

    def begin(self, name: str, metadata: Any) -> str:
        """A new pending operation named `name` by its service, with that service's `metadata` message."""
        with self._lock:
            self._ops[name] = operations_pb2.Operation(name=name, done=False, metadata=_pack(metadata))
        return name

    def set_metadata(self, name: str, metadata: Any) -> None:
        """Replace the metadata of a `begin` operation (a build's metadata carries the build as it runs)."""
        with self._lock:
            self._ops[name].metadata.CopyFrom(_pack(metadata))

    def finish(self, name: str, result: Any | None) -> None:
        """Done with `result` (a message of the operation's API version; None: google.protobuf.Empty)."""
        with self._lock:
            op = self._ops[name]
            if name in self._meta:
                op.metadata.CopyFrom(self._metadata(name, end=True))
            op.response.CopyFrom(_pack(empty_pb2.Empty() if result is None else result))
            op.done = True

    def fail(self, name: str, code: grpc.StatusCode, message: str) -> None:
        """Done with an error (google.rpc.Status), which the client raises as the matching exception."""
        with self._lock:
            op = self._ops[name]
            if name in self._meta:
                op.metadata.CopyFrom(self._metadata(name, end=True))
            op.error.CopyFrom(status_pb2.Status(code=code.value[0], message=message))
            op.done = True

    def api(self, name: str) -> str:
        with self._lock:
            return self._meta[name][2]

    def get(self, name: str) -> operations_pb2.Operation | None:
        with self._lock:
            op = self._ops.get(name)
            return None if op is None else operations_pb2.Operation.FromString(op.SerializeToString())

    def _metadata(self, name: str, end: bool = False) -> any_pb2.Any:
        verb, target, api, created = self._meta[name]
        meta = versions.types(api).OperationMetadata(
            create_time=created, end_time=_now() if end else None, target=target, verb=verb, api_version=api
        )
        return _pack(meta)


def operations_handler(ops: Operations, check: Any) -> grpc.GenericRpcHandler:
    """google.longrunning.Operations on the same server (the clients poll on the channel they call on)."""

    def get_operation(request: operations_pb2.GetOperationRequest, context: grpc.ServicerContext) -> Any:
        check("GetOperation", context)
        op = ops.get(request.name)
        if op is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Operation {request.name} not found.")
        return op

    return grpc.method_handlers_generic_handler(
        "google.longrunning.Operations",
        {
            "GetOperation": grpc.unary_unary_rpc_method_handler(
                get_operation,
                request_deserializer=operations_pb2.GetOperationRequest.FromString,
                response_serializer=operations_pb2.Operation.SerializeToString,
            )
        },
    )
