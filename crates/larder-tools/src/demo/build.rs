//! Building the demo's store: the dense SmolLM2 checkpoint upcycled into a
//! Mixtral-layout MoE in a temporary folder (every expert a copy of the dense
//! MLP, random routers), packed into the store, the temporary folder removed.

use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_bench::{Observer, Unit};
use larder_engine::pack::pack_source;
use larder_model::{upcycle, UpcycleLayout, UpcycleSpec};
use larder_store::format_size;
use larder_store::pack::{pack_with, PackEvent, PackOptions};

use super::{DemoOptions, Timings};
use crate::{Result, ToolsError};

/// Removes what an interrupted earlier run left: a folder without a manifest is started over.
fn remove_unfinished(dirs: [&Path; 2]) -> Result<()> {
    for stale in dirs {
        if stale.exists() {
            std::fs::remove_dir_all(stale).map_err(|e| ToolsError::io(format!("cannot remove the unfinished {}", stale.display()), e))?;
        }
    }
    Ok(())
}

/// Upcycles `checkpoint` into `tmp`.
fn upcycle_into(checkpoint: &Path, tmp: &Path, opts: &DemoOptions, observer: &dyn Observer, timings: &mut Timings) -> Result<()> {
    let spec = UpcycleSpec {
        source: checkpoint.to_path_buf(),
        out: tmp.to_path_buf(),
        experts: opts.experts,
        top_k: opts.top_k,
        layout: UpcycleLayout::Mixtral,
        seed: 0,
    };
    let started = Instant::now();
    let progress = observer.task("upcycle", 0, Unit::Bytes);
    let report = upcycle(&spec, &mut |done, total| {
        progress.set_total(total);
        progress.set(done);
    });
    progress.finish();
    let report =
        report.map_err(|e| ToolsError::from(e).during(format!("cannot upcycle {} into {}", checkpoint.display(), tmp.display())))?;
    timings.upcycle_s = Some(started.elapsed().as_secs_f64());
    observer.note(&format!(
        "[larder] demo: upcycled into {} layers x {} experts (top-{}), {} of experts, in {:.1}s",
        report.layers,
        report.experts,
        report.top_k,
        format_size(report.bank_bytes),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Packs the upcycled checkpoint at `tmp` into `store`.
fn pack_into(tmp: &Path, store: &Path, observer: &dyn Observer, timings: &mut Timings) -> Result<()> {
    let started = Instant::now();
    let src = pack_source(tmp).map_err(|e| ToolsError::from(e).during(format!("cannot read the upcycled checkpoint {}", tmp.display())))?;
    let progress = observer.task("pack", 0, Unit::Bytes);
    let packed = pack_with(&src, store, &[], PackOptions::default(), &mut |ev| match ev {
        PackEvent::Started { total_bytes } => progress.set_total(total_bytes),
        PackEvent::Advanced { bytes } => progress.inc(bytes),
        _ => {}
    });
    progress.finish();
    packed.map_err(|e| ToolsError::from(e).during(format!("cannot pack {} into {}", tmp.display(), store.display())))?;
    timings.pack_s = Some(started.elapsed().as_secs_f64());
    observer.note(&format!(
        "[larder] demo: packed the experts into {} in {:.1}s",
        store.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Upcycles `checkpoint` into a temporary folder, packs it into `store`, removes the temporary folder.
pub fn build_store(checkpoint: &Path, store: &Path, opts: &DemoOptions, observer: &dyn Observer, timings: &mut Timings) -> Result<()> {
    let tmp = PathBuf::from(format!("{}.upcycle.tmp", store.display()));
    remove_unfinished([&tmp, store])?;
    upcycle_into(checkpoint, &tmp, opts, observer, timings)?;
    pack_into(&tmp, store, observer, timings)?;
    std::fs::remove_dir_all(&tmp).map_err(|e| ToolsError::io(format!("cannot remove {}", tmp.display()), e))
}
