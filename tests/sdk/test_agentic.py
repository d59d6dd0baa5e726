"""The official SDKs meet the agent loop (`mode: agentic`, sent through the SDKs' `extra_body`): the model's
memory calls are run by the gateway, the answer reaches the SDK as an ordinary completion or stream, and the
tenant's core memory holds what the model wrote."""

import json

import anthropic
import openai

from conftest import call


def openai_client(gateway):
    return openai.OpenAI(base_url=gateway["base_url"] + "/v1", api_key=gateway["byok_key"], max_retries=0)


def anthropic_client(gateway):
    return anthropic.Anthropic(base_url=gateway["base_url"], api_key=gateway["byok_key"], max_retries=0)


def facts(gateway, block):
    return [entry["fact"] for entry in call(gateway, "GET", f"/v1/memory/blocks/{block}", key=gateway["byok_key"])["entries"]]


def remember(fact, block):
    return "use the tool brainstorm_memory_append with " + json.dumps({"block": block, "fact": fact})


def test_openai_sdk_runs_the_agent_loop(gateway):
    client = openai_client(gateway)
    text = remember("The SDK user likes Rust", "human")
    raw = client.chat.completions.with_raw_response.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": text}], extra_body={"mode": "agentic"}
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == f"mock openai reply to: {text}"
    assert completion.choices[0].finish_reason == "stop"
    assert (raw.headers["x-br-agent-mode"], raw.headers["x-br-agent-steps"], raw.headers["x-br-memory-writes"]) == ("agentic", "2", "1")
    assert "The SDK user likes Rust" in facts(gateway, "human")

    # Streamed: the SDK reads the final answer as a stream.
    text = remember("Streams end with DONE", "project")
    stream = client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": text}], stream=True, extra_body={"mode": "agentic"}
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == f"mock openai reply to: {text}"
    assert "Streams end with DONE" in facts(gateway, "project")


def test_anthropic_sdk_runs_the_agent_loop(gateway):
    client = anthropic_client(gateway)
    text = remember("Anthropic SDK users say hello", "general")
    raw = client.messages.with_raw_response.create(
        model="anthropic/claude-haiku-4-5", max_tokens=200, messages=[{"role": "user", "content": text}], extra_body={"mode": "agentic"}
    )
    message = raw.parse()
    assert message.content[0].text == f"mock anthropic reply to: {text}"
    assert message.stop_reason == "end_turn"
    assert raw.headers["x-br-memory-writes"] == "1"
    assert "Anthropic SDK users say hello" in facts(gateway, "general")
    # Skipping memory: nothing is loaded or offered.
    skipped = client.messages.with_raw_response.create(
        model="anthropic/claude-haiku-4-5",
        max_tokens=50,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"mode": "agentic"},
        extra_headers={"x-br-skip-memory": "true"},
    )
    assert (skipped.headers["x-br-memory"], skipped.headers["x-br-agent-steps"]) == ("skipped", "1")
