"""Agent mTLS with OpenSSL on both ends of the agent's side: the gateway (`brainstorm up`) serves
HTTPS with a certificate made by the `openssl` command line; an agent bootstraps over it with
Python's `ssl` and httpx (the HTTP client of the official openai SDK), exchanges its JWT for a
client certificate (a CSR made by `openssl req`, and a key the gateway makes), and reads itself
with nothing but the certificate in the handshake. An operator revokes one of its certificates, which
the next handshake's request finds refused, and the tenant's webhook receives both as audit events."""

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conftest import binary, free_port


def openssl(*arguments, cwd):
    subprocess.run(["openssl", *arguments], check=True, cwd=cwd, capture_output=True)


@pytest.fixture(scope="module")
def tls_gateway():
    work_dir = tempfile.mkdtemp(prefix="brainstorm-mtls-")
    # A self-signed server certificate for 127.0.0.1, made by OpenSSL.
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server-key.pem",
            "-out", "server.pem", "-days", "1", "-subj", "/CN=brainstorm test", "-addext", "subjectAltName=IP:127.0.0.1", cwd=work_dir)
    port = free_port()
    env = dict(os.environ, RUST_LOG="warn", BR_OBSERVABILITY_ALLOW_PRIVATE_URLS="true", BR_TLS_CERT_FILE=os.path.join(work_dir, "server.pem"),
               BR_TLS_KEY_FILE=os.path.join(work_dir, "server-key.pem"), BR_MAIL_OUTBOX=os.path.join(work_dir, "outbox"))
    log = open(os.path.join(work_dir, "up.log"), "w")
    process = subprocess.Popen([binary(), "up", "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(work_dir, "data")],
                               env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=work_dir)
    base_url = f"https://127.0.0.1:{port}"
    server_ca = os.path.join(work_dir, "server.pem")
    try:
        deadline = time.time() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"brainstorm exited early with {process.returncode}")
            try:
                if httpx.get(f"{base_url}/health", verify=trust(server_ca), timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        yield {"base_url": base_url, "server_ca": server_ca, "work_dir": work_dir}
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        shutil.rmtree(work_dir, ignore_errors=True)


def trust(server_ca, certificate=None, key=None):
    """An OpenSSL context trusting the test server, presenting `certificate` (files) when given."""
    context = ssl.create_default_context(cafile=server_ca)
    if certificate:
        context.load_cert_chain(certificate, key)
    return context


class Webhook(BaseHTTPRequestHandler):
    events = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        Webhook.events.extend(json.loads(body)["events"])
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def webhook():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/events"
    server.shutdown()


def certificate_events():
    return [event for event in Webhook.events if event["event"].startswith("audit.agent_certificate.")]


def write(directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w") as file:
        file.write(text)
    return path


def test_an_agent_reads_itself_with_the_certificate_it_exchanged_its_jwt_for(tls_gateway, webhook):
    base, work_dir = tls_gateway["base_url"], tls_gateway["work_dir"]
    with httpx.Client(base_url=base, verify=trust(tls_gateway["server_ca"]), timeout=30) as plain:
        admin = plain.post("/v1/register", json={"tenant_name": "mtls-sdk", "accept_tos": True}).json()["api_key"]["key"]
        destination = plain.post("/v1/observability/destinations", headers={"authorization": f"Bearer {admin}"}, json={
            "name": "soc", "type": "webhook", "config": {"url": webhook}, "event_types": ["audit"],
            "batch": {"max_size": 10, "flush_interval_ms": 100}})
        assert destination.status_code == 201, destination.text
        boot = plain.post("/v1/agent/bootstrap", json={"agent_id": "openssl-agent"}, headers={"authorization": f"Bearer {admin}"})
        assert boot.status_code == 201, boot.text
        jwt = boot.json()["jwt"]
        # The agent's own key: a CSR made by OpenSSL.
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "agent-key.pem",
                "-out", "agent.csr", "-subj", "/CN=whatever the agent says", cwd=work_dir)
        with open(os.path.join(work_dir, "agent.csr")) as file:
            csr = file.read()
        issued = plain.post("/v1/agent/auth/cert", json={"csr": csr, "ttl_seconds": 600}, headers={"authorization": f"Bearer {jwt}"})
        assert issued.status_code == 201, issued.text
        assert issued.headers["cache-control"] == "no-store"
        body = issued.json()
        assert body["key_source"] == "csr" and body.get("private_key") is None
        certificate = write(work_dir, "agent.pem", body["certificate"])
        # OpenSSL reads what the CA wrote and finds the agent in it.
        shown = subprocess.run(["openssl", "x509", "-in", certificate, "-noout", "-text"], check=True, capture_output=True, text=True).stdout
        assert body["spiffe_id"] in shown and "TLS Web Client Authentication" in shown, shown
        ca_file = write(work_dir, "agent-ca.pem", body["ca_certificate"])
        verified = subprocess.run(["openssl", "verify", "-CAfile", ca_file, "-purpose", "sslclient", certificate], capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        # A plain request without any credential is refused.
        refused = plain.get("/v1/agent/status")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "agent_token_required", refused.text

    context = trust(tls_gateway["server_ca"], certificate, os.path.join(work_dir, "agent-key.pem"))
    with httpx.Client(base_url=base, verify=context, timeout=30) as agent:
        status = agent.get("/v1/agent/status")
        assert status.status_code == 200, status.text
        assert status.json()["profile"]["agentId"] == "openssl-agent"
        me = agent.get("/v1/self").json()
        assert (me["type"], me["auth_method"], me["agent_id"]) == ("agent", "mtls", "openssl-agent"), json.dumps(me)[:500]
        # Renewal with the certificate alone, the gateway making the key this time.
        renewed = agent.post("/v1/agent/auth/cert")
        assert renewed.status_code == 201, renewed.text
        fresh = renewed.json()
        assert fresh["key_source"] == "generated" and fresh["private_key"].startswith("-----BEGIN PRIVATE KEY-----")

    fresh_context = trust(tls_gateway["server_ca"], write(work_dir, "fresh.pem", fresh["certificate"]),
                          write(work_dir, "fresh-key.pem", fresh["private_key"]))
    with httpx.Client(base_url=base, verify=fresh_context, timeout=30) as renewed_agent:
        limits = renewed_agent.get("/v1/agent/limits/me")
        assert limits.status_code == 200, limits.text
        assert renewed_agent.get("/v1/agent/profiles/me").json()["profile"]["agentId"] == "openssl-agent"

    # The operator revokes the first certificate: its next request is refused, the renewed one works.
    with httpx.Client(base_url=base, verify=trust(tls_gateway["server_ca"]), timeout=30) as plain:
        revoked = plain.post(f"/v1/agent/certificates/{body['serial']}/revoke", json={"reason": "rotated"},
                             headers={"authorization": f"Bearer {admin}"})
        assert revoked.status_code == 200 and revoked.json()["certificate"]["status"] == "revoked", revoked.text
    with httpx.Client(base_url=base, verify=context, timeout=30) as agent:
        refused = agent.get("/v1/agent/status")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "agent_certificate_revoked", refused.text
    with httpx.Client(base_url=base, verify=fresh_context, timeout=30) as renewed_agent:
        own = renewed_agent.get("/v1/agent/auth/cert").json()["certificates"]
        assert [(c["serial"], c["status"]) for c in own] == [(fresh["serial"], "active"), (body["serial"], "revoked")], own

    # The tenant's SIEM hears of both issuances and the revocation, with who did it.
    deadline = time.time() + 15
    while len(certificate_events()) < 3 and time.time() < deadline:
        time.sleep(0.1)
    seen = sorted((event["event"], event["data"]["subject"], event["data"]["actor"]) for event in certificate_events())
    assert seen == sorted([
        ("audit.agent_certificate.issued", body["serial"], "agent:openssl-agent"),
        ("audit.agent_certificate.issued", fresh["serial"], "agent:openssl-agent"),
        ("audit.agent_certificate.revoked", body["serial"], revoked.json()["certificate"]["revoked_by"]),
    ]), seen
    revocation = next(event for event in certificate_events() if event["event"].endswith(".revoked"))
    assert revocation["severity"] == 3 and revocation["data"]["reason"] == "rotated", revocation
    assert revocation["data"]["agent_id"] == "openssl-agent" and revocation["data"]["fingerprint_sha256"] == body["fingerprint_sha256"], revocation
