#!/usr/bin/env python3
"""Writes the gateway's OpenAPI document (services/edge-router/openapi.json, served at /openapi.json)
from the code itself: the edge's route table (`router` in services/edge-router/src/lib.rs) gives every
path and method, and each handler's doc comment its summary and the permission it names in
parentheses (`/// \\`GET /v1/models\\` (router.read): ...`). Nothing is written by hand, so the document
says what the router serves. `--check` exits 1 when the committed document is not what the code
gives (make test runs it; `make gen` rewrites it).
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EDGE = ROOT / "services" / "edge-router"
OUTPUT = EDGE / "openapi.json"

# The spec's unauthenticated routes (gateway-spec.md, Authentication 5), /health and the document.
UNAUTHENTICATED = {
    ("POST", "/v1/register"), ("GET", "/v1/providers/catalog"), ("POST", "/v1/providers/test"),
    ("POST", "/auth/oauth/token"), ("GET", "/health"), ("GET", "/openapi.json"),
}
ROUTE = re.compile(r'\.route\(\s*"([^"]+)",\s*(.+?)\)\s*$')
HANDLER = re.compile(r"\b(get|post|put|patch|delete)\(([\w:]+)\)")
PERMISSION = re.compile(r"^\(([a-z_]+\.[a-z_.]+(?:(?:, | or | and )[a-z_]+\.[a-z_.]+)*)\)")


def route_table(source):
    """(path, method, handler) for each `.route(...)` of `fn router`, in order."""
    body = source[source.index("fn router("):]
    body = body[: body.index(".fallback(")]
    table = []
    routes = 0
    for line in body.splitlines():
        match = ROUTE.search(line.strip())
        if not match:
            continue
        routes += 1
        path, methods = match.groups()
        handlers = HANDLER.findall(methods)
        if not handlers:
            raise SystemExit(f"gen-openapi: no method router in `{line.strip()}`")
        for method, handler in handlers:
            table.append((path, method.upper(), handler))
    if routes != body.count(".route("):
        raise SystemExit("gen-openapi: a `.route(...)` of `router` is not on one line; keep each on one line (rustfmt does)")
    return table


def handler_doc(handler):
    """The doc comment of `module::function` (or `routes::function`, `module::inner::function`)."""
    parts = handler.split("::")
    if parts[0] == "routes":
        file, inner = EDGE / "src" / "routes.rs", []
    else:
        file, inner = EDGE / "src" / "routes" / f"{parts[0]}.rs", parts[1:-1]
    source = file.read_text()
    start = 0
    for module in inner:
        start = source.index(f"pub mod {module} {{", start)
    function = re.compile(rf"^\s*pub(?:\(crate\))? async fn {re.escape(parts[-1])}\b", re.M)
    match = function.search(source, start)
    if not match:
        raise SystemExit(f"gen-openapi: no handler `{handler}` in {file}")
    lines = source[: match.start()].splitlines()
    doc = []
    for line in reversed(lines):
        stripped = line.strip()
        if stripped.startswith("///"):
            doc.append(stripped[3:].strip())
        elif stripped.startswith("#[") or not stripped:
            if doc:
                break
            continue
        else:
            break
    return " ".join(reversed(doc))


def operation(path, method, handler):
    doc = handler_doc(handler)
    # The doc starts by naming its route (`GET /v1/x`, or several): the rest is what it does.
    rest = re.sub(r"^(`[A-Z/]+ [^`]+`(?:,| and| or)?\s*)+", "", doc).strip()
    rest = rest.lstrip(":;, ").strip()
    permission = PERMISSION.match(rest)
    # A leading parenthesis is who may call: a permission (kept as `x-permission`) or a note.
    rest = re.sub(r"^\([^)]*\)", "", rest).lstrip(":;, ").strip()
    summary = rest.split(". ")[0].rstrip(".").strip() or f"{method} {path}"
    summary = summary[:1].upper() + summary[1:]
    module = handler.split("::")[0] if handler.split("::")[0] != "routes" else "gateway"
    entry = {
        "operationId": handler.replace("::", "_"),
        "tags": [module],
        "summary": summary,
        "description": doc,
        "responses": {
            "2XX": {"description": "success", "content": {"application/json": {"schema": {"type": "object"}}}},
            "default": {"description": "an error in the envelope", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
        },
    }
    if permission:
        entry["x-permission"] = permission.group(1)
    parameters = [
        {"name": name.lstrip("*"), "in": "path", "required": True, "schema": {"type": "string"}}
        # axum's catch-all segment (`{*name}`) takes the rest of the path, slashes included.
        | ({"description": "the rest of the path: may hold `/`, as is or sent as `%2F`"} if name.startswith("*") else {})
        for name in re.findall(r"\{([^}]+)\}", path)
    ]
    if parameters:
        entry["parameters"] = parameters
    if method in ("POST", "PUT", "PATCH"):
        entry["requestBody"] = {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}}
    if (method, path) in UNAUTHENTICATED:
        entry["security"] = []
    return entry


def document():
    table = route_table((EDGE / "src" / "lib.rs").read_text())
    version = re.search(r'^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
    paths = {}
    for path, method, handler in table:
        # OpenAPI templates a catch-all segment like any other parameter.
        paths.setdefault(re.sub(r"\{\*([^}]+)\}", r"{\1}", path), {})[method.lower()] = operation(path, method, handler)
    recovery = {
        "type": "object",
        "properties": {name: {"type": ["string", "object", "null"]} for name in ("action", "endpoint", "method", "body_template", "docs_url", "message")},
        "required": ["action", "endpoint", "method", "docs_url", "message"],
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Brainstorm gateway",
            "version": version,
            "description": "The gateway's REST API, generated from its route table and handlers' documentation "
                           "(scripts/gen-openapi.py). Every error answers in the envelope `Error`. "
                           "`x-permission` names the RBAC permission an operation requires, where it requires one.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "an API key (br_live_...), an agent JWT or, on /auth/*, the identity provider's JWT"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "recovery"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type"],
                            "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": "string"}, "provider": {"type": "string"}},
                        },
                        "recovery": recovery,
                    },
                },
            },
        },
        "paths": paths,
    }


def main():
    generated = document()
    text = json.dumps(generated, indent=1, sort_keys=False) + "\n"
    if "--check" in sys.argv[1:]:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is not what the code gives: run `make gen`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {sum(len(methods) for methods in generated['paths'].values())} operations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
