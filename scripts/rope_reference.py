#!/usr/bin/env python3
"""Writes crates/larder-model/tests/data/rope_reference.json: transformers' RoPE inverse frequencies
and attention scaling for several rope_scaling configs (yarn, linear). Usage:
    OMP_NUM_THREADS=1 venv/bin/python scripts/rope_reference.py > crates/larder-model/tests/data/rope_reference.json
(venv from scripts/requirements-fixtures.txt)."""
import torch, json
from transformers import Qwen3MoeConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
cases = [
  dict(head_dim=16, max_pos=256, theta=10000.0, rs={"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":64}),
  dict(head_dim=64, max_pos=131072, theta=1000000.0, rs={"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}),
  dict(head_dim=64, max_pos=4096, theta=10000.0, rs={"rope_type":"yarn","factor":40.0,"original_max_position_embeddings":4096,"beta_fast":32,"beta_slow":1,"mscale":1.0,"mscale_all_dim":1.0}),
  dict(head_dim=128, max_pos=40960, theta=1000000.0, rs={"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}),
  dict(head_dim=32, max_pos=2048, theta=10000.0, rs={"rope_type":"linear","factor":2.0}),
]
out=[]
for c in cases:
    rp = dict(c["rs"]); rp["rope_theta"]=c["theta"]
    cfg = Qwen3MoeConfig(hidden_size=c["head_dim"]*2, num_attention_heads=2, head_dim=c["head_dim"], max_position_embeddings=c["max_pos"], rope_parameters=rp)
    fn = ROPE_INIT_FUNCTIONS[rp["rope_type"]]
    inv, att = fn(cfg, "cpu")
    out.append(dict(case=c, inv_freq=[float(x) for x in inv], attention_scaling=float(att)))
print(json.dumps(out))
