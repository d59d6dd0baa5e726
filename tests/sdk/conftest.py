"""Starts the real brainstorm binary for the SDK tests, in both shapes."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from free_port import free_port as probe_free_port  # noqa: E402

POSTGRES_ADMIN_URL = os.environ.get("BR_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
MASTER_KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
OPENAI_KEY = "sk-openai-sdk-test-0123456789abcdefghijkl"
ANTHROPIC_KEY = "sk-ant-sdk-test-0123456789abcdefghijklmn"


def binary(variable="BR_BINARY"):
    path = os.environ.get(variable)
    if not path or not os.path.exists(path):
        raise RuntimeError(f"set {variable} to the built binary (make test does)")
    return path


_HANDED_OUT = set()


def free_port():
    """A free port outside the kernel's ephemeral range (scripts/free_port.py), never handed out twice
    in this run (ports asked for back to back cannot collide)."""
    port = probe_free_port(_HANDED_OUT)
    _HANDED_OUT.add(port)
    return port


def wait_healthy(port, processes):
    deadline = time.time() + 30
    while time.time() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"brainstorm exited early with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no health on port {port}")


def fresh_database():
    name = f"brainstorm_sdk_{uuid.uuid4().hex}"
    subprocess.run(["psql", POSTGRES_ADMIN_URL, "-qc", f"CREATE DATABASE {name}"], check=True)
    return POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def post_json(url, body, key=None):
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def call(gateway, method, path, body=None, expect=200, key=None, raw=False):
    """A REST call to the gateway with a tenant key (the gateway's sandbox key unless `key`): asserts
    the status and returns the JSON answer (None when empty), or with `raw` the text and headers."""
    request = urllib.request.Request(
        gateway["base_url"] + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key or gateway['key']}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            status, text, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, text, headers = error.code, error.read(), error.headers
    assert status == expect, (status, text)
    if raw:
        return text.decode(), headers
    return json.loads(text) if text else None


@pytest.fixture(scope="module", params=["embedded", "distributed"])
def gateway(request):
    work_dir = tempfile.mkdtemp(prefix="brainstorm-sdk-")
    processes = []
    logs = []

    def spawn(label, command, extra_env):
        log = open(os.path.join(work_dir, f"{label}.log"), "w")
        logs.append(log)
        processes.append(subprocess.Popen(command, env={**env, **extra_env}, stdout=subprocess.DEVNULL, stderr=log, cwd=work_dir))

    mock_port = free_port()
    # MCP servers and observability receivers in these tests listen on 127.0.0.1, which a production
    # gateway refuses by default.
    # The response cache is off unless a module turns it on (GATEWAY_ENV): the others count every call.
    env = dict(os.environ, RUST_LOG="warn", BR_MCP_ALLOW_PRIVATE_URLS="true", BR_OBSERVABILITY_ALLOW_PRIVATE_URLS="true",
               BR_RESPONSE_CACHE_MAX_BYTES="0")
    # A test module's own settings for every process (GATEWAY_ENV, a dict), e.g. an ingress's.
    env.update(getattr(request.module, "GATEWAY_ENV", {}))
    spawn("mock", [binary("BR_MOCK_UPSTREAM"), "--listen", f"127.0.0.1:{mock_port}", "--valid-key", OPENAI_KEY, "--valid-key", ANTHROPIC_KEY], {})
    mock_url = f"http://127.0.0.1:{mock_port}"
    env.update(
        BR_MAIL_OUTBOX=os.path.join(work_dir, "outbox"),
        BR_PROVIDER_OPENAI_BASE_URL=f"{mock_url}/v1",
        BR_PROVIDER_ANTHROPIC_BASE_URL=mock_url,
    )
    edge_port = free_port()
    try:
        if request.param == "embedded":
            spawn("up", [binary(), "up", "--listen", f"127.0.0.1:{edge_port}", "--data-dir", os.path.join(work_dir, "data")], {})
        else:
            database_url = fresh_database()
            subprocess.run([binary(), "migrate", "--database-url", database_url], check=True, env=env, capture_output=True)
            edge_env = {}
            for label, service in [("identity", "identity"), ("catalog", "catalog-health-sentinel"), ("budget", "budget-ledger"), ("audit", "audit-lineage"), ("policy", "policy-firewall"), ("mcp", "mcp-gateway"), ("prompts", "prompts-eval"), ("fanout", "observability-fanout")]:
                grpc_port, health_port = free_port(), free_port()
                spawn(label, [binary(), "serve", service, "--grpc-listen", f"127.0.0.1:{grpc_port}", "--listen", f"127.0.0.1:{health_port}"],
                      {"BR_DATABASE_URL": database_url, "BR_MASTER_KEY": MASTER_KEY})
                wait_healthy(health_port, processes)
                edge_env[f"BR_{service.upper().replace('-', '_')}_URL"] = f"http://127.0.0.1:{grpc_port}"
            spawn("edge", [binary(), "serve", "edge-router", "--listen", f"127.0.0.1:{edge_port}"], edge_env)
        wait_healthy(edge_port, processes)
        base_url = f"http://127.0.0.1:{edge_port}"
        sandbox_key = post_json(f"{base_url}/v1/register", {"tenant_name": f"sdk-{request.param}", "accept_tos": True})["api_key"]["key"]
        byok_key = post_json(f"{base_url}/v1/register", {"tenant_name": f"byok-{request.param}", "accept_tos": True})["api_key"]["key"]
        for provider, api_key in [("openai", OPENAI_KEY), ("anthropic", ANTHROPIC_KEY)]:
            post_json(f"{base_url}/v1/providers", {"provider": provider, "api_key": api_key}, key=byok_key)
        yield {"base_url": base_url, "key": sandbox_key, "byok_key": byok_key, "mock_url": mock_url, "shape": request.param}
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs:
            log.close()
        shutil.rmtree(work_dir, ignore_errors=True)
