"""Starts the real brainstorm binary for the SDK tests, in both shapes."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

import pytest

POSTGRES_ADMIN_URL = os.environ.get("BR_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def binary():
    path = os.environ.get("BR_BINARY")
    if not path or not os.path.exists(path):
        raise RuntimeError("set BR_BINARY to the built brainstorm binary (make test does)")
    return path


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


@pytest.fixture(scope="module", params=["embedded", "distributed"])
def gateway(request):
    work_dir = tempfile.mkdtemp(prefix="brainstorm-sdk-")
    env = dict(os.environ, BR_MAIL_OUTBOX=os.path.join(work_dir, "outbox"), RUST_LOG="warn")
    edge_port = free_port()
    processes = []
    logs = []

    def spawn(label, arguments, extra_env):
        log = open(os.path.join(work_dir, f"{label}.log"), "w")
        logs.append(log)
        processes.append(subprocess.Popen([binary(), *arguments], env={**env, **extra_env}, stdout=subprocess.DEVNULL, stderr=log, cwd=work_dir))

    try:
        if request.param == "embedded":
            spawn("up", ["up", "--listen", f"127.0.0.1:{edge_port}", "--data-dir", os.path.join(work_dir, "data")], {})
        else:
            database_url = fresh_database()
            subprocess.run([binary(), "migrate", "--database-url", database_url], check=True, env=env, capture_output=True)
            grpc_port, identity_port = free_port(), free_port()
            spawn("identity", ["serve", "identity", "--grpc-listen", f"127.0.0.1:{grpc_port}", "--listen", f"127.0.0.1:{identity_port}"], {"BR_DATABASE_URL": database_url})
            wait_healthy(identity_port, processes)
            spawn("edge", ["serve", "edge-router", "--listen", f"127.0.0.1:{edge_port}"], {"BR_IDENTITY_URL": f"http://127.0.0.1:{grpc_port}"})
        wait_healthy(edge_port, processes)
        base_url = f"http://127.0.0.1:{edge_port}"
        body = json.dumps({"tenant_name": f"sdk-{request.param}", "accept_tos": True}).encode()
        registration = urllib.request.Request(f"{base_url}/v1/register", data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(registration) as response:
            key = json.load(response)["api_key"]["key"]
        yield {"base_url": base_url, "key": key, "shape": request.param}
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
