"""Talks to a running `larder serve` through the official `anthropic` package.

Usage: python anthropic_client_check.py BASE_URL MODEL
Checks a message (greedy), the same conversation streamed through
`client.messages.stream` (same text, same usage), count_tokens (the
message's input tokens), tool use (tool_choice any: a tool_use block,
whole and streamed, then the conversation continued with a tool_result),
and that an unknown tool in tool_choice and a wrong model are refused.
Prints one JSON line; exits non-zero on failure.
"""
import json
import sys

import anthropic


def main() -> int:
    base, model = sys.argv[1], sys.argv[2]
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Hello there"}]
    msg = client.messages.create(model=model, max_tokens=8, temperature=0, system="Be brief.", messages=messages)
    assert msg.type == "message" and msg.role == "assistant", msg
    assert msg.content[0].type == "text", msg.content
    text = msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens"), msg.stop_reason
    assert msg.usage.output_tokens >= 1, msg.usage

    with client.messages.stream(model=model, max_tokens=8, temperature=0, system="Be brief.", messages=messages) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text, (pieces, text)
    assert final.content[0].text == text, final
    assert final.stop_reason == msg.stop_reason, final
    assert final.usage.output_tokens == msg.usage.output_tokens, final.usage

    count = client.messages.count_tokens(model=model, system="Be brief.", messages=messages)
    assert count.input_tokens == msg.usage.input_tokens, (count, msg.usage)

    weather = {"name": "get_weather", "description": "Weather in a city",
               "input_schema": {"type": "object", "additionalProperties": False, "required": ["city"],
                                "properties": {"city": {"type": "string", "maxLength": 8}}}}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    used = client.messages.create(model=model, max_tokens=100, temperature=0, messages=ask, tools=[weather],
                                  tool_choice={"type": "any"})
    assert used.stop_reason == "tool_use", used
    calls = [b for b in used.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and isinstance(calls[0].input["city"], str), used.content
    with client.messages.stream(model=model, max_tokens=100, temperature=0, messages=ask, tools=[weather],
                                tool_choice={"type": "any"}) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(calls[0].name, calls[0].input)], streamed
    assert streamed.stop_reason == "tool_use", streamed
    turns = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in used.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "21 C"}]}]
    after = client.messages.create(model=model, max_tokens=4, temperature=0, messages=turns, tools=[weather])
    assert after.usage.input_tokens > used.usage.input_tokens, after.usage
    try:
        client.messages.create(model=model, max_tokens=8, messages=ask, tools=[weather],
                               tool_choice={"type": "tool", "name": "nope"})
        raise AssertionError("an unknown tool in tool_choice should be refused")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and "tool" in str(e), e

    try:
        client.messages.create(model="not-this-model", max_tokens=8, messages=messages)
        raise AssertionError("a wrong model should be refused")
    except anthropic.NotFoundError:
        pass

    print(json.dumps({"ok": True, "anthropic": anthropic.__version__, "text": text, "input_tokens": count.input_tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
