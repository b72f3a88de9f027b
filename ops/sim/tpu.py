"""The Cloud TPU gRPC services (`google.cloud.tpu.v2.Tpu`, `google.cloud.tpu.v2alpha1.Tpu`) over one
`TpuState`, built from the client library's own request/response types (FINDINGS.md, the gRPC recipe).

Served: nodes (List/Get/Create/Delete), queued resources (List/Get/Create/Delete) and accelerator types
(List/Get). Other RPCs answer UNIMPLEMENTED, as gRPC does for an unregistered method.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.longrunning import operations_pb2

from ops.sim import versions
from ops.sim.rpc import page
from ops.sim.state import Pager, SimError, TpuState

log = logging.getLogger(__name__)

# ListAcceleratorTypes pages hold this many when the request sets no page_size, so the client's pager
# really pages (GCP_API_FACTS.md 0.4; Google's own default is not documented).
ACCELERATOR_TYPES_PAGE = 4
# Converted messages kept for a v2 client (the state keeps v2alpha1): a conversion goes through JSON and
# costs ~0.3 ms, a listing of 1,024 unchanged VMs would pay it on every sweep.
CONVERTED_MAX = 16384


def tpu_handler(state: TpuState, api: str) -> grpc.GenericRpcHandler:
    """The Tpu service of API version `api` (versions.V2 or versions.V2ALPHA1) over `state`."""
    t = versions.types(api)

    converted: dict[tuple[type, bytes], tuple[Any, bytes]] = {}

    def out(msg: Any) -> Any:
        """`msg` as `api`'s type; an unchanged message is converted once (known by its bytes)."""
        if api == versions.CANON:
            return msg
        key = (type(msg), type(msg).serialize(msg))
        done = converted.get(key)
        if done is None:
            if len(converted) >= CONVERTED_MAX:
                converted.clear()
            new = versions.convert(msg, api)
            converted[key] = (type(new), type(new).serialize(new))
            return new
        return done[0].deserialize(done[1])

    def into(msg: Any) -> Any:
        return versions.convert(msg, versions.CANON)

    def operation(name: str) -> operations_pb2.Operation:
        op = state.ops.get(name)
        assert op is not None
        return op

    def pager(req: Any) -> Pager:
        return lambda names: page(names, req.page_size, req.page_token, state.page_size)

    def list_nodes(req: Any) -> Any:
        items, token = state.list_nodes(req.parent, pager(req))
        return t.ListNodesResponse(nodes=[out(n) for n in items], next_page_token=token)

    def list_qrs(req: Any) -> Any:
        items, token = state.list_qrs(req.parent, pager(req))
        return t.ListQueuedResourcesResponse(queued_resources=[out(q) for q in items], next_page_token=token)

    def list_types(req: Any) -> Any:
        all_types = state.accelerator_types(req.parent)
        items, token = page(all_types, req.page_size, req.page_token, ACCELERATOR_TYPES_PAGE)
        types = [out(a) for a in items]
        return t.ListAcceleratorTypesResponse(accelerator_types=types, next_page_token=token)

    def get_type(req: Any) -> Any:
        parent, _, name = req.name.partition("/acceleratorTypes/")
        for accel in state.accelerator_types(parent):
            if accel.type_ == name:
                return out(accel)
        raise SimError(grpc.StatusCode.NOT_FOUND, f"Resource '{req.name}' was not found")

    lro = operations_pb2.Operation
    methods: dict[str, tuple[type, Any, Callable[[Any], Any]]] = {
        "ListNodes": (t.ListNodesRequest, t.ListNodesResponse, list_nodes),
        "GetNode": (t.GetNodeRequest, t.Node, lambda r: out(state.get_node(r.name))),
        "CreateNode": (
            t.CreateNodeRequest,
            lro,
            lambda r: operation(state.create_node(r.parent, r.node_id, into(r.node), api)),
        ),
        "DeleteNode": (t.DeleteNodeRequest, lro, lambda r: operation(state.delete_node(r.name, api))),
        "ListQueuedResources": (t.ListQueuedResourcesRequest, t.ListQueuedResourcesResponse, list_qrs),
        "GetQueuedResource": (
            t.GetQueuedResourceRequest,
            t.QueuedResource,
            lambda r: out(state.get_qr(r.name)),
        ),
        "CreateQueuedResource": (
            t.CreateQueuedResourceRequest,
            lro,
            lambda r: operation(
                state.create_qr(r.parent, r.queued_resource_id, into(r.queued_resource), r.request_id, api)
            ),
        ),
        "DeleteQueuedResource": (
            t.DeleteQueuedResourceRequest,
            lro,
            lambda r: operation(state.delete_qr(r.name, getattr(r, "force", False), api)),
        ),
        "ListAcceleratorTypes": (t.ListAcceleratorTypesRequest, t.ListAcceleratorTypesResponse, list_types),
        "GetAcceleratorType": (t.GetAcceleratorTypeRequest, t.AcceleratorType, get_type),
    }
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            _guarded(state, method, fn),
            request_deserializer=req_type.deserialize,
            response_serializer=(resp_type.SerializeToString if resp_type is lro else resp_type.serialize),
        )
        for method, (req_type, resp_type, fn) in methods.items()
    }
    return grpc.method_handlers_generic_handler(f"google.cloud.tpu.{api}.Tpu", handlers)


def _guarded(
    state: TpuState, method: str, fn: Callable[[Any], Any]
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """The RPC with the `unavailable` fault checked first and SimError turned into a gRPC status."""

    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            state.check(method)
            return fn(request)
        except SimError as e:
            context.abort(e.code, e.message)
        except Exception:
            log.exception("tpu-sim: %s failed", method)
            raise

    return handler


def check_for_operations(state: TpuState) -> Callable[[str, grpc.ServicerContext], None]:
    """The `unavailable` fault for GetOperation, in the shape `lro.operations_handler` takes."""

    def check(method: str, context: grpc.ServicerContext) -> None:
        try:
            state.check(method)
        except SimError as e:
            context.abort(e.code, e.message)

    return check
