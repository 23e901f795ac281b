"""Kimi Linear with attention-residual blocks (K3 extension, `n_layers_per_attn_res_block`): fixture generator.

Writes fixtures/kimi_linear_attn_res/ (config.json, model.safetensors, reference.json, reference.safetensors) in
the format of the other kimi_linear fixtures (scripts/gen_fixtures.py, scripts/fixtures_kimi_linear.py), so
crates/larder-model/tests/kimi_linear_attn_res.rs checks it with the same helpers.

No model class in transformers 5.24.0 combines Kimi Linear with attention residuals, so the reference is a
composite: transformers' `KimiLinearForCausalLM` (KDA + MLA mixers, dense first layer, group-routed MoE with a
shared expert) whose decoder-layer and model forwards are replaced by inkling2's block-attention-residual order
of operations, with real `Inkling2BlockAttentionResidual` module instances (1 query each, random non-zero
queries; inkling2's `_init_weights` zeros them, which would make every softmax uniform). Which lines mirror
which reference lines (transformers 5.24.0 `models/inkling2/modeling_inkling2.py`):

  * `attn_res_layer_forward` mirrors `Inkling2SlidingDecoderLayer.forward` (lines 891-915) with Kimi Linear's
    mixer call (`KimiLinearDecoderLayer.forward`, modeling_kimi_linear.py lines 813-829) in place of inkling2's
    `self_attn`, and without inkling2's `post_attention_convolution` / `post_mlp_convolution` (kimi_linear has
    none). Its 1-query `attention_input` is the sliding layer's form (line 867); inkling2's full-attention layers
    use 3 queries because their attention takes separate q/k/v inputs, which Kimi Linear's MLA and KDA do not.
  * `attn_res_model_forward` mirrors `Inkling2TextModel.forward` lines 1420-1438 (`block_states`, the append of
    the layer input at `is_block_boundary` after the layer ran, `final_input` before the final norm) around
    `KimiLinearModel.forward`'s embeddings, cache and masks (modeling_kimi_linear.py lines 907-931).
  * `attach_attn_res` builds the modules as `Inkling2SlidingDecoderLayer.__init__` (lines 866-868) and
    `Inkling2TextModel.__init__` (line 1369) do, under inkling2's tensor names
    (`model.layers.{i}.attention_input.query`, `model.layers.{i}.mlp_input.query`, `model.final_input.query`),
    shipped in f32 as inkling2's `_keep_in_fp32_modules_strict` keeps them.

The reference is computed from the saved folder: transformers loads the Kimi Linear part (the query tensors are
unexpected keys to it), the queries are then read from model.safetensors and checked bit for bit against the
generating model. Run with the fixture venv (transformers 5.24.0, torch CPU, one thread, f32):
    /work/venv-fixtures/bin/python scripts/fixtures_k3_attn_res.py
"""

import json
import os
import types

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask, create_recurrent_attention_mask
from transformers.modeling_outputs import MoeModelOutputWithPast
from transformers.models.inkling2.modeling_inkling2 import Inkling2BlockAttentionResidual

import fixtures_kimi_linear as kimi_linear
import gen_fixtures as gen

NAME = "kimi_linear_attn_res"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", NAME)
BLOCK = 2  # n_layers_per_attn_res_block: boundaries at layers 0, 2, 4, 6 of 7
QUERY_STD = 1.5  # depth-attention logits ~ N(0, QUERY_STD^2): softmax weights neither uniform nor one-hot
QUERY_PATTERNS = [r"model\.layers\.\d+\.(attention_input|mlp_input)\.query", r"model\.final_input\.query"]


def spec():
    # KDA 1-3, MLA 4, KDA 5-7 (1-based); 1 dense layer then MoE (4 groups of 2, top-3 from 2 groups, 1 shared).
    linear = dict(kda_layers=[1, 2, 3, 5, 6, 7], full_attn_layers=[4], num_heads=2, head_dim=16, short_conv_kernel_size=4)
    cfg = kimi_linear.kimi_linear_config(
        linear,
        first_k_dense_replace=1,
        vocab_size=256,
        hidden_size=48,
        intermediate_size=64,
        num_local_experts=8,
        num_experts_per_tok=3,
        n_group=4,
        topk_group=2,
    )
    return dict(cls=kimi_linear.KimiLinearForCausalLM, config=cfg, dtype="bfloat16", seed=8300, prompt_len=11, keep_f32=QUERY_PATTERNS)


def attach_attn_res(model, block):
    """inkling2's modules on a KimiLinearForCausalLM (zero queries), its forwards patched (module doc)."""
    inner = model.model
    for i, layer in enumerate(inner.layers):
        layer.is_block_boundary = i % block == 0  # inkling2 line 866
        layer.attention_input = Inkling2BlockAttentionResidual(model.config) if i > 0 else None  # line 867 (1 query)
        layer.mlp_input = Inkling2BlockAttentionResidual(model.config)  # line 868
        layer.forward = types.MethodType(attn_res_layer_forward, layer)
    inner.final_input = Inkling2BlockAttentionResidual(model.config)  # line 1369
    inner.forward = types.MethodType(attn_res_model_forward, inner)


@torch.no_grad()
def set_queries_(model, g):
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("_input.query"):
            p.copy_(QUERY_STD * torch.randn(tuple(p.shape), generator=g))


def attn_res_layer_forward(self, hidden_states, block_states, attention_mask=None, position_ids=None, cache=None, use_cache=False, **kwargs):
    dtype = hidden_states.dtype
    block_residual = hidden_states  # inkling2 lines 891-894
    if self.attention_input is not None:
        hidden_states = self.attention_input(block_states, hidden_states)[0]
    hidden_states = self.input_layernorm(hidden_states)  # kimi_linear lines 813-829 (the mixer)
    if self.block_type == "linear_attention":
        hidden_states = self.self_attn(hidden_states=hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    else:
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
    residual = hidden_states = hidden_states.float()  # inkling2 lines 906-915 (no post-attention/MLP convolutions)
    if self.is_block_boundary:
        block_states = torch.cat([block_states, block_residual.unsqueeze(-2)], dim=-2)
    else:
        residual = hidden_states = block_residual.float() + hidden_states
    hidden_states = self.mlp_input(block_states, hidden_states)[0]
    hidden_states = self.mlp(self.post_attention_layernorm(hidden_states).to(dtype))
    return (residual + hidden_states).to(dtype)


def attn_res_model_forward(
    self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None, use_cache=None, **kwargs
):
    assert self.config._attn_implementation == "eager", "inkling2 runs its attention residuals eagerly only"
    kwargs.pop("output_router_logits", None)
    if inputs_embeds is None:  # kimi_linear lines 907-931
        inputs_embeds = self.embed_tokens(input_ids)
    if use_cache and cache is None:
        cache = DynamicCache(config=self.config)
    if position_ids is None:
        past_seen_tokens = cache.get_seq_length() if cache is not None else 0
        position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens).unsqueeze(0)
    mask_kwargs = dict(
        config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, cache=cache, position_ids=position_ids
    )
    masks = {
        "full_attention": create_causal_mask(**mask_kwargs),
        "linear_attention": create_recurrent_attention_mask(**mask_kwargs),
    }
    hidden_states = inputs_embeds  # inkling2 lines 1420-1438
    block_states = inputs_embeds.new_zeros(*inputs_embeds.shape[:-1], 0, inputs_embeds.shape[-1])
    for i, decoder_layer in enumerate(self.layers[: self.config.num_hidden_layers]):
        new_hidden_states = decoder_layer(
            hidden_states,
            block_states,
            attention_mask=masks[self.config.layer_types[i]],
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
        if decoder_layer.is_block_boundary:
            block_states = torch.cat([block_states, hidden_states.unsqueeze(-2)], dim=-2)
        hidden_states = new_hidden_states
    hidden_states = self.final_input(block_states, hidden_states)[0]
    hidden_states = self.norm(hidden_states)
    return MoeModelOutputWithPast(last_hidden_state=hidden_states, cache=cache)


def save(sp, model, folder):
    """gen_fixtures' save (bf16 weights, f32 queries, Moonshot's layout) plus the K3 field in config.json."""
    gen.save_fixture(sp, model, folder, None)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["n_layers_per_attn_res_block"] = BLOCK
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def load_reference(folder, model_mem):
    """The composite rebuilt from the saved folder; every tensor must equal the generating model's."""
    ref = gen.load_reference_model(folder)
    attach_attn_res(ref, BLOCK)
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f, torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("_input.query"):
                t = f.get_tensor(name)
                assert t.dtype == torch.float32, (name, t.dtype)
                p.copy_(t)
    sd_mem, sd_ref = model_mem.state_dict(), ref.state_dict()
    assert set(sd_mem) == set(sd_ref)
    for k in sd_mem:
        assert torch.equal(sd_mem[k], sd_ref[k]), k
    return ref


@torch.no_grad()
def plain_distance(ref, prompt, logits):
    """max |logits - the same weights without attention residuals|: the extension must matter."""
    ids = torch.tensor([prompt], dtype=torch.long)
    plain = gen.load_reference_model(OUT)
    return float((plain(input_ids=ids, use_cache=False).logits[0].float() - logits).abs().max())


def generate():
    sp = spec()
    seed = sp["seed"]
    for _ in range(gen.MAX_SEED_TRIES):
        prompt = gen.make_prompt(sp, seed, None)
        model = gen.build_model(sp, seed)
        attach_attn_res(model, BLOCK)
        set_queries_(model, torch.Generator().manual_seed(seed + 1))
        model.eval()
        save(sp, model, OUT)
        ref = load_reference(OUT, model)
        ev = gen.evaluate(sp, ref, prompt)
        why = gen.acceptable(sp, ev, prompt)
        if not why:
            break
        gen.log(f"  [{NAME}] seed {seed} rejected: {'; '.join(why)}")
        seed += 1
    else:
        raise SystemExit(f"{NAME}: no acceptable seed")
    kimi_linear.check_reference_path()
    return sp, seed, prompt, ev, ref


def main():
    torch.set_num_threads(1)
    sp, seed, prompt, ev, ref = generate()
    folder = OUT
    logits = ev["logits"].contiguous()
    save_file({"logits": logits, **ev["extra_tensors"]}, os.path.join(folder, "reference.safetensors"), metadata={"format": "pt"})
    ref_json = {
        "generator": {"transformers": gen.transformers.__version__, "torch": torch.__version__, "seed": seed},
        "reference": "KimiLinearForCausalLM with inkling2's block attention residuals (scripts/fixtures_k3_attn_res.py)",
        "n_layers_per_attn_res_block": BLOCK,
        "prompt_ids": prompt,
        "logit_positions": list(range(len(prompt))),
        "greedy_ids": ev["greedy"],
        "greedy_ids_no_cache": ev["greedy_nocache"],
        "greedy_min_margin": ev["margin"],
        "routing": {str(l): r["indices"].tolist() for l, r in ev["routing"].items()},
        "routing_weights": {str(l): r["weights"].tolist() for l, r in ev["routing"].items()},
        "plain_kimi_linear_max_abs_diff": plain_distance(ref, prompt, logits),
        **ev["extra_stats"],
    }
    gen.write_json_lines(os.path.join(folder, "reference.json"), ref_json)
    gen.log(f"{NAME}: seed {seed}, {gen.dir_size(folder)} bytes; {json.dumps(ev['extra_stats'])}")
    gen.log(f"  attention residuals move the logits by {ref_json['plain_kimi_linear_max_abs_diff']:.3f}")


if __name__ == "__main__":
    main()
