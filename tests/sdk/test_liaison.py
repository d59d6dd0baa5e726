"""Liaison plans committed by the official SDKs: a plan minted for a conversation commits from the
Anthropic SDK (the same prompt in the other format has the same fingerprint), once; a completion
outside the grant is refused as the OpenAI SDK's PermissionDeniedError with the spec's reason."""

import anthropic
import openai
import pytest

from conftest import call

PROMPT = "List three causes of the outage."


def plan_headers(plan):
    return {"X-BR-Plan-Id": plan["plan_id"], "X-BR-Liaison": plan["liaison_id"]}


def mint(gateway, liaison, **fields):
    body = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}], **fields}
    return call(gateway, "POST", f"/v1/liaison/{liaison}/plan", body, expect=201, key=gateway["byok_key"])


def test_a_plan_commits_once_from_the_sdks_and_refuses_what_it_does_not_grant(gateway):
    liaison = call(gateway, "POST", "/v1/liaison/open", {"label": "sdk"}, expect=201, key=gateway["byok_key"])["liaison_id"]
    plan = mint(gateway, liaison, model="anthropic/claude-haiku-4-5", max_tokens=100)
    assert plan["v"] == 2 and plan["allowed_models"] == ["anthropic/claude-haiku-4-5"]

    claude = anthropic.Anthropic(base_url=gateway["base_url"], api_key=gateway["byok_key"], max_retries=0)
    message = claude.messages.create(model="anthropic/claude-haiku-4-5", max_tokens=100, system="You are terse.",
                                     messages=[{"role": "user", "content": PROMPT}], extra_headers=plan_headers(plan))
    assert message.content[0].text == f"mock anthropic reply to: {PROMPT}"
    with pytest.raises(anthropic.ConflictError) as again:
        claude.messages.create(model="anthropic/claude-haiku-4-5", max_tokens=100, system="You are terse.",
                               messages=[{"role": "user", "content": PROMPT}], extra_headers=plan_headers(plan))
    assert again.value.body["error"]["code"] == "plan_already_committed"

    second = mint(gateway, liaison, model="openai/gpt-4o-mini")
    gpt = openai.OpenAI(base_url=gateway["base_url"] + "/v1", api_key=gateway["byok_key"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        gpt.chat.completions.create(model="openai/gpt-4.1", messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}],
                                    extra_headers=plan_headers(second))
    body = refused.value.response.json()
    assert (body["error"]["code"], body["error"]["type"], body["error"]["reason"]) == ("plan_scope_exceeded", "permission_error", "model_outside_grant")
    assert body["recovery"]["action"] == "renegotiate"
    completion = gpt.chat.completions.create(model="openai/gpt-4o-mini", messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}],
                                             extra_headers=plan_headers(second))
    assert completion.choices[0].message.content == f"mock openai reply to: {PROMPT}"

    closed = call(gateway, "POST", f"/v1/liaison/{liaison}/close", expect=200, key=gateway["byok_key"])
    assert closed["cost_summary"]["plans_committed"] == 2 and closed["cost_summary"]["denials"] == 1
    assert len(closed["trace_digest"]) == 64
