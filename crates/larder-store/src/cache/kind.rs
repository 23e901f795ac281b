//! [`PolicyKind`]: the eviction policies by name, for command lines and
//! benchmarks, and building one for a budget.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use super::{EvictionPolicy, FairAdaptive, FairLru, HeatPinnedLru, Key, Lfu, Lru, S3Fifo};

/// Share of the budget [`PolicyKind::HeatPinnedLru`] pins.
pub(crate) const PIN_FRACTION: f64 = 0.5;

/// An eviction policy by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PolicyKind {
    FairLru,
    #[default]
    FairAdaptive,
    Lru,
    Lfu,
    S3Fifo,
    HeatPinnedLru,
}

impl PolicyKind {
    /// Every policy, the default ([`PolicyKind::FairAdaptive`]) first.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::FairAdaptive,
        PolicyKind::FairLru,
        PolicyKind::Lru,
        PolicyKind::Lfu,
        PolicyKind::S3Fifo,
        PolicyKind::HeatPinnedLru,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            PolicyKind::FairLru => "fair_lru",
            PolicyKind::FairAdaptive => "fair_adaptive",
            PolicyKind::Lru => "lru",
            PolicyKind::Lfu => "lfu",
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::HeatPinnedLru => "heat_pinned_lru",
        }
    }

    /// A fresh policy for `budget` bytes over `layers` layers; `heat`
    /// (per-key use counts) is used by [`PolicyKind::HeatPinnedLru`] only.
    pub fn build(&self, budget: u64, layers: usize, heat: &HashMap<Key, u64>) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::FairLru => Box::new(FairLru::new(budget, layers)),
            PolicyKind::FairAdaptive => Box::new(FairAdaptive::new(budget, layers)),
            PolicyKind::Lru => Box::new(Lru::new()),
            PolicyKind::Lfu => Box::new(Lfu::new()),
            PolicyKind::S3Fifo => Box::new(S3Fifo::new(budget)),
            PolicyKind::HeatPinnedLru => Box::new(HeatPinnedLru::new(budget, heat, PIN_FRACTION)),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not one of [`PolicyKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
        write!(f, "unknown cache policy `{}` (valid: {})", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownPolicy {}

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        PolicyKind::ALL
            .iter()
            .copied()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}
