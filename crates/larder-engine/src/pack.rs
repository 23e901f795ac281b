//! What `larder pack` packs: a checkpoint folder described for
//! [`larder_store::pack`] (its routed experts by tensor extent, its spine
//! tensors, the small files a store must carry to be loadable on its own).

use std::collections::HashSet;
use std::path::Path;

use larder_model::arch::read_spec;
use larder_model::checkpoint::Checkpoint;
use larder_model::{routed_expert_parts, DecoderModel, ModelSpec};
use larder_store::pack::{PackLayer, PackSource, SpineTensor};
use larder_store::Extent;

use crate::error::EngineError;
use crate::experts::{index_of_parts, source_identity};

/// Files copied next to the spine so a store loads like a checkpoint.
pub(crate) const CARRIED_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tiktoken.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Describes the checkpoint at `dir` for packing, after checking it loads
/// as `larder run` would load it (config, every tensor the architecture
/// needs, shapes, dtypes), so a pack never writes a store that cannot load.
pub fn pack_source(dir: &Path) -> Result<PackSource, EngineError> {
    let spec = read_spec(dir)?;
    validate(dir, &spec)?;
    let ckpt = Checkpoint::open(dir)?;
    describe(dir, &spec, &ckpt)
}

/// The pack description of checkpoint `ckpt` (opened or known from its
/// headers) whose config and small files are in `dir`: its routed experts
/// by extent, every other tensor as spine, the files to carry.
pub(crate) fn describe(dir: &Path, spec: &ModelSpec, ckpt: &Checkpoint) -> Result<PackSource, EngineError> {
    let parts = routed_expert_parts(spec, ckpt)?;
    // Every tensor a record is cut from; the rest of the checkpoint is spine.
    let expert_names: HashSet<String> = parts.iter().flatten().flatten().map(|p| p.tensor.clone()).collect();
    let index = index_of_parts(ckpt, parts)?;
    let mut layers = Vec::new();
    for (l, _) in larder_model::expert_layers(spec) {
        layers.push(PackLayer {
            layer: l,
            parts: index.parts[l].clone(),
            experts: index.layers[l].iter().map(|loc| loc.extents.clone()).collect(),
        });
    }
    let mut spine = Vec::new();
    for name in ckpt.names() {
        if expert_names.contains(name) {
            continue;
        }
        let info = ckpt.tensor_info(name)?;
        spine.push(SpineTensor {
            name: name.to_string(),
            dtype: info.dtype,
            shape: info.shape,
            extent: Extent {
                file: info.file,
                offset: info.offset,
                len: info.len,
            },
        });
    }
    let copy = CARRIED_FILES.iter().map(|f| dir.join(f)).filter(|p| p.is_file()).collect();
    Ok(PackSource {
        model_type: spec.model_type.clone(),
        identity: source_identity(dir, ckpt)?,
        files: index.files.clone(),
        spine,
        layers,
        copy,
    })
}

/// Builds the whole model from the checkpoint's headers, reading no weight
/// bytes: the same errors `run` would give, before anything is written.
fn validate(dir: &Path, spec: &ModelSpec) -> Result<(), EngineError> {
    let ckpt = Checkpoint::open_unread(dir)?;
    DecoderModel::load(spec.clone(), &ckpt, None)?;
    Ok(())
}
