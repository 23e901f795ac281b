"""Talks to a running `larder serve` through the official `anthropic` package.

Usage: python anthropic_client_check.py BASE_URL MODEL
Checks a message (greedy), the same conversation streamed through
`client.messages.stream` (same text, same usage), count_tokens (the
message's input tokens), a stop sequence, and that a tool definition (not
wired yet) and a missing max_tokens surface as anthropic.BadRequestError.
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
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    try:
        client.messages.create(model=model, max_tokens=8, messages=messages, tools=[weather])
        raise AssertionError("tools should be refused until tool calling is wired")
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
