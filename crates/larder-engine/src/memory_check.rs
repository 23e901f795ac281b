//! The check every model load makes against this process's cgroup memory
//! limit (v1 or v2, [`crate::memory_limit`]) before it reads any weight: a
//! run the kernel would kill says so first (a warning for the caller to
//! print, or an error), naming the limit, the file it came from, what the
//! model needs and what to do.
//!
//! When what the run cannot do without (the spine and one layer step's
//! routed experts) is over the limit itself and the cache is sized
//! automatically, nothing larder chooses can fit: that is an error. With
//! experts in RAM or an explicit `--ram-budget SIZE` (the user's choice) it
//! is a warning, as is a run whose spine, cache and prefill memory may
//! outgrow the room the limit leaves now.

use std::path::Path;

use larder_store::format_size;

use crate::engine::{ExpertMode, LoadOptions};
use crate::error::EngineError;
use crate::memory_limit::{cgroup_limit, check_fit, CgroupLimit, LimitFit, MemoryNeeds};
use crate::prefill::PrefillChunk;

/// How routed experts are held, for what a message advises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpertHolding {
    /// All loaded into RAM (a checkpoint folder without streaming flags).
    InRam,
    /// Streamed through a cache sized by `--ram-budget auto`.
    AutoCache,
    /// Streamed through a cache of an explicit `--ram-budget SIZE`.
    SizedCache,
}

/// What the check concludes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Fits,
    Warn(String),
    Refuse(String),
}

/// Checks the run that loads `model` with `load` (its cache sized
/// automatically when `auto_budget`, prompts split by `prefill`) against
/// this process's cgroup memory limit before loading (see the module doc):
/// a warning to show, or an error. Nothing is checked without a limit, or
/// where the model's sizes cannot be read (the load then says why).
pub(crate) fn check(model: &Path, auto_budget: bool, prefill: PrefillChunk, load: &LoadOptions) -> Result<Option<String>, EngineError> {
    let Some(limit) = cgroup_limit() else {
        return Ok(None);
    };
    let Ok(report) = crate::sizing::inspect(model) else {
        return Ok(None);
    };
    let sizes = &report.sizes;
    let (holding, needs) = match &load.experts {
        ExpertMode::InRam => (
            ExpertHolding::InRam,
            MemoryNeeds {
                spine: sizes.spine_bytes,
                experts_least: sizes.bank_bytes,
                experts_most: sizes.bank_bytes,
                prefill: 0,
            },
        ),
        ExpertMode::Stream(o) => (
            if auto_budget {
                ExpertHolding::AutoCache
            } else {
                ExpertHolding::SizedCache
            },
            MemoryNeeds {
                spine: sizes.spine_bytes,
                experts_least: sizes.min_cache_bytes().min(sizes.bank_bytes),
                experts_most: o.ram_budget.min(sizes.bank_bytes),
                prefill: 0,
            },
        ),
    };
    let needs = MemoryNeeds {
        prefill: prefill_bytes(&report.folder, prefill),
        ..needs
    };
    match verdict(&model.display().to_string(), &needs, &limit, holding) {
        Verdict::Fits => Ok(None),
        Verdict::Warn(message) => Ok(Some(message)),
        Verdict::Refuse(message) => Err(EngineError::File {
            path: model.to_path_buf(),
            message,
        }),
    }
}

/// Activation bytes a prefill pass may hold: the `--prefill-memory` cap, or
/// `--prefill-chunk` rows of the model in `folder` (0 where its config cannot be read).
fn prefill_bytes(folder: &Path, prefill: PrefillChunk) -> u64 {
    match prefill {
        PrefillChunk::Auto { memory } => memory,
        PrefillChunk::Rows(rows) => larder_model::arch::read_spec(folder)
            .map_or(0, |spec| larder_model::activation_bytes_per_row(&spec).saturating_mul(rows as u64)),
    }
}

/// The message for `model`'s `needs` under `limit` (see the module doc).
fn verdict(model: &str, needs: &MemoryNeeds, limit: &CgroupLimit, holding: ExpertHolding) -> Verdict {
    let least = format!(
        "{model} needs at least {} in memory (spine {} + {} {})",
        format_size(needs.least()),
        format_size(needs.spine),
        match holding {
            ExpertHolding::InRam => "all routed experts in RAM",
            _ => "one layer step's routed experts",
        },
        format_size(needs.experts_least)
    );
    let raise = "raise the limit (cgroup v1 memory.limit_in_bytes, v2 memory.max; `docker run --memory`)";
    match (check_fit(needs, limit), holding) {
        (LimitFit::Fits, _) => Verdict::Fits,
        (LimitFit::CannotFit, ExpertHolding::AutoCache) => Verdict::Refuse(format!(
            "{least}, over this process's {limit}: the kernel would kill it while loading. To run it, {raise} to \
             more than {}, or use a machine or container with more memory (an explicit --ram-budget SIZE tries anyway)",
            format_size(needs.least())
        )),
        (LimitFit::CannotFit, ExpertHolding::InRam) => Verdict::Warn(format!(
            "{least}, over this process's {limit}: the kernel will kill it while loading. Stream the experts \
             instead (--ram-budget auto), or {raise}"
        )),
        (LimitFit::CannotFit, ExpertHolding::SizedCache) => Verdict::Warn(format!(
            "{least}, over this process's {limit}: the kernel will kill it while loading; {raise}"
        )),
        (LimitFit::MayExceed, _) => Verdict::Warn(format!(
            "this run may hold up to {} (spine {} + {} {} + prefill memory {}), more than the {} that this process's \
             {limit} leaves ({} in use): the kernel may kill it. {}",
            format_size(needs.most()),
            format_size(needs.spine),
            match holding {
                ExpertHolding::InRam => "routed experts in RAM",
                _ => "expert cache",
            },
            format_size(needs.experts_most),
            format_size(needs.prefill),
            format_size(limit.room()),
            format_size(limit.working_set()),
            match holding {
                ExpertHolding::InRam =>
                    format!("Stream the experts (--ram-budget auto), lower --prefill-memory or --prefill-chunk, or {raise}"),
                ExpertHolding::AutoCache => format!("Lower --prefill-memory or --prefill-chunk, or {raise}"),
                ExpertHolding::SizedCache => format!("Lower --ram-budget, --prefill-memory or --prefill-chunk, or {raise}"),
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::memory_limit::CgroupVersion;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn limit() -> CgroupLimit {
        CgroupLimit {
            version: CgroupVersion::V1,
            origin: "/sys/fs/cgroup/memory/job/memory.limit_in_bytes".into(),
            limit: 640 * MIB,
            usage: 40 * MIB,
            inactive_file: 0,
        }
    }

    fn needs(spine: u64, least: u64, most: u64, prefill: u64) -> MemoryNeeds {
        MemoryNeeds {
            spine: spine * MIB,
            experts_least: least * MIB,
            experts_most: most * MIB,
            prefill: prefill * MIB,
        }
    }

    #[test]
    fn a_spine_over_the_limit_refuses_auto_and_warns_otherwise() {
        let big = needs(700, 10, 10, 0);
        let Verdict::Refuse(m) = verdict("/m", &big, &limit(), ExpertHolding::AutoCache) else {
            panic!("auto must refuse");
        };
        assert!(m.contains("/m needs at least 710.00 MiB") && m.contains("spine 700.00 MiB"), "{m}");
        assert!(
            m.contains("cgroup v1 memory limit 640.00 MiB (/sys/fs/cgroup/memory/job/memory.limit_in_bytes)"),
            "{m}"
        );
        assert!(m.contains("raise the limit") && m.contains("--ram-budget SIZE"), "{m}");
        for holding in [ExpertHolding::InRam, ExpertHolding::SizedCache] {
            assert!(matches!(verdict("/m", &big, &limit(), holding), Verdict::Warn(_)), "{holding:?}");
        }
    }

    #[test]
    fn experts_in_ram_over_the_limit_advise_streaming() {
        let Verdict::Warn(m) = verdict("/m", &needs(100, 900, 900, 0), &limit(), ExpertHolding::InRam) else {
            panic!("in RAM over the limit must warn");
        };
        assert!(m.contains("all routed experts in RAM") && m.contains("--ram-budget auto"), "{m}");
    }

    #[test]
    fn a_run_that_may_outgrow_the_room_warns_with_what_to_lower() {
        let Verdict::Warn(m) = verdict("/m", &needs(300, 10, 200, 150), &limit(), ExpertHolding::SizedCache) else {
            panic!("650 MiB in 600 MiB of room must warn");
        };
        assert!(
            m.contains("up to 650.00 MiB (spine 300.00 MiB + expert cache 200.00 MiB + prefill memory 150.00 MiB)"),
            "{m}"
        );
        assert!(
            m.contains("600.00 MiB that this process's cgroup v1") && m.contains("(40.00 MiB in use)"),
            "{m}"
        );
        assert!(m.contains("Lower --ram-budget, --prefill-memory or --prefill-chunk"), "{m}");
        assert_eq!(
            verdict("/m", &needs(300, 10, 200, 50), &limit(), ExpertHolding::AutoCache),
            Verdict::Fits
        );
    }
}
