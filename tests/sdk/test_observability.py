"""Observability fan-out through the gateway, in both shapes: destinations receiving the tenant's
usage and audit events (a signed webhook, batched), an XDR connector receiving OCSF 1.3.0 through a
Splunk HTTP Event Collector with filter rules, the tenant switch, tests, stats and templates."""

import hashlib
import hmac
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import call, post_json

WEBHOOK_SECRET = "webhook-signing-secret-7781"
HEC_TOKEN = "hec-token-secret-5519"


class Receiver(BaseHTTPRequestHandler):
    received = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        Receiver.received.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        self.send_response(500 if self.path.startswith("/fail") else 200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def received(prefix):
    return [request for request in Receiver.received if request["path"].startswith(prefix)]


def wait_for(predicate, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def complete(gateway, key, expect=200):
    request = urllib.request.Request(gateway["base_url"] + "/v1/chat/completions", method="POST",
        data=json.dumps({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "fan me out"}]}).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            assert response.status == expect
            return response.headers["x-br-request-id"]
    except urllib.error.HTTPError as error:
        assert error.code == expect, error.read()
        return error.headers["x-br-request-id"]


def events_of(prefix):
    return [event for request in received(prefix) for event in json.loads(request["body"])["events"]]


def test_destinations_receive_the_tenants_events(gateway, receiver):
    key, shape = gateway["byok_key"], gateway["shape"]
    hook = f"/hook-{shape}"
    destination = call(gateway, "POST", "/v1/observability/destinations", {
        "name": "events webhook", "type": "webhook", "config": {"url": receiver + hook, "secret": WEBHOOK_SECRET},
        "event_types": ["usage", "audit"], "batch": {"max_size": 2, "flush_interval_ms": 200}}, expect=201, key=key)
    assert destination["secrets_set"] == ["secret"] and WEBHOOK_SECRET not in json.dumps(destination)
    assert destination["batch"] == {"max_size": 2, "flush_interval_ms": 200}
    listed = call(gateway, "GET", "/v1/observability/destinations", key=key)
    assert WEBHOOK_SECRET not in json.dumps(listed) and listed["count"] >= 1
    bad = call(gateway, "POST", "/v1/observability/destinations", {"name": "x", "type": "splunk", "config": {"hec_url": receiver}}, expect=400, key=key)
    assert bad["error"]["code"] == "invalid_destination" and "hec_token" in bad["error"]["message"]

    assert call(gateway, "POST", f"/v1/observability/test/{destination['id']}", key=key) == {"delivered": True}
    test = received(hook)[-1]
    assert test["headers"]["x-br-signature"] == "sha256=" + hmac.new(WEBHOOK_SECRET.encode(), test["body"], hashlib.sha256).hexdigest()
    assert json.loads(test["body"])["events"][0]["event"] == "usage.test"

    first, second = complete(gateway, key), complete(gateway, key)
    assert wait_for(lambda: {first, second} <= {event["request_id"] for event in events_of(hook) if event["event"] == "usage.succeeded"})
    assert wait_for(lambda: {first, second} <= {event["request_id"] for event in events_of(hook) if event["event"] == "audit.allowed"})
    usage = next(event for event in events_of(hook) if event["request_id"] == first and event["event_type"] == "usage")
    assert usage["data"]["model"] and usage["data"]["input_tokens"] > 0 and usage["severity"] == 1

    # An evaluation's outcome is a quality event, for destinations that take them.
    quality_hook = f"/quality-{shape}"
    call(gateway, "POST", "/v1/observability/destinations", {"name": "quality", "type": "webhook", "config": {"url": receiver + quality_hook},
        "event_types": ["quality"], "batch": {"max_size": 1, "flush_interval_ms": 100}}, expect=201, key=key)
    prompt_id = f"fanned-{shape}"
    call(gateway, "POST", "/v1/prompts", {"id": prompt_id, "template": "Hello {{name}}"}, expect=201, key=key)
    run = call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {"test_cases": [
        {"input": {"name": "Ada"}, "expected_output": "Hello Ada"}, {"input": {"name": "Bob"}, "expected_output": "Bye"}]}, key=key)
    assert wait_for(lambda: any(event["request_id"] == run["run_id"] for event in events_of(quality_hook)))
    quality = next(event for event in events_of(quality_hook) if event["request_id"] == run["run_id"])
    assert quality["event"] == "quality.evaluation.failed" and quality["event_type"] == "quality" and quality["severity"] == 3
    assert quality["data"]["prompt_id"] == prompt_id and (quality["data"]["pass_count"], quality["data"]["fail_count"]) == (1, 1)
    assert all(event["event_type"] != "quality" for event in events_of(hook)), "the first destination did not subscribe to quality"

    # The tenant's switch stops its observability destinations.
    assert call(gateway, "PUT", "/v1/observability/config", {"enabled": False}, key=key) == {"enabled": False}
    quiet = complete(gateway, key)
    time.sleep(1.5)
    assert quiet not in {event["request_id"] for event in events_of(hook)}
    assert call(gateway, "PUT", "/v1/observability/config", {"enabled": True}, key=key) == {"enabled": True}
    assert call(gateway, "GET", "/v1/observability/config", key=key) == {"enabled": True}

    failing = call(gateway, "POST", "/v1/observability/destinations", {"name": "down", "type": "custom", "config": {"url": receiver + "/fail"}}, expect=201, key=key)
    result = call(gateway, "POST", f"/v1/observability/test/{failing['id']}", key=key)
    assert result["delivered"] is False and "500" in result["error"]
    call(gateway, "DELETE", f"/v1/observability/destinations/{failing['id']}", key=key)
    call(gateway, "POST", f"/v1/observability/test/{failing['id']}", expect=404, key=key)

    templates = call(gateway, "GET", "/v1/observability/templates", key=key)
    assert templates["count"] == 5
    datadog = call(gateway, "GET", "/v1/observability/templates/datadog", key=key)
    assert datadog["config_schema"]["required"] == ["api_key"] and "usage" in datadog["recommended_event_types"] and datadog["example_config"]
    call(gateway, "GET", "/v1/observability/templates/nowhere", expect=404, key=key)


def test_xdr_connectors_receive_ocsf_security_events(gateway, receiver):
    key, shape = gateway["byok_key"], gateway["shape"]
    hec = f"/hec-{shape}"
    connector = call(gateway, "POST", "/v1/observability/xdr/destinations", {
        "name": "soc splunk", "type": "splunk", "config": {"hecUrl": receiver + hec, "hecToken": HEC_TOKEN},
        "filter_rules": {"include": ["audit.denied.*"], "min_severity": 3}}, expect=201, key=key)
    assert HEC_TOKEN not in json.dumps(connector) and connector["secrets_set"] == ["hecToken"]
    assert connector["filter_rules"] == {"include": ["audit.denied.*"], "min_severity": 3} and connector["enabled"] is True
    assert call(gateway, "GET", "/v1/observability/xdr/destinations", key=key)["count"] >= 1
    # XDR connectors are not observability destinations, and the other way round.
    call(gateway, "POST", f"/v1/observability/test/{connector['id']}", expect=404, key=key)

    allowed = complete(gateway, key)
    call(gateway, "POST", "/v1/killswitch/activate", {"reason": "fan-out test"}, key=key)
    denied = complete(gateway, key, expect=503)
    call(gateway, "POST", "/v1/killswitch/deactivate", key=key)

    def ocsf_events():
        events = []
        for request in received(hec):
            for line in request["body"].decode().replace("}{", "}\n{").splitlines():
                events.append(json.loads(line))
        return events
    assert wait_for(lambda: any(event["event"]["metadata"]["uid"] == denied for event in ocsf_events()))
    event = next(event for event in ocsf_events() if event["event"]["metadata"]["uid"] == denied)
    assert received(hec)[-1]["headers"]["authorization"] == f"Splunk {HEC_TOKEN}"
    assert event["sourcetype"] == "ocsf"
    ocsf = event["event"]
    assert (ocsf["class_uid"], ocsf["metadata"]["version"], ocsf["severity"], ocsf["status"]) == (6003, "1.3.0", "Critical", "Failure")
    assert ocsf["message"] == "audit.denied.kill_switch_active"
    assert all(event["event"]["metadata"]["uid"] != allowed for event in ocsf_events()), "allowed requests are filtered out"

    stats = call(gateway, "GET", f"/v1/observability/xdr/destinations/{connector['id']}/stats", key=key)
    assert stats["sent"] >= 1 and stats["failed"] == 0 and stats["last_delivery_at"]
    assert call(gateway, "POST", f"/v1/observability/xdr/destinations/{connector['id']}/test", key=key) == {"delivered": True}
    assert call(gateway, "POST", f"/v1/observability/xdr/destinations/{connector['id']}/enable", {"enabled": False}, key=key) == {"id": connector["id"], "enabled": False}
    updated = call(gateway, "PUT", f"/v1/observability/xdr/destinations/{connector['id']}", {"filter_rules": None, "name": "soc"}, key=key)
    assert updated["filter_rules"] is None and updated["name"] == "soc" and updated["enabled"] is False
    # Any subset updates, the type too: a new type takes the config sent with it (the old type's
    # secret goes); without one, the stored config must suit the new type.
    unsuited = call(gateway, "PUT", f"/v1/observability/xdr/destinations/{connector['id']}", {"type": "sumo_logic"}, expect=400, key=key)
    assert unsuited["error"]["code"] == "invalid_destination" and "config.url" in unsuited["error"]["message"]
    moved = call(gateway, "PUT", f"/v1/observability/xdr/destinations/{connector['id']}",
                 {"type": "sumo_logic", "config": {"url": receiver + f"/sumo-{shape}"}}, key=key)
    assert (moved["type"], moved["secrets_set"], moved["name"]) == ("sumo_logic", [], "soc")
    assert call(gateway, "POST", f"/v1/observability/xdr/destinations/{connector['id']}/test", key=key) == {"delivered": True}
    assert wait_for(lambda: len(received(f"/sumo-{shape}")) >= 1)
    bad = call(gateway, "POST", "/v1/observability/xdr/destinations", {"name": "x", "type": "webhook", "config": {"url": receiver}}, expect=400, key=key)
    assert bad["error"]["code"] == "invalid_destination"
    call(gateway, "DELETE", f"/v1/observability/xdr/destinations/{connector['id']}", key=key)


def test_operators_actions_reach_the_siem(gateway, receiver):
    """Kill switches, scoped switches, agents' lifecycle moves and API keys made and revoked are
    audit events for the tenant's destinations, with who acted and why (a tenant of its own: its
    switch goes on and off); a repeated revocation is not announced again."""
    shape = gateway["shape"]
    admin = post_json(gateway["base_url"] + "/v1/register", {"tenant_name": f"soc-{shape}", "accept_tos": True})["api_key"]["key"]
    hook = f"/activity-{shape}"
    call(gateway, "POST", "/v1/observability/destinations", {"name": "soc", "type": "webhook", "config": {"url": receiver + hook},
         "event_types": ["audit"], "batch": {"max_size": 50, "flush_interval_ms": 100}}, expect=201, key=admin)
    call(gateway, "POST", "/v1/agent/profiles", {"agentId": "watched", "ownerId": "u1"}, expect=201, key=admin)
    call(gateway, "PATCH", "/v1/agent/profiles/lifecycle/watched", {"state": "active"}, key=admin)
    call(gateway, "PATCH", "/v1/agent/profiles/lifecycle/watched", {"state": "suspended"}, key=admin)
    call(gateway, "POST", "/v1/killswitch/scope", {"type": "tool", "id": "shell", "reason": "exfiltration"}, key=admin)
    call(gateway, "DELETE", "/v1/killswitch/scope/tool/shell", key=admin)
    made = call(gateway, "POST", "/v1/api-keys", {"name": "ci", "role": "developer"}, expect=201, key=admin)["api_key"]
    call(gateway, "DELETE", f"/v1/api-keys/{made['id']}", key=admin)
    call(gateway, "DELETE", f"/v1/api-keys/{made['id']}", key=admin)
    call(gateway, "POST", "/v1/killswitch/activate", {"reason": "incident 42"}, key=admin)
    call(gateway, "POST", "/v1/killswitch/deactivate", key=admin)
    expected = ["audit.agent.lifecycle_changed", "audit.agent.lifecycle_changed", "audit.kill_switch.scope_activated",
                "audit.kill_switch.scope_deactivated", "audit.kill_switch.activated", "audit.kill_switch.deactivated",
                "audit.api_key.created", "audit.api_key.revoked"]
    activity = lambda: [event for event in events_of(hook) if event["event"] in expected]
    assert wait_for(lambda: len(activity()) >= len(expected)), [event["event"] for event in events_of(hook)]
    by_name = {}
    for event in activity():
        by_name.setdefault(event["event"], []).append(event)
    assert sorted(by_name) == sorted(set(expected))
    switched = by_name["audit.kill_switch.activated"][0]
    assert switched["severity"] == 5 and switched["data"]["reason"] == "incident 42", switched
    assert switched["data"]["actor"].startswith("key:") and switched["data"]["outcome"] == "succeeded", switched
    scoped = by_name["audit.kill_switch.scope_activated"][0]
    assert (scoped["data"]["subject"], scoped["severity"], scoped["data"]["reason"]) == ("tool:shell", 4, "exfiltration"), scoped
    states = sorted((event["data"]["state"], event["severity"]) for event in by_name["audit.agent.lifecycle_changed"])
    assert states == [("active", 1), ("suspended", 3)], states
    assert all(event["data"]["subject"] == "watched" for event in by_name["audit.agent.lifecycle_changed"])
    created, revoked = by_name["audit.api_key.created"], by_name["audit.api_key.revoked"]
    assert len(created) == 1 and len(revoked) == 1, (created, revoked)
    assert (created[0]["data"]["subject"], created[0]["data"]["role"], revoked[0]["severity"]) == (made["id"], "developer", 3)
    assert made["key"] not in json.dumps(created) and made["prefix"] == revoked[0]["data"]["prefix"]
