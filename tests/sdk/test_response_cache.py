"""The official SDKs meet the response cache: a repeated request is answered from the edge (`X-BR-Cache:
hit`, at $0) with the same content, in either client format, and the SDKs' own `extra_body` turns it off."""

import anthropic
import openai

# The harness turns the cache off for the other modules.
GATEWAY_ENV = {"BR_RESPONSE_CACHE_MAX_BYTES": "8388608"}


def openai_client(gateway):
    return openai.OpenAI(base_url=gateway["base_url"] + "/v1", api_key=gateway["byok_key"], max_retries=0)


def anthropic_client(gateway):
    return anthropic.Anthropic(base_url=gateway["base_url"], api_key=gateway["byok_key"], max_retries=0)


def test_openai_sdk_repeats_are_answered_from_the_cache(gateway):
    client = openai_client(gateway)
    ask = dict(model="openai/gpt-4o-mini", temperature=0, messages=[{"role": "user", "content": "cache me, openai sdk"}])
    first = client.chat.completions.with_raw_response.create(**ask)
    second = client.chat.completions.with_raw_response.create(**ask)
    assert (first.headers["x-br-cache"], second.headers["x-br-cache"]) == ("miss", "hit")
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content == "mock openai reply to: cache me, openai sdk"
    assert second.headers["x-br-actual-cost"] == "0.000000"
    assert second.headers["x-br-savings"] == first.headers["x-br-actual-cost"]
    skipped = client.chat.completions.with_raw_response.create(**ask, extra_body={"cache": False})
    assert skipped.headers["x-br-cache"] == "bypass"
    assert float(skipped.headers["x-br-actual-cost"]) > 0


def test_anthropic_sdk_repeats_are_answered_from_the_cache(gateway):
    client = anthropic_client(gateway)
    ask = dict(model="anthropic/claude-haiku-4-5", max_tokens=100, messages=[{"role": "user", "content": "cache me, anthropic sdk"}])
    first = client.messages.with_raw_response.create(**ask)
    second = client.messages.with_raw_response.create(**ask)
    assert (first.headers["x-br-cache"], second.headers["x-br-cache"]) == ("miss", "hit")
    assert second.parse().content[0].text == first.parse().content[0].text == "mock anthropic reply to: cache me, anthropic sdk"
    assert second.parse().id != first.parse().id
    private = client.messages.with_raw_response.create(**ask, extra_headers={"x-br-cache-privacy": "private"})
    assert (private.headers["x-br-cache"], private.headers["x-br-cache-privacy"]) == ("bypass", "private")
