//! Streaming routed experts: where the model's [`ExpertProvider`] meets
//! larder-store. [`StoreExperts`] turns each fetched record into a SwiGLU
//! expert without copying its bytes (gpt-oss: the six MXFP4 slices viewed
//! as they lie; unquantized gpt-oss weights are input-major as shipped and
//! transposed once per fetch, as the in-RAM loader transposes them once), and [`direct_index`] / [`packed_index`]
//! say where every expert lives: in the original safetensors (read by range,
//! no pack step) or in a packed store.

use std::path::Path;
use std::sync::Arc;

use larder_model::assemble::{check_fused_part, check_weight_shape, gpt_oss_expert, shipped_format, weight_matrix, PartKind, PartMeta};
use larder_model::checkpoint::Checkpoint;
use larder_model::ModuleRule;
use larder_model::{expert_layers, expert_tensors, routed_expert_parts, ExpertPart, ExpertProvider, ModelError, ModelSpec};
use larder_model::{gpt_oss_layer_parts, FusedLayer};
use larder_store::manifest::SourceIdentity;
use larder_store::{Digest, ExpertIndex, ExpertLocation, ExpertRecord, ExpertStore, Extent, Part, PartDesc, StoreError};
use larder_tensor::{ComponentLayout, ExpertLayout, GluActivation, SwigluExpert, WeightFormat, WeightMatrix};

use crate::error::EngineError;

/// An [`ExpertProvider`] over an [`ExpertStore`].
pub(crate) struct StoreExperts {
    store: Arc<ExpertStore>,
    /// Per layer: gate, up, down as stored, each with the index of its
    /// first part (codes) and, for block-scaled formats, of its scales.
    layouts: Vec<Option<[Projection; 3]>>,
    /// Per layer: the experts' input/output width (`hidden_size`, or the
    /// latent size of latent-space experts) and their intermediate width.
    width: Vec<usize>,
    intermediate: Vec<usize>,
    /// Per layer: each record part's role, dtype and shape (the index's).
    parts: Vec<Vec<PartDesc>>,
    /// Per layer: gpt-oss experts (slices of fused tensors; `layouts` is
    /// `None` there), built from their record parts by
    /// [`gpt_oss_expert`].
    fused: Vec<Option<FusedLayer>>,
    /// How the (non-fused) experts combine gate and up (`ModelSpec::ffn_activation`).
    activation: GluActivation,
}

/// How one projection of a record is stored: its format and the indices
/// of its parts (codes; scales and `weight_shape` where shipped).
#[derive(Debug, Clone, Copy)]
struct Projection {
    format: WeightFormat,
    codes: usize,
    scales: Option<usize>,
    shape: Option<usize>,
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
    pub(crate) fn new(store: Arc<ExpertStore>, spec: &ModelSpec) -> Result<StoreExperts, EngineError> {
        let index = store.index();
        let mut layouts = vec![None; spec.layers.len()];
        let mut intermediate = vec![0; spec.layers.len()];
        let mut width = vec![0; spec.layers.len()];
        let mut fused = vec![None; spec.layers.len()];
        for (l, n) in expert_layers(spec) {
            let bad = |m: String| EngineError::Invalid {
                field: "experts",
                message: format!("layer {l}: {m} (is the store from another model?)"),
            };
            let have = index.layers.get(l).map_or(0, |x| x.len());
            if have != n {
                return Err(bad(format!("the store holds {have} experts, the config says {n}")));
            }
            if let Some(f) = gpt_oss_layer_parts(spec, l, None)? {
                check_fused_records(&f, &index.parts[l]).map_err(bad)?;
                fused[l] = Some(f);
                continue;
            }
            let want = expert_tensors(spec, l, 0).ok_or_else(|| bad("not a MoE layer".into()))?;
            let parts = &index.parts[l];
            let mut projections = Vec::with_capacity(3);
            let mut k = 0;
            for t in &want {
                let p = parts.get(k).ok_or_else(|| bad(format!("records lack the {} projection", t.role)))?;
                if p.role != t.role {
                    return Err(bad(format!(
                        "component {k} is {} {:?}, expected {} {:?}",
                        p.role, p.shape, t.role, t.shape
                    )));
                }
                let mut proj = Projection {
                    format: WeightFormat::Mxfp4,
                    codes: k,
                    scales: None,
                    shape: None,
                };
                k += 1;
                while let Some(kind) = parts.get(k).and_then(|q| PartKind::of_role(&q.role, t.role)) {
                    match kind {
                        PartKind::Scales if proj.scales.is_none() => proj.scales = Some(k),
                        PartKind::Shape if proj.shape.is_none() => proj.shape = Some(k),
                        _ => return Err(bad(format!("component {k} ({}) repeats a part", parts[k].role))),
                    }
                    k += 1;
                }
                let module = t.name.strip_suffix(".weight").unwrap_or(&t.name);
                let packed = match spec.compressed.as_ref().map(|c| c.rule(module)) {
                    Some(ModuleRule::Packed(f)) => Some(f),
                    _ => None,
                };
                let [rows, cols] = t.shape;
                proj.format = shipped_format(
                    module,
                    rows,
                    cols,
                    meta(p),
                    proj.scales.map(|s| meta(&parts[s])),
                    packed,
                    spec.fp8_block,
                )
                .map_err(bad)?;
                projections.push(proj);
            }
            if k != parts.len() {
                return Err(bad(format!("records have {} components, expected {k}", parts.len())));
            }
            let [gate, up, down] = <[Projection; 3]>::try_from(projections).map_err(|_| bad("not three projections".into()))?;
            layouts[l] = Some([gate, up, down]);
            intermediate[l] = want[0].shape[0];
            width[l] = want[0].shape[1];
        }
        let parts = index.parts.clone();
        Ok(StoreExperts {
            store,
            fused,
            parts,
            layouts,
            width,
            activation: spec.ffn_activation,
            intermediate,
        })
    }

    /// The expert over a record's bytes (no copy of weight codes). Components
    /// sharing one buffer become one record view, so gate and up fuse when adjacent.
    fn expert(&self, layer: usize, expert: usize, rec: &ExpertRecord) -> Result<SwigluExpert, ModelError> {
        if let Some(f) = &self.fused[layer] {
            let name = format!("{}.experts.{expert}", f.block);
            let p = &rec.parts;
            let slices: Vec<_> = self.parts[layer]
                .iter()
                .zip(p)
                .map(|(d, v)| (d.dtype.as_str(), v.clone()))
                .collect();
            return Ok(gpt_oss_expert(&name, f.hidden, f.intermediate, f.mxfp4, &slices, f.activation)?);
        }
        let layout = self.layouts[layer].ok_or_else(|| ModelError::Experts(format!("layer {layer} has no routed experts")))?;
        let (h, i) = (self.width[layer], self.intermediate[layer]);
        let name = format!("layer {layer} expert {expert}");
        let p = &rec.parts;
        let one_owner = p.iter().all(|v| v.same_owner(&p[0]));
        let all_dense = layout.iter().all(|pr| matches!(pr.format, WeightFormat::Dense(_)));
        if one_owner && all_dense {
            // One view over the record, so adjacent gate and up fuse.
            let record = p[0].whole_owner();
            let c = |k: usize| ComponentLayout {
                format: layout[k].format,
                offset: p[layout[k].codes].start(),
                len: p[layout[k].codes].len(),
                scales: None,
            };
            let layout = ExpertLayout {
                hidden: h,
                intermediate: i,
                gate: c(0),
                up: c(1),
                down: c(2),
            };
            return Ok(SwigluExpert::from_record(&name, &record, &layout)?.with_activation(self.activation));
        }
        let parts = &self.parts[layer];
        let bytes = |k: usize| p[k].clone();
        let m = |k: usize, rows, cols| -> Result<WeightMatrix, ModelError> {
            let pr = layout[k];
            if let Some(s) = pr.shape {
                check_weight_shape(&parts[s].dtype, p[s].as_slice(), rows, cols)
                    .map_err(|m| ModelError::Experts(format!("{name} {}: {m}", parts[s].role)))?;
            }
            let scales = pr.scales.map(|s| (parts[s].dtype.as_str(), bytes(s)));
            Ok(weight_matrix(&name, rows, cols, pr.format, bytes(pr.codes), scales)?)
        };
        Ok(SwigluExpert::new(&name, m(0, i, h)?, m(1, i, h)?, m(2, h, i)?)?.with_activation(self.activation))
    }
}

impl StoreExperts {
    /// The checks a record's bytes must pass when the model builds its
    /// expert, beyond its digest: each compressed-tensors `weight_shape`
    /// equals the shape the config gives ([`check_weight_shape`]).
    /// `parts` in index order.
    pub(crate) fn check_parts(&self, layer: usize, parts: &[&[u8]]) -> Result<(), String> {
        let Some(Some(layout)) = self.layouts.get(layer) else {
            return Ok(());
        };
        let (h, i) = (self.width[layer], self.intermediate[layer]);
        for (pr, (rows, cols)) in layout.iter().zip([(i, h), (i, h), (h, i)]) {
            if let Some(s) = pr.shape {
                let desc = &self.parts[layer][s];
                let bytes = parts.get(s).ok_or_else(|| format!("{}: missing", desc.role))?;
                check_weight_shape(&desc.dtype, bytes, rows, cols).map_err(|m| format!("{}: {m}", desc.role))?;
            }
        }
        Ok(())
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

/// Checks a gpt-oss layer's record parts are the slices its config says
/// the experts ship in (roles, dtypes and shapes, in order).
fn check_fused_records(f: &FusedLayer, parts: &[PartDesc]) -> Result<(), String> {
    if parts.len() != f.parts.len() {
        let roles: Vec<&str> = f.parts.iter().map(|p| p.role).collect();
        return Err(format!(
            "records have {} components, expected {} ({roles:?})",
            parts.len(),
            roles.len()
        ));
    }
    for (k, (want, have)) in f.parts.iter().zip(parts).enumerate() {
        if have.role != want.role {
            return Err(format!("component {k} is {}, expected {}", have.role, want.role));
        }
        check_fused_part(want, &have.dtype, &have.shape, true)?;
    }
    Ok(())
}

/// A record part's dtype and shape, as [`shipped_format`] checks them.
fn meta(q: &PartDesc) -> PartMeta<'_> {
    PartMeta {
        dtype: &q.dtype,
        shape: &q.shape,
    }
}

/// Where every routed expert of a checkpoint is in its own safetensors
/// files: one extent per shipped part, read where it lies (a whole tensor,
/// or a gpt-oss expert's slice `[e]` of each fused per-layer tensor); direct
/// streaming, and the input of pack.
pub(crate) fn direct_index(spec: &ModelSpec, ckpt: &Checkpoint) -> Result<ExpertIndex, EngineError> {
    index_of_parts(ckpt, routed_expert_parts(spec, ckpt)?)
}

/// The index of `parts` (`[layer][expert]`, from [`routed_expert_parts`]):
/// one extent per part, where it lies in `ckpt`'s files.
pub(crate) fn index_of_parts(ckpt: &Checkpoint, parts: Vec<Vec<Vec<ExpertPart>>>) -> Result<ExpertIndex, EngineError> {
    let mut index = ExpertIndex {
        files: ckpt.file_paths(),
        layers: vec![Vec::new(); parts.len()],
        parts: vec![Vec::new(); parts.len()],
        ..Default::default()
    };
    for (l, layer) in parts.into_iter().enumerate() {
        let mut experts = Vec::with_capacity(layer.len());
        for (e, parts) in layer.into_iter().enumerate() {
            let mut loc = ExpertLocation {
                extents: Vec::new(),
                parts: Vec::new(),
                digest: None,
                digest_seed: 0,
                copies: Vec::new(),
            };
            let mut descs = Vec::new();
            for part in parts {
                loc.parts.push(Part {
                    extent: loc.extents.len(),
                    offset: 0,
                    len: part.info.len,
                });
                loc.extents.push(Extent {
                    file: part.info.file,
                    offset: part.info.offset,
                    len: part.info.len,
                });
                descs.push(PartDesc {
                    role: part.role,
                    dtype: part.info.dtype,
                    shape: part.info.shape,
                });
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
pub(crate) fn source_identity(dir: &Path, ckpt: &Checkpoint) -> Result<SourceIdentity, EngineError> {
    let cfg = dir.join("config.json");
    let bytes = std::fs::read(&cfg).map_err(|source| EngineError::Io { path: cfg.clone(), source })?;
    let files = ckpt
        .file_paths()
        .iter()
        .enumerate()
        .map(|(i, p)| larder_store::manifest::SourceFile {
            name: p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            size: ckpt.file_size(i),
            header_digest: Digest::of(ckpt.file_header(i)).to_string(),
        })
        .collect();
    Ok(SourceIdentity {
        config_digest: Digest::of(&bytes).to_string(),
        files,
    })
}
