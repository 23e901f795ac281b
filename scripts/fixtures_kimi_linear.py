"""Kimi Linear (`model_type: kimi_linear`, KDA + MLA hybrid) fixtures for scripts/gen_fixtures.py.

This module owns what is specific to Kimi Linear; gen_fixtures.py owns the generic pipeline (seeded re-init,
save, reload in f32, logits, routing via router hooks, greedy with / without cache, seed acceptance):

  * the fixture specs (`SPECS`) and the Hub tensor-name patterns (`NAME_PATTERNS`);
  * `reinit_gates_`: KDA forget-gate parameters (`A_log`, `dt_bias`) drawn so that the per-step decays exp(g) are
    spread over (0, 1) instead of the generic init's values;
  * `to_hub_layout`: turns transformers' save into the layout Moonshot's checkpoints ship (see docs/kimi_linear.md):
    dense-MLP tensors under `mlp.` (transformers 5.24.0 writes them under `block_sparse_moe.`, which it reads back
    but no real checkpoint uses) and config.json with `linear_attn_config` / `first_k_dense_replace` /
    `moe_layer_freq` / `mla_use_nope` / `moe_router_activation_func` and without transformers' derived fields
    (`layer_types`, `mlp_layer_types`, `linear_*`, `qk_head_dim`, `head_dim`), so the reference model is loaded from
    exactly what larder reads;
  * `kda_reference`: the extra KDA references computed on the reloaded f32 model: logits fed token by token through
    transformers' cache (recurrent KDA form, `logits_token_by_token`), their distance to the one-pass logits
    (chunked KDA form), and the spread of the forget-gate decays and betas (a seed is rejected if gates are
    degenerate).

The reference code path is transformers 5.24.0's pure-torch KDA (`chunk_kimi_delta_attention` for multi-token
forwards, `recurrent_kimi_delta_attention` for cached single-token steps, `causal_conv1d_fn` / `_update`), on CPU
in f32; no fla / causal-conv1d kernel is installed, so the hub-kernel decorators fall back to these functions
(checked by `check_reference_path`).
"""

import importlib.util
import json
import math
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import KimiLinearConfig, KimiLinearForCausalLM

LAYER = r"model\.layers\.\d+\."
ATTN = LAYER + r"self_attn\."
MOE = LAYER + r"block_sparse_moe\."
NAME_PATTERNS = [
    r"(model\.embed_tokens\.weight|model\.norm\.weight|lm_head\.weight)",
    LAYER + r"(input_layernorm|post_attention_layernorm)\.weight",
    LAYER + r"mlp\.(gate_proj|up_proj|down_proj)\.weight",
    # KDA mixer
    ATTN + r"(q_proj|k_proj|v_proj|f_a_proj|f_b_proj|b_proj|g_a_proj|g_b_proj|o_proj)\.weight",
    ATTN + r"(q_conv1d|k_conv1d|v_conv1d)\.weight",
    ATTN + r"(A_log|dt_bias|o_norm\.weight)",
    # MLA mixer
    ATTN + r"(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)\.weight",
    ATTN + r"(q_a_layernorm|kv_a_layernorm)\.weight",
    # MoE
    MOE + r"experts\.\d+\.(w1|w2|w3)\.weight",
    MOE + r"shared_experts\.(gate_proj|up_proj|down_proj)\.weight",
    MOE + r"gate\.(weight|e_score_correction_bias)",
]

# Fields transformers 5.24.0 derives in KimiLinearConfig.__post_init__ and writes to config.json; Moonshot's
# checkpoints do not have them (they give linear_attn_config, first_k_dense_replace instead).
DERIVED_FIELDS = (
    "layer_types",
    "mlp_layer_types",
    "linear_head_dim",
    "linear_num_heads",
    "linear_conv_kernel_dim",
    "qk_head_dim",
    "head_dim",
)
# The derived fields that define the layer layout: reloading the Hub-form config.json must give the same values.
LAYOUT_FIELDS = DERIVED_FIELDS[:5]

# Per-step decay exp(g) and beta spread a seed must reach (fractions over every KDA layer, position and channel).
DECAY_LOW, DECAY_HIGH, DECAY_MIN_FRACTION = 0.5, 0.9, 0.05


def kimi_linear_config(linear, first_k_dense_replace, **kw):
    """A KimiLinearConfig built from the Hub-style fields (linear_attn_config with 1-based layer lists)."""
    base = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=16,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_local_experts=12,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.446,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=12,
        rms_norm_eps=1e-5,
        model_max_length=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    base.update(kw)
    n_layers = len(linear["kda_layers"]) + len(linear["full_attn_layers"])
    return KimiLinearConfig(
        num_hidden_layers=n_layers,
        linear_attn_config=dict(linear),
        first_k_dense_replace=first_k_dense_replace,
        # Hub fields transformers 5.24.0 keeps but does not use (it always computes these values): see
        # docs/kimi_linear.md "Fields transformers ignores".
        moe_layer_freq=1,
        mla_use_nope=True,
        moe_router_activation_func="sigmoid",
        **base,
    )


def spec_kimi_linear_tiny():
    # 3 KDA layers, an MLA layer, 2 KDA layers; KDA head_dim 16 x 3 heads (48 != hidden 64, 64 / 3 not integral);
    # q_lora_rank null (as Kimi-Linear-48B); 4 groups of 3 experts, top-4 from 2 groups; 1 dense layer.
    linear = dict(kda_layers=[1, 2, 3, 5, 6], full_attn_layers=[4], num_heads=3, head_dim=16, short_conv_kernel_size=4)
    cfg = kimi_linear_config(linear, first_k_dense_replace=1)
    return dict(cls=KimiLinearForCausalLM, config=cfg, dtype="bfloat16", seed=8000, prompt_len=13)


def spec_kimi_linear_mla_first():
    # MLA layers first and in the middle (1-based 1 and 4), KDA head_dim 32 x 2 heads (= hidden / heads), conv
    # kernel 3, low-rank q (q_lora_rank 48), 2 dense layers, one expert group, no renormalisation, 2 shared experts,
    # tensors transformers keeps in f32 (`_keep_in_fp32_modules_strict` + A_log) shipped in f32 beside bf16 weights,
    # and a 70-token prompt: transformers' chunked KDA runs 2 chunks of 64 (chunk-boundary arithmetic).
    linear = dict(kda_layers=[2, 3, 5], full_attn_layers=[1, 4], num_heads=2, head_dim=32, short_conv_kernel_size=3)
    cfg = kimi_linear_config(
        linear,
        first_k_dense_replace=2,
        q_lora_rank=48,
        num_local_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=2,
        norm_topk_prob=False,
        routed_scaling_factor=1.75,
    )
    keep_f32 = [r".*\.A_log", r".*\.dt_bias", r".*\.gate\.weight", r".*\.e_score_correction_bias"]
    return dict(
        cls=KimiLinearForCausalLM, config=cfg, dtype="bfloat16", seed=8100, prompt_len=70, keep_f32=keep_f32
    )


SPECS = {
    "kimi_linear_tiny": spec_kimi_linear_tiny,
    "kimi_linear_mla_first": spec_kimi_linear_mla_first,
}


@torch.no_grad()
def reinit_gates_(model, g):
    """KDA forget gate: A_log = log(a), a ~ U(0.5, 4) per head; dt_bias ~ N(-2, 0.5^2) per channel.

    With f_b_proj(f_a_proj(x)) ~ N(0, 1) the per-step log decay -a * softplus(f + dt_bias) mostly lies in about
    [-3, -0.01], i.e. decays exp(g) between ~0.05 and ~0.99 (the spread is measured and checked per seed)."""
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("forget_gate.A_log"):
            a = 0.5 + 3.5 * torch.rand(tuple(p.shape), generator=g)
            p.copy_(torch.log(a))
        elif name.endswith("forget_gate.dt_bias"):
            p.copy_(-2.0 + 0.5 * torch.randn(tuple(p.shape), generator=g))


def keep_f32_tensors(model, patterns):
    """The parameters and buffers a spec ships in f32 (name full-matches a regex in `patterns`), by name."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return {n: t for n, t in named if any(re.fullmatch(p, n) for p in patterns)}


def to_hub_layout(folder, config):
    """Rewrites transformers' save into Moonshot's layout (module doc); the caller reloads from it."""
    path = os.path.join(folder, "model.safetensors")
    with safe_open(path, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    out = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if len(parts) > 3 and parts[1] == "layers" and parts[3] == "block_sparse_moe":
            layer = int(parts[2])
            if config.mlp_layer_types[layer] == "dense":
                name = name.replace(".block_sparse_moe.", ".mlp.")
        out[name] = t.contiguous()
    save_file(out, path, metadata={"format": "pt"})
    cfg_path = os.path.join(folder, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    for key in DERIVED_FIELDS:
        cfg.pop(key, None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def check_hub_config(config, reloaded):
    """The Hub-form config.json must give transformers the same layer layout as the config it was built from."""
    for key in LAYOUT_FIELDS:
        assert getattr(reloaded, key) == getattr(config, key), (key, getattr(reloaded, key), getattr(config, key))


def check_reference_path():
    """transformers' KDA and conv functions fall back to its pure-torch code only when neither the original packages
    (`fla`, `causal_conv1d`) nor hub `kernels` can be imported (integrations/hub_kernels.py,
    use_kernel_func_from_hub_with_fallback): refuse to produce a reference if any is installed."""
    for package in ("fla", "causal_conv1d", "kernels"):
        assert importlib.util.find_spec(package) is None, f"{package} is installed: the reference would not be torch"


@torch.no_grad()
def token_by_token_logits(model, ids):
    """Logits of `ids` ([1, T]) fed one token per forward through transformers' cache: the first token runs the
    prefill path (chunked KDA on one token), every later one `recurrent_kimi_delta_attention` +
    `causal_conv1d_update` (the recurrent form)."""
    cache = None
    rows = []
    for t in range(ids.shape[1]):
        out = model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = out.cache
        rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


@torch.no_grad()
def gate_statistics(model, ids):
    """Decays exp(g) and betas of every KDA layer over a one-pass forward."""
    decays, betas, hooks = [], [], []
    for name, mod in model.named_modules():
        if name.endswith("self_attn.forget_gate"):
            hooks.append(mod.register_forward_hook(lambda _m, _i, out: decays.append(out.exp().flatten())))
        elif name.endswith("self_attn.b_proj"):
            hooks.append(mod.register_forward_hook(lambda _m, _i, out: betas.append(torch.sigmoid(out).flatten())))
    try:
        model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    d, b = torch.cat(decays), torch.cat(betas)
    q = torch.tensor([0.0, 0.05, 0.5, 0.95, 1.0])
    return dict(
        decay_quantiles=[float(x) for x in torch.quantile(d, q)],
        decay_below_low=float((d < DECAY_LOW).float().mean()),
        decay_above_high=float((d > DECAY_HIGH).float().mean()),
        beta_quantiles=[float(x) for x in torch.quantile(b, q)],
    )


@torch.no_grad()
def kda_reference(model, prompt):
    """Extra references and acceptance diagnostics for a kimi_linear fixture (see module doc)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    one_pass = model(input_ids=ids, use_cache=False).logits[0].float()
    tbt = token_by_token_logits(model, ids)
    stats = gate_statistics(model, ids)
    stats["token_by_token_max_abs_diff"] = float((tbt - one_pass).abs().max())
    stats["token_by_token_greedy_agrees"] = bool(torch.equal(tbt.argmax(-1), one_pass.argmax(-1)))
    why = []
    if stats["decay_below_low"] < DECAY_MIN_FRACTION or stats["decay_above_high"] < DECAY_MIN_FRACTION:
        why.append(f"forget-gate decays not spread {stats['decay_quantiles']}")
    if not math.isfinite(stats["token_by_token_max_abs_diff"]) or stats["token_by_token_max_abs_diff"] > 1e-4:
        why.append(f"token-by-token logits differ by {stats['token_by_token_max_abs_diff']:.2e}")
    return dict(logits_token_by_token=tbt.contiguous()), stats, why


# --------------------------------------------------------------------------------------------------------------
# An independent, token-sequential forward written from docs/kimi_linear.md (no transformers code): it reads the
# fixture folder as larder does (config.json Hub fields + model.safetensors) and must reproduce transformers'
# logits within 1e-4, its routing and its greedy ids. It is the executable form of the spec the Rust code follows.
# --------------------------------------------------------------------------------------------------------------


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def l2_normalize(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def softplus_capped(x):
    return torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x)))


def swiglu(w, prefix, x, names=("gate_proj", "up_proj", "down_proj")):
    gate, up, down = (w[f"{prefix}.{n}.weight"] for n in names)
    return down @ (torch.nn.functional.silu(gate @ x) * (up @ x))


class SpecModel:
    """Kimi Linear, one token at a time, f32; `state` is per sequence (conv windows, recurrent states, MLA latents)."""

    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = cfg = json.load(f)
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            self.w = {k: f.get_tensor(k).float() for k in f.keys()}
        lin = cfg["linear_attn_config"]
        n = cfg["num_hidden_layers"]
        kda, full = set(lin["kda_layers"]), set(lin["full_attn_layers"])  # 1-based
        assert kda.isdisjoint(full) and kda | full == set(range(1, n + 1)), "linear_attn_config layer lists"
        assert cfg.get("mla_use_nope", True) and cfg.get("moe_layer_freq", 1) == 1
        assert cfg.get("moe_router_activation_func", "sigmoid") == "sigmoid"
        self.kinds = ["kda" if i + 1 in kda else "mla" for i in range(n)]
        self.dense = [i < cfg.get("first_k_dense_replace", 1) for i in range(n)]
        self.heads, self.head_dim, self.kernel = lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"]
        self.eps = cfg["rms_norm_eps"]

    def new_state(self):
        qkv = 3 * self.heads * self.head_dim
        state = []
        for kind in self.kinds:
            if kind == "kda":
                window = torch.zeros(qkv, self.kernel - 1)
                state.append(dict(window=window, s=torch.zeros(self.heads, self.head_dim, self.head_dim)))
            else:
                state.append(dict(latents=[], k_rot=[]))
        return state

    def kda(self, p, x, st):
        w, H, D = self.w, self.heads, self.head_dim
        mixed = torch.cat([w[f"{p}.{n}_proj.weight"] @ x for n in "qkv"])
        conv_w = torch.cat([w[f"{p}.{n}_conv1d.weight"][:, 0, :] for n in "qkv"])  # [3HD, K]
        window = torch.cat([st["window"], mixed[:, None]], dim=1)  # [3HD, K]: oldest .. current
        st["window"] = window[:, 1:]
        conv = torch.nn.functional.silu((conv_w * window).sum(-1))
        q, k, v = (t.view(H, D) for t in conv.split(H * D))
        q = l2_normalize(q) * D**-0.5
        k = l2_normalize(k)
        f = w[f"{p}.f_b_proj.weight"] @ (w[f"{p}.f_a_proj.weight"] @ x)
        g = -torch.exp(w[f"{p}.A_log"].view(H, 1)) * softplus_capped((f + w[f"{p}.dt_bias"]).view(H, D))
        beta = torch.sigmoid(w[f"{p}.b_proj.weight"] @ x)
        s = st["s"] * torch.exp(g)[:, :, None]  # decay first: rows are key channels
        delta = (v - (s * k[:, :, None]).sum(1)) * beta[:, None]
        s = s + k[:, :, None] * delta[:, None, :]
        st["s"] = s
        o = (s * q[:, :, None]).sum(1)  # [H, Dv]
        gate = (w[f"{p}.g_b_proj.weight"] @ (w[f"{p}.g_a_proj.weight"] @ x)).view(H, D)
        o = rms_norm(o, w[f"{p}.o_norm.weight"], self.eps) * torch.sigmoid(gate)
        return w[f"{p}.o_proj.weight"] @ o.reshape(-1)

    def mla(self, p, x, st):
        w, c = self.w, self.cfg
        heads, nope, rope, vd, rank = (
            c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        )
        if c.get("q_lora_rank") is None:
            q = w[f"{p}.q_proj.weight"] @ x
        else:
            qa = rms_norm(w[f"{p}.q_a_proj.weight"] @ x, w[f"{p}.q_a_layernorm.weight"], 1e-6)
            q = w[f"{p}.q_b_proj.weight"] @ qa
        q = q.view(heads, nope + rope)
        kv = w[f"{p}.kv_a_proj_with_mqa.weight"] @ x
        st["latents"].append(rms_norm(kv[:rank], w[f"{p}.kv_a_layernorm.weight"], 1e-6))
        st["k_rot"].append(kv[rank:])
        kvb = (torch.stack(st["latents"]) @ w[f"{p}.kv_b_proj.weight"].T).view(-1, heads, nope + vd)
        k_rot = torch.stack(st["k_rot"])[:, None, :].expand(-1, heads, rope)
        keys = torch.cat([kvb[..., :nope], k_rot], dim=-1)  # [T, heads, nope + rope], no RoPE anywhere
        scores = torch.einsum("hd,thd->ht", q, keys) * (nope + rope) ** -0.5
        out = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), kvb[..., nope:])
        return w[f"{p}.o_proj.weight"] @ out.reshape(-1)

    def moe(self, p, x):
        w, c = self.w, self.cfg
        scores = torch.sigmoid(w[f"{p}.gate.weight"] @ x)
        biased = scores + w[f"{p}.gate.e_score_correction_bias"]
        n, groups = scores.shape[0], c["num_expert_group"]
        group_scores = biased.view(groups, n // groups).topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros(groups, dtype=torch.bool)
        keep[torch.topk(group_scores, c["topk_group"])[1]] = True
        eligible = biased.masked_fill(~keep.repeat_interleave(n // groups), float("-inf"))
        chosen = torch.topk(eligible, c["num_experts_per_token"])[1].tolist()
        chosen.sort(key=lambda e: (-float(eligible[e]), e))  # canonical order
        weights = scores[chosen]
        if c["moe_renormalize"]:
            weights = weights / (weights.sum() + 1e-20)
        weights = weights * c["routed_scaling_factor"]
        # (Kimi K3's latent experts, SiTU and attention residuals: scripts/fixtures_kimi_k3.py.)
        out = torch.zeros_like(x)
        for e, wt in zip(chosen, weights):
            out = out + wt * swiglu(w, f"{p}.experts.{e}", x, ("w1", "w3", "w2"))
        return out + swiglu(w, f"{p}.shared_experts", x), chosen

    def step(self, token, state):
        """One token through every layer; returns (logits [vocab], {layer: canonical expert ids})."""
        w, eps = self.w, self.eps
        h = w["model.embed_tokens.weight"][token]
        routing = {}
        for i, kind in enumerate(self.kinds):
            p = f"model.layers.{i}"
            x = rms_norm(h, w[f"{p}.input_layernorm.weight"], eps)
            mixer = self.kda if kind == "kda" else self.mla
            h = h + mixer(f"{p}.self_attn", x, state[i])
            x = rms_norm(h, w[f"{p}.post_attention_layernorm.weight"], eps)
            if self.dense[i]:
                h = h + swiglu(w, f"{p}.mlp", x)
            else:
                y, routing[i] = self.moe(f"{p}.block_sparse_moe", x)
                h = h + y
        h = rms_norm(h, w["model.norm.weight"], eps)
        return w["lm_head.weight"] @ h, routing


@torch.no_grad()
def spec_check(folder, prompt, logits, routing, greedy_ids, token_by_token):
    """Runs SpecModel on the saved fixture; returns its distances to transformers' references (asserts exactness
    of routing and greedy ids)."""
    model = SpecModel(folder)
    state = model.new_state()
    rows = []
    for t, token in enumerate(prompt):
        row, route = model.step(token, state)
        rows.append(row)
        for layer, ids in route.items():
            assert ids == routing[layer]["indices"][t].tolist(), (layer, t, ids)
    spec_logits = torch.stack(rows)
    new = []
    for step in range(len(greedy_ids)):
        new.append(int(torch.argmax(rows[-1])))
        if step + 1 < len(greedy_ids):
            rows.append(model.step(new[-1], state)[0])
    assert new == greedy_ids, (new, greedy_ids)
    return dict(
        spec_max_abs_diff=float((spec_logits - logits).abs().max()),
        spec_vs_token_by_token_max_abs_diff=float((spec_logits - token_by_token).abs().max()),
    )
