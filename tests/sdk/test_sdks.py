"""The official OpenAI and Anthropic SDKs, pointed at the gateway, work unchanged."""

import anthropic
import openai
import pytest


def openai_client(gateway, key=None):
    return openai.OpenAI(base_url=gateway["base_url"] + "/v1", api_key=key or gateway["key"], max_retries=0)


def test_openai_chat_completion(gateway):
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is a gateway?"}],
    )
    assert raw.headers["x-br-request-id"].startswith("req_")
    assert raw.headers["x-br-routed-model"] == "brainstorm/sandbox"
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.model == "brainstorm/sandbox"
    assert "what is a gateway?" in completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_openai_streaming(gateway):
    stream = openai_client(gateway).chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "stream this"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert "stream this" in text
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


def test_openai_models_and_errors(gateway):
    models = openai_client(gateway).models.list()
    assert "brainstorm/sandbox" in [model.id for model in models.data]
    # `models.retrieve` percent-encodes the id's slash; the gateway reads it back.
    sandbox = openai_client(gateway).models.retrieve("brainstorm/sandbox")
    assert (sandbox.id, sandbox.owned_by) == ("brainstorm/sandbox", "brainstorm")
    with pytest.raises(openai.NotFoundError) as not_found:
        openai_client(gateway).models.retrieve("openai/gpt-4o")
    assert not_found.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError) as unauthorized:
        openai_client(gateway, key="br_live_" + "x" * 40).models.list()
    assert unauthorized.value.status_code == 401
    assert unauthorized.value.body["type"] == "authentication_error"
    with pytest.raises(openai.BadRequestError) as bad_request:
        openai_client(gateway).chat.completions.create(model="gpt-4o-mini", messages=[])
    assert bad_request.value.status_code == 400


@pytest.mark.parametrize("auth", ["api_key", "auth_token"])
def test_anthropic_messages(gateway, auth):
    client = anthropic.Anthropic(base_url=gateway["base_url"], max_retries=0, **{auth: gateway["key"]})
    message = client.messages.create(
        model="claude-sonnet-5-5",
        max_tokens=200,
        system="be brief",
        messages=[{"role": "user", "content": "hello from the sdk"}],
    )
    assert message.type == "message"
    assert message.role == "assistant"
    assert "hello from the sdk" in message.content[0].text
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0


def test_anthropic_streaming(gateway):
    client = anthropic.Anthropic(base_url=gateway["base_url"], api_key=gateway["key"], max_retries=0)
    with client.messages.stream(model="claude-sonnet-5-5", max_tokens=200, messages=[{"role": "user", "content": "stream me"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "stream me" in text
    assert final.stop_reason == "end_turn"
    assert final.content[0].text == text


def test_anthropic_errors(gateway):
    client = anthropic.Anthropic(base_url=gateway["base_url"], api_key="br_live_" + "y" * 40, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="claude-sonnet-5-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
