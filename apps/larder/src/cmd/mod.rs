//! Subcommands of the `larder` binary, one file each.

pub mod bench;
pub mod forward;
pub mod run;

use std::path::Path;

use anyhow::Context;
use larder_engine::Engine;

/// Loads a checkpoint folder, with the folder named in any error.
pub fn load_engine(model: &Path) -> anyhow::Result<Engine> {
    let started = std::time::Instant::now();
    let engine = Engine::load(model).with_context(|| format!("cannot load model {}", model.display()))?;
    tracing::info!("loaded {} in {:.2}s", model.display(), started.elapsed().as_secs_f64());
    Ok(engine)
}

/// Prints one JSON document on stdout.
pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}
