//! Streaming routed experts: where the model's [`ExpertProvider`] meets
//! larder-store. [`StoreExperts`] turns each fetched record into a SwiGLU
//! expert without copying its bytes, and [`direct_index`] / [`packed_index`]
//! say where every expert lives: in the original safetensors (read by range,
//! no pack step) or in a packed store.

use std::path::Path;
use std::sync::Arc;

use larder_model::checkpoint::Checkpoint;
use larder_model::{expert_layers, expert_tensors, ExpertProvider, ModelError, ModelSpec};
use larder_store::manifest::SourceIdentity;
use larder_store::{Digest, ExpertIndex, ExpertLocation, ExpertRecord, ExpertStore, Extent, Manifest, Part, PartDesc, StoreError};
use larder_tensor::expert::{ComponentLayout, ExpertLayout, SwigluExpert};
use larder_tensor::weight::SharedBytes;
use larder_tensor::{WeightDType, WeightFormat, WeightMatrix};

use crate::error::EngineError;

/// An [`ExpertProvider`] over an [`ExpertStore`].
pub struct StoreExperts {
    store: Arc<ExpertStore>,
    /// Per layer: gate, up, down as stored, each with the index of its
    /// first part (codes) and, for block-scaled formats, of its scales.
    layouts: Vec<Option<[Projection; 3]>>,
    /// Per layer: the experts' input/output width (`hidden_size`, or the
    /// latent size of latent-space experts) and their intermediate width.
    width: Vec<usize>,
    intermediate: Vec<usize>,
}

/// How one projection of a record is stored.
#[derive(Debug, Clone, Copy)]
struct Projection {
    format: WeightFormat,
    codes: usize,
    scales: Option<usize>,
}

/// The error type threaded through a fetch: model errors from compute,
/// store errors from reads.
struct Fail(ModelError);

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail(ModelError::Provider(Box::new(e)))
    }
}

impl StoreExperts {
    /// Checks the index describes `spec`'s experts (roles, shapes, dtypes).
    pub fn new(store: Arc<ExpertStore>, spec: &ModelSpec) -> Result<StoreExperts, EngineError> {
        let index = store.index();
        let mut layouts = vec![None; spec.layers.len()];
        let mut intermediate = vec![0; spec.layers.len()];
        let mut width = vec![0; spec.layers.len()];
        for (l, n) in expert_layers(spec) {
            let bad = |m: String| EngineError::Invalid {
                field: "experts",
                message: format!("layer {l}: {m} (is the store from another model?)"),
            };
            let have = index.layers.get(l).map_or(0, |x| x.len());
            if have != n {
                return Err(bad(format!("the store holds {have} experts, the config says {n}")));
            }
            let want = expert_tensors(spec, l, 0).ok_or_else(|| bad("not a MoE layer".into()))?;
            let parts = &index.parts[l];
            let mut projections = Vec::with_capacity(3);
            let mut k = 0;
            for t in &want {
                let p = parts.get(k).ok_or_else(|| bad(format!("records lack the {} projection", t.role)))?;
                if p.role != t.role || p.shape != t.shape {
                    return Err(bad(format!(
                        "component {k} is {} {:?}, expected {} {:?}",
                        p.role, p.shape, t.role, t.shape
                    )));
                }
                let scale = parts.get(k + 1).filter(|s| s.role == format!("{}.scale", t.role));
                let format = match (p.dtype.as_str(), scale) {
                    ("F8_E4M3", Some(s)) => {
                        let (br, bc) = spec
                            .fp8_block
                            .ok_or_else(|| bad("fp8 experts but the config has no quantization_config.weight_block_size".into()))?;
                        if s.dtype != "F32" || s.shape != [t.shape[0].div_ceil(br), t.shape[1].div_ceil(bc)] {
                            return Err(bad(format!("{} scales are {} {:?}", t.role, s.dtype, s.shape)));
                        }
                        WeightFormat::Fp8Block {
                            block_rows: br,
                            block_cols: bc,
                        }
                    }
                    ("F8_E4M3", None) => return Err(bad(format!("fp8 {} without its weight_scale_inv", t.role))),
                    (d, _) => WeightFormat::Dense(
                        parse_dtype(d).ok_or_else(|| bad(format!("{} dtype {d} is not supported for experts yet", t.role)))?,
                    ),
                };
                projections.push(Projection {
                    format,
                    codes: k,
                    scales: scale.map(|_| k + 1),
                });
                k += 1 + scale.is_some() as usize;
            }
            if k != parts.len() {
                return Err(bad(format!("records have {} components, expected {k}", parts.len())));
            }
            layouts[l] = Some([projections[0], projections[1], projections[2]]);
            intermediate[l] = want[0].shape[0];
            width[l] = want[0].shape[1];
        }
        Ok(StoreExperts {
            store,
            layouts,
            width,
            intermediate,
        })
    }

    pub fn store(&self) -> &Arc<ExpertStore> {
        &self.store
    }

    /// The expert over a record's bytes (no copy of weight codes). Components
    /// sharing one buffer become one record view, so gate and up fuse when adjacent.
    fn expert(&self, layer: usize, expert: usize, rec: &ExpertRecord) -> Result<SwigluExpert, ModelError> {
        let layout = self.layouts[layer].ok_or_else(|| ModelError::Experts(format!("layer {layer} has no routed experts")))?;
        let (h, i) = (self.width[layer], self.intermediate[layer]);
        let name = format!("layer {layer} expert {expert}");
        let p = &rec.parts;
        let one_owner = p.iter().all(|v| Arc::ptr_eq(&v.owner, &p[0].owner));
        if one_owner {
            let owner = p[0].owner.clone();
            let total = (*owner).as_ref().len();
            let record = SharedBytes::new(owner, 0, total);
            let c = |k: usize| {
                let pr = layout[k];
                ComponentLayout {
                    format: pr.format,
                    offset: p[pr.codes].start,
                    len: p[pr.codes].len,
                    scales: pr.scales.map(|s| (p[s].start, p[s].len)),
                }
            };
            let layout = ExpertLayout {
                hidden: h,
                intermediate: i,
                gate: c(0),
                up: c(1),
                down: c(2),
            };
            return Ok(SwigluExpert::from_record(&name, &record, &layout)?);
        }
        let m = |k: usize, rows, cols| {
            let pr = layout[k];
            let v = &p[pr.codes];
            let codes = SharedBytes::new(v.owner.clone(), v.start, v.len);
            match (pr.format, pr.scales) {
                (WeightFormat::Fp8Block { block_rows, block_cols }, Some(s)) => {
                    let scales = p[s]
                        .as_slice()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    WeightMatrix::fp8_block(&name, rows, cols, codes, scales, block_rows, block_cols)
                }
                (WeightFormat::Dense(d), _) => WeightMatrix::new(&name, d, rows, cols, codes),
                (f, _) => Err(larder_tensor::WeightError::Layout {
                    name: name.clone(),
                    message: format!("{f} experts are not supported here"),
                }),
            }
        };
        Ok(SwigluExpert::new(&name, m(0, i, h)?, m(1, i, h)?, m(2, h, i)?)?)
    }
}

impl ExpertProvider for StoreExperts {
    fn with_experts(
        &self,
        layer: usize,
        ids: &[usize],
        run: &mut dyn FnMut(usize, &SwigluExpert) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        self.store
            .fetch::<Fail>(layer, ids, &mut |i, rec| {
                let mlp = self.expert(layer, ids[i], &rec).map_err(Fail)?;
                run(i, &mlp).map_err(Fail)
            })
            .map_err(|f| f.0)
    }

    fn prefetch(&self, layer: usize, ids: &[usize]) {
        self.store.prefetch(layer, ids);
    }

    fn wants_prefetch(&self) -> bool {
        true
    }

    fn is_resident(&self, layer: usize, expert: usize) -> bool {
        self.store.cache().contains((layer, expert))
    }
}

fn parse_dtype(s: &str) -> Option<WeightDType> {
    match s {
        "F32" => Some(WeightDType::F32),
        "F16" => Some(WeightDType::F16),
        "BF16" => Some(WeightDType::BF16),
        _ => None,
    }
}

/// Where every routed expert of a checkpoint is in its own safetensors
/// files: one extent per tensor (direct streaming, and the input of pack).
pub fn direct_index(spec: &ModelSpec, ckpt: &Checkpoint) -> Result<ExpertIndex, EngineError> {
    ckpt.set_fp8_block(spec.fp8_block);
    let mut index = ExpertIndex {
        files: ckpt.file_paths(),
        layers: vec![Vec::new(); spec.layers.len()],
        parts: vec![Vec::new(); spec.layers.len()],
    };
    for (l, n) in expert_layers(spec) {
        let mut experts = Vec::with_capacity(n);
        for e in 0..n {
            let tensors = expert_tensors(spec, l, e).ok_or_else(|| ModelError::Experts(format!("layer {l}: not a MoE layer")))?;
            let mut loc = ExpertLocation {
                extents: Vec::new(),
                parts: Vec::new(),
                digest: None,
                digest_seed: 0,
            };
            let mut descs = Vec::new();
            for t in tensors.iter() {
                let (info, scale) = ckpt.checked_info(&t.name, &t.shape)?;
                for (role, info) in [(t.role.to_string(), Some(info)), (format!("{}.scale", t.role), scale)] {
                    let Some(info) = info else { continue };
                    loc.parts.push(Part {
                        extent: loc.extents.len(),
                        offset: 0,
                        len: info.len,
                    });
                    loc.extents.push(Extent {
                        file: info.file,
                        offset: info.offset,
                        len: info.len,
                    });
                    descs.push(PartDesc {
                        role,
                        dtype: info.dtype,
                        shape: info.shape,
                    });
                }
            }
            if e == 0 {
                index.parts[l] = descs;
            } else if index.parts[l] != descs {
                return Err(EngineError::Invalid {
                    field: "experts",
                    message: format!("layer {l}: expert {e}'s tensors differ in dtype or shape from expert 0's"),
                });
            }
            experts.push(loc);
        }
        index.layers[l] = experts;
    }
    Ok(index)
}

/// The identity of a checkpoint folder: its config.json and each
/// safetensors file's name, size and header.
pub fn source_identity(dir: &Path, ckpt: &Checkpoint) -> Result<SourceIdentity, EngineError> {
    let cfg = dir.join("config.json");
    let bytes = std::fs::read(&cfg).map_err(|source| EngineError::Io { path: cfg.clone(), source })?;
    let files = ckpt
        .file_paths()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let size = std::fs::metadata(p)
                .map_err(|source| EngineError::Io { path: p.clone(), source })?
                .len();
            Ok(larder_store::manifest::SourceFile {
                name: p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                size,
                header_digest: Digest::of(ckpt.file_header(i)).to_string(),
            })
        })
        .collect::<Result<_, EngineError>>()?;
    Ok(SourceIdentity {
        config_digest: Digest::of(&bytes).to_string(),
        files,
    })
}

/// The index of a packed store at `dir`, after checking its config.json is
/// the one it was packed from and its carried files are the ones packed.
pub fn packed_index(dir: &Path) -> Result<(Manifest, ExpertIndex), EngineError> {
    let manifest = Manifest::read(dir).map_err(store_err)?;
    let cfg = dir.join("config.json");
    let bytes = std::fs::read(&cfg).map_err(|source| EngineError::Io { path: cfg.clone(), source })?;
    if Digest::of(&bytes).to_string() != manifest.source.config_digest {
        return Err(EngineError::File {
            path: cfg,
            message: "differs from the config.json the store's manifest was packed from; the manifest belongs to another model".into(),
        });
    }
    crate::integrity::check_carried_files(dir, &manifest)?;
    let index = manifest.index(dir).map_err(store_err)?;
    Ok((manifest, index))
}

pub(crate) fn store_err(e: StoreError) -> EngineError {
    EngineError::Model(ModelError::Provider(Box::new(e)))
}
