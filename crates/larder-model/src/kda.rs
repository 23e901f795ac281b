//! Kimi Delta Attention (KDA), the linear-attention mixer of Kimi Linear,
//! exactly as docs/kimi_linear.md describes transformers 5.24.0's
//! computation, in f32:
//!
//! 1. `p = [q_proj x; k_proj x; v_proj x]` (`3·H·D` channels);
//! 2. a causal depthwise convolution of `kernel` taps per channel over the
//!    sequence's last inputs (the layer state's window), then SiLU;
//! 3. q and k L2-normalised per head (eps 1e-6 inside the root), q scaled by
//!    `D^-0.5`;
//! 4. the per-channel log decay `g = -exp(A_log[h]) · softplus(f_b(f_a x) +
//!    dt_bias)` (with K3's lower bound: `bound · sigmoid(exp(A_log[h]) ·
//!    (f_b(f_a x) + dt_bias))`), decay `exp(g)`; `beta = sigmoid(b_proj x)`
//!    per head;
//! 5. the gated delta rule on each head's `D x D` state `S` (rows: key
//!    channels): decay, read `m = Sᵀk`, `δ = (v − m)·β`, `S += k δᵀ`, output
//!    `o = Sᵀq`;
//! 6. `o_norm` (RMSNorm per head, `rms_norm_eps`) gated by
//!    `sigmoid(g_b(g_a x))` (K3's full-rank gate: `sigmoid(g_proj x)`), then
//!    `o_proj`.
//!
//! **Batch invariance.** Steps 1-4 and 6 work on each row alone with
//! row-independent kernels (larder-tensor's `Linear` gives a row the same
//! bits in any batch); the convolution reads earlier rows' *inputs* `p`,
//! never their results, so it too is a fixed function of the values. Step 5
//! runs token after token, the same arithmetic in the same order whether a
//! token comes in a prompt chunk of 1, 7 or 500 rows or alone in a decode
//! step; heads are independent, so they run in parallel without changing a
//! bit. The logits are therefore bit-identical for one-chunk, uneven-chunk
//! and token-by-token prefill, and whatever else shares the batch.
//!
//! **Cost.** The token-sequential recurrence is about 4·H·D² multiply-adds
//! per token per layer over a state of H·D² floats (Kimi-Linear-48B: 2.1 M
//! over 2 MiB) and cannot be parallelised across a sequence's tokens. On long
//! prompts it is slower than transformers' chunked form (which turns a
//! 64-token chunk into matrix products), whose rounding depends on where the
//! chunk boundaries fall; larder gives that speed up for exactness under any
//! chunking. Decoding one token costs the same either way. Measured on the
//! 2-vCPU development VM (x86-64 baseline build, one thread, H=32, D=128):
//! 0.44 ms per token per KDA layer, so about 9 ms per prompt token for
//! Kimi-Linear-48B's 20 KDA layers before the per-head parallelism.

use larder_tensor::ops::{rms_norm_row, sigmoid, silu};
use larder_tensor::vector::dot;
use larder_tensor::{Linear, Mat};
use rayon::prelude::*;

use crate::error::ModelError;
use crate::source::WeightView;
use crate::spec::{KdaOutputGate, KdaSpec};
use crate::state::{RecurrentLayer, RecurrentValues};

/// Epsilon of the q/k L2 norm (inside the square root).
const L2_EPS: f32 = 1e-6;

/// One KDA layer's weights.
pub(crate) struct KdaMixer {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    /// `[3·H·D, kernel]`: q, k, then v channels; tap `kernel - 1` is the
    /// current token.
    conv: Vec<f32>,
    f_a: Linear,
    f_b: Linear,
    /// `exp(A_log)` per head.
    decay_rate: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The K3 lower-bounded forget gate's bound (see [`forget_log_decay`]);
    /// `None`: transformers 5.24.0 kimi_linear's unbounded gate.
    gate_lower_bound: Option<f32>,
    b_proj: Linear,
    output_gate: OutputGateProj,
    o_norm: Vec<f32>,
    o_proj: Linear,
    heads: usize,
    head_dim: usize,
    kernel: usize,
    rms_norm_eps: f32,
}

/// The projection of the output norm's gate from the layer input.
enum OutputGateProj {
    /// `g_b(g_a x)` (Kimi Linear).
    LowRank { a: Linear, b: Linear },
    /// `g_proj x` (the K3 full-rank gate, bailing_hybrid's KDA).
    FullRank(Linear),
}

impl OutputGateProj {
    fn forward(&self, x: &Mat) -> Mat {
        match self {
            OutputGateProj::LowRank { a, b } => b.forward(&a.forward(x)),
            OutputGateProj::FullRank(g) => g.forward(x),
        }
    }
}

/// Per-row values of a chunk that feed the recurrence, `[rows, H·D]` (beta
/// `[rows, H]`).
struct RecurrenceInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    decay: Vec<f32>,
    beta: Vec<f32>,
}

impl KdaMixer {
    /// Loads the KDA tensors under `attn` (`model.layers.N.self_attn`),
    /// checking every shape against `spec` and `hidden`.
    pub(crate) fn load(attn: &WeightView<'_>, spec: &KdaSpec, hidden: usize, rms_norm_eps: f32) -> Result<Self, ModelError> {
        let (h, d, k) = (spec.num_heads, spec.head_dim, spec.conv_kernel);
        let hd = h
            .checked_mul(d)
            .ok_or_else(|| ModelError::config(&attn.config_path(), "linear_attn_config.head_dim", "num_heads x head_dim overflows"))?;
        let lin = |module: &str, rows: usize, cols: usize| -> Result<Linear, ModelError> {
            check_shape(attn, &attn.pp(module).name("weight"), &[rows, cols])?;
            attn.linear(module, rows, cols)
        };
        let conv = conv_taps(attn, hd, k)?;
        let a_log = a_log(attn, h)?;
        let full_rank = spec.output_gate == KdaOutputGate::FullRank;
        let output_gate = match attn.switched_linear("g_proj", full_rank, hd, hidden, "linear_attn_config.use_full_rank_gate")? {
            Some(g) => OutputGateProj::FullRank(g),
            None => OutputGateProj::LowRank {
                a: lin("g_a_proj", d, hidden)?,
                b: lin("g_b_proj", hd, d)?,
            },
        };
        Ok(KdaMixer {
            q_proj: lin("q_proj", hd, hidden)?,
            k_proj: lin("k_proj", hd, hidden)?,
            v_proj: lin("v_proj", hd, hidden)?,
            conv,
            f_a: lin("f_a_proj", d, hidden)?,
            f_b: lin("f_b_proj", hd, d)?,
            decay_rate: a_log.iter().map(|a| a.exp()).collect(),
            dt_bias: tensor(attn, "dt_bias", &[&[hd]])?,
            gate_lower_bound: spec.gate_lower_bound,
            b_proj: lin("b_proj", h, hidden)?,
            output_gate,
            o_norm: tensor(attn, "o_norm.weight", &[&[d]])?,
            o_proj: lin("o_proj", hidden, hd)?,
            heads: h,
            head_dim: d,
            kernel: k,
            rms_norm_eps,
        })
    }

    /// `(heads, head_dim, kernel)`.
    pub(crate) fn dims(&self) -> (usize, usize, usize) {
        (self.heads, self.head_dim, self.kernel)
    }

    /// Mixes rows `x` (the next positions of one sequence) through the
    /// recurrent `state`, whose update stays uncommitted until the pass
    /// succeeds (see [`RecurrentLayer::update`]).
    pub(crate) fn forward(&self, x: &Mat, state: &mut RecurrentLayer) -> Mat {
        let rows = x.rows();
        let hd = self.heads * self.head_dim;
        let p = [self.q_proj.forward(x), self.k_proj.forward(x), self.v_proj.forward(x)];
        let f = self.f_b.forward(&self.f_a.forward(x));
        let b = self.b_proj.forward(x);
        let gate = self.output_gate.forward(x);
        // A return point inside this pass: the values after its first `mark` rows.
        let mark = state.mark().filter(|&m| m <= rows);
        let (o, marked) = state.update(|source, result| {
            let mut inputs = self.convolve(&p, &source.window, &mut result.window);
            let window = mark.map(|m| self.window_at(&p, &source.window, m));
            self.gates(&f, &b, &mut inputs);
            let (o, matrix) = self.recurrence(&inputs, rows, source, result, mark);
            (o, matrix.zip(window).map(|(matrix, window)| RecurrentValues { matrix, window }))
        });
        state.set_marked(marked);
        let mut gated = Mat::zeros(rows, hd);
        let mut normed = vec![0.0f32; self.head_dim];
        for r in 0..rows {
            let out = gated.row_mut(r);
            for (h, head) in out.chunks_exact_mut(self.head_dim).enumerate() {
                let at = r * hd + h * self.head_dim;
                rms_norm_row(&o[at..at + self.head_dim], &self.o_norm, self.rms_norm_eps, &mut normed);
                for ((v, &n), &g) in head.iter_mut().zip(&normed).zip(&gate.row(r)[h * self.head_dim..]) {
                    *v = n * sigmoid(g);
                }
            }
        }
        self.o_proj.forward(&gated)
    }

    /// Steps 2-3: the causal convolution + SiLU of each row's `p` over the
    /// window (`kernel - 1` earlier inputs, oldest first), then the q/k L2
    /// norms; writes the window after the last row to `new_window`.
    fn convolve(&self, p: &[Mat; 3], window: &[f32], new_window: &mut [f32]) -> RecurrenceInputs {
        let (rows, hd, k) = (p[0].rows(), self.heads * self.head_dim, self.kernel);
        let channels = 3 * hd;
        let past = k - 1;
        // Input of channel c at history index i (0..past: the window, then the rows).
        let input = |i: usize, c: usize| -> f32 {
            if i < past {
                window[i * channels + c]
            } else {
                p[c / hd].row(i - past)[c % hd]
            }
        };
        let mut out = [vec![0.0f32; rows * hd], vec![0.0f32; rows * hd], vec![0.0f32; rows * hd]];
        for r in 0..rows {
            for c in 0..channels {
                let taps = &self.conv[c * k..(c + 1) * k];
                let mut acc = 0.0f32;
                for (j, &w) in taps.iter().enumerate() {
                    acc += w * input(r + j, c);
                }
                out[c / hd][r * hd + c % hd] = silu(acc);
            }
        }
        for (slot, row) in new_window.chunks_exact_mut(channels).enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                *v = input(rows + slot, c);
            }
        }
        let [mut q, mut kk, v] = out;
        let scale = (self.head_dim as f32).powf(-0.5);
        l2_normalise(&mut q, self.head_dim, scale);
        l2_normalise(&mut kk, self.head_dim, 1.0);
        RecurrenceInputs {
            q,
            k: kk,
            v,
            decay: Vec::new(),
            beta: Vec::new(),
        }
    }

    /// The convolution window after the first `rows` rows of `p` (the
    /// `kernel - 1` inputs before row `rows`, oldest first), as `convolve`
    /// writes it after the last row.
    fn window_at(&self, p: &[Mat; 3], window: &[f32], rows: usize) -> Vec<f32> {
        let hd = self.heads * self.head_dim;
        let (channels, past) = (3 * hd, self.kernel - 1);
        let mut out = vec![0.0f32; past * channels];
        for (slot, row) in out.chunks_exact_mut(channels).enumerate() {
            let i = rows + slot;
            for (c, v) in row.iter_mut().enumerate() {
                *v = if i < past {
                    window[i * channels + c]
                } else {
                    p[c / hd].row(i - past)[c % hd]
                };
            }
        }
        out
    }

    /// Step 4: per-channel decays `exp(g)` from the forget-gate projection
    /// `f` (`[rows, H·D]`) and per-head betas from `b` (`[rows, H]`).
    fn gates(&self, f: &Mat, b: &Mat, inputs: &mut RecurrenceInputs) {
        let d = self.head_dim;
        inputs.decay = (0..f.rows())
            .flat_map(|r| {
                f.row(r)
                    .iter()
                    .zip(&self.dt_bias)
                    .enumerate()
                    .map(move |(c, (&u, &bias))| forget_log_decay(self.decay_rate[c / d], u + bias, self.gate_lower_bound).exp())
            })
            .collect();
        inputs.beta = b.as_slice().iter().map(|&v| sigmoid(v)).collect();
    }

    /// Step 5, token after token, each head on its own (in parallel): the
    /// state starts from `source` and ends in `result`; returns the outputs
    /// `[rows, H·D]` and, with a `mark`, every head's state after that many rows.
    fn recurrence(
        &self,
        inputs: &RecurrenceInputs,
        rows: usize,
        source: &RecurrentValues,
        result: &mut RecurrentValues,
        mark: Option<usize>,
    ) -> (Vec<f32>, Option<Vec<f32>>) {
        let (h, d) = (self.heads, self.head_dim);
        let hd = h * d;
        let per_head: Vec<(Vec<f32>, Option<Vec<f32>>)> = result
            .matrix
            .par_chunks_mut(d * d)
            .zip(source.matrix.par_chunks(d * d))
            .enumerate()
            .map(|(head, (s, s0))| {
                if rows == 0 {
                    s.copy_from_slice(s0);
                }
                let mut o = vec![0.0f32; rows * d];
                let mut at_mark = (mark == Some(0)).then(|| s0.to_vec());
                for r in 0..rows {
                    let at = r * hd + head * d;
                    let token = Token {
                        q: &inputs.q[at..at + d],
                        k: &inputs.k[at..at + d],
                        v: &inputs.v[at..at + d],
                        decay: &inputs.decay[at..at + d],
                        beta: inputs.beta[r * h + head],
                    };
                    let from = if r == 0 { Some(s0) } else { None };
                    delta_rule_step(s, from, &token, &mut o[r * d..(r + 1) * d]);
                    if mark == Some(r + 1) {
                        at_mark = Some(s.to_vec());
                    }
                }
                (o, at_mark)
            })
            .collect();
        let mut out = vec![0.0f32; rows * hd];
        for (head, (o, _)) in per_head.iter().enumerate() {
            for r in 0..rows {
                out[r * hd + head * d..r * hd + (head + 1) * d].copy_from_slice(&o[r * d..(r + 1) * d]);
            }
        }
        let marked = mark.map(|_| per_head.into_iter().flat_map(|(_, m)| m.unwrap_or_default()).collect());
        (out, marked)
    }
}

/// One token's inputs to one head's delta rule.
struct Token<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    decay: &'a [f32],
    beta: f32,
}

/// One token of the gated delta rule on one head's state `s` (`D x D`, rows
/// = key channels), in transformers' order: decay (from `from` when given,
/// else `s` itself), `m = sᵀk`, `δ = (v − m)·β`, `s += k δᵀ`, `o = sᵀq`.
/// Every sum runs over key channels in ascending order.
fn delta_rule_step(s: &mut [f32], from: Option<&[f32]>, t: &Token<'_>, o: &mut [f32]) {
    let d = t.k.len();
    let mut m = vec![0.0f32; d];
    for i in 0..d {
        let row = &mut s[i * d..(i + 1) * d];
        match from {
            Some(s0) => {
                for (x, &y) in row.iter_mut().zip(&s0[i * d..(i + 1) * d]) {
                    *x = y * t.decay[i];
                }
            }
            None => row.iter_mut().for_each(|x| *x *= t.decay[i]),
        }
        for (mj, &x) in m.iter_mut().zip(row.iter()) {
            *mj += x * t.k[i];
        }
    }
    let delta: Vec<f32> = t.v.iter().zip(&m).map(|(&v, &m)| (v - m) * t.beta).collect();
    o.fill(0.0);
    for i in 0..d {
        let row = &mut s[i * d..(i + 1) * d];
        for (x, &dj) in row.iter_mut().zip(&delta) {
            *x += t.k[i] * dj;
        }
        for (oj, &x) in o.iter_mut().zip(row.iter()) {
            *oj += x * t.q[i];
        }
    }
}

/// Step 4's log decay `g` of one channel from its head's `decay_rate =
/// exp(A_log[h])` and `u = f_b(f_a x) + dt_bias`: without a bound,
/// transformers 5.24.0 kimi_linear's `-decay_rate · softplus(u)`; with
/// `lower_bound` (the K3 lower-bounded gate), transformers 5.24.0
/// glm5_next's `Glm5NextTextForgetGate`: `lower_bound · sigmoid(decay_rate ·
/// u)`, so `g` stays in `(lower_bound, 0)`. Checked against that module's
/// outputs in `tests/kimi_linear_config.rs`.
pub fn forget_log_decay(decay_rate: f32, u: f32, lower_bound: Option<f32>) -> f32 {
    match lower_bound {
        Some(bound) => bound * sigmoid(decay_rate * u),
        None => -decay_rate * softplus(u),
    }
}

/// `x` as transformers' kimi_linear computes softplus: `x` above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// Each `dim`-sized chunk divided by `sqrt(Σx² + 1e-6)`, times `scale`.
fn l2_normalise(x: &mut [f32], dim: usize, scale: f32) {
    for head in x.chunks_exact_mut(dim) {
        let norm = (dot(head, head) + L2_EPS).sqrt();
        for v in head.iter_mut() {
            *v = *v / norm * scale;
        }
    }
}

/// An error naming `name` (a full tensor name) unless its stored shape is
/// `shape` (checked where the source knows stored shapes; a missing weight
/// is the error the weight's own request then gives).
fn check_shape(attn: &WeightView<'_>, name: &str, shape: &[usize]) -> Result<(), ModelError> {
    match attn.source().stored_shape(name)? {
        Some(got) if got != shape => Err(shape_error(attn, name, &got, shape)),
        _ => Ok(()),
    }
}

/// The q, k and v convolutions' taps, `[3·H·D, kernel]`. Each tensor's
/// stored shape is checked before it is taken (a source holds only what
/// its files hold), and the concatenation is allocated fallibly, so a
/// `short_conv_kernel_size` the weights disagree with is an error naming
/// it, never an allocation sized from config.json alone.
fn conv_taps(attn: &WeightView<'_>, hd: usize, kernel: usize) -> Result<Vec<f32>, ModelError> {
    let mut parts = Vec::with_capacity(3);
    for module in ["q_conv1d", "k_conv1d", "v_conv1d"] {
        parts.push(tensor(&attn.pp(module), "weight", &[&[hd, 1, kernel]])?);
    }
    let len: usize = parts.iter().map(Vec::len).sum();
    let mut conv = Vec::new();
    conv.try_reserve_exact(len).map_err(|e| {
        ModelError::config(
            &attn.config_path(),
            "linear_attn_config.short_conv_kernel_size",
            format!(
                "{kernel} taps over {hd} channels: cannot allocate the {len} convolution taps of `{}` ({e})",
                attn.path()
            ),
        )
    })?;
    for part in parts {
        conv.extend(part);
    }
    Ok(conv)
}

/// A small f32 tensor `name` under `at` (conv taps, gate parameters, norm
/// weight) whose stored shape is one of `shapes`, widened to f32.
fn tensor(at: &WeightView<'_>, name: &str, shapes: &[&[usize]]) -> Result<Vec<f32>, ModelError> {
    let full = at.name(name);
    match at.tensor_f32_any(name, shapes) {
        Ok((values, _)) => Ok(values),
        Err(ModelError::TensorShape { name: n, got, .. }) if n == full => Err(shape_error(at, &full, &got, shapes[0])),
        Err(e) => Err(e),
    }
}

/// `A_log`, one value per head: `[H]`, transformers' `[1, 1, H, 1]`, or
/// Kimi K3's padded `[n > H]` (the release stores 128 values for 96 heads;
/// fla's kernel reads `A_log[h]`), whose padding must be exactly zero.
fn a_log(attn: &WeightView<'_>, heads: usize) -> Result<Vec<f32>, ModelError> {
    let padded = match attn.stored_shape("A_log")? {
        Some(shape) if shape.len() == 1 && shape[0] > heads => Some(shape[0]),
        _ => None,
    };
    let Some(n) = padded else {
        return tensor(attn, "A_log", &[&[1, 1, heads, 1], &[heads]]);
    };
    let mut values = tensor(attn, "A_log", &[&[n]])?;
    if let Some(i) = values[heads..].iter().position(|&v| v != 0.0) {
        return Err(ModelError::config(
            &attn.config_path(),
            "linear_attn_config.num_heads",
            format!(
                "tensor `{}` holds {n} values for {heads} heads, and its padding is not zero (value {} at index {}): \
                 the tensor and num_heads disagree",
                attn.name("A_log"),
                values[heads + i],
                heads + i
            ),
        ));
    }
    values.truncate(heads);
    Ok(values)
}

/// A shape mismatch of KDA tensor `name`, blamed on the config fields that set it.
fn shape_error(at: &WeightView<'_>, name: &str, got: &[usize], expected: &[usize]) -> ModelError {
    ModelError::config(
        &at.config_path(),
        "linear_attn_config",
        format!(
            "tensor `{name}` has shape {got:?}, but num_heads, head_dim and short_conv_kernel_size (with hidden_size) \
             expect {expected:?}"
        ),
    )
}
