"""Talks to a running `larder serve` through the official `openai` package.

Usage: python openai_client_check.py BASE_URL MODEL
Checks a chat completion, a text completion, a streamed chat (same text as
the non-streamed one, greedy), and that an unsupported request surfaces as
openai.BadRequestError; then the Responses API: a response (the chat's
text), the same streamed, a follow-up through previous_response_id. Tools:
see tool_checks. Prints one JSON line; exits non-zero on failure.
"""
import json
import sys
import typing

import openai
import pydantic


class Weather(pydantic.BaseModel):
    """Weather in a city (a bounded schema: a random model finishes it)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    city: typing.Annotated[str, pydantic.StringConstraints(max_length=8)]
    unit: typing.Literal["c", "f"]


def tool_checks(client, model):
    """Tools: a required call (whole, streamed, parsed into pydantic), the
    conversation continued with the tool's result, and the Responses API's
    function tool and function_call_output."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=100, temperature=0, tools=[tool], tool_choice="required"
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather", call
    Weather.model_validate_json(call.function.arguments)

    streamed = {}
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=100, temperature=0, tools=[tool], tool_choice="required", stream=True
    ):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                streamed[d.index] = (d.function.name, d.function.arguments)
    assert streamed == {0: (call.function.name, call.function.arguments)}, (streamed, call)

    parsed = client.chat.completions.parse(
        model=model, messages=messages, max_tokens=100, temperature=0, tools=[tool], tool_choice="required"
    )
    assert isinstance(parsed.choices[0].message.tool_calls[0].function.parsed_arguments, Weather), parsed

    history = messages + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "21 C"}]
    after = client.chat.completions.create(model=model, messages=history, max_tokens=4, temperature=0, tools=[tool])
    assert after.usage.prompt_tokens > whole.usage.prompt_tokens, after.usage

    try:
        client.chat.completions.create(model=model, messages=messages, tools=[tool],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
        raise AssertionError("an unknown tool in tool_choice should be refused")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "tool_choice" in str(e), e

    weather = {"type": "function", "name": "get_weather", "description": "Weather in a city",
               "parameters": Weather.model_json_schema()}
    resp = client.responses.create(model=model, input="Weather in Paris?", tools=[weather], tool_choice="required",
                                   max_output_tokens=100, temperature=0)
    calls = [o for o in resp.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", resp.output
    Weather.model_validate_json(calls[0].arguments)
    events = list(client.responses.create(model=model, input="Weather in Paris?", tools=[weather], tool_choice="required",
                                          max_output_tokens=100, temperature=0, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [(calls[0].name, calls[0].arguments)], done
    follow = client.responses.create(model=model, previous_response_id=resp.id, tools=[weather], max_output_tokens=4,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 C"}])
    assert follow.usage.input_tokens > resp.usage.input_tokens, follow.usage


def main() -> int:
    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Hello there"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    text = chat.choices[0].message.content
    assert chat.object == "chat.completion", chat
    assert chat.usage.completion_tokens >= 1, chat.usage
    assert chat.choices[0].finish_reason in ("stop", "length")

    comp = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
    assert comp.object == "text_completion", comp
    assert comp.choices[0].finish_reason == "length", comp

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(pieces) == text, (pieces, text)
    assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage
    assert finish == chat.choices[0].finish_reason

    # n choices decoded together (greedy: identical), with logprobs.
    two = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, n=2, logprobs=True, top_logprobs=2
    )
    assert [c.index for c in two.choices] == [0, 1], two
    assert two.choices[0].message.content == two.choices[1].message.content, two
    assert two.choices[0].logprobs is not None and len(two.choices[0].logprobs.content) > 0, two
    assert all(len(t.top_logprobs) == 2 for t in two.choices[0].logprobs.content), two

    # Structured output: a pydantic model through client.chat.completions.parse.

    class Pet(pydantic.BaseModel):
        kind: typing.Literal["cat", "dog"]
        legs: typing.Annotated[int, pydantic.Field(ge=0, le=8)]

    parsed = client.chat.completions.parse(
        model=model, messages=messages, max_tokens=64, temperature=0, response_format=Pet
    )
    assert isinstance(parsed.choices[0].message.parsed, Pet), parsed

    try:
        client.chat.completions.create(model=model, messages=messages, n=99)
        raise AssertionError("n=99 should be refused")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "n" in str(e), e

    try:
        client.chat.completions.create(model="not-this-model", messages=messages)
        raise AssertionError("a wrong model should be refused")
    except openai.NotFoundError:
        pass

    resp = client.responses.create(model=model, input="Hello there", max_output_tokens=8, temperature=0)
    assert resp.object == "response" and resp.status in ("completed", "incomplete"), resp
    assert resp.output_text == text, (resp.output_text, text)
    assert resp.usage.input_tokens == chat.usage.prompt_tokens, (resp.usage, chat.usage)

    events = list(client.responses.create(model=model, input="Hello there", max_output_tokens=8, temperature=0, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == text, (deltas, text)
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete"), events
    assert events[-1].response.output_text == text, events[-1]
    assert [e.sequence_number for e in events] == list(range(len(events)))

    follow = client.responses.create(
        model=model, input="And then?", previous_response_id=resp.id, max_output_tokens=4, temperature=0
    )
    assert follow.previous_response_id == resp.id and follow.usage.input_tokens > resp.usage.input_tokens, follow
    assert client.responses.retrieve(follow.id).output_text == follow.output_text

    tool_checks(client, model)

    print(json.dumps({"ok": True, "openai": openai.__version__, "chat": text, "completion": comp.choices[0].text,
                      "response": resp.output_text}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
