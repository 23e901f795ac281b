#!/usr/bin/env python3
"""Writes the hand-made seed corpus of larder's fuzz targets (fuzz/corpus/<target>/).

Real files come from fixtures/ (config.json, tokenizer_config.json, the
safetensors headers and index of the tiny checkpoints, with their data cut
down to a few bytes); edge cases are written here. Re-run after a format
change; libFuzzer adds what it finds next to these. The real route traces
(fuzz/corpus/trace/real_*, synth_*) are recorded by larder itself; see
trace() for the commands.
"""
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"
FIX = ROOT / "fixtures"
SEP = b"\n\0FILE\0\n"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def st(tensors, data_len=None, raw_header=None):
    """A safetensors file: {name: (dtype, shape, nbytes)} laid out back to back."""
    header, off = {}, 0
    for name, (dtype, shape, n) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    body = bytes((i * 7) & 0xFF for i in range(off if data_len is None else data_len))
    return struct.pack("<Q", len(h)) + h + body


def real_header(path, keep=64):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[: 8 + n + keep]


def checkpoint():
    t = "checkpoint"
    put(t, "single_f32", b"\0" + st({"a": ("F32", [4], 16), "b": ("BF16", [2, 2], 8)}))
    put(t, "fp8_with_scale", b"\0" + st({"w": ("F8_E4M3", [2, 4], 8), "w_scale_inv": ("F32", [1, 1], 4)}))
    put(t, "metadata", b"\0" + st({}, raw_header=b'{"__metadata__":{"format":"pt"},"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}', data_len=2))
    put(t, "lying_offsets", b"\0" + st({}, raw_header=b'{"x":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}}', data_len=4))
    put(t, "huge_shape", b"\0" + st({}, raw_header=b'{"x":{"dtype":"BF16","shape":[9223372036854775807,2],"data_offsets":[0,0]}}', data_len=0))
    put(t, "zero_shape", b"\0" + st({}, raw_header=b'{"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"y":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', data_len=4))
    put(t, "huge_header_len", b"\0" + struct.pack("<Q", 1 << 62) + b"{}")
    put(t, "empty", b"\0")
    put(t, "real_qwen3_moe_tiny_cut", b"\0" + real_header(FIX / "qwen3_moe_tiny" / "model.safetensors"))
    put(t, "real_deepseek_v3_fp8_cut", b"\0" + real_header(FIX / "deepseek_v3_fp8" / "model.safetensors"))
    index = (FIX / "qwen3_moe_tok" / "model.safetensors.index.json").read_bytes()
    put(t, "real_index_cut_shards", b"\1" + index + SEP + st({"a": ("F32", [1], 4)}) + SEP + st({"b": ("BF16", [2], 4)}))
    small_index = json.dumps({"metadata": {"total_size": 8}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}).encode()
    put(t, "small_index", b"\1" + small_index + SEP + st({"a": ("F32", [1], 4)}) + SEP + st({"b": ("BF16", [2], 4)}))
    put(t, "index_escapes", b"\1" + b'{"weight_map":{"a":"../model.safetensors","b":".","c":""}}')
    put(t, "index_duplicate_tensor", b"\1" + small_index + SEP + st({"a": ("F32", [1], 4)}) + SEP + st({"a": ("F32", [1], 4)}))
    put(t, "no_index_two_files", b"\2" + st({"a": ("F16", [3], 6)}) + SEP + st({"b": ("I64", [1], 8)}))


def config():
    for p in sorted(FIX.glob("*/config.json")):
        put("config", p.parent.name, p.read_bytes())
    base = json.loads((FIX / "qwen3_moe_tiny" / "config.json").read_text())
    edge = {
        "zero_heads": {"num_attention_heads": 0},
        "huge_layers": {"num_hidden_layers": 1 << 62},
        "huge_experts": {"num_experts": 1 << 62, "num_experts_per_tok": 1 << 62},
        "odd_head_dim": {"head_dim": 3},
        "negative": {"hidden_size": -1},
        "float_sizes": {"hidden_size": 64.5},
        "null_rope": {"rope_scaling": None, "rope_theta": 0},
        "yarn": {"rope_scaling": {"type": "yarn", "factor": 0, "original_max_position_embeddings": 0}},
        "bad_act": {"hidden_act": "gelu"},
    }
    for name, patch in edge.items():
        put("config", "edge_" + name, json.dumps({**base, **patch}))
    kimi = json.loads((FIX / "kimi_linear_tiny" / "config.json").read_text())
    kda = {
        # Aborted the recorded load (doctor, plan, pack) before issue 37's fix.
        "regress_kda_huge_conv_kernel": {"short_conv_kernel_size": 1 << 31},
        "edge_kda_huge_heads": {"num_heads": 1 << 31, "head_dim": 1 << 16},
    }
    for name, patch in kda.items():
        put("config", name, json.dumps({**kimi, "linear_attn_config": {**kimi["linear_attn_config"], **patch}}))
    put("config", "edge_not_json", "{")
    put("config", "edge_no_model_type", "{}")
    put("config", "edge_unknown_arch", '{"model_type":"gpt2"}')


def trace():
    """Hand-made route traces (JSON Lines: a header, then one token a line).

    The real ones were recorded with (from the repository root):
      larder run --model fixtures/M --ids 1,200,31,7,9 --max-new 4 --ignore-eos \\
        --trace fuzz/corpus/trace/real_M    (M: qwen3_moe_tiny, deepseek_v3_tiny, kimi_linear_tiny)
      larder trace synth --model fixtures/qwen3_moe_tiny --routing mixed --tokens 6 \\
        --out fuzz/corpus/trace/synth_qwen3_moe_tiny_mixed
    """
    def header(**patch):
        h = {"larder_trace": 1, "model": "m", "experts": 8, "top_k": 2, "moe_layers": [1, 2],
             "expert_bytes": [4096, 4096], "lookahead": 0}
        return json.dumps({**h, **patch})

    def token(pos, routes, phase="decode", pass_=None, **extra):
        return json.dumps({"seq": 0, "pos": pos, "phase": phase, "pass": pos if pass_ is None else pass_,
                           "routes": routes, **extra})

    tokens = [token(0, [[0, 1], [2, 3]], "prompt", 0), token(1, [[1, 2], [3, 4]], "prompt", 0),
              token(2, [[0, 1], [5, 6]]), token(3, [[7, 1], [2, 3]])]
    edge = {
        # Aborted `trace stats` (a counter per claimed expert) before issue 37's fix.
        "regress_huge_experts": [header(experts=1 << 40)] + tokens,
        "edge_max_experts": [header(experts=1 << 31), token(0, [[2147483647, 0], [1 << 30, 5]])],
        "edge_huge_expert_bytes": [header(expert_bytes=[1 << 40, 18446744073709551615])] + tokens,
        "edge_lookahead": [header(lookahead=1), token(0, [[0, 1], [2, 3]], predicted=[[[], [2, 7]]]),
                           token(1, [[4, 1], [2, 6]], predicted=[[[], [6, 1]]])],
        "edge_passes_backwards": [header(), token(0, [[0, 1], [2, 3]], pass_=3), token(1, [[0, 1], [2, 3]], pass_=2)],
        "edge_bad_routes": [header(), token(0, [[0, 0], [9, 3]]), token(1, [[0, 1, 2], [3]])],
        "edge_header_only": [header(moe_layers=list(range(64)), expert_bytes=[1] * 64, lookahead=64)],
        "edge_not_json": ["{", "x"],
    }
    for name, lines in edge.items():
        put("trace", name, "\n".join(lines) + "\n")
    put("trace", "edge_empty", "")


def manifest():
    digest = "xxh3-128:" + "0" * 32
    m = {
        "format": "larder-store", "version": 2, "store_id": "0123456789abcdef", "model_type": "qwen3_moe",
        "source": {"config_digest": digest, "files": [{"name": "model.safetensors", "size": 1, "header_digest": digest}]},
        "files": [{"name": "config.json", "size": 2, "digest": digest}],
        "spine": [{"file": "spine.safetensors", "size": 100, "header_digest": digest, "tensors": [
            {"name": "model.norm.weight", "dtype": "BF16", "shape": [4], "offset": 8, "len": 8, "digest": digest}]}],
        "drives": [{"path": "drive-0", "gbps": 1.0}],
        "layers": [{"layer": 1, "parts": [
            {"role": "gate", "dtype": "BF16", "shape": [2, 4], "offset": 0, "len": 16},
            {"role": "up", "dtype": "BF16", "shape": [2, 4], "offset": 16, "len": 16}],
            "experts": [
                {"expert": 0, "drive": 0, "file": "larder-0123456789abcdef/layer-001.experts", "offset": 0, "len": 4096, "digest": digest},
                {"expert": 1, "drive": 0, "file": "larder-0123456789abcdef/layer-001.experts", "offset": 4096, "len": 4096, "digest": digest}]}],
        "digest": digest,
    }
    put("manifest", "plausible", json.dumps(m, indent=1))
    # Regression seeds: a huge layer number crashed Manifest::index (fixed in 951a2c8).
    for name, patch in {
        "huge_layer": {"layers": [{**m["layers"][0], "layer": 1 << 63}]},
        "max_layer": {"layers": [{**m["layers"][0], "layer": 18446744073709551615}]},
    }.items():
        put("manifest", "regress_" + name, json.dumps({**m, **patch}))
    for name, patch in {
        "expert_out_of_range": {"layers": [{**m["layers"][0], "experts": [{**m["layers"][0]["experts"][0], "expert": 7}]}]},
        "overflowing_extent": {"layers": [{**m["layers"][0], "experts": [{**m["layers"][0]["experts"][0], "offset": 18446744073709551615}]}]},
        "no_drive": {"drives": []},
        "absolute_drive": {"drives": [{"path": "/", "gbps": 1.0}]},
        "escaping_file": {"layers": [{**m["layers"][0], "experts": [{**m["layers"][0]["experts"][0], "file": "../x"}]}]},
        "old_version": {"version": 1},
    }.items():
        put("manifest", name, json.dumps({**m, **patch}))
    put("manifest", "not_json", "{\"format\":")


def request():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    chat = {
        "basic": {"model": "larder", "messages": msgs},
        "full": {"model": "larder", "messages": msgs, "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 4, "seed": 1,
                 "stop": ["x", "y"], "stream": True, "stream_options": {"include_usage": True}, "n": 1, "user": "u",
                 "frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "ignore_eos": True, "max_completion_tokens": 5},
        "parts": {"model": "larder", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
        "refused": {"model": "larder", "messages": msgs, "tools": [], "logit_bias": {"1": 2}, "n": 2},
        "wrong_types": {"model": 3, "messages": "hi", "max_tokens": -1, "temperature": "hot", "seed": 1e300, "stop": [1]},
        "nan_like": {"model": "larder", "messages": msgs, "temperature": 1e309, "top_p": -0.0, "max_tokens": 18446744073709551615},
    }
    for name, body in chat.items():
        put("request", "chat_" + name, b"\0" + json.dumps(body).encode())
    comp = {
        "text": {"model": "larder", "prompt": "hello"},
        "ids": {"model": "larder", "prompt": [1, 2, 3], "max_tokens": 2, "echo": False},
        "list": {"model": "larder", "prompt": ["a"]},
        "bad_ids": {"model": "larder", "prompt": [-1, 4294967296, 1.5]},
        "unknown": {"model": "larder", "prompt": "x", "suffix": "y", "best_of": 2, "zzz": 1},
    }
    for name, body in comp.items():
        put("request", "completion_" + name, b"\1" + json.dumps(body).encode())
    put("request", "not_utf8", b"\0{\"model\":\"\xff\"}")
    put("request", "deep", b"\1" + b"[" * 200 + b"]" * 200)


def chat_template():
    put("chat_template", "messages", b"\x80system\0be brief\0user\0hi\0assistant\0<think>\nx\n</think>\n\nok\0user\0again")
    put("chat_template", "messages_odd_roles", b"\0tool\0{{ raise }}\0\0\0user")
    for p in sorted(FIX.glob("*/tokenizer_config.json")):
        put("chat_template", "config_" + p.parent.name, b"\1" + p.read_bytes())
    put("chat_template", "config_named_list", b"\1" + json.dumps({"chat_template": [{"name": "default", "template": "{{ messages[0].content }}"}],
                                                                   "bos_token": {"content": "<s>"}, "eos_token": 3}).encode())
    jinja = {
        "loop": "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
        "raise": "{{ raise_exception('no system role') }}",
        "pycompat": "{{ messages[0].content.strip().startswith('b') }}{{ strftime_now('%d %b %Y %A %%') }}{{ messages | length }}",
        "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "big_range": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "string_repeat": "{{ 'x' * 1000000000 }}",
        "syntax_error": "{% for %}",
    }
    for name, src in jinja.items():
        put("chat_template", "jinja_" + name, b"\2" + src.encode())


def sse():
    # libFuzzer's arbitrary input: any bytes decode; a few shapes to start from.
    put("sse", "empty", b"")
    put("sse", "text", b"\1\1\0\0\0\5" + b"\1hello\n\ndata: [DONE]\r\n" * 4)
    put("sse", "mixed", bytes(range(256)))


if __name__ == "__main__":
    checkpoint()
    config()
    trace()
    manifest()
    request()
    chat_template()
    sse()
