"""`gpt_oss_bf16`: the gpt-oss architecture with its experts unquantized, in the layout transformers saves (and
bf16 gpt-oss checkpoints ship) for an unquantized `GptOssForCausalLM`. scripts/gen_fixtures.py owns the pipeline
(seeded re-init, save, reload, reference logits, routing, greedy); this file holds the spec and the checks it runs
through the spec's "quant" entry (`prepare` in build_model, `finish` after the reference).

Regenerate: /work/venv-fixtures/bin/python scripts/gen_fixtures.py --only gpt_oss_bf16   (transformers 5.24.0)

The model is gpt_oss_tiny's (scripts/fixtures_4bit.py: 4 layers alternating sliding (window 4) / full attention,
hidden 64, 4 heads x 16, 2 KV heads, YaRN factor 32 as gpt-oss ships it, sinks, qkv/o biases, router and expert
biases, 12 experts top-4, swiglu_limit 7) with intermediate_size 32 instead of 64, so that the bf16 experts keep
the checkpoint under 1 MB. Parameters get gpt_oss_tiny's spreads (`fixtures_4bit.prepare_gpt_oss`: large expert
weights so the swiglu clamps bite, non-zero biases and sinks; its experts are then MXFP4-representable values,
which bf16 holds exactly), everything is saved in bf16, and the reference is the f32 forward of the reloaded model.

On-disk expert layout (transformers 5.24.0 models/gpt_oss/modeling_gpt_oss.py `GptOssExperts`; no conversion
mapping exists for gpt_oss, so the parameters are saved as they are held), per MoE layer N:
  * `model.layers.N.mlp.experts.gate_up_proj`      [E, H, 2I]  (x @ W[e]: input-major, i.e. transposed vs nn.Linear;
                                                     output column 2i is gate unit i, 2i+1 up unit i)
  * `model.layers.N.mlp.experts.gate_up_proj_bias` [E, 2I]     (same interleave)
  * `model.layers.N.mlp.experts.down_proj`         [E, I, H]   (act @ W[e])
  * `model.layers.N.mlp.experts.down_proj_bias`    [E, H]
`finish` asserts these names, shapes and dtypes, that they equal the reference model's parameters, and records the
fraction of gate / up pre-activations the swiglu limit clamps; config.json gets the real gpt-oss-20b key set with
this model's values and without `quantization_config` (an unquantized checkpoint has none).
"""

import os

import torch
from safetensors import safe_open
from transformers import GptOssConfig, GptOssForCausalLM

import fixtures_4bit as four_bit


def prepare(model, seed):
    four_bit.prepare_gpt_oss(model, seed)
    return {}


def hub_config(config):
    c = four_bit.gpt_oss_hub_config(config)
    del c["quantization_config"]
    return c


@torch.no_grad()
def finish(folder, spec, prompt, ev, ref):
    config = spec["config"]
    E, H, I = config.num_local_experts, config.hidden_size, config.intermediate_size
    shapes = {"gate_up_proj": (E, H, 2 * I), "gate_up_proj_bias": (E, 2 * I), "down_proj": (E, I, H),
              "down_proj_bias": (E, H)}
    sd = ref.state_dict()
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        names = set(f.keys())
        for layer in range(config.num_hidden_layers):
            for part, shape in shapes.items():
                name = f"model.layers.{layer}.mlp.experts.{part}"
                t = f.get_tensor(name)
                assert t.dtype == torch.bfloat16 and tuple(t.shape) == shape, (name, t.dtype, t.shape)
                assert torch.equal(t.float(), sd[name].float()), name
                names.discard(name)
    assert not any(".experts." in n for n in names), sorted(n for n in names if ".experts." in n)
    four_bit.write_config(folder, lambda _c: hub_config(config))
    stats = {"experts": "bf16, unquantized (gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H], biases)"}
    stats.update(four_bit.swiglu_clamp_fraction(ref, prompt))
    return stats


def spec_gpt_oss_bf16():
    rope = dict(four_bit.GPT_OSS_ROPE)
    cfg = GptOssConfig(
        vocab_size=512, hidden_size=64, intermediate_size=32, head_dim=16, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=4, num_local_experts=12, num_experts_per_tok=4,
        layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=4, swiglu_limit=7.0,
        rms_norm_eps=1e-5, max_position_embeddings=131072, rope_parameters=rope, attention_bias=True,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=2, pad_token_id=0,
    )
    return dict(
        cls=GptOssForCausalLM, config=cfg, dtype="bfloat16", seed=9100, prompt_len=12,
        quant=dict(prepare=prepare, finish=finish),
    )


SPECS = {"gpt_oss_bf16": spec_gpt_oss_bf16}
