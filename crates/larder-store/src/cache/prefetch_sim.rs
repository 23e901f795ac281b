//! Prefetch replay: what the store reads on demand and in the background
//! over a recorded decode, with the predictions the trace recorded, and the
//! cache and policy driven as the store drives them. This is what the
//! planner times: demand reads stall the model, prefetch reads overlap its
//! compute, and both cost drive bandwidth and cache room.
//!
//! Per decode token and MoE layer, in model order, as
//! [`ExpertStore::prefetch`](crate::ExpertStore::prefetch) and
//! [`ExpertStore::fetch`](crate::ExpertStore::fetch) run:
//! 1. the experts the previous layer's router predicted for this layer that
//!    are not held are read in the background and inserted (a prefetch
//!    read), unless the layer's prefetch is off: after
//!    [`PREFETCH_PROBE`](crate::store::PREFETCH_PROBE) reads with fewer than
//!    `PREFETCH_MIN_PRECISION` of them used,
//!    only every `PREFETCH_PROBE`th request goes through;
//! 2. the layer's demanded experts are looked up (a hit on a prefetched entry
//!    counts that prefetch as used) and the misses read on demand and
//!    inserted.
//!
//! Timing enters only through [`PrefetchRule::per_layer`]: how many
//! background reads a layer completes before its demand cancels the rest as
//! stale (the planner derives it from the CPU time they hide behind and the
//! drives' speed); the cancelled predictions are neither read nor cached.

use std::collections::HashSet;

use serde::Serialize;

use super::sim::{replay_step, Held, Step};
use super::{EvictionPolicy, Key};

/// One MoE layer of one decode token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerAccess {
    /// The decoder layer index (the cache key's layer).
    pub layer: usize,
    /// Bytes of one of its expert records.
    pub bytes: u64,
    /// The experts the token routes to here.
    pub demand: Vec<usize>,
    /// The experts the previous MoE layer's router picked for this layer
    /// (empty: no prefetch, as for the first MoE layer).
    pub predicted: Vec<usize>,
}

/// One decode pass (one token, or one row per sequence in a batch): its MoE
/// layers in model order, each with the union of its rows' experts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodeStep {
    pub tokens: usize,
    pub layers: Vec<LayerAccess>,
}

/// When a layer's prefetch switches itself off (the store's rule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefetchRule {
    /// Background reads before precision is judged, and the probe interval.
    pub probe: u64,
    /// Share of background reads that must be used to keep prefetching.
    pub min_precision: f64,
    /// Background reads a layer completes per step before its demand
    /// cancels the rest (in prediction order; `None`: all complete).
    pub per_layer: Option<usize>,
}

impl Default for PrefetchRule {
    fn default() -> Self {
        PrefetchRule {
            probe: crate::store::PREFETCH_PROBE,
            min_precision: crate::store::PREFETCH_MIN_PRECISION,
            per_layer: None,
        }
    }
}

/// What one MoE layer cost over the replayed decode.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrefetchLayer {
    pub layer: usize,
    /// Demanded experts (deduped per token) and how many were held.
    pub accesses: u64,
    pub hits: u64,
    /// Records read on demand (the model waits for them).
    pub demand_reads: u64,
    pub demand_bytes: u64,
    /// Records read in the background.
    pub prefetch_reads: u64,
    pub prefetch_bytes: u64,
    /// Background reads a demand then hit.
    pub prefetch_used: u64,
    /// Prefetch requests skipped because the layer's precision was low.
    pub prefetch_skipped: u64,
}

/// A replayed decode: per MoE layer (in the order given), over `tokens`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrefetchResult {
    pub tokens: u64,
    pub layers: Vec<PrefetchLayer>,
}

impl PrefetchResult {
    /// Share of demanded experts that were held (prefetched ones included).
    pub fn hit_rate(&self) -> f64 {
        let (a, h) = self.layers.iter().fold((0, 0), |(a, h), l| (a + l.accesses, h + l.hits));
        if a == 0 {
            0.0
        } else {
            h as f64 / a as f64
        }
    }

    /// Bytes read per token, demand and background.
    pub fn bytes_per_token(&self) -> f64 {
        let bytes: u64 = self.layers.iter().map(|l| l.demand_bytes + l.prefetch_bytes).sum();
        bytes as f64 / self.tokens.max(1) as f64
    }
}

/// Replays `warm` (the prompt's passes: demand only, as prefill reads) and
/// then `decode` (every step the same MoE layers) against `policy` (fresh,
/// built for `budget`) with `rule`, counting only the decode.
pub fn simulate_prefetch(
    warm: &[Step],
    decode: &[DecodeStep],
    budget: u64,
    policy: &mut dyn EvictionPolicy,
    rule: PrefetchRule,
) -> PrefetchResult {
    let mut held = Held::new(budget, policy);
    for step in warm {
        replay_step(&mut held, step, &mut |_, _, _| {});
    }
    let layers = decode.first().map_or(0, |t| t.layers.len());
    let mut out: Vec<PrefetchLayer> = decode.first().map_or_else(Vec::new, |t| {
        t.layers
            .iter()
            .map(|a| PrefetchLayer {
                layer: a.layer,
                ..PrefetchLayer::default()
            })
            .collect()
    });
    let mut requests = vec![0u64; layers];
    let mut in_flight: HashSet<Key> = HashSet::new();
    for step in decode {
        for (i, access) in step.layers.iter().enumerate().take(layers) {
            let tally = &mut out[i];
            if !access.predicted.is_empty() && prefetch_allowed(tally, &mut requests[i], rule) {
                let mut room = rule.per_layer.unwrap_or(usize::MAX);
                for &e in &access.predicted {
                    let key = (access.layer, e);
                    if room > 0 && !held.contains(key) {
                        room -= 1;
                        held.insert_expected(key, access.bytes);
                        tally.prefetch_reads += 1;
                        tally.prefetch_bytes += access.bytes;
                        in_flight.insert(key);
                    }
                }
            }
            let demand = Step {
                tokens: 0,
                accesses: access.demand.iter().map(|&e| ((access.layer, e), access.bytes)).collect(),
            };
            replay_step(&mut held, &demand, &mut |key, bytes, hit| {
                tally.accesses += 1;
                let prefetched = in_flight.remove(&key);
                if hit {
                    tally.hits += 1;
                    tally.prefetch_used += u64::from(prefetched);
                } else {
                    tally.demand_reads += 1;
                    tally.demand_bytes += bytes;
                }
            });
        }
    }
    PrefetchResult {
        tokens: decode.iter().map(|s| s.tokens as u64).sum(),
        layers: out,
    }
}

/// The store's switch: a layer whose background reads were mostly unused
/// lets only every `probe`th request through.
fn prefetch_allowed(tally: &mut PrefetchLayer, requests: &mut u64, rule: PrefetchRule) -> bool {
    let precision = tally.prefetch_used as f64 / tally.prefetch_reads.max(1) as f64;
    if tally.prefetch_reads < rule.probe || precision >= rule.min_precision {
        return true;
    }
    *requests += 1;
    if (*requests).is_multiple_of(rule.probe) {
        true
    } else {
        tally.prefetch_skipped += 1;
        false
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cache::sim::simulate;
    use crate::cache::PolicyKind;

    /// Two MoE layers (decoder layers 1 and 2), records of 10 bytes.
    fn step(first: &[usize], second: &[usize], predicted: &[usize]) -> DecodeStep {
        let access = |layer, demand: &[usize], predicted: &[usize]| LayerAccess {
            layer,
            bytes: 10,
            demand: demand.to_vec(),
            predicted: predicted.to_vec(),
        };
        DecodeStep {
            tokens: 1,
            layers: vec![access(1, first, &[]), access(2, second, predicted)],
        }
    }

    fn run(decode: &[DecodeStep], budget: u64, rule: PrefetchRule) -> PrefetchResult {
        let mut policy = PolicyKind::Lru.build(budget, 2, &HashMap::new());
        simulate_prefetch(&[], decode, budget, policy.as_mut(), rule)
    }

    #[test]
    fn right_predictions_turn_demand_reads_into_background_reads() {
        let decode: Vec<DecodeStep> = (0..4).map(|t| step(&[t], &[10 + t], &[10 + t])).collect();
        let r = run(&decode, 1000, PrefetchRule::default());
        let second = &r.layers[1];
        assert_eq!((second.demand_reads, second.prefetch_reads, second.prefetch_used), (0, 4, 4));
        assert_eq!((second.hits, r.layers[0].demand_reads), (4, 4));
        assert!((r.hit_rate() - 0.5).abs() < 1e-12);
        assert!((r.bytes_per_token() - 20.0).abs() < 1e-12);
    }

    #[test]
    fn wrong_predictions_switch_a_layer_off_but_for_probes() {
        let rule = PrefetchRule {
            probe: 4,
            min_precision: 0.5,
            per_layer: None,
        };
        let decode: Vec<DecodeStep> = (0..40).map(|t| step(&[0], &[1], &[100 + t])).collect();
        let r = run(&decode, 1000, rule);
        let second = &r.layers[1];
        // Four reads, none used; then one request in four goes through.
        assert_eq!(second.prefetch_used, 0);
        assert_eq!(second.prefetch_reads, 4 + 36 / 4);
        assert_eq!(second.prefetch_skipped, 36 - 36 / 4);
        assert_eq!(second.demand_reads, 1);
    }

    #[test]
    fn a_per_layer_limit_cancels_the_later_predictions() {
        let decode: Vec<DecodeStep> = (0..3).map(|t| step(&[0], &[10 * t, 10 * t + 1], &[10 * t, 10 * t + 1])).collect();
        let rule = PrefetchRule {
            per_layer: Some(1),
            ..PrefetchRule::default()
        };
        let second = run(&decode, 1000, rule).layers[1].clone();
        assert_eq!((second.prefetch_reads, second.prefetch_used, second.demand_reads), (3, 3, 3));
    }

    #[test]
    fn without_predictions_it_counts_what_the_plain_replay_counts() {
        let decode: Vec<DecodeStep> = (0..50).map(|t| step(&[t % 7, t % 3], &[t % 5], &[])).collect();
        let steps: Vec<Step> = decode
            .iter()
            .map(|s| Step {
                tokens: 1,
                accesses: s
                    .layers
                    .iter()
                    .flat_map(|a| a.demand.iter().map(|&e| ((a.layer, e), a.bytes)))
                    .collect(),
            })
            .collect();
        let mut policy = PolicyKind::Lru.build(40, 2, &HashMap::new());
        let plain = simulate(&steps, 40, policy.as_mut());
        let r = run(&decode, 40, PrefetchRule::default());
        let hits: u64 = r.layers.iter().map(|l| l.hits).sum();
        let reads: u64 = r.layers.iter().map(|l| l.demand_bytes).sum();
        assert_eq!((hits, reads), (plain.hits, plain.bytes_read));
        assert!(r.layers.iter().all(|l| l.prefetch_reads == 0));
    }
}
