"""Every route of the spec, fed malformed input, answers with the error envelope: never a 5xx for a
client's mistake, never a bare or empty error body (spec "Errors"; README's standards).

The probes are what a buggy client or a hostile one sends: bodies that are not JSON, JSON of the wrong
shape, strings carrying a NUL (which PostgreSQL's text refuses), path parameters that are unknown,
NUL-bearing, very long or not UTF-8, and query parameters of the wrong type. A probe may be refused
(4xx) or, where the input is harmless, served (2xx/3xx); what it may never do is reach a 500, or come
back as an error without `error.message`, `error.type` and a `recovery` object.
"""

import http.client
import json
import re
from urllib.parse import urlsplit

import pytest

# Every route of gateway-spec.md ("Endpoints" tables and the completion surfaces), as the spec writes it.
ROUTES = """
POST /v1/chat/completions
POST /v1/messages
POST /v1/embeddings
POST /v1/register
GET /v1/account
PATCH /v1/account
POST /v1/account/graduate
GET /v1/account/graduation
POST /v1/account/users/invite
GET /v1/account/users
DELETE /v1/account/users/{id}
POST /v1/account/verify-email
POST /v1/account/verify-email/confirm
POST /v1/tenant/claim-link
GET /auth/me
GET /v1/admin/digest
POST /v1/admin/invite-codes
GET /v1/admin/invite-codes
DELETE /v1/admin/invite-codes/{id}
GET /v1/admin/tenants
GET /v1/admin/tenants/{id}
POST /v1/admin/tenants/{id}/approve
POST /v1/admin/tenants/{id}/reject
POST /v1/admin/xdr/risk-push
DELETE /v1/admin/xdr/risk-push
GET /v1/models
GET /v1/models/leaderboard
GET /v1/catalog/runnable
GET /v1/health/providers
GET /v1/providers/catalog
POST /v1/providers/test
POST /v1/providers
GET /v1/providers
DELETE /v1/providers/{providerId}
GET /v1/self
GET /v1/explain/{request_id}
POST /v1/oauth/apps
GET /v1/oauth/apps
DELETE /v1/oauth/apps/{id}
GET /auth/oauth/authorize
POST /auth/oauth/authorize
POST /auth/oauth/token
POST /v1/auth/device/authorize
POST /v1/auth/device/token
POST /v1/auth/link
POST /auth/claim
POST /auth/device/confirm
POST /v1/mcp/servers
GET /v1/mcp/servers
GET /v1/mcp/servers/{id}
PUT /v1/mcp/servers/{id}
DELETE /v1/mcp/servers/{id}
POST /v1/mcp/servers/{id}/discover
GET /v1/mcp/tools
POST /v1/mcp/tools/{server}/{tool}
GET /v1/mcp/audit
GET /v1/mcp/governance
PUT /v1/mcp/governance/policy
GET /v1/mcp/approvals
POST /v1/mcp/approvals/{id}/approve
POST /v1/mcp/approvals/{id}/deny
POST /v1/observability/test/{id}
GET /v1/observability/templates
GET /v1/observability/templates/{provider}
POST /v1/observability/xdr/destinations/{id}/test
GET /v1/observability/xdr/destinations/{id}/stats
POST /v1/observability/xdr/destinations/{id}/enable
POST /v1/prompts
GET /v1/prompts
GET /v1/prompts/{id}
PUT /v1/prompts/{id}
DELETE /v1/prompts/{id}
POST /v1/prompts/{id}/promote
POST /v1/prompts/{id}/test
POST /v1/prompts/{id}/ab
GET /v1/prompts/{id}/ab
POST /v1/prompts/{id}/evaluate
GET /v1/prompts/{id}/evaluate/results
GET /v1/prompts/{id}/evaluate/results/{runId}/export
POST /v1/eval/datasets
GET /v1/eval/datasets
POST /v1/eval/datasets/{id}/items
GET /v1/eval/datasets/{id}/items
DELETE /v1/eval/datasets/{id}/items/{itemId}
POST /v1/eval/datasets/{id}/import-from-logs
GET /v1/eval/datasets/{id}/export
GET /v1/memory/blocks
GET /v1/memory/blocks/{block}
GET /v1/memory/entries
POST /v1/memory/entries
PUT /v1/memory/entries/{id}
DELETE /v1/memory/entries/{id}
POST /v1/memory/init
GET /v1/governance/memory/audit
GET /v1/governance/memory/stats
GET /v1/governance/memory/compliance
GET /v1/governance/sleep-time/report
GET /v1/governance/summary
POST /v1/governance/policy/dry-run
GET /v1/governance/lineage/{request_id}
GET /v1/governance/lineage
GET /v1/governance/audit/chain/verify
GET /v1/governance/audit/chain/export
GET /v1/governance/artifacts/{request_id}
GET /v1/governance/agents/inventory
GET /v1/approvals/pending
POST /v1/approvals/{id}/approve
GET /v1/security/status
GET /v1/security/policies
PUT /v1/security/policies
POST /v1/security/policies/test
GET /v1/security/policies/presets
GET /v1/security/anomalies
GET /v1/security/anomalies/stats/{entityType}/{entityId}/{metric}
GET /v1/firewall/interceptions
GET /auth/firewall/interceptions
GET /v1/guardrails/providers
GET /v1/guardrails/templates
POST /v1/guardrails/providers
DELETE /v1/guardrails/providers/{id}
POST /v1/guardrails/test
GET /v1/killswitch/status
GET /auth/killswitch/status
POST /v1/killswitch/scope
GET /v1/killswitch/scopes
DELETE /v1/killswitch/scope/{type}/{id}
GET /v1/budget/status
PUT /v1/budget/limits
GET /v1/budget/forecast
GET /v1/budget/agents
PUT /v1/budget/agents/{agentId}
GET /v1/budget/alerts/history
GET /v1/replays/decisions
POST /v1/replays/simulate
GET /v1/replays/compare
POST /v1/agent/bootstrap
GET /v1/agent/status
GET /v1/agent/limits/me
GET /v1/agent/anomaly/me
GET /v1/agent/profiles
POST /v1/agent/profiles
GET /v1/agent/profiles/me
GET /v1/agent/profiles/{agentId}
PATCH /v1/agent/profiles/{agentId}
DELETE /v1/agent/profiles/{agentId}
PATCH /v1/agent/profiles/lifecycle/{agentId}
POST /v1/agent/delegate
GET /v1/agent/sub-agents
DELETE /v1/agent/sub-agents/{child_agent_id}
GET /v1/agent-limits
PUT /v1/agent-limits
PATCH /v1/agent-limits
POST /v1/liaison/open
POST /v1/liaison/{liaison_id}/plan
POST /v1/liaison/{liaison_id}/close
"""
# Left out on purpose: `POST /v1/mcp/connect`, the MCP endpoint, whose errors are JSON-RPC's own
# (`{"jsonrpc", "id", "error": {"code", "message"}}`), as MCP clients expect; the kill switch's activate/deactivate (a probe would switch the tenant off and
# every later probe would only see 503 kill_switch_active; the kill-switch suites cover their input),
# and the SSE streams (`GET /v1/mcp/connect`, `GET /v1/liaison/{id}/events`), which hold the
# connection open by design.

PARAM = re.compile(r"\{[^}]+\}")

# Path parameter values: unknown, NUL, very long, not UTF-8 once decoded, a traversal, numbers out of range.
PATH_PROBES = ["no-such-thing", "%00", "a%00b", "x" * 3000, "%FF%FE", "..%2F..%2Fetc", "-1", "99999999999999999999999", "%F0%9F%98%80"]

# Bodies: not JSON, JSON of every wrong kind, and objects whose usual fields carry wrong types or NULs.
COMMON_FIELDS = ["name", "tenant_name", "email", "code", "url", "provider", "api_key", "key", "model", "messages",
                 "content", "value", "token", "agent_id", "scope", "type", "id", "role", "template", "prompt",
                 "tool_name", "description", "input", "callback_urls", "scopes", "items", "dataset", "limit",
                 "daily_limit_usd", "monthly_limit_usd", "per_day_usd", "budget_limit_usd", "thresholds", "rules",
                 "policies", "transport", "auth", "liaison_id", "plan_id", "client_id", "redirect_uri", "device_code",
                 "user_code", "claim_token", "block", "metadata", "variants", "expires_at", "max_uses", "score"]
NUL_BODY = {field: "bad\u0000value" for field in COMMON_FIELDS}
WRONG_TYPES_BODY = {field: [{"nested": None}] for field in COMMON_FIELDS}
NUMBERS_BODY = {field: -1e308 for field in COMMON_FIELDS}
BODY_PROBES = [
    b"{", b"not json", b"[]", b'"text"', b"123", b"null", b"{}", b"\xff\xfe\x00",
    b"[" * 5000 + b"]" * 5000,
    b'{"a": 1e999999}',
    json.dumps(NUL_BODY).encode(),
    json.dumps(WRONG_TYPES_BODY).encode(),
    json.dumps(NUMBERS_BODY).encode(),
    json.dumps({"messages": [{"role": "user", "content": "\u0000"}], "model": "\u0000", "tools": [{"type": "function", "function": {"name": "\u0000", "parameters": {"type": "object"}}}]}).encode(),
]

QUERY_PROBES = ["?limit=-1&offset=-1&since=-5&until=abc", "?limit=abc&period=%00&since=not-a-time", "?limit=99999999999999999999&from=%FF&to=%00"]


# Routes the spec names by prefix only ("shapes not shown"); their shapes are ours (docs/architecture.md).
PREFIX_ROUTES = """
GET /v1/config
GET /v1/insights/cost
GET /v1/insights/reliability
GET /v1/ops/status
GET /v1/usage/requests
GET /v1/usage/export
"""


def routes():
    for line in (ROUTES + PREFIX_ROUTES).split("\n"):
        if not line.strip():
            continue
        method, path = line.split()
        yield method, path


def send(gateway, method, path, body, content_type="application/json", key=None, headers=None):
    """One raw HTTP/1.1 exchange (bytes as given, no client-side validation): status and body."""
    address = urlsplit(gateway["base_url"])
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    key = gateway["probe_key"] if key is None else key
    # An empty key sends no Authorization header at all.
    headers = {**({"authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    if body is not None:
        headers["content-type"] = content_type
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def problem(status, body):
    """What is wrong with an answer to a malformed request, or None."""
    if status >= 500 and status != 503:
        return f"status {status}"
    if status < 400:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return f"status {status} with a body that is not JSON: {body[:200]!r}"
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict) or not error.get("message") or not error.get("type"):
        return f"status {status} without error.message/error.type: {body[:200]!r}"
    if not isinstance(answer.get("recovery"), dict) or not answer["recovery"].get("action"):
        return f"status {status} without a recovery object: {body[:200]!r}"
    if status == 503 and error.get("type") not in ("service_unavailable", "kill_switch_active"):
        return f"status 503 of type {error.get('type')}: {body[:200]!r}"
    return None


def record(failures, label, status, answer):
    """Adds to `failures` what is wrong with an answer, under `label`."""
    if (why := problem(status, answer)) is not None:
        failures.append(f"{label}: {why}")


@pytest.fixture(scope="module")
def probed(gateway):
    """The gateway with a tenant of its own for the probes (they may create or delete its resources)."""
    address = urlsplit(gateway["base_url"])
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    connection.request("POST", "/v1/register", body=json.dumps({"tenant_name": "malformed-probes", "accept_tos": True}),
                       headers={"content-type": "application/json"})
    answer = json.loads(connection.getresponse().read())
    connection.close()
    return {**gateway, "probe_key": answer["api_key"]["key"]}


# Routes of the spec that are not served, and why (docs/architecture.md); none today.
NOT_SERVED = set()


def test_every_route_of_the_spec_is_served(probed):
    unserved = []
    for method, template in list(routes()) + sorted(NOT_SERVED) + [("POST", "/v1/killswitch/activate"), ("POST", "/v1/killswitch/deactivate"),
                                                                  ("GET", "/v1/mcp/connect"), ("GET", "/v1/liaison/{liaison_id}/events")]:
        if method == "POST" and template == "/v1/killswitch/activate":
            continue  # served (the kill-switch suites); a probe would switch the tenant off
        path = PARAM.sub("no-such-thing", template)
        status, answer = send(probed, method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None)
        code = json.loads(answer).get("error", {}).get("code") if status >= 400 and answer.startswith(b"{") else None
        served = code not in ("route_not_found", "method_not_allowed")
        if served == ((method, template) in NOT_SERVED):
            unserved.append(f"{method} {template}: {status} {code}")
    assert not unserved, "\n".join(unserved)


def test_malformed_path_parameters_get_the_error_envelope(probed):
    failures = []
    for method, template in routes():
        if not PARAM.search(template):
            continue
        for value in PATH_PROBES:
            path = PARAM.sub(value, template)
            status, body = send(probed, method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None)
            record(failures, f"{method} {path[:120]}", status, body)
    assert not failures, "\n".join(failures)


def test_malformed_bodies_get_the_error_envelope(probed):
    failures = []
    for method, template in routes():
        if method not in ("POST", "PUT", "PATCH"):
            continue
        path = PARAM.sub("no-such-thing", template)
        for body in BODY_PROBES:
            status, answer = send(probed, method, path, body)
            record(failures, f"{method} {path} body {body[:60]!r}", status, answer)
        status, answer = send(probed, method, path, b"{}", content_type="text/plain")
        record(failures, f"{method} {path} as text/plain", status, answer)
    assert not failures, "\n".join(failures)


def test_malformed_queries_get_the_error_envelope(probed):
    failures = []
    for method, template in routes():
        if method != "GET":
            continue
        path = PARAM.sub("no-such-thing", template)
        for query in QUERY_PROBES:
            status, answer = send(probed, method, path + query, None)
            record(failures, f"{method} {path}{query}", status, answer)
    assert not failures, "\n".join(failures)


def test_unauthenticated_probes_get_the_error_envelope(probed):
    failures = []
    for method, template in routes():
        path = PARAM.sub("no-such-thing", template)
        for key in ("", "br_live_" + "0" * 40, "not a key \u00e9".encode().decode("latin-1")):
            status, answer = send(probed, method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None, key=key)
            record(failures, f"{method} {path} key {key[:12]!r}", status, answer)
            if status < 400 and (method, template) not in UNAUTHENTICATED:
                failures.append(f"{method} {path} key {key[:12]!r}: {status}, served without a valid key")
    assert not failures, "\n".join(failures)


def test_text_holding_a_nul_is_refused_alike_in_both_shapes(probed):
    """PostgreSQL's text cannot hold a NUL (U+0000), SQLite's can: the edge refuses it up front in what
    it stores, so both shapes answer alike, and a prompt, which it only relays, may still carry one."""
    refused = [
        ("POST", "/v1/eval/datasets", {"name": "dataset \u0000"}),
        ("POST", "/v1/mcp/servers", {"name": "tools \u0000", "transport": "streamable-http", "url": "http://127.0.0.1:9/mcp"}),
        ("POST", "/v1/prompts", {"id": "greeting", "template": "hello \u0000 {{name}}"}),
        ("POST", "/v1/memory/entries", {"block": "facts", "fact": "a \u0000 fact"}),
        ("POST", "/v1/chat/completions", {"model": "auto", "user": "agent\u0000", "messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/v1/chat/completions", {"model": "auto", "conversation_id": "c\u0000", "messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/v1/embeddings", {"model": "auto", "input": "a \u0000 text", "user": "agent"}),
        ("GET", "/v1/agent/profiles/a%00b", None),
        ("GET", "/v1/governance/lineage?trace_id=%00", None),
    ]
    for method, path, body in refused:
        status, answer = send(probed, method, path, None if body is None else json.dumps(body).encode())
        assert status == 400, (method, path, status, answer)
        assert json.loads(answer)["error"]["code"] in ("invalid_text", "invalid_path_parameter", "invalid_query_parameter"), answer
    status, answer = send(probed, "POST", "/v1/chat/completions",
                          json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi \u0000 there"}]}).encode())
    assert status == 200, answer
    status, answer = send(probed, "POST", "/v1/messages/count_tokens",
                          json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi \u0000 there"}]}).encode())
    assert status == 200 and json.loads(answer)["input_tokens"] > 0, answer
    status, answer = send(probed, "POST", "/v1/eval/datasets", json.dumps({"name": "the text \\u0000, no NUL"}).encode())
    assert status == 201 and json.loads(answer)["name"] == "the text \\u0000, no NUL", answer


HUGE = 1e308
EXTREME_PROBES = [
    ("PUT", "/v1/budget/limits", {"daily_limit_usd": HUGE, "monthly_limit_usd": -1}),
    ("PUT", "/v1/budget/limits", {"daily_limit_usd": 1e300, "monthly_limit_usd": 1e300}),
    ("PUT", "/v1/budget/agents/agent-extreme", {"perDayUsd": HUGE}),
    ("PUT", "/v1/budget/agents/agent-extreme", {"perDayUsd": -HUGE}),
    ("POST", "/v1/agent/profiles", {"agentId": "agent-extreme", "budgetDailyUsd": HUGE, "budgetMonthlyUsd": -5}),
    ("PUT", "/v1/agent-limits", {"agent:extreme": {"maxBudgetUsd": HUGE, "maxRequestsPerMinute": 1e15}}),
    ("PATCH", "/v1/agent-limits", {"agent:extreme": {"maxBudgetUsd": -HUGE, "maxRequestsPerMinute": -1}}),
    ("POST", "/v1/chat/completions", {"model": "auto", "max_tokens": 1e18, "temperature": HUGE, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/chat/completions", {"model": "auto", "max_tokens": -1, "top_p": -HUGE, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/chat/completions", {"model": "auto", "route": {"strategy": "price", "maxCostPerRequest": -HUGE}, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/chat/completions", {"model": "auto", "stream": True, "max_tokens": 18446744073709551615, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/messages", {"model": "auto", "max_tokens": 18446744073709551616, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/messages", {"model": "auto", "max_tokens": 0, "messages": []}),
    ("POST", "/v1/embeddings", {"model": "auto", "input": [""] * 5000}),
    ("POST", "/v1/tenant/claim-link", {"role": "member", "max_uses": 1e18, "expires_in_days": 1e9}),
    ("POST", "/v1/tenant/claim-link", {"role": "member", "max_uses": -1, "expires_in_days": -1}),
    ("POST", "/v1/prompts", {"id": "extreme", "template": "hello {{name}}"}),
    ("POST", "/v1/prompts/extreme/promote", {"version": 1e18, "target_environment": "prod"}),
    ("POST", "/v1/prompts/extreme/promote", {"version": -9223372036854775808, "target_environment": "prod"}),
    ("POST", "/v1/prompts/extreme/ab", {"action": "start", "version_a": 1, "version_b": 18446744073709551615, "split_ratio": HUGE}),
    ("POST", "/v1/prompts/extreme/evaluate", {"test_cases": [{"input": {}}], "version": -1}),
    ("POST", "/v1/prompts/extreme/test", {"variables": {"name": "x" * 100000}, "version": 1e18}),
    ("POST", "/v1/eval/datasets", {"name": "extreme", "description": "x" * 200000}),
    ("PUT", "/v1/security/policies", {"confidenceThreshold": HUGE, "mode": "block", "enabled": True}),
    ("POST", "/v1/security/policies/test", {"text": "x" * 1000000}),
    ("POST", "/v1/guardrails/test", {"text": "\u202e" * 10000, "content": "x"}),
    ("PUT", "/v1/mcp/governance/policy", {"tool_name": "t", "allowed": True, "max_cost_usd": -HUGE}),
    ("POST", "/v1/liaison/open", {"ttl_seconds": 1e18}),
    ("POST", "/v1/agent/delegate", {"child_agent_id": "c", "budget_usd": HUGE, "ttl_seconds": 1e18}),
    ("POST", "/v1/memory/entries", {"block": "facts", "fact": "x" * 1000000}),
    ("POST", "/v1/admin/xdr/risk-push", {"tenant_id": "0" * 36, "agent_id": "0" * 36, "risk_score": HUGE, "source": "s", "ttl_seconds": 1e18}),
    ("POST", "/v1/replays/simulate", {"strategy": "price", "limit": 1e18, "since": -1}),
]
EXTREME_QUERIES = [
    "/v1/budget/forecast?days=1000000000000000000",
    "/v1/governance/lineage?trace_id=x&limit=18446744073709551616",
    "/v1/security/anomalies?limit=1000000000&offset=1000000000",
    "/v1/mcp/audit?limit=99999999999",
    "/v1/governance/memory/audit?limit=4294967296",
    "/v1/models/leaderboard?limit=4294967295&offset=18446744073709551615",
    "/v1/replays/decisions?limit=4294967295&since=-9223372036854775808",
    "/v1/replays/compare?strategy=price&since=99999999999999999999",
    "/v1/firewall/interceptions?limit=4294967295&since=0",
    "/v1/budget/alerts/history?limit=4294967295",
    "/v1/governance/audit/chain/export?from_sequence=-1&to_sequence=9223372036854775807",
    "/v1/governance/audit/chain/verify?from=-1&to=9223372036854775807",
    "/v1/insights/cost?since=9999-12-31T23:59:59Z&until=0001-01-01T00:00:00Z",
    "/v1/insights/reliability?since=-999999999-01-01T00:00:00Z",
    "/v1/usage/requests?limit=4294967295&cursor=9999-12-31T23:59:59.999Z,zzz",
    "/v1/usage/export?format=jsonl&since=0000-01-01T00:00:00Z&until=9999-12-31T23:59:59Z",
]


def test_extreme_values_in_valid_shapes_never_reach_a_5xx(probed):
    """Numbers at and past the ends of their types, and very long text, in bodies and queries that
    otherwise have their route's shape: refused or served, never a 500 (or a dropped connection, which
    is what a panicking handler gives)."""
    failures = []
    for method, path, body in EXTREME_PROBES:
        status, answer = send(probed, method, path, json.dumps(body).encode())
        record(failures, f"{method} {path} {json.dumps(body)[:100]}", status, answer)
    for path in EXTREME_QUERIES:
        status, answer = send(probed, "GET", path, None)
        record(failures, f"GET {path}", status, answer)
    status, answer = send(probed, "GET", "/v1/account", None)
    assert status == 200, ("the gateway still answers", status, answer)
    assert not failures, "\n".join(failures)


def test_the_openapi_document_lists_what_is_served(probed):
    """`GET /openapi.json` (where a 404's recovery points) answers without a key; every operation it
    lists is served, and every route of the spec is in it."""
    address = urlsplit(probed["base_url"])
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    connection.request("GET", "/openapi.json")
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("content-type") == "application/json"
    document = json.loads(response.read())
    connection.close()
    assert document["openapi"] == "3.1.0" and "Error" in document["components"]["schemas"]
    listed = {(method.upper(), PARAM.sub("{}", path)) for path, methods in document["paths"].items() for method in methods}
    spec = {(method, PARAM.sub("{}", path)) for method, path in routes()} | {("POST", "/v1/killswitch/activate")}
    assert not spec - listed, f"spec routes missing from the document: {sorted(spec - listed)}"
    unserved = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            assert operation["summary"] and operation["operationId"], (method, path)
            if (method, path) in (("post", "/v1/killswitch/activate"), ("get", "/v1/liaison/{liaison_id}/events")):
                continue  # served: a probe would switch the tenant off / hold an event stream open
            if (method, path) == ("delete", "/v1/mcp/connect"):
                continue  # its handler answers 405 itself: no MCP sessions to end, as the transport allows
            status, answer = send(probed, method.upper(), PARAM.sub("no-such-thing", path), b"{}" if method in ("post", "put", "patch") else None)
            code = json.loads(answer).get("error", {}).get("code") if status >= 400 and answer.startswith(b"{") else None
            if code in ("route_not_found", "method_not_allowed"):
                unserved.append(f"{method.upper()} {path}: {status} {code}")
    assert not unserved, "\n".join(unserved)
    status, answer = send(probed, "GET", "/v1/no-such-route", None)
    assert status == 404 and json.loads(answer)["recovery"]["endpoint"] == "/openapi.json"


# The spec's routes that take no credential (Authentication 5): a forged one is ignored there.
UNAUTHENTICATED = {("POST", "/v1/register"), ("GET", "/v1/providers/catalog"), ("POST", "/v1/providers/test"), ("POST", "/auth/oauth/token")}
FORGED_TOKENS = [
    "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhZG1pbiJ9.",  # alg none, no signature
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl",  # a signature it cannot have
    "eyJ.eyJ.eyJ",  # three parts, none of them JSON
    "a.b.c.d.e",
    "br_test_" + "z" * 200,
]
ODD_HEADERS = [
    {"x-br-tenant-id": "../../etc"}, {"x-br-agent-id": "a" * 5000}, {"traceparent": "00-zz-zz-01"},
    {"x-br-plan-id": "plan_nope", "x-br-liaison": "lia_nope"}, {"x-br-firewall-mode": "off"},
    {"x-br-route": "{not json"}, {"x-user-id": "\u00e9\u00e9".encode().decode("latin-1")},
]


def test_forged_tokens_and_odd_headers_get_the_error_envelope(probed):
    """Bearers that look like JWTs but are forged or broken, and the gateway's own request headers
    with values no client should send: refused (or ignored) in the envelope, never a 5xx."""
    failures = []
    for method, template in routes():
        path = PARAM.sub("no-such-thing", template)
        body = b"{}" if method in ("POST", "PUT", "PATCH") else None
        for token in FORGED_TOKENS:
            status, answer = send(probed, method, path, body, key=token)
            record(failures, f"{method} {path} token {token[:16]}", status, answer)
            if status < 400 and (method, template) not in UNAUTHENTICATED:
                failures.append(f"{method} {path} token {token[:16]}: {status}, accepted")
    completion = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]}).encode()
    for headers in ODD_HEADERS:
        for method, path, body in (("POST", "/v1/chat/completions", completion), ("POST", "/v1/messages", completion),
                                   ("GET", "/v1/self", None), ("GET", "/auth/me", None)):
            status, answer = send(probed, method, path, body, headers=headers)
            record(failures, f"{path} with {list(headers)}", status, answer)
    assert not failures, "\n".join(failures)
