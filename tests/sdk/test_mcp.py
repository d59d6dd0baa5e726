"""The MCP gateway with real MCP software on both sides: servers built with the official MCP Python SDK
(FastMCP, over the streamable HTTP transport and the legacy SSE one) registered, discovered and called
through the gateway under governance; and the official MCP client connected to the gateway's own MCP
server at /v1/mcp/connect."""

import asyncio
import json
import threading
import time

import httpx
import pytest
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.fastmcp import FastMCP
from mcp.shared.exceptions import McpError

from conftest import call, free_port

UPSTREAM_TOKEN = "upstream-mcp-token-0123456789"


def build_server():
    server = FastMCP("math")

    @server.tool()
    def add(a: float, b: float) -> float:
        """Adds two numbers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Echoes its text."""
        return text

    return server


class RequireBearer:
    """ASGI middleware: the upstream refuses calls without the gateway-held credential."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {UPSTREAM_TOKEN}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await self.app(scope, receive, send)


def serve(app):
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.time() + 15
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("the upstream MCP server did not start")
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def upstream():
    streamable, streamable_url = serve(RequireBearer(build_server().streamable_http_app()))
    legacy, legacy_url = serve(build_server().sse_app())
    yield {"streamable": f"{streamable_url}/mcp", "sse": f"{legacy_url}/sse"}
    streamable.should_exit = True
    legacy.should_exit = True




def test_servers_are_registered_discovered_and_called(gateway, upstream):
    name = f"math-{gateway['shape']}"
    server = call(gateway, "POST", "/v1/mcp/servers", {
        "name": name, "transport": "streamable-http", "url": upstream["streamable"],
        "auth": {"type": "bearer", "token": UPSTREAM_TOKEN}}, expect=201)
    assert server["auth"]["type"] == "bearer" and UPSTREAM_TOKEN not in json.dumps(server)
    call(gateway, "POST", "/v1/mcp/servers", {"name": name, "transport": "streamable-http", "url": upstream["streamable"]}, expect=409)
    bad = call(gateway, "POST", "/v1/mcp/servers", {"name": "x", "transport": "websocket", "url": upstream["streamable"]}, expect=400)
    assert bad["error"]["code"] == "invalid_mcp_server" and bad["recovery"]

    discovered = call(gateway, "POST", f"/v1/mcp/servers/{server['id']}/discover")
    assert sorted(tool["name"] for tool in discovered["tools"]) == ["add", "echo"] and discovered["count"] == 2
    add = next(tool for tool in discovered["tools"] if tool["name"] == "add")
    assert set(add["inputSchema"]["properties"]) == {"a", "b"}
    assert call(gateway, "GET", f"/v1/mcp/servers/{name}")["tool_count"] == 2

    answer = call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 2, "b": 3.5}})
    assert answer["result"]["content"][0]["text"] == "5.5"
    assert answer["result"]["isError"] is False
    assert answer["metadata"]["tool"] == "add" and answer["metadata"]["server_id"] == server["id"]
    # A tool's own failure (bad arguments) is its result, flagged, not a gateway error.
    failed = call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": "not a number"}})
    assert failed["result"]["isError"] is True

    # The legacy transport.
    legacy = call(gateway, "POST", "/v1/mcp/servers", {"name": f"legacy-{gateway['shape']}", "transport": "sse", "url": upstream["sse"]}, expect=201)
    call(gateway, "POST", f"/v1/mcp/servers/{legacy['id']}/discover")
    echoed = call(gateway, "POST", f"/v1/mcp/tools/{legacy['id']}/echo", {"arguments": {"text": "hello over sse"}})
    assert echoed["result"]["content"][0]["text"] == "hello over sse"

    audit = call(gateway, "GET", "/v1/mcp/audit?limit=10")
    assert [entry["result"] for entry in audit["entries"][:3]] == ["success", "tool_error", "success"]
    assert audit["entries"][0]["server_name"] == f"legacy-{gateway['shape']}"

    # Without the credential the upstream refuses, and the gateway says so.
    call(gateway, "PUT", f"/v1/mcp/servers/{server['id']}", {"auth": None})
    refused = call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 1, "b": 1}}, expect=503)
    assert refused["error"]["code"] == "mcp_server_unreachable" and "401" in refused["error"]["message"]
    # Both of auth's members are optional: a token alone is a bearer credential, an auth without one is none.
    restored = call(gateway, "PUT", f"/v1/mcp/servers/{server['id']}", {"auth": {"token": UPSTREAM_TOKEN}})
    assert restored["auth"]["type"] == "bearer"
    assert call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 1, "b": 1}})["result"]["isError"] is False
    assert call(gateway, "PUT", f"/v1/mcp/servers/{server['id']}", {"auth": {"type": "bearer"}})["auth"] is None
    call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 1, "b": 1}}, expect=503)
    call(gateway, "PUT", f"/v1/mcp/servers/{server['id']}", {"auth": {"type": "bearer", "token": UPSTREAM_TOKEN}})


def test_governance_denies_and_queues_for_approval(gateway, upstream):
    name = f"governed-{gateway['shape']}"
    call(gateway, "POST", "/v1/mcp/servers", {
        "name": name, "transport": "streamable-http", "url": upstream["streamable"],
        "auth": {"type": "bearer", "token": UPSTREAM_TOKEN}}, expect=201)
    call(gateway, "PUT", "/v1/mcp/governance/policy", {"tool_name": f"{name}/echo", "allowed": False})
    governance = call(gateway, "PUT", "/v1/mcp/governance/policy", {"tool_name": f"{name}/add", "allowed": True, "requires_approval": True, "max_cost_usd": 0.05})
    assert governance["enabled"] is True
    assert {"tool_name": f"{name}/add", "allowed": True, "requires_approval": True, "max_cost_usd": 0.05}.items() <= next(
        policy for policy in governance["policies"] if policy["tool_name"] == f"{name}/add").items()

    denied = call(gateway, "POST", f"/v1/mcp/tools/{name}/echo", {"arguments": {"text": "x"}}, expect=403)
    assert denied["error"]["code"] == "tool_denied"
    queued = call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 20, "b": 22}}, expect=202)
    assert queued["status"] == "queued" and queued["approval_id"]
    pending = call(gateway, "GET", "/v1/mcp/approvals?status=pending")["approvals"]
    mine = next(approval for approval in pending if approval["id"] == queued["approval_id"])
    assert mine["tool"] == "add" and mine["arguments"] == {"a": 20, "b": 22} and mine["status"] == "pending"

    approved = call(gateway, "POST", f"/v1/mcp/approvals/{queued['approval_id']}/approve")
    assert approved["status"] == "approved" and approved["result"]["content"][0]["text"] == "42.0"
    again = call(gateway, "POST", f"/v1/mcp/approvals/{queued['approval_id']}/deny", expect=409)
    assert again["error"]["code"] == "approval_already_decided"
    second = call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 1, "b": 1}}, expect=202)
    # The shared approval queue shows it beside the completion path's approvals: keys, never values.
    queue = call(gateway, "GET", "/v1/approvals/pending")["approvals"]
    listed = next(approval for approval in queue if approval["id"] == second["approval_id"])
    assert listed["surface"] == "mcp" and listed["tool_name"] == "add" and sorted(listed["argument_keys"]) == ["a", "b"]
    assert "arguments" not in listed
    # ... and its endpoints decide it too.
    assert call(gateway, "POST", f"/v1/approvals/{second['approval_id']}/deny") == {"id": second["approval_id"], "status": "denied"}
    call(gateway, "POST", f"/v1/mcp/approvals/{second['approval_id']}/approve", expect=409)


async def connect_and_steer(gateway, name):
    url = gateway["base_url"] + "/v1/mcp/connect"
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {gateway['key']}"}, timeout=30)
    async with http, streamable_http_client(url, http_client=http) as (read, write, _):
        async with ClientSession(read, write) as session:
            initialized = await session.initialize()
            assert initialized.serverInfo.name == "brainstorm"
            tools = {tool.name for tool in (await session.list_tools()).tools}
            assert {"br_activate_killswitch", "br_deactivate_killswitch", "br_get_killswitch_status",
                    "br_get_budget_status", "br_get_budget_forecast", "br_agent_inventory"} <= tools
            # The tenant's registered servers' tools, through the same connection and governance.
            assert f"{name}__add" in tools and f"{name}__echo" in tools
            added = await session.call_tool(f"{name}__add", {"a": 1, "b": 2})
            assert not added.isError and added.content[0].text == "3.0"
            with pytest.raises(McpError, match="unknown tool"):
                await session.call_tool(f"{name}__missing", {})
            activated = await session.call_tool("br_activate_killswitch", {"reason": "runaway agent"})
            assert not activated.isError, activated
            assert activated.structuredContent["active"] is True
            # While it is active the gateway refuses tool calls, but its MCP server still steers it.
            blocked = call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 1, "b": 1}}, expect=503)
            assert blocked["error"]["code"] == "kill_switch_active", blocked
            proxied = await session.call_tool(f"{name}__add", {"a": 1, "b": 2})
            assert proxied.isError and proxied.structuredContent["error"]["code"] == "kill_switch_active"
            status = await session.call_tool("br_get_killswitch_status", {})
            assert status.structuredContent["active"] is True and status.structuredContent["reason"] == "runaway agent"
            budget = await session.call_tool("br_get_budget_status", {})
            assert not budget.isError and "daily" in budget.structuredContent
            inventory = await session.call_tool("br_agent_inventory", {"period": "week"})
            assert not inventory.isError and "summary" in inventory.structuredContent
            wrong = await session.call_tool("br_agent_inventory", {"period": 7})
            assert wrong.isError and wrong.structuredContent["error"]["code"] == "invalid_arguments"
            deactivated = await session.call_tool("br_deactivate_killswitch", {})
            assert not deactivated.isError and deactivated.structuredContent["active"] is False


def test_the_official_mcp_client_steers_the_gateway(gateway, upstream):
    name = f"steered-{gateway['shape']}"
    server = call(gateway, "POST", "/v1/mcp/servers", {
        "name": name, "transport": "streamable-http", "url": upstream["streamable"],
        "auth": {"type": "bearer", "token": UPSTREAM_TOKEN}}, expect=201)
    call(gateway, "POST", f"/v1/mcp/servers/{server['id']}/discover")
    asyncio.run(connect_and_steer(gateway, name))
    assert call(gateway, "POST", f"/v1/mcp/tools/{name}/add", {"arguments": {"a": 1, "b": 1}})["result"]["isError"] is False
    described = call(gateway, "GET", "/v1/mcp/connect")
    assert described["transport"] == "streamable-http" and any(tool["name"] == "br_agent_inventory" for tool in described["tools"])
