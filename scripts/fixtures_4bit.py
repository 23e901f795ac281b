"""4-bit expert fixtures: `gpt_oss_tiny` (MXFP4), `deepseek_v3_int4` (compressed-tensors pack-quantized INT4) and
`deepseek_v3_mxfp4` (compressed-tensors mxfp4-pack-quantized). Quantizers, checkpoint writers and independent
decoders; scripts/gen_fixtures.py owns the pipeline (seeded re-init, save, reload, reference logits, routing, greedy)
and calls `prepare` (in build_model) and `finish` (after the reference) through the spec's "quant" entry.

Regenerate: /work/venv-fixtures/bin/python scripts/gen_fixtures.py --only gpt_oss_tiny deepseek_v3_int4 deepseek_v3_mxfp4
(transformers 5.24.0, torch CPU one thread; the transformers cross-checks of the two compressed-tensors fixtures also
need compressed-tensors 0.20.1 with its deps loguru 0.7.3 and psutil 7.2.2 in the venv.)

Why every reference is exact: `prepare` rounds every non-expert parameter to bf16 and replaces every expert weight by
the exact dequantization of its 4-bit codes (fp4 value x 2^k, or int4 q x bf16 scale: at most 4 + 8 significant bits,
so exact in f32). The model is then saved in f32 (all values exactly representable), reloaded by transformers in f32,
and the reference logits are computed from those values; only then does `finish` rewrite model.safetensors in the
shipped format (bf16 + 4-bit), asserting value by value that (a) every bf16 tensor converts exactly and (b) the 4-bit
codes decode (by the numpy decoders below, written from the format definitions, reading the saved bytes) to exactly
the f32 weights the reference computed with.

Format facts (checked against the reference code named; each is asserted by `finish`):

MXFP4, gpt-oss (transformers 5.24.0 integrations/mxfp4.py, `_convert_moe_packed_tensors`, `Mxfp4GptOssExperts`):
  * tensors per MoE layer: `model.layers.N.mlp.experts.gate_up_proj_blocks` u8 [E, 2I, H/32, 16],
    `..._scales` u8 [E, 2I, H/32], `..._bias` bf16 [E, 2I]; `down_proj_blocks` u8 [E, H, I/32, 16],
    `down_proj_scales` u8 [E, H, I/32], `down_proj_bias` bf16 [E, H]. Blocks are stored [out, in] (row = output
    unit); transformers computes `x @ W` with W = dequant(blocks).transpose(1, 2), i.e. [E, in, out].
  * byte j of a 32-value block holds element 2j in its LOW nibble and element 2j+1 in its HIGH nibble;
  * a nibble is e2m1: bit 3 sign, bits 0-2 index into [0, 0.5, 1, 1.5, 2, 3, 4, 6] (so 0x8 is -0.0);
  * a scale byte s is e8m0: the block's values are multiplied by 2^(s - 127) (`torch.ldexp(lut, s - 127)`);
  * gate_up rows interleave: row 2i is gate unit i, row 2i+1 is up unit i (`gate_up[..., ::2]`, `[..., 1::2]`);
    the GLU is gate' = min(gate, limit), up' = clamp(up, -limit, limit), (up' + 1) * gate' * sigmoid(1.702 gate'),
    biases are added before the clamp; routing is top-k over (x W_r^T + b_r), softmax over the k chosen logits.
MXFP4, compressed-tensors 0.20.1 `mxfp4-pack-quantized` (compressors/mxfp4/base.py, nvfp4/helpers.py, mx_utils.py):
  per expert projection `weight_packed` u8 [out, in/2] (same nibble order and e2m1 codes as above: byte k holds
  column 2k low, 2k+1 high) and `weight_scale` u8 [out, in/32] e8m0 (2^(s-127)); no weight_shape; group 32.
INT4, compressed-tensors 0.20.1 `pack-quantized` (compressors/pack_quantized/helpers.py `pack_to_int32`):
  per expert projection `weight_packed` i32 [out, in/8], `weight_scale` bf16 [out, in/32], `weight_shape` i32 [2]
  = [out, in]; column c is nibble (c % 8) of word c // 8, at bits 4*(c % 8) (little end first); a nibble u holds
  q = u - 8 (offset binary, q in [-8, 7]); the weight is q * scale[row, c // 32] (symmetric, no zero point). Groups
  must divide `in` (compressed-tensors raises "tensor column shape must be divisble by the given group_size"), so
  there is no ragged-group case. Note: compressed-tensors itself dequantizes as `q.to(scale.dtype) * scale`, i.e.
  rounds q * scale to bf16; this fixture's reference is the exact product (finish() records how far apart the two
  are in reference.json: `ct_bf16_dequant_*`).
"""

import json
import os
import re

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import save_file

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
E2M1_MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
GROUP = 32
SCALE_SPREAD = 2  # per-block magnitudes multiplied by 2^U{-2..2} before quantization: scales vary per block

# Real config.json of https://huggingface.co/openai/gpt-oss-20b (its key set; tiny values are put in below)
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}
GPT_OSS_ROPE = {k: v for k, v in GPT_OSS_20B["rope_scaling"].items()} | {"rope_theta": 150000.0}

# Kimi-K2-Thinking's quantization_config (compressed-tensors pack-quantized INT4, group 32, experts only)
KIMI_K2_THINKING_QCONFIG = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
# The K3 form: the same ignore list, MXFP4 weights (compressed-tensors' MXFP4A16 preset as it serialises it)
K3_MXFP4_QCONFIG = {
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "float",
                "symmetric": True,
                "group_size": 32,
                "strategy": "group",
                "dynamic": False,
                "scale_dtype": "torch.uint8",
            },
            "input_activations": None,
            "output_activations": None,
            "format": "mxfp4-pack-quantized",
        }
    },
    "format": "mxfp4-pack-quantized",
    "ignore": KIMI_K2_THINKING_QCONFIG["ignore"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}


# ------------------------------------------------------------------------------------------------------------------
# quantizers (torch, exact dequantization)
# ------------------------------------------------------------------------------------------------------------------


def spread_blocks(w, g):
    """Multiplies each 32-column block of a 2-D weight by 2^U{-SCALE_SPREAD..SCALE_SPREAD} (exact)."""
    rows, cols = w.shape
    k = torch.randint(-SCALE_SPREAD, SCALE_SPREAD + 1, (rows, cols // GROUP, 1), generator=g).float()
    return (w.view(rows, cols // GROUP, GROUP) * torch.exp2(k)).view(rows, cols)


def mxfp4_quantize(w):
    """2-D f32 [rows, cols] -> (nibbles u8 [rows, cols], e8m0 u8 [rows, cols/32], dequantized f32).
    Shared exponent floor(log2(amax)) - 2 (OCP MX), magnitudes to the nearest e2m1 value (ties down), saturating at 6;
    the sign bit is kept for values that round to zero (code 0x8, -0.0)."""
    rows, cols = w.shape
    blocks = w.view(rows, cols // GROUP, GROUP)
    amax = blocks.abs().amax(-1)
    assert bool((amax > 0).all())
    exp = torch.floor(torch.log2(amax)).to(torch.int32) - 2
    assert bool((exp > -127).all() and (exp < 128).all())
    x = blocks / torch.exp2(exp.float()).unsqueeze(-1)  # exact: power-of-two division
    mag = x.abs()
    idx = torch.zeros_like(mag, dtype=torch.uint8)
    for mid in E2M1_MIDPOINTS:
        idx += (mag > mid).to(torch.uint8)
    codes = idx | (torch.signbit(x).to(torch.uint8) << 3)
    lut = torch.tensor(E2M1, dtype=torch.float32)
    deq = torch.ldexp(lut[codes.long()], exp.unsqueeze(-1)).view(rows, cols)
    return codes.view(rows, cols), (exp + 127).to(torch.uint8), deq


def int4_quantize(w):
    """2-D f32 [rows, cols] -> (q int8 [rows, cols] in [-8, 7], scale bf16 [rows, cols/32], dequantized f32).
    Symmetric min-max as compressed-tensors' observer: scale = bf16(amax / 7.5), q = clamp(round(w / scale), -8, 7);
    dequantized = q * scale computed exactly in f32."""
    rows, cols = w.shape
    blocks = w.view(rows, cols // GROUP, GROUP)
    scale = (blocks.abs().amax(-1) / 7.5).to(torch.bfloat16)
    assert bool((scale.float() > 0).all())
    s = scale.float().unsqueeze(-1)
    q = torch.clamp(torch.round(blocks / s), -8, 7)
    deq = (q * s).view(rows, cols)
    assert torch.equal(deq.double(), (q.double() * s.double()).view(rows, cols)), "int4 dequantization not exact in f32"
    return q.to(torch.int8).view(rows, cols), scale, deq


def pack_nibbles_u8(codes):
    """[..., cols] nibbles -> [..., cols/2] bytes, element 2k in the low nibble, 2k+1 in the high nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def pack_int4_i32(q):
    """[rows, cols] int8 in [-8, 7] -> [rows, cols/8] int32: column c is bits 4*(c%8).. of word c//8, value q + 8."""
    rows, cols = q.shape
    u = (q.to(torch.int64) + 8).view(rows, cols // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    words = (u << shifts).sum(-1)  # < 2^32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


# ------------------------------------------------------------------------------------------------------------------
# independent numpy decoders (from the format definitions; they read the saved bytes)
# ------------------------------------------------------------------------------------------------------------------


def np_e2m1(nibbles):
    mags = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
    v = mags[nibbles & 7]
    return np.where(nibbles & 8, -v, v).astype(np.float32)


def np_unpack_u8(packed):
    """bytes [..., n] -> nibbles [..., 2n], low nibble first."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def np_mxfp4_rows(packed_rows, scales):
    """packed [rows, cols/2] u8 + e8m0 [rows, cols/32] -> f32 [rows, cols]."""
    vals = np_e2m1(np_unpack_u8(packed_rows))
    rows, cols = vals.shape
    factor = np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)
    return (vals.reshape(rows, cols // GROUP, GROUP) * factor[..., None]).reshape(rows, cols)


def np_bf16_to_f32(raw):
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def np_int4_rows(packed, scale_bf16_bits, shape):
    """i32 [rows, cols/8] + bf16 [rows, cols/32] (as raw uint16) + [rows, cols] -> f32 [rows, cols]."""
    rows, cols = (int(x) for x in shape)
    words = packed.view(np.uint32)
    nib = (words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    q = nib.reshape(rows, cols).astype(np.int32) - 8
    scale = np_bf16_to_f32(scale_bf16_bits)
    return (q.reshape(rows, cols // GROUP, GROUP).astype(np.float32) * scale[..., None]).reshape(rows, cols)


def raw_safetensors(path):
    """{name: (dtype string, numpy array of the raw little-endian bytes in that dtype)} read from the file itself."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    np_types = {"U8": np.uint8, "I32": np.int32, "BF16": np.uint16, "F32": np.float32, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=np.dtype(np_types[meta["dtype"]]).newbyteorder("<"))
        out[name] = (meta["dtype"], arr.reshape(meta["shape"]))
    return out


# ------------------------------------------------------------------------------------------------------------------
# prepare: bf16 spine + exactly dequantized experts in the f32 model (called by gen_fixtures.build_model)
# ------------------------------------------------------------------------------------------------------------------

EXPERT_PARAM = re.compile(r"(model\.layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)\Z")


@torch.no_grad()
def round_spine_bf16_(model):
    """Every parameter except the fused expert weights -> its bf16 value (buffers such as the router correction bias
    are already bf16-valued; rotary buffers stay f32)."""
    for name, p in model.named_parameters():
        if not EXPERT_PARAM.search(name):
            p.copy_(p.to(torch.bfloat16).float())


def quantize_2d(w, fmt, g):
    w = spread_blocks(w, g)
    if fmt == "int4":
        q, scale, deq = int4_quantize(w)
        return deq, dict(q=q, scale=scale)
    codes, e8m0, deq = mxfp4_quantize(w)
    return deq, dict(codes=codes, e8m0=e8m0)


@torch.no_grad()
def prepare_deepseek(model, seed, fmt):
    """DeepSeek-V3 per-expert projections [out, in] -> {hub name: quantized parts}; the model gets the dequantized
    values (transformers' fused gate_up_proj [E, 2I, H]: rows [:I] gate_proj, [I:] up_proj; down_proj [E, H, I])."""
    g = torch.Generator().manual_seed(seed + 4004)
    round_spine_bf16_(model)
    out = {}
    for name, p in model.named_parameters():
        m = EXPERT_PARAM.search(name)
        if not m:
            continue
        for e in range(p.shape[0]):
            if m.group(2) == "gate_up_proj":
                half = p.shape[1] // 2
                parts = (("gate_proj", slice(0, half)), ("up_proj", slice(half, None)))
            else:
                parts = (("down_proj", slice(None)),)
            for part, rows in parts:
                deq, packed = quantize_2d(p[e, rows].clone(), fmt, g)
                p[e, rows] = deq
                out[f"{m.group(1)}.experts.{e}.{part}"] = packed
    return out


@torch.no_grad()
def prepare_gpt_oss(model, seed):
    """gpt-oss: larger expert weights (so the swiglu clamp bites), non-zero router/expert biases and sinks, then the
    bf16 spine and MXFP4 experts. transformers holds experts as [E, in, out]; the Hub stores [E, out, in] blocks."""
    g = torch.Generator().manual_seed(seed + 4005)
    hidden = model.config.hidden_size
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("mlp.experts.gate_up_proj"):
            p.copy_(0.5 * torch.randn(tuple(p.shape), generator=g))
        elif name.endswith("mlp.experts.down_proj"):
            p.copy_(0.03 * torch.randn(tuple(p.shape), generator=g))
        elif name.endswith(("experts.gate_up_proj_bias", "experts.down_proj_bias")):
            p.copy_(0.5 * torch.randn(tuple(p.shape), generator=g))
        elif name.endswith("mlp.router.weight"):
            p.copy_((2.5 / hidden**0.5) * torch.randn(tuple(p.shape), generator=g))
        elif name.endswith("mlp.router.bias"):
            p.copy_(0.5 * torch.randn(tuple(p.shape), generator=g))
        elif name.endswith("self_attn.sinks"):
            p.copy_(1.0 * torch.randn(tuple(p.shape), generator=g))
    round_spine_bf16_(model)
    out = {}
    for name, p in model.named_parameters():
        m = EXPERT_PARAM.search(name)
        if not m:
            continue
        for e in range(p.shape[0]):
            deq, packed = quantize_2d(p[e].t().contiguous(), "mxfp4", g)
            p[e] = deq.t()
            out.setdefault(name, []).append(packed)
    return out


# ------------------------------------------------------------------------------------------------------------------
# finish: the shipped checkpoint, its independent decoding and the transformers cross-checks
# ------------------------------------------------------------------------------------------------------------------


def torch_dequant(packed):
    if "q" in packed:
        s = packed["scale"].float().repeat_interleave(GROUP, -1)
        return packed["q"].float() * s
    lut = torch.tensor(E2M1, dtype=torch.float32)
    exp = packed["e8m0"].to(torch.int32).repeat_interleave(GROUP, -1) - 127
    return torch.ldexp(lut[packed["codes"].long()], exp)


def stored_f32(folder):
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def bf16_exact(name, t):
    b = t.to(torch.bfloat16)
    assert torch.equal(b.float(), t), f"{name} is not bf16-valued"
    return b.contiguous()


def write_config(folder, update):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg = update(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return cfg


def write_deepseek(folder, quantized, fmt):
    """f32 save -> bf16 spine + compressed-tensors experts (per expert projection, Hub names)."""
    tensors = stored_f32(folder)
    out = {}
    for name, t in tensors.items():
        stem = name.removesuffix(".weight")
        if stem in quantized:
            packed = quantized[stem]
            assert torch.equal(torch_dequant(packed), t), name
            if fmt == "int4":
                out[stem + ".weight_packed"] = pack_int4_i32(packed["q"])
                out[stem + ".weight_scale"] = packed["scale"].contiguous()
                out[stem + ".weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int32)
            else:
                out[stem + ".weight_packed"] = pack_nibbles_u8(packed["codes"])
                out[stem + ".weight_scale"] = packed["e8m0"].contiguous()
        else:
            out[name] = bf16_exact(name, t)
    assert len(quantized) == sum(1 for k in out if k.endswith(".weight_packed"))
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    qcfg = KIMI_K2_THINKING_QCONFIG if fmt == "int4" else K3_MXFP4_QCONFIG
    write_config(folder, lambda c: {**c, "dtype": "bfloat16", "quantization_config": json.loads(json.dumps(qcfg))})


def check_deepseek_bytes(folder, ref, fmt):
    """Numpy decoding of the saved bytes == the reference model's f32 weights, every tensor."""
    raw = raw_safetensors(os.path.join(folder, "model.safetensors"))
    sd = {k: v.float() for k, v in ref.state_dict().items()}
    n_expert = 0
    for name, (dt, arr) in raw.items():
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight_packed", name)
        if m:
            stem = name.removesuffix(".weight_packed")
            fused = sd[f"{m.group(1)}.experts.{'down_proj' if m.group(3) == 'down_proj' else 'gate_up_proj'}"]
            want = fused[int(m.group(2))]
            if m.group(3) != "down_proj":
                half = want.shape[0] // 2
                want = want[:half] if m.group(3) == "gate_proj" else want[half:]
            if fmt == "int4":
                assert dt == "I32" and raw[stem + ".weight_scale"][0] == "BF16" and raw[stem + ".weight_shape"][0] == "I32"
                got = np_int4_rows(arr, raw[stem + ".weight_scale"][1], raw[stem + ".weight_shape"][1])
            else:
                assert dt == "U8" and raw[stem + ".weight_scale"][0] == "U8"
                got = np_mxfp4_rows(arr, raw[stem + ".weight_scale"][1])
            assert np.array_equal(got, want.numpy()), name
            n_expert += 1
        elif not name.endswith((".weight_scale", ".weight_shape")):
            assert dt == "BF16", (name, dt)
            assert np.array_equal(np_bf16_to_f32(arr), sd[name].numpy()), name
    return n_expert


def check_with_compressed_tensors(folder, quantized, fmt):
    """compressed-tensors 0.20.1's own unpackers read the saved tensors back to our codes; returns how far its bf16
    dequantization (q.to(bf16) * scale) is from the exact product (0 for mxfp4, whose products are powers of two
    times e2m1 values)."""
    from compressed_tensors.compressors.mx_utils import decompress_mx_scale
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    worst, differing, total = 0.0, 0, 0
    for stem, packed in quantized.items():
        exact = torch_dequant(packed)
        if fmt == "int4":
            shape = torch.Size(saved[stem + ".weight_shape"].tolist())
            q = unpack_from_int32(saved[stem + ".weight_packed"], 4, shape)
            assert torch.equal(q, packed["q"]), stem
            ct = (q.to(torch.bfloat16) * saved[stem + ".weight_scale"].repeat_interleave(GROUP, -1)).float()
        else:
            p = saved[stem + ".weight_packed"]
            vals = unpack_fp4_from_uint8(p, p.shape[0], p.shape[1] * 2, dtype=torch.float32)
            scale = decompress_mx_scale(saved[stem + ".weight_scale"]).float().repeat_interleave(GROUP, -1)
            ct = vals * scale
        worst = max(worst, float((ct - exact).abs().max()))
        differing += int((ct != exact).sum())
        total += exact.numel()
    return {"ct_bf16_dequant_max_abs_diff": worst, "ct_bf16_dequant_differing_fraction": differing / total}


@torch.no_grad()
def transformers_reload(folder, prompt, logits, quantization_config):
    """Loads the shipped folder with transformers (dequantizing on CPU), casts it to f32 (compressed-tensors
    dequantizes in the scale dtype, bf16) and returns (max |dlogit| against the reference, the model)."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(
        folder,
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
        quantization_config=quantization_config,
    ).eval()
    m = m.float()
    got = m(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float()
    return float((got - logits).abs().max()), m


def check_ct_experts(loaded, ref, fmt):
    """transformers + compressed-tensors' fused expert weights == our exact dequantization (mxfp4) or its bf16
    rounding (int4): so the layout (names, nibble order, gate/up split) is theirs, and any logit difference is the
    bf16 rounding of q * scale alone."""
    sd_ref = ref.state_dict()
    n = 0
    for name, t in loaded.state_dict().items():
        if EXPERT_PARAM.search(name):
            want = sd_ref[name].float()
            if fmt == "int4":
                want = want.to(torch.bfloat16).float()
            assert torch.equal(t.float(), want), name
            n += 1
    assert n > 0
    return n


def finish_deepseek(folder, spec, prompt, ev, ref, fmt):
    from transformers import CompressedTensorsConfig

    quantized = spec["quant_tensors"]
    write_deepseek(folder, quantized, fmt)
    stats = {"quantized_expert_projections": check_deepseek_bytes(folder, ref, fmt)}
    stats.update(check_with_compressed_tensors(folder, quantized, fmt))
    diff, loaded = transformers_reload(folder, prompt, ev["logits"], CompressedTensorsConfig(dequantize=True))
    check_ct_experts(loaded, ref, fmt)
    if fmt == "mxfp4":
        assert diff == 0.0, f"transformers + compressed-tensors differ from the reference: {diff}"
    stats["transformers_ct_reload_max_abs_diff"] = diff
    return stats


def gpt_oss_hub_config(config):
    """config.json with the real gpt-oss-20b key set and this model's values."""
    c = dict(GPT_OSS_20B)
    for k in ("head_dim", "hidden_size", "intermediate_size", "layer_types", "num_attention_heads",
              "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "num_local_experts",
              "sliding_window", "swiglu_limit", "vocab_size", "rms_norm_eps", "max_position_embeddings",
              "eos_token_id", "pad_token_id"):
        c[k] = getattr(config, k)
    c["experts_per_token"] = config.num_experts_per_tok
    rope = dict(config.rope_parameters)
    c["rope_theta"] = rope.pop("rope_theta")
    c["rope_scaling"] = rope
    c["transformers_version"] = GPT_OSS_20B["transformers_version"]
    assert set(c) == set(GPT_OSS_20B)
    return c


def write_gpt_oss(folder, quantized, config):
    tensors = stored_f32(folder)
    out = {}
    for name, t in tensors.items():
        if name in quantized:
            blocks, scales = [], []
            for e, packed in enumerate(quantized[name]):
                assert torch.equal(torch_dequant(packed).t(), t[e]), (name, e)
                rows, cols = packed["codes"].shape
                blocks.append(pack_nibbles_u8(packed["codes"]).view(rows, cols // GROUP, GROUP // 2))
                scales.append(packed["e8m0"])
            out[name + "_blocks"] = torch.stack(blocks).contiguous()
            out[name + "_scales"] = torch.stack(scales).contiguous()
        else:
            out[name] = bf16_exact(name, t)
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    write_config(folder, lambda _c: gpt_oss_hub_config(config))


def check_gpt_oss_bytes(folder, ref):
    raw = raw_safetensors(os.path.join(folder, "model.safetensors"))
    sd = {k: v.float() for k, v in ref.state_dict().items()}
    n = 0
    for name, (dt, arr) in raw.items():
        if name.endswith("_blocks"):
            stem = name.removesuffix("_blocks")
            sdt, scales = raw[stem + "_scales"]
            assert dt == "U8" and sdt == "U8" and arr.shape[:-1] == scales.shape and arr.shape[-1] == 16
            E, R, G, _ = arr.shape
            got = np.stack([np_mxfp4_rows(arr[e].reshape(R, G * 16), scales[e]) for e in range(E)])
            assert np.array_equal(got.transpose(0, 2, 1), sd[stem].numpy()), name
            n += E
        elif not name.endswith("_scales"):
            assert dt == "BF16", (name, dt)
            assert np.array_equal(np_bf16_to_f32(arr), sd[name].numpy()), name
    return n


@torch.no_grad()
def swiglu_clamp_fraction(model, prompt):
    """Fraction of routed (token, expert) gate / up pre-activations the swiglu limit clamps, over the prompt."""
    counts = dict(gate=0, up=0, n=0)
    originals = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        orig = experts._apply_gate

        def counting(gate_up, experts=experts, orig=orig):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            counts["gate"] += int((gate > experts.limit).sum())
            counts["up"] += int((up.abs() > experts.limit).sum())
            counts["n"] += gate.numel()
            return orig(gate_up)

        experts._apply_gate = counting
        originals.append((experts, orig))
    try:
        model(input_ids=torch.tensor([prompt]), use_cache=False)
    finally:
        for experts, orig in originals:
            experts._apply_gate = orig
    assert counts["n"] > 0
    return {"swiglu_gate_clamped_fraction": counts["gate"] / counts["n"],
            "swiglu_up_clamped_fraction": counts["up"] / counts["n"]}


def finish_gpt_oss(folder, spec, prompt, ev, ref):
    from transformers import Mxfp4Config

    write_gpt_oss(folder, spec["quant_tensors"], spec["config"])
    stats = {"quantized_experts": check_gpt_oss_bytes(folder, ref)}
    stats.update(swiglu_clamp_fraction(ref, prompt))
    diff, _ = transformers_reload(folder, prompt, ev["logits"], Mxfp4Config(dequantize=True))
    assert diff == 0.0, f"transformers' mxfp4 dequantization differs from the reference: {diff}"
    stats["transformers_mxfp4_reload_max_abs_diff"] = diff
    return stats


QUANT = {
    "gpt_oss": dict(prepare=prepare_gpt_oss, finish=finish_gpt_oss),
    "int4": dict(
        prepare=lambda model, seed: prepare_deepseek(model, seed, "int4"),
        finish=lambda *a: finish_deepseek(*a, "int4"),
    ),
    "mxfp4": dict(
        prepare=lambda model, seed: prepare_deepseek(model, seed, "mxfp4"),
        finish=lambda *a: finish_deepseek(*a, "mxfp4"),
    ),
}
