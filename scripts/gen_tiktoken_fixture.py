#!/usr/bin/env python3
"""Writes fixtures/tiktoken_kimi/: a tokenizer in Kimi's on-disk form
(`tiktoken.model` + `tokenizer_config.json`) and the ids PyPI tiktoken gives
for a varied corpus, so larder's Rust loader is checked against tiktoken
without Python in CI.

tiktoken's own rank files (cl100k_base, o200k_base) are downloaded at run time
and the network is closed here, so the rank file is trained by this script: a
plain byte-pair procedure over an embedded multilingual corpus (deterministic:
the same script always writes the same files). A few tokens that no merge
reaches are appended on purpose, to exercise tiktoken's "whole piece is a
token" shortcut.

The reference encoder is tiktoken (pinned below) with Kimi's pre-tokenizer
regex and special tokens numbered as Kimi's `tokenization_kimi.py` numbers
them: ids num_base_tokens .. num_base_tokens + 257, named from
`added_tokens_decoder` or `<|reserved_token_{id}|>`, matched in text
(`allowed_special="all"`), after Kimi's split of the text into runs of at most
25,000 whitespace / non-whitespace characters.

Run (never in CI):
    python3 -m venv /work/venv-tiktoken
    /work/venv-tiktoken/bin/pip install tiktoken==0.14.0
    /work/venv-tiktoken/bin/python scripts/gen_tiktoken_fixture.py --out fixtures/tiktoken_kimi
"""

import argparse
import base64
import collections
import json
import random
from pathlib import Path

import regex  # installed with tiktoken
import tiktoken

TIKTOKEN_VERSION = "0.14.0"

# Kimi's pre-tokenizer, as `pat_str` in tokenization_kimi.py of the Kimi-K2 /
# Kimi Linear checkpoints: Han runs on their own, letter runs split by case
# with English contractions attached, digits in groups of up to three, other
# symbols with one leading space, newline runs, whitespace runs.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
NUM_RESERVED_SPECIAL_TOKENS = 256  # Kimi: 256 + 2 special ids after the ranks
MAX_RUN_CHARS = 25_000  # Kimi's longest run of (non-)whitespace per tiktoken call
MAX_ENCODE_CHARS = 400_000
NUM_MERGES = 2600

# Named special tokens at their offsets from num_base_tokens, in the layout of
# Kimi-K2's tokenizer_config.json (the rest are reserved).
NAMED_SPECIALS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    254: "[UNK]",
    255: "[PAD]",
}

# Our own minimal Kimi-style template (role header, <|im_middle|>, content, <|im_end|>).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>"
    "{%- else -%}<|im_assistant|>{%- endif -%}"
    "{{ message['role'] }}<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. It's a sentence that uses every letter, "
    "and we'll use it again: they're training a tokenizer, isn't that what you'd expect? "
    "Mixture-of-experts models route each token to a few experts; the rest stay on the drive. "
    "Streaming weights from NVMe drives through a RAM cache keeps the logits bit-identical.",
    "fn main() {\n    let mut total: u64 = 0;\n    for i in 0..100 {\n        total += i * i;\n    }\n"
    "    println!(\"total = {total}\");\n}\n\nimpl Tokenizer for Ranks {\n    fn encode(&self, text: &str)"
    " -> Vec<u32> { self.inner.encode(text) }\n}\n",
    "def train(corpus, merges=1000):\n    counts = collections.Counter()\n    for word in corpus:\n"
    "        counts[word] += 1\n    return {k: v for k, v in counts.items() if v > 1}\n\n"
    "if __name__ == '__main__':\n\tprint(train(['a', 'b', 'a']))\n",
    "東京都は日本の首都です。北京欢迎你！我们今天学习中文和日本語。人工智能正在改变世界，"
    "大型语言模型需要大量的计算资源。中华人民共和国成立于一九四九年。",
    "ひらがなとカタカナを勉強しています。すしがすきです。コンピューターのプログラムを書きます。"
    "ありがとうございます。おはようございます。",
    "안녕하세요, 세계! 한국어 텍스트를 토큰화합니다. 대한민국의 수도는 서울입니다. 감사합니다.",
    "مرحبا بالعالم، هذا نص عربي للتجربة. اللغة العربية جميلة جدا. شكرا لكم.",
    "Привет, мир! Это текст на русском языке. Съешь же ещё этих мягких французских булок.",
    "Grüße aus München! Ça va très bien, naïve café, el niño pequeño, Zürich, façade, São Paulo.",
    "Emoji: 😀 😃 😄 👍 👍🏽 🚀 🎉 ❤️ 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 🇫🇷",
    "Numbers: 0 1 2 3 42 100 256 1024 2026 3.14159 2.71828 1,000,000 $19.99 50% #1 (555) 123-4567",
    "JSON: {\"id\": 17, \"name\": \"larder\", \"tags\": [\"moe\", \"exact\"], \"ok\": true, \"n\": null}",
    "HTML: <div class=\"main\"><p>Hello</p><a href=\"https://example.com/path?q=1&r=2\">link</a></div>",
]

SYLLABLES = ["ka", "to", "ri", "mon", "ex", "pert", "stre", "am", "ing", "tion", "al", "er", "the",
             "and", "in", "un", "re", "de", "pro", "con", "ly", "ness", "able", "ment", "s", "ed"]

CASES = {
    "english": "Hello, world! This is larder, an engine that runs mixture-of-experts models exactly.",
    "contractions": "I'm sure you'll see they'd've come; DON'T SHOUT, It'S Fine. O'Neil's dog's toy; "
                    "WE'LL SEE, you'RE RIGHT, I'VE, she'D, it'LL",
    "mixed_case": "HelloWorld camelCase SCREAMING_SNAKE_CASE MixedCASEWords iPhone McDonald's XMLHttpRequest ǅemal ǈ",
    "code_rust": "fn add(a: u32, b: u32) -> u32 {\n    a.wrapping_add(b) // sum\n}\n\n#[test]\nfn t() { assert_eq!(add(2, 2), 4); }\n",
    "code_python": "class A:\n\tdef f(self, x):\n\t\treturn x ** 2  # square\n\nprint([A().f(i) for i in range(10)])\r\n",
    "cjk_han": "东京都は日本の首都です。北京欢迎你！中文文本没有空格分词，汉字连续出现。",
    "japanese_kana": "ひらがな カタカナ ｶﾀｶﾅ がぎぐげご パピプペポ ー〜、。「かぎかっこ」",
    "korean": "안녕하세요, 세계! 한국어 텍스트 토큰화 테스트입니다. 한글 ㄱㄴㄷ",
    "arabic": "مرحبا بالعالم، هذا نص عربي ١٢٣٤٥ مع أرقام. السلام عليكم",
    "emoji": "😀👍🏽🚀 family 👨‍👩‍👧‍👦 flag 🏳️‍🌈 coder 👩‍💻 🇯🇵🇫🇷 keycap 1️⃣ ❤️‍🔥 🫠",
    "digits": "1 12 123 1234 12345 123456 1234567 3.14159265 1,000,000 007 ٣٤٥٦ ２０２６ ⅫⅣ ½ ²³",
    "whitespace": "a    b\t\t c  \n\n   \n d   \u00a0e\u3000f \u2003g   \r\n\r\n  h\u200bi \u2028j  ",
    "newlines": "\n\nline one\nline two\r\nline three\r\r\n\n\n   \n\tindented\n",
    "leading_trailing_space": "   leading and trailing   ",
    "combining": "e\u0301 nai\u0308ve Z\u0324\u0354\u0367\u0311\u0313 a\u0301\u0302\u0303 \u0301alone",
    "controls": "tab\tnul\x00bell\x07 fs\x1cgs\x1drs\x1eus\x1f esc\x1b[31m del\x7f",
    "symbols": "!!! ??? ... --- === +++ *** ### @@@ ~~~ ``` ''' \"\"\" <<>> [[ ]] {{ }} ⟨⟩ → ⇒ ∀∃ ∑ ≤≥ © ® ™ € £ ¥",
    "cyrillic_greek": "Съешь же ещё этих мягких французских булок. Ελληνικά κείμενα ΑΒΓ αβγ",
    "specials_inline": "<|im_user|>user<|im_middle|>Hi there<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "specials_reserved": "[BOS]text[EOS] <|reserved_token_{r}|>x <|im_end <|im_end|>|> [PAD][UNK]",
    "unreachable_tokens": " larder unreachable 東京都 xyzzy🙂🙃 Larder",
    "long_digit_run": "1234567890" * 2600 + " tail",
    "long_split_mixed": "x" * 10 + " " + "9" * 25_003 + "\n",
}


def python_pieces(text):
    return regex.findall(KIMI_PAT_STR, text, flags=regex.V1)


def train_ranks():
    """Byte-level BPE: ranks 0..255 are the bytes, then NUM_MERGES merges by count."""
    rng = random.Random(0)
    words = []
    for _ in range(6000):
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
        words.append((" " if rng.random() < 0.7 else "") + (w.capitalize() if rng.random() < 0.2 else w))
    corpus = "".join(TRAINING_TEXT) * 8 + "".join(words)
    counts = collections.Counter(p.encode("utf-8") for p in python_pieces(corpus))
    vocab = [[bytes([b]) for b in w] for w in counts]
    freq = list(counts.values())
    ranks = {bytes([b]): b for b in range(256)}
    for _ in range(NUM_MERGES):
        pairs = collections.Counter()
        for parts, f in zip(vocab, freq):
            for a, b in zip(parts, parts[1:]):
                pairs[(a, b)] += f
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + b
        if merged not in ranks:
            ranks[merged] = len(ranks)
        for parts in vocab:
            i = 0
            while i < len(parts) - 1:
                if parts[i] == a and parts[i + 1] == b:
                    parts[i : i + 2] = [merged]
                i += 1
    for extra in [" larder", "unreachable", "東京都", "xyzzy", "🙂🙃", " Larder"]:
        ranks.setdefault(extra.encode("utf-8"), len(ranks))
    return ranks


def kimi_runs(text):
    """Kimi's split before tiktoken: 400k-char chunks, then runs of at most 25k
    whitespace or non-whitespace characters (str.isspace)."""
    for start in range(0, len(text), MAX_ENCODE_CHARS):
        chunk = text[start : start + MAX_ENCODE_CHARS]
        run_len, run_is_space, begin = 0, chunk[0].isspace() if chunk else False, 0
        for i, ch in enumerate(chunk):
            if ch.isspace() != run_is_space:
                run_len, run_is_space = 1, ch.isspace()
            else:
                run_len += 1
                if run_len > MAX_RUN_CHARS:
                    yield chunk[begin:i]
                    begin, run_len = i, 1
        yield chunk[begin:]


def encode(enc, text):
    return [t for run in kimi_runs(text) for t in enc.encode(run, allowed_special="all")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    assert tiktoken.__version__ == TIKTOKEN_VERSION, tiktoken.__version__

    ranks = train_ranks()
    n = len(ranks)
    names = {n + off: name for off, name in NAMED_SPECIALS.items()}
    specials = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + NUM_RESERVED_SPECIAL_TOKENS + 2)}
    enc = tiktoken.Encoding(name="tiktoken.model", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens=specials)

    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    (out / "tiktoken.model").write_text("\n".join(lines) + "\n")
    added = {
        str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        for i, name in sorted(names.items())
    }
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    cases = []
    for name, text in CASES.items():
        text = text.replace("{r}", str(n + 100))
        ids = encode(enc, text)
        assert enc.decode(ids) == text, name
        short = len(text) < 1000
        cuts = sorted({1, len(ids) // 3, len(ids) // 2, len(ids) - 1} & set(range(1, len(ids)))) if short else []
        cases.append({
            "name": name,
            "text": text,
            "ids": ids,
            "split_changes_ids": ids != enc.encode(text, allowed_special="all"),
            "decoded_prefixes": [[k, enc.decode(ids[:k])] for k in cuts],
        })
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "東京の天気は？ It's 25°C — say 👍"},
    ]
    rendered = "".join(
        {"system": "<|im_system|>", "user": "<|im_user|>"}.get(m["role"], "<|im_assistant|>")
        + m["role"] + "<|im_middle|>" + m["content"] + "<|im_end|>"
        for m in messages
    ) + "<|im_assistant|>assistant<|im_middle|>"
    reference = {
        "tiktoken_version": TIKTOKEN_VERSION,
        "num_base_tokens": n,
        "n_vocab": enc.n_vocab,
        "special_tokens": {name: i for name, i in specials.items() if i in names},
        "cases": cases,
        "chat_messages": messages,
        "chat_rendered": rendered,
        "chat_ids": encode(enc, rendered),
    }
    (out / "reference.json").write_text(json.dumps(reference, ensure_ascii=False) + "\n")
    print(f"{n} ranks, n_vocab {enc.n_vocab}, {len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
