"""Kimi Linear with latent-space experts (K3 extension): the `kimi_linear_latent` fixture.

No model class computes Kimi Linear with latent-space experts, so the reference is a composite of two transformers
5.24.0 models, patched as little as possible:

  * everything but the MoE blocks is `KimiLinearForCausalLM` (models/kimi_linear/modeling_kimi_linear.py): KDA and
    MLA mixers, dense first layer, DeepSeek-style router with groups and correction bias, Kimi's SwiGLU experts
    (`KimiLinearExperts`, `w1`/`w3`/`w2`), the shared expert (`KimiLinearMLP`);
  * each MoE block (`KimiLinearMoE`) is replaced by `KimiLinearLatentMoE` below, which computes in the order of
    `NemotronHMoE` (models/nemotron_h/modeling_nemotron_h.py, `config.moe_latent_size`):

      __init__ (NemotronHMoE.__init__, lines 736-738): `fc1_latent_proj = nn.Linear(hidden_size, moe_latent_size,
          bias=config.mlp_bias)` and `fc2_latent_proj = nn.Linear(moe_latent_size, hidden_size, bias=...)`; Kimi has
          no `mlp_bias` (its MLPs have none), so both are bias-free. NemotronHExperts (lines 668-675) gives its
          experts input/output width `moe_latent_size`; here Kimi's experts keep their class and get that width:
          `gate_up_proj [E, 2 Im, latent]`, `down_proj [E, latent, Im]`, `hidden_dim = latent`.
      forward (NemotronHMoE.forward, lines 743-756), line for line:
          residuals = hidden_states                                        # 744
          orig_shape = hidden_states.shape                                 # 745
          _, topk_weights, topk_indices = self.gate(hidden_states)         # 746: router on the FULL hidden state
          hidden_states = hidden_states.view(-1, hidden_states.shape[-1])  # 747
          hidden_states = self.fc1_latent_proj(hidden_states)              # 750: hidden -> latent
          hidden_states = self.experts(hidden_states, topk_indices, topk_weights)  # 751: weighted sum in latent space
          hidden_states = self.fc2_latent_proj(hidden_states)              # 752: latent -> hidden
          hidden_states = hidden_states.view(*orig_shape)                  # 754
          hidden_states = hidden_states + self.shared_experts(residuals)   # 755: shared expert on the full input

    `self.gate` is KimiLinearTopkRouter and `self.shared_experts` KimiLinearMLP, unchanged (as KimiLinearMoE).

The checkpoint is saved by transformers' own save_pretrained (per-expert Hub names `experts.{e}.w1/w3/w2`, the
latent projections as `block_sparse_moe.fc1_latent_proj.weight [latent, hidden]` /
`.fc2_latent_proj.weight [hidden, latent]`), rewritten to Moonshot's layout like every kimi_linear fixture, with
`moe_latent_size` in config.json. The reference model is the patched class loaded back from that folder in f32.
Everything else (seeded init, reload, logits, routing, greedy with / without cache, token-by-token logits, seed
acceptance, the independent `SpecModel` forward, which reads `moe_latent_size` too) is scripts/gen_fixtures.py's
pipeline.

Run with the fixture venv (transformers 5.24.0, torch CPU, one thread):
    /work/venv-fixtures/bin/python scripts/fixtures_k3_latent.py [--out fixtures]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import KimiLinearForCausalLM  # noqa: E402
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearMoE  # noqa: E402

import fixtures_kimi_linear as kimi_linear  # noqa: E402
import gen_fixtures  # noqa: E402

NAME = "kimi_linear_latent"
LATENT_PATTERN = kimi_linear.MOE + r"(fc1_latent_proj|fc2_latent_proj)\.weight"


class KimiLinearLatentMoE(KimiLinearMoE):
    """KimiLinearMoE computed in NemotronHMoE's order with experts in a `moe_latent_size` space (module doc)."""

    def __init__(self, config):
        super().__init__(config)
        latent = config.moe_latent_size
        experts = self.experts  # KimiLinearExperts: same class and forward, latent input/output width
        experts.hidden_dim = latent
        experts.gate_up_proj = nn.Parameter(torch.empty(experts.num_experts, 2 * experts.intermediate_dim, latent))
        experts.down_proj = nn.Parameter(torch.empty(experts.num_experts, latent, experts.intermediate_dim))
        self.fc1_latent_proj = nn.Linear(config.hidden_size, latent, bias=False)
        self.fc2_latent_proj = nn.Linear(latent, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        residuals = hidden_states
        orig_shape = hidden_states.shape
        _, topk_weights, topk_indices = self.gate(hidden_states)
        hidden_states = hidden_states.view(-1, hidden_states.shape[-1])
        hidden_states = self.fc1_latent_proj(hidden_states)
        hidden_states = self.experts(hidden_states, topk_indices, topk_weights)
        hidden_states = self.fc2_latent_proj(hidden_states)
        hidden_states = hidden_states.view(*orig_shape)
        hidden_states = hidden_states + self.shared_experts(residuals)
        return hidden_states


class KimiLinearLatentForCausalLM(KimiLinearForCausalLM):
    """KimiLinearForCausalLM whose MoE layers are KimiLinearLatentMoE (`config.moe_latent_size` must be set)."""

    def __init__(self, config):
        super().__init__(config)
        assert getattr(config, "moe_latent_size", None), "moe_latent_size must be set"
        for i, layer in enumerate(self.model.layers):
            if config.mlp_layer_types[i] == "sparse":
                layer.mlp = KimiLinearLatentMoE(config)
        self.post_init()


def spec_kimi_linear_latent():
    # kimi_linear_tiny's layout (KDA 1-3, MLA 4, KDA 5-6; one dense layer; 12 experts in 4 groups, top-4 from 2;
    # shared expert) with experts in a 24-wide latent space (hidden 64): expert width != hidden everywhere.
    linear = dict(kda_layers=[1, 2, 3, 5, 6], full_attn_layers=[4], num_heads=3, head_dim=16, short_conv_kernel_size=4)
    cfg = kimi_linear.kimi_linear_config(linear, first_k_dense_replace=1, moe_latent_size=24)
    return dict(
        cls=KimiLinearLatentForCausalLM,
        reference_cls=KimiLinearLatentForCausalLM,
        config=cfg,
        dtype="bfloat16",
        seed=8200,
        prompt_len=13,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="fixtures", help="output folder (the fixture goes to OUT/kimi_linear_latent)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    gen_fixtures.SPECS[NAME] = spec_kimi_linear_latent
    gen_fixtures.NAME_PATTERNS["kimi_linear"] = kimi_linear.NAME_PATTERNS + [LATENT_PATTERN]
    r = gen_fixtures.generate_fixture(NAME, args.out, None)
    print(
        f"{NAME}: seed {r['seed']} ({r['attempts']} tries), {r['size'] / 1e6:.3f} MB, greedy {r['greedy']}, "
        f"min margin {r['margin']:.4f}, logits std {r['logits_std']:.2f}, rq {r['rq']}\n{r['extra_stats']}"
    )


if __name__ == "__main__":
    main()
