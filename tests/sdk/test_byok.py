"""The official SDKs reach real provider models through the gateway, across formats, with exact costs."""

import json
import urllib.request
from decimal import Decimal

import anthropic
import openai

TOOL_OPENAI = {"type": "function", "function": {"name": "lookup", "description": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}
TOOL_ANTHROPIC = {"name": "lookup", "description": "search", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}


def openai_client(gateway):
    return openai.OpenAI(base_url=gateway["base_url"] + "/v1", api_key=gateway["byok_key"], max_retries=0)


def anthropic_client(gateway):
    return anthropic.Anthropic(base_url=gateway["base_url"], api_key=gateway["byok_key"], max_retries=0)


def exact_cost(input_tokens, output_tokens, input_per_million, output_per_million):
    cost = (Decimal(input_tokens) * Decimal(input_per_million) + Decimal(output_tokens) * Decimal(output_per_million)) / Decimal(1_000_000)
    return f"{cost:.6f}"


def test_openai_sdk_calls_an_anthropic_model(gateway):
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model="anthropic/claude-haiku-4-5", messages=[{"role": "user", "content": "hello claude from openai"}])
    completion = raw.parse()
    assert completion.choices[0].message.content == "mock anthropic reply to: hello claude from openai"
    assert completion.model == "anthropic/claude-haiku-4-5"
    assert raw.headers["x-br-actual-cost"] == exact_cost(completion.usage.prompt_tokens, completion.usage.completion_tokens, "1.00", "5.00")


def test_openai_sdk_streams_an_anthropic_model_with_tools(gateway):
    stream = openai_client(gateway).chat.completions.create(
        model="anthropic/claude-haiku-4-5", stream=True, tools=[TOOL_OPENAI],
        messages=[{"role": "user", "content": "please use a tool for me"}])
    name, arguments, finish = None, "", None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name = call.function.name or name
                arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    assert name == "lookup"
    assert json.loads(arguments) == {"query": "please use a tool for me"}
    assert finish == "tool_calls"

    text = "".join(chunk.choices[0].delta.content or "" for chunk in openai_client(gateway).chat.completions.create(
        model="anthropic/claude-haiku-4-5", stream=True, messages=[{"role": "user", "content": "plain stream"}]) if chunk.choices)
    assert text == "mock anthropic reply to: plain stream"


def test_anthropic_sdk_calls_an_openai_model(gateway):
    raw = anthropic_client(gateway).messages.with_raw_response.create(
        model="openai/gpt-4o-mini", max_tokens=200, messages=[{"role": "user", "content": "hello gpt from anthropic"}])
    message = raw.parse()
    assert message.content[0].text == "mock openai reply to: hello gpt from anthropic"
    assert message.stop_reason == "end_turn"
    assert raw.headers["x-br-actual-cost"] == exact_cost(message.usage.input_tokens, message.usage.output_tokens, "0.15", "0.60")

    tool_message = anthropic_client(gateway).messages.create(
        model="openai/gpt-4o-mini", max_tokens=200, tools=[TOOL_ANTHROPIC], messages=[{"role": "user", "content": "please use a tool"}])
    assert tool_message.stop_reason == "tool_use"
    tool_use = next(block for block in tool_message.content if block.type == "tool_use")
    assert tool_use.name == "lookup" and tool_use.input == {"query": "please use a tool"}


def test_anthropic_sdk_streams_an_openai_model(gateway):
    with anthropic_client(gateway).messages.stream(model="openai/gpt-4o-mini", max_tokens=200, messages=[{"role": "user", "content": "stream gpt"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "mock openai reply to: stream gpt"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0

    with anthropic_client(gateway).messages.stream(model="openai/gpt-4o-mini", max_tokens=200, tools=[TOOL_ANTHROPIC],
                                                   messages=[{"role": "user", "content": "use a tool please"}]) as stream:
        final = stream.get_final_message()
    tool_use = next(block for block in final.content if block.type == "tool_use")
    assert tool_use.input == {"query": "use a tool please"}


def last_upstream_body(gateway):
    with urllib.request.urlopen(gateway["mock_url"] + "/__mock/requests") as response:
        return json.loads(response.read())[-1]["body"]


def test_openai_sdk_options_reach_the_provider(gateway):
    completion = openai_client(gateway).chat.completions.create(
        model="openai/gpt-4o-mini", seed=7, presence_penalty=0.5, frequency_penalty=-0.5, logit_bias={"50256": -100},
        parallel_tool_calls=False, tools=[TOOL_OPENAI], reasoning_effort="low", max_completion_tokens=64,
        messages=[{"role": "user", "content": "options please"}])
    assert completion.choices[0].finish_reason is not None
    sent = last_upstream_body(gateway)
    assert {name: sent.get(name) for name in ("seed", "presence_penalty", "frequency_penalty", "logit_bias", "parallel_tool_calls",
                                              "reasoning_effort", "max_completion_tokens")} == {
        "seed": 7, "presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"50256": -100},
        "parallel_tool_calls": False, "reasoning_effort": "low", "max_completion_tokens": 64}

    # The same options from the Anthropic SDK's side: its parallel-tool refusal reaches OpenAI as such.
    anthropic_client(gateway).messages.create(
        model="openai/gpt-4o-mini", max_tokens=64, tools=[TOOL_ANTHROPIC], tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "one tool at a time"}])
    assert last_upstream_body(gateway)["parallel_tool_calls"] is False

    # Several answers in one reply are refused with the body's error, as the SDK reports it.
    try:
        openai_client(gateway).chat.completions.create(model="openai/gpt-4o-mini", n=2, messages=[{"role": "user", "content": "twice"}])
    except openai.BadRequestError as refused:
        assert refused.status_code == 400 and "n greater than 1" in str(refused.body)
    else:
        raise AssertionError("n=2 was answered")


def test_cached_prompt_tokens_reach_both_sdks(gateway):
    # The mock caches a conversation's earlier turns once they reach 1,024 tokens, in steps of 128.
    messages = [{"role": "user", "content": "word " * 1100}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and now?"}]
    completion = openai_client(gateway).chat.completions.create(model="openai/gpt-4o-mini", messages=messages)
    assert completion.usage.prompt_tokens == 1103
    assert completion.usage.prompt_tokens_details.cached_tokens == 1024
    message = anthropic_client(gateway).messages.create(model="openai/gpt-4o-mini", max_tokens=50, messages=messages)
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (79, 1024)


def test_anthropic_sdk_cache_breakpoints_are_written_then_read(gateway):
    system = [{"type": "text", "text": "sdk rule " * 600, "cache_control": {"type": "ephemeral"}}]
    def call():
        return anthropic_client(gateway).messages.create(
            model="anthropic/claude-haiku-4-5", max_tokens=50, system=system, messages=[{"role": "user", "content": "hello there"}])
    first, second = call(), call()
    assert (first.usage.cache_creation_input_tokens, first.usage.cache_read_input_tokens) == (1200, 0)
    assert (second.usage.cache_creation_input_tokens, second.usage.cache_read_input_tokens) == (0, 1200)
    assert second.usage.input_tokens == 2


def test_anthropic_sdk_thinks_through_a_tool_loop(gateway):
    client = anthropic_client(gateway)
    ask = {"role": "user", "content": "please use a tool now"}
    common = dict(model="anthropic/claude-haiku-4-5", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024}, tools=[TOOL_ANTHROPIC])
    first = client.messages.create(messages=[ask], **common)
    assert [block.type for block in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "mock thinking about: please use a tool now" and first.content[0].signature
    tool_use = first.content[1]
    # The SDK's own objects go back as the assistant turn; the mock refuses them if the thinking is lost.
    answer = client.messages.create(messages=[ask, {"role": "assistant", "content": first.content},
                                              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "found"}]}], **common)
    assert [block.type for block in answer.content] == ["thinking", "text"]
    with client.messages.stream(messages=[ask], **common) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].signature == first.content[0].signature


def test_documents_from_both_sdks_reach_the_other_format(gateway):
    pdf = "JVBERi0xLjQK"
    # The OpenAI SDK's file part reaches Anthropic as a document block, named by its filename.
    completion = openai_client(gateway).chat.completions.create(
        model="anthropic/claude-haiku-4-5",
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "summarize the file"},
            {"type": "file", "file": {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{pdf}"}}]}])
    assert completion.choices[0].message.content == "mock anthropic reply to: summarize the file"
    assert last_upstream_body(gateway)["messages"][0]["content"][1] == {
        "type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}, "title": "report.pdf"}

    # The Anthropic SDK's document block reaches OpenAI as a file part.
    message = anthropic_client(gateway).messages.create(
        model="openai/gpt-4o-mini", max_tokens=64,
        messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
            {"type": "text", "text": "what is in it?"}]}])
    assert message.content[0].text == "mock openai reply to: what is in it?"
    assert last_upstream_body(gateway)["messages"][0]["content"][0] == {
        "type": "file", "file": {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{pdf}"}}

    # A file in one provider's storage cannot follow the request elsewhere: refused, as the SDK reports it.
    try:
        openai_client(gateway).chat.completions.create(
            model="openai/gpt-4o-mini", messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-abc"}}]}])
    except openai.BadRequestError as refused:
        assert refused.status_code == 400 and refused.body["code"] == "unsupported_content"
    else:
        raise AssertionError("a file id was answered")


def test_anthropic_sdk_counts_tokens(gateway):
    client = anthropic_client(gateway)
    counted = client.messages.count_tokens(
        model="anthropic/claude-haiku-4-5", system="be brief", messages=[{"role": "user", "content": "count these five words please"}])
    assert counted.input_tokens == 7
    sent = last_upstream_body(gateway)
    assert "max_tokens" not in sent and sent["model"] == "claude-haiku-4-5"
    # OpenAI-format models have no count endpoint: the gateway's estimate, never zero.
    raw = client.messages.with_raw_response.count_tokens(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "count these five words please"}])
    assert raw.headers["x-br-token-count"] == "estimate" and raw.parse().input_tokens > 0


def test_openai_sdk_embeds(gateway):
    client = openai_client(gateway)
    # The SDK asks for base64 by default and decodes it; the gateway answers in the asked encoding.
    raw = client.embeddings.with_raw_response.create(model="openai/text-embedding-3-small", input=["a cat sat", "a dog ran far"])
    embedded = raw.parse()
    assert [item.index for item in embedded.data] == [0, 1]
    assert len(embedded.data[0].embedding) == 8 and embedded.data[0].embedding != embedded.data[1].embedding
    assert embedded.usage.prompt_tokens == 7
    assert raw.headers["x-br-routed-model"] == "openai/text-embedding-3-small"
    floats = client.embeddings.create(model="openai/text-embedding-3-small", input="a cat sat", encoding_format="float")
    # The same single-precision numbers, written as JSON numbers or decoded from base64.
    assert all(abs(a - b) <= 1e-7 * max(1.0, abs(b)) for a, b in zip(floats.data[0].embedding, embedded.data[0].embedding, strict=True))
    shorter = client.embeddings.create(model="openai/text-embedding-3-small", input="a cat sat", dimensions=3)
    assert len(shorter.data[0].embedding) == 3
    try:
        client.embeddings.create(model="openai/gpt-4o-mini", input="not an embedder")
    except openai.NotFoundError as refused:
        assert refused.status_code == 404
    else:
        raise AssertionError("a chat model embedded")


def test_openai_sdk_reads_log_probabilities(gateway):
    completion = openai_client(gateway).chat.completions.create(
        model="openai/gpt-4o-mini", logprobs=True, top_logprobs=2, messages=[{"role": "user", "content": "how sure?"}])
    content = completion.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == completion.choices[0].message.content
    assert content[0].logprob == -0.01 and len(content[0].top_logprobs) == 2
    stream = openai_client(gateway).chat.completions.create(
        model="openai/gpt-4o-mini", logprobs=True, stream=True, messages=[{"role": "user", "content": "how sure?"}])
    streamed = [entry.token for chunk in stream if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert "".join(streamed) == completion.choices[0].message.content


def test_both_sdks_list_and_retrieve_the_models_a_key_runs(gateway):
    # One shape both SDKs read: OpenAI's members and Anthropic's, on the list and on each model.
    listed = [model.id for model in openai_client(gateway).models.list()]
    assert "openai/gpt-4o-mini" in listed and "anthropic/claude-haiku-4-5" in listed
    anthropic_listed = list(anthropic_client(gateway).models.list())
    assert [model.id for model in anthropic_listed] == listed
    assert anthropic_listed[0].type == "model" and anthropic_listed[0].created_at.year == 2025

    # `models.retrieve` sends the id's slash percent-encoded.
    model = openai_client(gateway).models.retrieve("openai/gpt-4o-mini")
    assert (model.id, model.owned_by) == ("openai/gpt-4o-mini", "openai")
    assert anthropic_client(gateway).models.retrieve("anthropic/claude-haiku-4-5").display_name == "anthropic/claude-haiku-4-5"
    # A deprecated model's entry carries its notice, where its completions' Link header points.
    old = openai_client(gateway).models.retrieve("openai/gpt-3.5-turbo")
    assert old.model_extra["x_model_router"]["deprecation"]["replacement"] == "openai/gpt-4.1-nano"
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model="openai/gpt-3.5-turbo", messages=[{"role": "user", "content": "old model"}])
    assert '</v1/models/openai/gpt-3.5-turbo>; rel="deprecation"' in raw.headers["link"]
    try:
        anthropic_client(gateway).models.retrieve("openai/no-such-model")
        raise AssertionError("an unknown model was retrieved")
    except anthropic.NotFoundError as error:
        assert error.status_code == 404
