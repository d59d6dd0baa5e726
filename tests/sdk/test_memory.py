"""Agent memory through the gateway, in both shapes: sized blocks, eviction of the oldest unpinned
fact to archival, pins that protect, the audit trail and its governance views (stats, compliance,
summary, the sleep-time report), separate memory keys, and `init` asking a model (through the gateway)
for facts."""

import time

from conftest import call


def test_blocks_evict_pins_protect_and_everything_is_audited(gateway):
    memory = f"?memory_key=agent-{gateway['shape']}"
    started_ms = int(time.time() * 1000) - 1000
    tea = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "Ada prefers tea", "block": "human"}, expect=201)
    assert tea["block"] == "human" and tea["evicted"] == []
    assert call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "x", "block": "dreams"}, expect=400)["error"]["code"] == "invalid_block"
    keep = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "never forget the launch date", "pinned": True}, expect=201)
    first = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "general fact 1"}, expect=201)
    for number in range(2, 100):
        call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": f"general fact {number}"}, expect=201)
    overflow = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "general fact 100"}, expect=201)
    assert [evicted["id"] for evicted in overflow["evicted"]] == [first["id"]], "the oldest unpinned fact goes, the pinned one stays"
    blocks = call(gateway, "GET", f"/v1/memory/blocks{memory}")
    general = next(block for block in blocks["blocks"] if block["name"] == "general")
    assert general == {"name": "general", "count": 100, "limit": 100, "pinned_count": 1}
    assert (blocks["total_core_entries"], blocks["total_archival_entries"]) == (101, 1)
    assert {block["name"] for block in blocks["blocks"]} == {"human", "project", "system", "general"}
    archived = call(gateway, "GET", f"/v1/memory/entries{memory}&include_archival=true")
    assert any(entry["id"] == first["id"] and entry["archived"] for entry in archived["entries"])
    assert call(gateway, "GET", f"/v1/memory/blocks/human{memory}")["entries"][0]["fact"] == "Ada prefers tea"

    for number in range(50):
        call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": f"rule {number}", "block": "system", "pinned": True}, expect=201)
    full = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "one rule too many", "block": "system"}, expect=409)
    assert full["error"]["code"] == "memory_block_full"

    replaced = call(gateway, "PUT", f"/v1/memory/entries/{tea['id']}{memory}", {"fact": "Ada prefers green tea", "pinned": True})
    assert replaced["fact"] == "Ada prefers green tea" and replaced["pinned"] is True
    call(gateway, "DELETE", f"/v1/memory/entries/{keep['id']}{memory}")
    call(gateway, "DELETE", f"/v1/memory/entries/{keep['id']}{memory}", expect=404)
    # Another memory key sees none of it.
    assert call(gateway, "GET", "/v1/memory/blocks?memory_key=someone-else")["total_core_entries"] == 0

    audit = call(gateway, "GET", f"/v1/governance/memory/audit{memory}&operation=evict&since={started_ms}")
    assert audit["count"] == 1 and audit["entries"][0]["entry_id"] == first["id"]
    latest = call(gateway, "GET", f"/v1/governance/memory/audit{memory}&limit=3")["entries"]
    assert [entry["operation"] for entry in latest] == ["delete", "pin", "replace"]
    assert latest[2]["fact_after"] == "Ada prefers green tea" and latest[0]["actor"]
    assert call(gateway, "GET", f"/v1/governance/memory/audit{memory}&since={int(time.time() * 1000) + 60_000}")["count"] == 0
    stats = call(gateway, "GET", f"/v1/governance/memory/stats{memory}")["operations"]
    assert stats["append"] == 152 and stats["evict"] == 1 and stats["delete"] == 1 and stats["replace"] == 1

    call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "Ada's email is ada@example.com", "block": "human"}, expect=201)
    compliance = call(gateway, "GET", f"/v1/governance/memory/compliance{memory}")
    assert compliance["violations_found"] == 1 and compliance["compliant"] is False
    violation = compliance["violations"][0]
    assert violation["issues"] == ["possible_email"] and "ada@example.com" not in violation["fact_preview"]
    summary = call(gateway, "GET", f"/v1/governance/summary{memory}")
    assert summary["memory"]["pii_violations"] == 1 and summary["memory"]["total_entries"] == compliance["total_entries"]
    assert summary["activity_24h"]["append"] == 153 and summary["activity_24h"]["delete"] == 1
    assert next(block for block in summary["memory"]["blocks"] if block["block"] == "system")["utilization"] == 1.0


def test_the_sleep_time_report_tells_what_happened_while_away(gateway):
    memory = f"?memory_key=sleeper-{gateway['shape']}"
    before_ms = int(time.time() * 1000) - 1000
    old = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "an old project note", "block": "project"}, expect=201)
    for number in range(1, 50):
        call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": f"project note {number}", "block": "project"}, expect=201)
    time.sleep(0.01)
    away_ms = int(time.time() * 1000)
    time.sleep(0.01)
    # While away: an append that evicts the oldest project note, a fact holding an e-mail address, a
    # replacement and a deletion.
    overflow = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "the newest project note", "block": "project"}, expect=201)
    assert [evicted["id"] for evicted in overflow["evicted"]] == [old["id"]]
    contact = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "Ada writes from ada@example.com", "block": "human"}, expect=201)
    call(gateway, "PUT", f"/v1/memory/entries/{overflow['id']}{memory}", {"fact": "the newest project note, revised", "pinned": False})
    call(gateway, "DELETE", f"/v1/memory/entries/{contact['id']}{memory}")
    leak = call(gateway, "POST", f"/v1/memory/entries{memory}", {"fact": "Ada's mail: ada@example.com", "block": "human"}, expect=201)

    report = call(gateway, "GET", f"/v1/governance/sleep-time/report{memory}&since={away_ms}")
    assert report["memory_key"] == f"sleeper-{gateway['shape']}"
    assert report["window"]["since"] == away_ms and report["window"]["until"] >= away_ms
    assert report["operations"] == {"append": 3, "replace": 1, "delete": 1, "pin": 0, "evict": 1}
    assert report["total_operations"] == 6 and report["trail_complete"] is True
    assert len(report["actors"]) == 1 and report["actors"][0]["operations"] == 6
    assert [(eviction["entry_id"], eviction["block"], eviction["fact_preview"]) for eviction in report["evictions"]] == [
        (old["id"], "project", "an old project note")]
    project = next(block for block in report["blocks"] if block["block"] == "project")
    assert project == {"block": "project", "entries": 50, "limit": 50, "pinned": 0, "utilization": 1.0, "near_capacity": True}
    assert next(block for block in report["blocks"] if block["block"] == "human")["near_capacity"] is False
    # Only the fact still held counts (the deleted one is gone), its address masked.
    assert [violation["entry_id"] for violation in report["new_violations"]] == [leak["id"]]
    assert report["new_violations"][0]["issues"] == ["possible_email"] and "ada@example.com" not in str(report)
    assert {item["kind"] for item in report["attention"]} == {"block_near_capacity", "personal_data_written"}

    whole = call(gateway, "GET", f"/v1/governance/sleep-time/report{memory}&since={before_ms}")
    assert whole["operations"]["append"] == 53 and whole["total_operations"] == 56
    later = call(gateway, "GET", f"/v1/governance/sleep-time/report{memory}&since={int(time.time() * 1000) + 60_000}")
    assert later["total_operations"] == 0 and later["evictions"] == [] and later["new_violations"] == []
    assert {item["kind"] for item in later["attention"]} == {"block_near_capacity"}, "a full block still needs a look"
    default = call(gateway, "GET", f"/v1/governance/sleep-time/report{memory}")
    assert default["total_operations"] == 56 and default["window"]["until"] - default["window"]["since"] == 24 * 3600 * 1000
    assert call(gateway, "GET", f"/v1/governance/sleep-time/report{memory}&since=-5", expect=400)["error"]["code"] == "invalid_since"
    assert call(gateway, "GET", f"/v1/governance/sleep-time/report{memory}&since=soon", expect=400)["error"]["code"] == "invalid_query_parameter"


def test_init_asks_a_model_for_facts(gateway):
    key = gateway["byok_key"]
    refused = call(gateway, "POST", "/v1/memory/init", {"documents": [{"content": "Ada leads project Apollo."}]}, expect=400, key=key)
    assert refused["error"]["code"] == "missing_field"
    call(gateway, "POST", "/v1/memory/init", {"documents": [], "model": "openai/gpt-4o-mini"}, expect=400, key=key)
    # The mock upstream echoes the instruction instead of extracting; the `[]` it quotes reads as "no
    # facts", so nothing is stored. A model that fails is a failure of its document.
    answer = call(gateway, "POST", "/v1/memory/init", {
        "documents": [{"content": "Ada leads project Apollo.", "source": "notes.md"}], "model": "openai/gpt-4o-mini"}, key=key)
    assert answer["status"] == "no_facts" and answer["entries"] == [] and answer["entries_after"] == 0 and answer["failures"] == []
    assert isinstance(answer["duration_ms"], int)
    failed = call(gateway, "POST", "/v1/memory/init", {"documents": [{"content": "Ada.", "source": "a.md"}], "model": "openai/no-such-model"}, key=key)
    assert failed["status"] == "no_facts" and failed["failures"][0]["source"] == "a.md" and failed["failures"][0]["error"]


def test_prompt_templates_read_memory_blocks(gateway):
    memory = f"agent-templated-{gateway['shape']}"
    call(gateway, "POST", f"/v1/memory/entries?memory_key={memory}", {"fact": "Ada prefers tea", "block": "human"}, expect=201)
    call(gateway, "POST", f"/v1/memory/entries?memory_key={memory}", {"fact": "Ada works nights", "block": "human"}, expect=201)
    prompt_id = f"with-memory-{gateway['shape']}"
    call(gateway, "POST", "/v1/prompts", {"id": prompt_id, "template": "About the user:\n{{memory.human}}\nTask: {{task}}"}, expect=201)
    rendered = call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {"variables": {"task": "plan the week"}, "memory_key": memory})
    assert rendered["resolved_text"] == "About the user:\n- Ada prefers tea\n- Ada works nights\nTask: plan the week"
    assert rendered["missing_variables"] == []
    given = call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {"variables": {"task": "x", "memory": {"human": "given"}}, "memory_key": memory})
    assert given["resolved_text"] == "About the user:\ngiven\nTask: x", "variables win over memory"
    empty = call(gateway, "POST", f"/v1/prompts/{prompt_id}/test", {"variables": {"task": "x"}, "memory_key": "nobody"})
    assert empty["resolved_text"] == "About the user:\n\nTask: x"
