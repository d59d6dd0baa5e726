"""Agent mTLS behind a real nginx that terminates TLS, configured as ingress-nginx is with
`auth-tls-verify-client: optional` and `auth-tls-pass-certificate-to-upstream: "true"`: nginx checks
the agent's certificate against the agent CA the gateway hands out, and forwards it percent-encoded
in `ssl-client-cert` over plain HTTP to the gateway, which trusts that header from nginx's address
only (`BR_CLIENT_CERT_HEADER`, `BR_CLIENT_CERT_TRUSTED_PROXIES`). Python's `ssl` and httpx (the
openai SDK's HTTP client) are the agent; in both shapes."""

import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.parse

import httpx
import pytest

from conftest import free_port

GATEWAY_ENV = {"BR_CLIENT_CERT_HEADER": "ssl-client-cert", "BR_CLIENT_CERT_TRUSTED_PROXIES": "127.0.0.1"}

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {work}/server.pem;
        ssl_certificate_key {work}/server-key.pem;
        ssl_client_certificate {work}/agent-ca.pem;
        ssl_verify_client optional;
        ssl_verify_depth 1;
        location / {{
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_bind 127.0.0.1;
            proxy_set_header Host $host;
            proxy_set_header ssl-client-cert $ssl_client_escaped_cert;
        }}
    }}
}}
"""


def openssl(*arguments, cwd):
    subprocess.run(["openssl", *arguments], check=True, cwd=cwd, capture_output=True)


def nginx_binary():
    found = shutil.which("nginx") or next((path for path in ["/usr/sbin/nginx", "/usr/local/sbin/nginx"] if os.path.exists(path)), None)
    if not found:
        raise RuntimeError("nginx is needed (Debian's nginx-light; make test installs it)")
    return found


def write(directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w") as file:
        file.write(text)
    return path


@pytest.fixture(scope="module")
def ingress(gateway):
    """An agent with a certificate from the gateway, and nginx in front of the gateway trusting its CA."""
    work = tempfile.mkdtemp(prefix="brainstorm-ingress-")
    base = gateway["base_url"]
    admin = httpx.post(f"{base}/v1/register", json={"tenant_name": f"ingress-{gateway['shape']}", "accept_tos": True}).json()["api_key"]["key"]
    boot = httpx.post(f"{base}/v1/agent/bootstrap", json={"agent_id": "edge-agent"}, headers={"authorization": f"Bearer {admin}"})
    assert boot.status_code == 201, boot.text
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "agent-key.pem",
            "-out", "agent.csr", "-subj", "/CN=edge-agent", cwd=work)
    with open(os.path.join(work, "agent.csr")) as file:
        csr = file.read()
    issued = httpx.post(f"{base}/v1/agent/auth/cert", json={"csr": csr}, headers={"authorization": f"Bearer {boot.json()['jwt']}"})
    assert issued.status_code == 201, issued.text
    body = issued.json()
    # Forwarded certificates reach this plain-HTTP edge, so the exchange says mTLS is available.
    assert body["mtls_available"] is True, body
    write(work, "agent.pem", body["certificate"])
    write(work, "agent-ca.pem", body["ca_certificate"])
    # The ingress's own server certificate, and a certificate from a CA the ingress does not trust.
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server-key.pem",
            "-out", "server.pem", "-days", "1", "-subj", "/CN=ingress", "-addext", "subjectAltName=IP:127.0.0.1", cwd=work)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "stranger-key.pem",
            "-out", "stranger.pem", "-days", "1", "-subj", "/CN=edge-agent", "-addext", "extendedKeyUsage=clientAuth", cwd=work)
    port = free_port()
    upstream = base.removeprefix("http://")
    conf = write(work, "nginx.conf", NGINX_CONF.format(work=work, port=port, upstream=upstream))
    log = open(os.path.join(work, "nginx.out"), "w")
    nginx = subprocess.Popen([nginx_binary(), "-p", work, "-c", conf], stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.time() + 15
        while True:
            assert nginx.poll() is None, open(os.path.join(work, "nginx.out")).read() + open(os.path.join(work, "error.log")).read()
            try:
                httpx.get(f"{url}/health", verify=trust(work), timeout=1)
                break
            except httpx.HTTPError:
                assert time.time() < deadline, "nginx did not answer"
                time.sleep(0.05)
        yield {"url": url, "work": work, "admin": admin, "serial": body["serial"], "certificate": body["certificate"], "gateway": base}
    finally:
        nginx.terminate()
        try:
            nginx.wait(timeout=10)
        except subprocess.TimeoutExpired:
            nginx.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def trust(work, certificate=None, key=None):
    """An OpenSSL context trusting the ingress, presenting `certificate` (files in `work`) when given."""
    context = ssl.create_default_context(cafile=os.path.join(work, "server.pem"))
    if certificate:
        context.load_cert_chain(os.path.join(work, certificate), os.path.join(work, key))
    return context


def agent_client(ingress, certificate="agent.pem", key="agent-key.pem"):
    return httpx.Client(base_url=ingress["url"], verify=trust(ingress["work"], certificate, key), timeout=30)


def code(response):
    return response.json()["error"]["code"]


def test_the_ingress_forwards_the_agents_certificate_to_the_gateway(ingress):
    with agent_client(ingress) as agent:
        me = agent.get("/v1/self")
        assert me.status_code == 200, me.text
        assert (me.json()["type"], me.json()["auth_method"], me.json()["agent_id"]) == ("agent", "mtls", "edge-agent"), me.text
        status = agent.get("/v1/agent/status")
        assert status.status_code == 200 and status.json()["profile"]["agentId"] == "edge-agent", status.text
        # Renewal through the ingress with the certificate alone.
        renewed = agent.post("/v1/agent/auth/cert")
        assert renewed.status_code == 201 and renewed.json()["key_source"] == "generated", renewed.text
    # API keys pass the ingress untouched, no certificate needed.
    with agent_client(ingress, certificate=None) as client:
        models = client.get("/v1/models", headers={"authorization": f"Bearer {ingress['admin']}"})
        assert models.status_code == 200, models.text
        anonymous = client.get("/v1/agent/status")
        assert anonymous.status_code == 401 and code(anonymous) == "agent_token_required", anonymous.text


def test_a_forged_header_does_not_pass_the_ingress_nor_reach_the_gateway_from_elsewhere(ingress):
    forged = urllib.parse.quote(ingress["certificate"], safe="")
    # Through nginx without a certificate: nginx writes the header itself (empty: none).
    with agent_client(ingress, certificate=None) as client:
        refused = client.get("/v1/agent/status", headers={"ssl-client-cert": forged})
        assert refused.status_code == 401 and code(refused) == "agent_token_required", refused.text
    # Straight to the gateway from an address that is not the ingress's: ignored.
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=ingress["gateway"], transport=transport, timeout=30) as stranger:
        refused = stranger.get("/v1/agent/status", headers={"ssl-client-cert": forged})
        assert refused.status_code == 401 and code(refused) == "agent_token_required", refused.text
    # A certificate from another CA stops at the ingress, which verifies against the agent CA.
    with agent_client(ingress, "stranger.pem", "stranger-key.pem") as stranger:
        assert stranger.get("/v1/agent/status").status_code == 400


def test_a_revoked_certificate_is_refused_behind_the_ingress(ingress):
    revoked = httpx.post(f"{ingress['gateway']}/v1/agent/certificates/{ingress['serial']}/revoke", json={"reason": "leaked"},
                         headers={"authorization": f"Bearer {ingress['admin']}"})
    assert revoked.status_code == 200, revoked.text
    with agent_client(ingress) as agent:
        refused = agent.get("/v1/agent/status")
        assert refused.status_code == 401 and code(refused) == "agent_certificate_revoked", refused.text
