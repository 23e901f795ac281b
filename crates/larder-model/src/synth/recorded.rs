//! The synth's hand-written tensor lists ([`super::tensors`]) against what
//! the loaders ask for: for every architecture, tiny preset and experts
//! format, a [`Recorder`] run over the synth's own config.json learns
//! exactly the names the synth writes, each dtype and shape among those
//! recorded. (A step towards building the synth's list from the recorder.)

use std::collections::BTreeMap;

use super::tensors::{layer_tensors, top_tensors};
use super::{ExpertsFormat, SynthSpec, ARCHITECTURES};
use crate::arch::read_spec;
use crate::{DecoderModel, Recorder};

/// Checks one synth spec; `Err` says what differs.
fn check(synth: &SynthSpec) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!(
        "larder-synth-recorded-{}-{}-{:?}",
        std::process::id(),
        synth.arch,
        synth.experts_format
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let config = serde_json::to_string(&synth.config()).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("config.json"), config).map_err(|e| e.to_string())?;
    let spec = read_spec(&dir).map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    let spec = spec?;
    let planned: BTreeMap<String, (Vec<usize>, &str)> = top_tensors(synth)
        .into_iter()
        .chain((0..synth.layers).flat_map(|l| layer_tensors(synth, l)))
        .map(|t| (t.name, (t.shape, t.dtype.name())))
        .collect();
    let recorder = Recorder::with_names(planned.keys().cloned());
    DecoderModel::load(spec, &recorder, None).map_err(|e| format!("recording: {e}"))?;
    let recorded = recorder.tensors();
    let names: Vec<&String> = recorded.iter().map(|t| &t.name).collect();
    let planned_names: Vec<&String> = planned.keys().collect();
    let mut sorted = names.clone();
    sorted.sort();
    if sorted != planned_names {
        return Err(format!("recorded {sorted:?}\nwritten {planned_names:?}"));
    }
    for t in &recorded {
        let (shape, dtype) = &planned[&t.name];
        if !t.dtypes.contains(dtype) || !t.shapes.contains(shape) {
            return Err(format!(
                "`{}`: written {dtype} {shape:?}, recorded {:?} {:?}",
                t.name, t.dtypes, t.shapes
            ));
        }
    }
    Ok(())
}

#[test]
fn synth_tensor_lists_are_what_the_loaders_read() {
    // Tiny presets only: with k3-mini and gpt-oss 20b this was killed for
    // memory (likely gpt-oss bf16: a recorded load transposes unquantized
    // fused experts into owned memory).
    for arch in ARCHITECTURES {
        for &format in ExpertsFormat::for_arch(arch) {
            let mut synth = SynthSpec::preset(arch, "tiny", None).unwrap();
            synth.set_experts_format(format).unwrap();
            if let Err(e) = check(&synth) {
                panic!("{arch} tiny {format:?}: {e}");
            }
        }
    }
}
