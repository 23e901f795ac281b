"""Reference values for the K3 extensions larder checks at unit level.

Writes fixtures/kimi_linear_k3_gate/lower_bound_gate.json: the lower-bounded
KDA forget gate of transformers 5.24.0's `Glm5NextTextForgetGate`
(models/glm5_next/modeling_glm5_next.py, `config.linear_lower_bound`, which
glm5_next's config reads from `linear_attn_config.gate_lower_bound`):

    g = lower_bound * sigmoid(exp(A_log[h]) * (f_b(f_a(x)) + dt_bias))

run in f32 on CPU. The JSON holds, per case, the projection output
`f = f_b(f_a(x))` `[T, H*D]`, `dt_bias` `[H*D]`, `A_log` `[H]`, the bound and
the module's output `g` `[T, H*D]`, so larder's gate function is checked on
exactly the reference's inputs (crates/larder-model/tests/kimi_linear_config.rs).

Run with the fixture venv (transformers 5.24.0 + torch):
    /work/venv-fixtures/bin/python scripts/fixtures_k3_ext.py
"""

import json
from pathlib import Path

import torch
import transformers
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextForgetGate

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "kimi_linear_k3_gate" / "lower_bound_gate.json"


def case(seed: int, hidden: int, heads: int, head_dim: int, lower_bound: float, tokens: int) -> dict:
    torch.manual_seed(seed)
    config = Glm5NextTextConfig(
        hidden_size=hidden,
        linear_attn_config={"num_heads": heads, "head_dim": head_dim, "gate_lower_bound": lower_bound},
    )
    assert config.linear_lower_bound == lower_bound
    gate = Glm5NextTextForgetGate(config).float().eval()
    with torch.no_grad():
        # Wide ranges: sigmoid saturates on both sides, A_log spans decay rates 0.05 .. 20.
        gate.f_a_proj.weight.normal_(0.0, 1.0)
        gate.f_b_proj.weight.normal_(0.0, 1.0)
        gate.dt_bias.uniform_(-3.0, 3.0)
        gate.A_log.uniform_(-3.0, 3.0)
        x = torch.randn(1, tokens, hidden) * 2.0
        f = gate.f_b_proj(gate.f_a_proj(x))
        g = gate(x)
    return {
        "heads": heads,
        "head_dim": head_dim,
        "lower_bound": lower_bound,
        "A_log": gate.A_log.tolist(),
        "dt_bias": gate.dt_bias.tolist(),
        "f": f.reshape(tokens, heads * head_dim).tolist(),
        "g": g.reshape(tokens, heads * head_dim).tolist(),
    }


def main() -> None:
    torch.set_num_threads(1)
    cases = [case(0, 16, 3, 4, -5.0, 6), case(1, 24, 2, 8, -2.5, 5)]
    doc = {
        "reference": f"transformers {transformers.__version__} models/glm5_next/modeling_glm5_next.py Glm5NextTextForgetGate, torch {torch.__version__}, f32, CPU",
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=None) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
