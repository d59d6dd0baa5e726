"""Prompts and evaluations through the gateway, in both shapes: versions, environments promoted in
order, A/B tests splitting renders, and evaluations scored without a model, with a model (completions
through the gateway to the mock upstream) and by a judging model, stored, listed and exported."""

import csv
import io
import json
import time
import urllib.request

from conftest import call


def test_versions_environments_and_ab_tests(gateway):
    prompt_id = f"greet-{gateway['shape']}"
    created = call(gateway, "POST", "/v1/prompts", {
        "id": prompt_id, "template": "Say hello to {{name}} in {{language}}.", "variables": {"language": "English"},
        "change_note": "first"}, expect=201)
    assert created["version"] == 1 and created["environments"] == {"dev": 1, "staging": None, "prod": None}
    call(gateway, "POST", "/v1/prompts", {"id": prompt_id, "template": "x"}, expect=409)
    assert call(gateway, "POST", "/v1/prompts", {"id": "bad", "template": "x", "variables": [1]}, expect=400)["error"]["code"] == "invalid_prompt"

    rendered = call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {"variables": {"name": "Ada"}})
    assert rendered == {"resolved_text": "Say hello to Ada in English.", "template_id": prompt_id, "version": 1,
                        "is_ab_test": False, "missing_variables": []}
    assert call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {})["missing_variables"] == ["name"]

    updated = call(gateway, "PUT", f"/v1/prompts/{prompt_id}", {"template": "Greet {{name}} warmly in {{language}}.", "change_note": "warmer"})
    assert updated["version"] == 2 and [version["version"] for version in updated["versions"]] == [2, 1]
    assert updated["versions"][1]["environments"] == ["dev"]

    refused = call(gateway, "POST", f"/v1/prompts/{prompt_id}/promote", {"version": 2, "target_environment": "prod"}, expect=409)
    assert refused["error"]["code"] == "promotion_out_of_order"
    for environment in ["dev", "staging", "prod"]:
        promoted = call(gateway, "POST", f"/v1/prompts/{prompt_id}/promote", {"version": 2, "target_environment": environment})
    assert promoted["environments"] == {"dev": 2, "staging": 2, "prod": 2}
    assert call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {"variables": {"name": "Bo"}, "environment": "prod"})["resolved_text"] == "Greet Bo warmly in English."

    started = call(gateway, "POST", f"/v1/prompts/{prompt_id}/ab", {"action": "start", "version_a": 1, "version_b": 2, "split_ratio": 0.5})
    assert started["active"] is True and started["split_ratio"] == 0.5
    versions = [call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {"variables": {"name": "X"}}) for _ in range(40)]
    assert all(rendered["is_ab_test"] for rendered in versions)
    assert {rendered["version"] for rendered in versions} == {1, 2}
    results = call(gateway, "GET", f"/v1/prompts/{prompt_id}/ab")
    assert results["version_a"]["exposures"] + results["version_b"]["exposures"] == 40
    assert call(gateway, "POST", f"/v1/prompts/{prompt_id}/ab", {"action": "stop"})["active"] is False
    call(gateway, "POST", f"/v1/prompts/{prompt_id}/ab", {"action": "stop"}, expect=409)
    assert call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {"variables": {"name": "X"}})["is_ab_test"] is False

    assert any(prompt["id"] == prompt_id for prompt in call(gateway, "GET", "/v1/prompts")["prompts"])
    assert call(gateway, "DELETE", f"/v1/prompts/{prompt_id}") == {"id": prompt_id, "archived": True}
    assert not any(prompt["id"] == prompt_id for prompt in call(gateway, "GET", "/v1/prompts")["prompts"])
    assert any(prompt["id"] == prompt_id for prompt in call(gateway, "GET", "/v1/prompts?include_archived=true")["prompts"])
    assert call(gateway, "PUT", f"/v1/prompts/{prompt_id}", {"template": "y"}, expect=409)["error"]["code"] == "prompt_archived"


def test_evaluations_are_scored_stored_and_exported(gateway):
    key = gateway["byok_key"]
    prompt_id = f"capital-{gateway['shape']}"
    call(gateway, "POST", "/v1/prompts", {"id": prompt_id, "template": "What is the capital of {{country}}?"}, expect=201, key=key)
    cases = [
        {"input": {"country": "France"}, "expected_output": "What is the capital of France?"},
        {"input": {"country": "Peru"}, "expected_output": "Lima"},
    ]
    plain = call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {"test_cases": cases}, key=key)
    assert plain["scorer"] == "exact_match" and plain["model"] is None
    assert (plain["test_case_count"], plain["pass_count"], plain["fail_count"], plain["avg_score"]) == (2, 1, 1, 0.5)
    assert [result["pass"] for result in plain["results"]] == [True, False]
    assert plain["results"][0]["rendered"] == "What is the capital of France?"

    # With a model: each case is a completion through the gateway (the mock echoes the prompt).
    contains = [{"input": {"country": "Peru"}, "expected_output": "capital of Peru"}, {"input": {"country": "Chile"}, "expected_output": "Santiago"}]
    modelled = call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {"test_cases": contains, "model": "openai/gpt-4o-mini", "scorer": "contains"}, key=key)
    assert modelled["results"][0]["actual"] == "mock openai reply to: What is the capital of Peru?"
    assert [result["pass"] for result in modelled["results"]] == [True, False]
    judged = call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {
        "test_cases": [{"input": {"country": "Peru"}}], "model": "openai/gpt-4o-mini", "scorer": "llm_judge", "store": False}, key=key)
    assert "error" not in judged["results"][0] and 0 <= judged["results"][0]["score"] <= 1 and judged["stored"] is False
    structural = call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {"test_cases": [{"input": {"country": "Peru"}}], "model": "openai/gpt-4o-mini"}, key=key)
    assert structural["scorer"] == "validity" and structural["results"][0]["score"] == 1.0

    bad = call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {"test_cases": [{"input": {"country": "Peru"}}], "scorer": "contains"}, expect=400, key=key)
    assert bad["error"]["code"] == "invalid_test_cases"
    call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {"test_cases": [{"input": {}}], "scorer": "llm_judge"}, expect=400, key=key)

    runs = call(gateway, "GET", f"/v1/prompts/{prompt_id}/evaluate/results", key=key)
    assert runs["count"] == 3 and "results" not in runs["runs"][0]
    assert [run["run_id"] for run in runs["runs"]] == [structural["run_id"], modelled["run_id"], plain["run_id"]]
    exported = call(gateway, "GET", f"/v1/prompts/{prompt_id}/evaluate/results/{plain['run_id']}/export?format=json", key=key)
    assert exported["results"] == plain["results"]
    text, headers = call(gateway, "GET", f"/v1/prompts/{prompt_id}/evaluate/results/{plain['run_id']}/export?format=csv", key=key, raw=True)
    assert headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["input_vars", "expected", "actual", "score", "pass", "scorer"]
    assert rows[1] == ['{"country":"France"}', "What is the capital of France?", "What is the capital of France?", "1.0", "true", "exact_match"]
    call(gateway, "GET", f"/v1/prompts/{prompt_id}/evaluate/results/{judged['run_id']}/export", expect=404, key=key)


def test_datasets_feed_evaluations_and_import_the_audit_trail(gateway):
    key = gateway["byok_key"]
    name = f"capitals-{gateway['shape']}"
    dataset = call(gateway, "POST", "/v1/eval/datasets", {"name": name, "description": "capital cities"}, expect=201, key=key)
    call(gateway, "POST", "/v1/eval/datasets", {"name": name}, expect=409, key=key)
    added = call(gateway, "POST", f"/v1/eval/datasets/{dataset['id']}/items", {"items": [
        {"input": {"country": "France"}, "expected_output": "Name the capital of France."},
        {"input": {"country": "Peru"}, "expected_output": "Lima", "metadata": {"difficulty": "hard"}},
    ]}, expect=201, key=key)
    assert added["count"] == 2
    too_many = call(gateway, "POST", f"/v1/eval/datasets/{dataset['id']}/items", {"items": [{"input": {}}] * 101}, expect=400, key=key)
    assert too_many["error"]["code"] == "invalid_items"
    items = call(gateway, "GET", f"/v1/eval/datasets/{dataset['id']}/items", key=key)["items"]
    assert [item["input"]["country"] for item in items] == ["France", "Peru"] and items[1]["metadata"] == {"difficulty": "hard"}

    prompt_id = f"dataset-prompt-{gateway['shape']}"
    call(gateway, "POST", "/v1/prompts", {"id": prompt_id, "template": "Name the capital of {{country}}."}, expect=201, key=key)
    run = call(gateway, "POST", f"/v1/prompts/{prompt_id}/evaluate", {"dataset_id": dataset["id"]}, key=key)
    assert (run["test_case_count"], run["pass_count"]) == (2, 1)

    # A completion, then its record imported as an item (the audit trail is written asynchronously).
    completion = urllib.request.Request(gateway["base_url"] + "/v1/chat/completions", method="POST",
        data=json.dumps({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "a question worth keeping"}]}).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    with urllib.request.urlopen(completion) as response:
        request_id = response.headers["x-br-request-id"]
    deadline = time.time() + 10
    while True:
        request = urllib.request.Request(gateway["base_url"] + f"/v1/eval/datasets/{dataset['id']}/import-from-logs", method="POST",
            data=json.dumps({"model": "openai/gpt-4o-mini", "limit": 100}).encode(),
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
        with urllib.request.urlopen(request) as response:
            imported = json.load(response)
        sources = {item["source_request_id"] for item in call(gateway, "GET", f"/v1/eval/datasets/{dataset['id']}/items", key=key)["items"]}
        if request_id in sources:
            break
        assert time.time() < deadline, imported
        time.sleep(0.2)
    item = next(item for item in call(gateway, "GET", f"/v1/eval/datasets/{dataset['id']}/items", key=key)["items"] if item["source_request_id"] == request_id)
    assert item["input"]["request_id"] == request_id and item["input"]["input_tokens"] > 0 and item["metadata"]["source"] == "audit"
    again = call(gateway, "POST", f"/v1/eval/datasets/{dataset['id']}/import-from-logs", {"model": "openai/gpt-4o-mini", "limit": 100}, key=key)
    assert again["imported"] == 0 and again["skipped"] >= 1
    none = call(gateway, "POST", f"/v1/eval/datasets/{dataset['id']}/import-from-logs", {"model": "no/such-model"}, key=key)
    assert none == {"imported": 0, "skipped": 0, "items": []}

    text, headers = call(gateway, "GET", f"/v1/eval/datasets/{dataset['id']}/export?format=csv", key=key, raw=True)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["input", "expected_output", "metadata"] and rows[1] == ['{"country":"France"}', "Name the capital of France.", "{}"]
    exported = call(gateway, "GET", f"/v1/eval/datasets/{dataset['id']}/export", key=key)
    assert exported["dataset"]["name"] == name and len(exported["items"]) == len(rows) - 1

    assert call(gateway, "DELETE", f"/v1/eval/datasets/{dataset['id']}/items/{items[0]['id']}", key=key)["deleted"] is True
    call(gateway, "DELETE", f"/v1/eval/datasets/{dataset['id']}/items/{items[0]['id']}", expect=404, key=key)
    deleted = call(gateway, "DELETE", f"/v1/eval/datasets/{dataset['id']}", key=key)
    assert deleted["items_deleted"] == len(rows) - 2
    call(gateway, "GET", f"/v1/eval/datasets/{dataset['id']}", expect=404, key=key)
