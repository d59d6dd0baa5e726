#!/usr/bin/env python3
"""A Kubernetes API server for the operator's end-to-end test (tests/operator.rs).

No real API server can run on these machines, so this serves kmock's KubernetesEmulator (PyPI
`kmock`: objects kept in memory, list, watch, get, create, merge-patch, delete with finalizers) on
127.0.0.1, with the few things a real API server does that the operator relies on and kmock leaves
out: every created object gets `metadata.uid`, `creationTimestamp`, `generation` and a
`resourceVersion`; every write moves the resourceVersion on, and a write to `spec` moves the
generation; a merge patch naming a stale `metadata.resourceVersion` is refused with 409, as the API
server's optimistic concurrency does; errors carry the API server's reasons (`NotFound`,
`AlreadyExists`), which clients match on. The operator's resources, Secrets and Events are declared so that
listing them works before the first one exists.

    python kube_emulator.py --port 0   # prints "listening on http://127.0.0.1:PORT" when ready
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import sys
import uuid
from typing import Any

import kmock
from kmock._internal import k8s, enums

RESOURCES = {
    "brainstorm.dev/v1alpha1/tenants": kmock.ResourceInfo(
        kind="Tenant", singular="tenant", namespaced=True, subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
    "brainstorm.dev/v1alpha1/killswitches": kmock.ResourceInfo(
        kind="KillSwitch", singular="killswitch", namespaced=True, subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
    "events.k8s.io/v1/events": kmock.ResourceInfo(
        kind="Event", singular="event", namespaced=True,
        verbs={"get", "list", "watch", "create", "patch"},
    ),
    "v1/secrets": kmock.ResourceInfo(
        kind="Secret", singular="secret", namespaced=True,
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
}


# The Kubernetes StatusReason of kmock's errors, by HTTP status.
REASONS = {404: "NotFound", 409: "AlreadyExists"}


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with object identity, versions and optimistic concurrency."""

    _versions = itertools.count(1)

    async def _handle(self, request: kmock.Request):  # type: ignore[override]
        data = request.data if isinstance(request.data, dict) else None
        if request.resource is not None and data is not None:
            metadata = data.setdefault("metadata", {})
            if request.action == enums.action.CREATE:
                metadata.setdefault("uid", str(uuid.uuid4()))
                metadata.setdefault("creationTimestamp", now())
                metadata["generation"] = 1
                metadata["resourceVersion"] = str(next(self._versions))
            elif request.action == enums.action.UPDATE and request.name is not None:
                stored = self._stored(request)
                if stored is not None:
                    expected = metadata.get("resourceVersion")
                    current = stored.get("metadata", {}).get("resourceVersion")
                    if expected is not None and expected != current:
                        return await self._refuse(request, expected, current)
                    if request.subresource is None and "spec" in data:
                        metadata["generation"] = int(stored.get("metadata", {}).get("generation", 1)) + 1
                metadata["resourceVersion"] = str(next(self._versions))
        return await super()._handle(request)

    async def _render_error(self, exc: Exception):  # type: ignore[override]
        response = await super()._render_error(exc)
        if isinstance(exc, k8s.KubernetesError) and exc.status in REASONS:
            import json
            body = json.loads(response.body)
            body["reason"] = REASONS[exc.status]
            body.pop("details", None)
            response.body = json.dumps(body).encode()
        return response

    def _stored(self, request: kmock.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        for (resource, namespace, name), obj in self.objects.items():
            if (resource, namespace, name) == key and not obj.deleted:
                return obj.raw
        return None

    async def _refuse(self, request: kmock.Request, expected: str, current: str | None):
        import aiohttp.web
        return aiohttp.web.json_response({
            "apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": f"the object has been modified (resourceVersion {expected}, now {current}); please apply your changes to the latest version and try again",
        }, status=409)


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def serve(port: int) -> None:
    async with ApiServer() as emulator:
        for key, info in RESOURCES.items():
            emulator.resources[key] = info
        async with kmock.Server(emulator, port=port) as server:
            print(f"listening on {str(server.url).rstrip('/')}", flush=True)
            await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    arguments = parser.parse_args()
    try:
        asyncio.run(serve(arguments.port))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
