"""What every simulated Google service shares: a gRPC handler built from the client library's own
request/response types, with the `unavailable` and `permission_denied` faults checked first and
`SimError` turned into a gRPC status; and offset pagination (GCP_API_FACTS.md 0.4).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.longrunning import operations_pb2

from ops.sim.faults import UNAVAILABLE_MESSAGE, FaultKind, Faults
from ops.sim.state import SimError

log = logging.getLogger(__name__)

LRO = operations_pb2.Operation
# method -> (request type, response type (proto-plus, or a protobuf class: an Operation, Empty), handler)
Methods = dict[str, tuple[type, Any, Callable[[Any], Any]]]


def page(items: list[Any], page_size: int, page_token: str, default: int = 0) -> tuple[list[Any], str]:
    """One page and the next token (an offset); `default` 0 = everything at once."""
    try:
        start = int(page_token) if page_token else 0
    except ValueError:
        raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid page token {page_token!r}") from None
    size = page_size or default or len(items) or 1
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


def check_faults(faults: Faults, method: str, permission: str, resource: str) -> None:
    """An armed `unavailable` answers UNAVAILABLE (HTTP 503); `permission_denied` answers as IAM does."""
    if faults.take(FaultKind.UNAVAILABLE, method=method):
        raise SimError(grpc.StatusCode.UNAVAILABLE, UNAVAILABLE_MESSAGE)
    if faults.take(FaultKind.PERMISSION_DENIED, method=method):
        raise SimError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).",
        )


def service_handler(
    service: str,
    methods: Methods,
    faults: Faults,
    permissions: dict[str, str],
    resource_of: Callable[[Any], str],
) -> grpc.GenericRpcHandler:
    """The gRPC service `service` (e.g. google.cloud.secretmanager.v1.SecretManagerService).

    `permissions` maps a method to the IAM permission a `permission_denied` fault names; `resource_of`
    gives the resource a request is about (its name or parent), for that message."""

    def guarded(method: str, fn: Callable[[Any], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                check_faults(faults, method, permissions.get(method, ""), resource_of(request))
                return fn(request)
            except SimError as e:
                context.abort(e.code, e.message)
            except Exception:
                log.exception("sim: %s/%s failed", service, method)
                raise

        return handler

    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            guarded(method, fn),
            request_deserializer=req_type.deserialize,
            response_serializer=getattr(resp_type, "serialize", None) or resp_type.SerializeToString,
        )
        for method, (req_type, resp_type, fn) in methods.items()
    }
    return grpc.method_handlers_generic_handler(service, handlers)


def resource_of(request: Any) -> str:
    """The first of name / parent a request has, for a permission message."""
    for field in ("name", "parent", "project_id"):
        value = getattr(request, field, "")
        if value:
            return value
    return ""
