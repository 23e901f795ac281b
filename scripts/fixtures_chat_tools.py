"""Expected renders of chats with tools, tool calls, tool results and thinking
switches, through the chat templates of larder's tokenizer fixtures, made by
transformers' `apply_chat_template(messages, tools=..., add_generation_prompt=...,
**kwargs)`; `crates/larder-engine/tests/chat_tools.rs` renders the same with
larder and compares exactly.

    python -m venv /tmp/venv && /tmp/venv/bin/pip install -r scripts/requirements-chat-tools.txt
    /tmp/venv/bin/python scripts/fixtures_chat_tools.py --out fixtures/chat_tools.json

No torch is needed. Messages are OpenAI's, converted as larder converts them
for a template (crates/larder-engine/src/chat_json.rs): a call's `arguments`
(a JSON string in OpenAI's API) are parsed into a mapping, except for a
template that concatenates them as text (DeepSeek-V3's), which gets the string;
reasoning goes under both `reasoning_content` (Qwen3) and `thinking` (gpt-oss).
A conversation the template refuses (jinja raises) is recorded with
`"error"`, and larder must refuse it too. The clock is fixed (gpt-oss's
template writes today's date).
"""

import argparse
import copy
import datetime as dt
import json
import re
from pathlib import Path

import jinja2
import transformers
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils

TRANSFORMERS_VERSION = "5.24.0"
JINJA2_VERSION = "3.1.6"
FIXED_NOW = dt.datetime(2025, 8, 5, 12, 34, 56, tzinfo=dt.timezone.utc)

TEMPLATES = ["qwen3_moe_tok", "deepseek_v3_tok", "tokenizer_gptoss"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time <in> a \"zone\" & more: é",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}


def call(i, name, args):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


LOOP = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [call(1, "get_weather", {"city": "Paris"})]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
]

CONVERSATIONS = [
    {"name": "tools_declared", "tools": [WEATHER, TIME], "kwargs": {}, "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]},
    {"name": "tools_no_system", "tools": [WEATHER], "kwargs": {}, "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Weather in Paris?"}]},
    {"name": "call_and_result", "tools": [WEATHER], "kwargs": {}, "add_generation_prompt": True,
     "messages": LOOP},
    {"name": "call_result_answer", "tools": [WEATHER], "kwargs": {}, "add_generation_prompt": False,
     "messages": LOOP + [{"role": "assistant", "content": "21 degrees."}]},
    {"name": "call_with_empty_content", "tools": [WEATHER], "kwargs": {}, "add_generation_prompt": True,
     "messages": [LOOP[1], {**LOOP[2], "content": ""}, LOOP[3]]},
    {"name": "two_calls_two_results", "tools": [WEATHER, TIME], "kwargs": {}, "add_generation_prompt": True,
     "messages": [
         {"role": "user", "content": "Weather and time in Paris?"},
         {"role": "assistant", "content": "", "tool_calls": [
             call(1, "get_weather", {"city": "Paris", "unit": "celsius"}), call(2, "get_time", {"zone": "Europe/Paris"})]},
         {"role": "tool", "tool_call_id": "call_1", "content": "21"},
         {"role": "tool", "tool_call_id": "call_2", "content": "14:00"},
     ]},
    {"name": "reasoning_in_history", "tools": None, "kwargs": {}, "add_generation_prompt": True,
     "messages": [
         {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
         {"role": "user", "content": "3+3?"},
     ]},
    {"name": "thinking_off", "tools": None, "kwargs": {"enable_thinking": False}, "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Hi"}]},
    {"name": "reasoning_effort_high", "tools": None, "kwargs": {"reasoning_effort": "high"},
     "add_generation_prompt": True, "messages": [{"role": "user", "content": "Hi"}]},
]


class FixedClock(dt.datetime):
    """`datetime` whose `now()` is FIXED_NOW (what `strftime_now` reads)."""

    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW if tz is not None else FIXED_NOW.replace(tzinfo=None)


def concatenates_arguments(source):
    squeezed = re.sub(r"\s", "", source)
    return any(p in squeezed for p in ("['arguments']+", ".arguments+", '["arguments"]+'))


def for_template(messages, as_text):
    """OpenAI messages as larder hands them to a template."""
    out = []
    for m in copy.deepcopy(messages):
        if "reasoning_content" in m:
            m["thinking"] = m["reasoning_content"]
        for c in m.get("tool_calls", []):
            if not as_text:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="fixtures")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    assert transformers.__version__ == TRANSFORMERS_VERSION, transformers.__version__
    assert jinja2.__version__ == JINJA2_VERSION, jinja2.__version__
    chat_template_utils.datetime = FixedClock
    cases = []
    for name in TEMPLATES:
        tok = AutoTokenizer.from_pretrained(Path(args.fixtures) / name)
        as_text = concatenates_arguments(tok.chat_template)
        for conv in CONVERSATIONS:
            case = {"template": name, **conv}
            try:
                case["rendered"] = tok.apply_chat_template(
                    for_template(conv["messages"], as_text),
                    tools=conv["tools"],
                    tokenize=False,
                    add_generation_prompt=conv["add_generation_prompt"],
                    **conv["kwargs"],
                )
            except Exception as e:  # jinja2's errors, raise_exception
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    doc = {
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "fixed_now_unix": int(FIXED_NOW.timestamp()),
        "cases": cases,
    }
    Path(args.out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
