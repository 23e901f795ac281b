//! The recorder learns, from config.json alone (plus which optional tensors
//! ship), exactly the tensors every fixture checkpoint ships: the same
//! names, each shipped dtype among the dtypes recorded and each shape among
//! the shapes recorded. Tensor names, shapes and formats are declared once,
//! in the loaders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use larder_model::arch::read_spec;
use larder_model::checkpoint::Checkpoint;
use larder_model::{DecoderModel, Recorder};
use larder_model::{RecordedRole, RecordedTensor};

/// Every model fixture (a folder with config.json and reference.json).
fn model_fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("fixtures folder")
        .map(|e| e.expect("fixtures entry").path())
        .filter(|d| d.join("config.json").exists() && d.join("reference.json").exists())
        .collect();
    dirs.sort();
    dirs
}

/// What the recorder learns of the checkpoint in `dir`.
fn record(dir: &Path, ckpt: &Checkpoint) -> Vec<RecordedTensor> {
    let spec = read_spec(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let recorder = Recorder::with_names(ckpt.names().into_iter().map(str::to_string));
    DecoderModel::load(spec, &recorder, None).unwrap_or_else(|e| panic!("{}: recording: {e}", dir.display()));
    recorder.tensors()
}

#[test]
fn the_recorder_learns_exactly_what_every_fixture_ships() {
    let fixtures = model_fixtures();
    assert!(fixtures.len() >= 19, "only {} model fixtures found", fixtures.len());
    for dir in fixtures {
        let ckpt = Checkpoint::open(&dir).unwrap();
        let recorded = record(&dir, &ckpt);
        let mut by_name = BTreeMap::new();
        for t in &recorded {
            assert!(
                by_name.insert(t.name.as_str(), t).is_none(),
                "{}: `{}` recorded twice",
                dir.display(),
                t.name
            );
        }
        // Kimi K3 ships layer 0's mixer-input attention-residual site, which its model never reads.
        let mut shipped = ckpt.names();
        shipped.retain(|n| !n.starts_with("model.layers.0.self_attention_res_"));
        let learned: Vec<&str> = by_name.keys().copied().collect();
        assert_eq!(learned, shipped, "{}: recorded names differ from the shipped ones", dir.display());
        for t in &recorded {
            let info = ckpt.tensor_info(&t.name).unwrap();
            assert!(
                t.dtypes.contains(&info.dtype.as_str()),
                "{}: `{}` ships {} but the recorder wants {:?} ({:?})",
                dir.display(),
                t.name,
                info.dtype,
                t.dtypes,
                t.role
            );
            // A padded `A_log` (K3 ships 128 values for 96 heads) is read at
            // its stored length, which a recorder without shapes cannot know.
            let padded_a_log = t.name.ends_with(".A_log") && info.shape.len() == 1;
            assert!(
                padded_a_log || t.shapes.contains(&info.shape),
                "{}: `{}` ships {:?} but the recorder wants {:?} ({:?})",
                dir.display(),
                t.name,
                info.shape,
                t.shapes,
                t.role
            );
        }
    }
}

#[test]
fn quantized_fixtures_record_their_formats_parts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let roles = |fixture: &str| -> BTreeMap<String, (RecordedRole, Vec<&'static str>)> {
        let dir = root.join(fixture);
        let ckpt = Checkpoint::open(&dir).unwrap();
        record(&dir, &ckpt).into_iter().map(|t| (t.name, (t.role, t.dtypes))).collect()
    };
    let fp8 = roles("deepseek_v3_fp8");
    let q = "model.layers.0.self_attn.q_a_proj.weight";
    assert_eq!(fp8[q].1, ["F8_E4M3"]);
    assert_eq!(fp8[&format!("{q}_scale_inv")].1, ["F32"]);
    assert!(!fp8["lm_head.weight"].1.contains(&"F8_E4M3"), "lm_head stays unquantized");
    assert_eq!(fp8["model.embed_tokens.weight"].0, RecordedRole::Param);
    let int4 = roles("deepseek_v3_int4");
    let packed: Vec<&String> = int4.keys().filter(|n| n.ends_with(".weight_shape")).collect();
    assert!(!packed.is_empty(), "int4 experts record their weight_shape");
    let gpt_oss = roles("gpt_oss_tiny");
    let blocks = "model.layers.0.mlp.experts.gate_up_proj_blocks";
    assert_eq!(gpt_oss[blocks], (RecordedRole::FusedRaw, vec!["U8"]));
}

/// The loaders tag every routed-expert request and nothing else: a tagged
/// record is a tensor of `mlp.experts` / `block_sparse_moe.experts` (by the
/// hub's naming, which no loader code consults), and
/// `routed_expert_parts` cuts every expert from exactly those tensors, in
/// the same parts for every expert of a layer.
#[test]
fn loaders_tag_routed_expert_tensors_and_only_those() {
    for dir in model_fixtures() {
        let ckpt = Checkpoint::open(&dir).unwrap();
        let spec = read_spec(&dir).unwrap();
        let recorded = record(&dir, &ckpt);
        for t in &recorded {
            let named_expert = t.name.contains(".experts.") && !t.name.contains("shared_expert");
            assert_eq!(
                t.expert.is_some(),
                named_expert,
                "{}: `{}` tagged {:?}",
                dir.display(),
                t.name,
                t.expert
            );
        }
        let tagged: std::collections::BTreeSet<&str> = recorded.iter().filter(|t| t.expert.is_some()).map(|t| t.name.as_str()).collect();
        let parts = larder_model::routed_expert_parts(&spec, &ckpt).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut cut_from = std::collections::BTreeSet::new();
        for (l, n) in larder_model::expert_layers(&spec) {
            assert_eq!(parts[l].len(), n, "{}: layer {l}", dir.display());
            let roles = |expert: &[larder_model::ExpertPart]| expert.iter().map(|p| p.role.clone()).collect::<Vec<_>>();
            let first = roles(&parts[l][0]);
            for (e, expert) in parts[l].iter().enumerate() {
                assert!(!expert.is_empty(), "{}: layer {l} expert {e} has no parts", dir.display());
                assert_eq!(roles(expert), first, "{}: layer {l} expert {e}", dir.display());
                cut_from.extend(expert.iter().map(|p| p.tensor.clone()));
            }
            assert_eq!(first.first().map(|r| r.starts_with("gate")), Some(true));
        }
        let cut_from: std::collections::BTreeSet<&str> = cut_from.iter().map(String::as_str).collect();
        assert_eq!(cut_from, tagged, "{}", dir.display());
    }
}
