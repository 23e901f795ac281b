"""Model-level reference for three K3 gate extensions on a Kimi Linear model.

Writes fixtures/kimi_linear_k3_gates/ (config.json, model.safetensors, reference.json, reference.safetensors): a
tiny transformers 5.24.0 `KimiLinearForCausalLM` (KDA layers before and after an MLA layer, a dense first layer,
shared expert, group routing) with the three extensions installed on its module instances, each computed by the
public reference code that defines it:

  * lower-bounded KDA forget gate: every `self_attn.forget_gate` is replaced by a `Glm5NextTextForgetGate`
    (models/glm5_next/modeling_glm5_next.py, `lower_bound * sigmoid(exp(A_log) * (f_b(f_a x) + dt_bias))`) built
    from a glm5_next config with `linear_attn_config.gate_lower_bound`, the config field larder reads;
  * full-rank KDA output gate: `g_b_proj(g_a_proj(x))` becomes one `[H*D, hidden]` projection, exactly
    `BailingHybridDeltaAttention`'s `output_gate = self.g_proj(hidden_states)` into the same gated o_norm
    (models/bailing_hybrid/modeling_bailing_hybrid.py lines 784-785): `g_a_proj` is set to Identity and `g_b_proj`
    to a full-rank Linear, saved as `self_attn.g_proj.weight`;
  * MLA head-wise output gate: `BailingHybridAttention`'s `gate = sigmoid(g_proj(x).float());
    attn_output = attn_output * gate.unsqueeze(-1)` before o_proj (lines 417-418), installed as a pre-hook on
    the MLA layer's `o_proj` (its input is the attention output `[batch, seq, heads * v_head_dim]`) with the
    layer's input captured by a pre-hook on the attention module; `self_attn.g_proj.weight` is `[heads, hidden]`.

Weights are rounded to bf16 (A_log, dt_bias, router correction bias stay f32), saved in bf16 in Moonshot's layout
(scripts/fixtures_kimi_linear.py `to_hub_layout`), and the reference is the f32 forward of the rounded model:
one-pass logits (transformers' chunked KDA) and token-by-token logits through its cache (recurrent KDA).

Run once with the fixture venv (transformers 5.24.0 + torch, CPU):
    /work/venv-fixtures/bin/python scripts/fixtures_k3_gates.py
"""

import json
import math
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextForgetGate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures_kimi_linear as kimi_linear  # noqa: E402
import gen_fixtures  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "kimi_linear_k3_gates"
LOWER_BOUND = -3.0
SEED = 8300
PROMPT_LEN = 11
KEEP_F32 = (".A_log", ".dt_bias", ".e_score_correction_bias")


def base_config():
    linear = dict(kda_layers=[1, 2, 4, 5], full_attn_layers=[3], num_heads=2, head_dim=16, short_conv_kernel_size=4)
    return kimi_linear.kimi_linear_config(linear, first_k_dense_replace=1, hidden_size=48)


@torch.no_grad()
def install_extensions(model, g):
    """Installs the three extensions (module doc) on `model`'s layer instances; returns the hook handles."""
    cfg = model.config
    hidden, heads = cfg.hidden_size, cfg.num_attention_heads
    glm5 = Glm5NextTextConfig(
        hidden_size=hidden,
        linear_attn_config={
            "num_heads": cfg.linear_num_heads,
            "head_dim": cfg.linear_head_dim,
            "gate_lower_bound": LOWER_BOUND,
        },
    )
    assert glm5.linear_lower_bound == LOWER_BOUND
    hooks = []
    for layer in model.model.layers:
        attn = layer.self_attn
        if hasattr(attn, "forget_gate"):
            old = attn.forget_gate
            gate = Glm5NextTextForgetGate(glm5).float()
            gate.f_a_proj.weight.copy_(old.f_a_proj.weight)
            gate.f_b_proj.weight.copy_(old.f_b_proj.weight)
            gate.dt_bias.copy_(old.dt_bias)
            gate.A_log.copy_(old.A_log.view(-1))
            attn.forget_gate = gate
            qkv = attn.g_b_proj.weight.shape[0]
            attn.g_a_proj = nn.Identity()
            attn.g_b_proj = nn.Linear(hidden, qkv, bias=False)
            attn.g_b_proj.weight.copy_(torch.randn(qkv, hidden, generator=g) / hidden**0.5)
        else:
            attn.g_proj = nn.Linear(hidden, heads, bias=False)
            attn.g_proj.weight.copy_(2.0 * torch.randn(heads, hidden, generator=g) / hidden**0.5)
            hooks += mla_output_gate(attn, heads)
    return hooks


def mla_output_gate(attn, heads):
    """BailingHybridAttention's head-wise output gate (module doc) as two hooks on a kimi_linear MLA module."""
    seen = {}

    def capture(_module, args, kwargs):
        seen["x"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

    def gate_output(_module, args):
        attn_output = args[0]
        batch, seq, width = attn_output.shape
        gate = torch.sigmoid(attn.g_proj(seen["x"]).float()).to(attn_output.dtype)
        gated = attn_output.view(batch, seq, heads, width // heads) * gate.unsqueeze(-1)
        return (gated.reshape(batch, seq, width),)

    return [
        attn.register_forward_pre_hook(capture, with_kwargs=True),
        attn.o_proj.register_forward_pre_hook(gate_output),
    ]


@torch.no_grad()
def round_to_bf16_(model):
    for name, p in model.named_parameters():
        if not name.endswith(KEEP_F32):
            p.copy_(p.to(torch.bfloat16).float())


def save_checkpoint(model, config):
    """Saves in Moonshot's layout, renames the full-rank KDA gate to `g_proj`, ships weights in bf16 and writes
    the extension fields into config.json."""
    if OUT.exists():
        shutil.rmtree(OUT)
    model.save_pretrained(OUT)
    kimi_linear.to_hub_layout(str(OUT), config)
    path = OUT / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    out = {}
    for name, t in tensors.items():
        if name.endswith("self_attn.g_b_proj.weight"):
            name = name.replace("g_b_proj", "g_proj")
        out[name] = t if name.endswith(KEEP_F32) else t.to(torch.bfloat16)
    assert not any("forget_gate" in n for n in out), sorted(out)
    save_file(out, str(path), metadata={"format": "pt"})
    cfg_path = OUT / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["linear_attn_config"]["gate_lower_bound"] = LOWER_BOUND
    cfg["linear_attn_config"]["use_full_rank_gate"] = True
    cfg["mla_use_output_gate"] = True
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return sorted(out)


@torch.no_grad()
def main():
    torch.set_num_threads(1)
    kimi_linear.check_reference_path()
    torch.manual_seed(SEED)
    config = base_config()
    model = transformers.KimiLinearForCausalLM(config).float().eval()
    gen_fixtures.reinit_(model, SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    hooks = install_extensions(model, g)
    round_to_bf16_(model)
    names = save_checkpoint(model, config)
    prompt = torch.randint(3, config.vocab_size, (PROMPT_LEN,), generator=g).tolist()
    # gen_fixtures' evaluation (logits, DeepSeek-canonical routing, greedy with and without cache via generate,
    # kimi_linear's token-by-token logits and gate statistics), on the model with the extensions installed.
    ev = gen_fixtures.evaluate(None, model, prompt)
    assert not ev["extra_why"], ev["extra_why"]
    assert ev["margin"] > gen_fixtures.GREEDY_MARGIN_MIN, ev["margin"]
    assert ev["greedy"] == ev["greedy_nocache"] == ev["greedy_manual"][: len(ev["greedy"])]
    stats = ev["extra_stats"]
    assert stats["decay_quantiles"][0] > math.exp(LOWER_BOUND) - 1e-6, stats
    for h in hooks:
        h.remove()
    without_mla_gate = model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float()
    save_file(
        {"logits": ev["logits"].contiguous(), **ev["extra_tensors"]},
        str(OUT / "reference.safetensors"),
        metadata={"format": "pt"},
    )
    doc = {
        "generator": {
            "script": "scripts/fixtures_k3_gates.py",
            "reference": "transformers kimi_linear with glm5_next's forget gate and bailing_hybrid's output gates",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "seed": SEED,
        },
        "prompt_ids": prompt,
        "logit_positions": list(range(len(prompt))),
        "greedy_ids": ev["greedy"],
        "greedy_ids_no_cache": ev["greedy_nocache"],
        "greedy_min_margin": ev["margin"],
        "routing": {str(k): v["indices"].tolist() for k, v in sorted(ev["routing"].items())},
        "routing_weights": {str(k): v["weights"].float().tolist() for k, v in sorted(ev["routing"].items())},
        "mla_output_gate_changes_logits_by": float((without_mla_gate - ev["logits"]).abs().max()),
        **stats,
    }
    (OUT / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k not in ("routing", "routing_weights")}, indent=1))
    print(f"{len(names)} tensors")


if __name__ == "__main__":
    main()
