//! compressed-tensors 4-bit checkpoints (`deepseek_v3_int4`: INT4
//! pack-quantized, `deepseek_v3_mxfp4`: MXFP4): bad input is refused with an
//! error naming the tensor or the `quantization_config` field. (That they
//! load and match transformers is tests/fixtures.rs; that streaming matches
//! in-RAM bit for bit is larder-engine's tests/streaming.rs.)

mod scratch;

use std::path::Path;

use scratch::FixtureCopy;

use larder_model::load_model;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

const INT4: &str = "deepseek_v3_int4";
const MXFP4: &str = "deepseek_v3_mxfp4";
const GATE: &str = "model.layers.1.mlp.experts.0.gate_proj";

fn copy_fixture(name: &str, tag: &str) -> FixtureCopy {
    FixtureCopy::new(&format!("larder-ct-{name}"), name, tag)
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

/// A replacement tensor: dtype, shape, bytes.
type NewTensor = (Dtype, Vec<usize>, Vec<u8>);

/// A change to `quantization_config`.
type SchemeEdit = Box<dyn Fn(&mut Value)>;

/// Rewrites model.safetensors with `name` replaced by `(dtype, shape, bytes)`, or dropped (`None`).
fn replace_tensor(dir: &Path, name: &str, new: Option<NewTensor>) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, TensorView<'_>)> = st.tensors().into_iter().filter(|(n, _)| n != name).collect();
    if let Some((dtype, shape, data)) = &new {
        tensors.push((name.to_string(), TensorView::new(*dtype, shape.clone(), data).unwrap()));
    }
    std::fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
}

fn load_error(dir: &Path) -> String {
    match load_model(dir, None) {
        Ok(_) => panic!("{} should not load", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_names(msg: &str, wants: &[&str]) {
    for w in wants {
        assert!(msg.contains(w), "{msg}\n  should name {w}");
    }
}

#[test]
fn truncated_or_misshapen_packed_tensors_are_named() {
    let packed = format!("{GATE}.weight_packed");
    let scale = format!("{GATE}.weight_scale");
    let cases: Vec<(&str, &str, NewTensor, &str)> = vec![
        // int4 words [32, 8] cut to [32, 7].
        (INT4, &packed, (Dtype::I32, vec![32, 7], vec![0; 32 * 7 * 4]), "shape [32, 7]"),
        // int4 scales [32, 2] cut to [32, 1].
        (INT4, &scale, (Dtype::BF16, vec![32, 1], vec![0; 32 * 2]), "shape [32, 1]"),
        // int4 words shipped as bytes.
        (INT4, &packed, (Dtype::U8, vec![32, 32], vec![0; 32 * 32]), "dtype U8"),
        // mxfp4 blocks [32, 32] cut to [32, 16].
        (MXFP4, &packed, (Dtype::U8, vec![32, 16], vec![0; 32 * 16]), "shape [32, 16]"),
        // mxfp4 scales of the wrong shape, and not e8m0 bytes.
        (MXFP4, &scale, (Dtype::U8, vec![2, 32], vec![127; 64]), "shape [2, 32]"),
        (MXFP4, &scale, (Dtype::BF16, vec![32, 2], vec![0; 128]), "dtype BF16"),
    ];
    for (i, (fixture, tensor, new, want)) in cases.into_iter().enumerate() {
        let dir = copy_fixture(fixture, &format!("shape{i}"));
        replace_tensor(&dir, tensor, Some(new));
        assert_names(&load_error(&dir), &[tensor, want]);
    }
}

#[test]
fn weight_shape_must_agree_with_the_packed_size() {
    let shape = format!("{GATE}.weight_shape");
    let dir = copy_fixture(INT4, "wshape");
    let wrong: Vec<u8> = [32i32, 72].iter().flat_map(|v| v.to_le_bytes()).collect();
    replace_tensor(&dir, &shape, Some((Dtype::I32, vec![2], wrong)));
    assert_names(&load_error(&dir), &[&shape, "weight_shape says [32, 72]", "[32, 64]"]);

    let dir = copy_fixture(INT4, "noshape");
    replace_tensor(&dir, &shape, None);
    assert_names(&load_error(&dir), &[&shape, "not found"]);
}

#[test]
fn a_missing_scale_is_named() {
    for fixture in [INT4, MXFP4] {
        let scale = format!("{GATE}.weight_scale");
        let dir = copy_fixture(fixture, "noscale");
        replace_tensor(&dir, &scale, None);
        assert_names(&load_error(&dir), &[&scale, "not found"]);
    }
}

#[test]
fn packed_tensors_must_be_described_by_the_scheme() {
    // A module listed in `ignore` but shipped packed.
    let dir = copy_fixture(INT4, "ignored-packed");
    edit_config(&dir, |v| {
        v["quantization_config"]["ignore"]
            .as_array_mut()
            .unwrap()
            .push(json!("re:.*experts\\.0\\..*"));
    });
    assert_names(
        &load_error(&dir),
        &["quantization_config.ignore", &format!("{GATE}.weight_packed"), "ships packed"],
    );

    // A targeted module (not in `ignore`) shipped unquantized loads: what is
    // stored decides (Kimi K3 ships bf16 `Linear`s its `ignore` list misses).
    let dir = copy_fixture(MXFP4, "targeted-plain");
    edit_config(&dir, |v| {
        let ignore = v["quantization_config"]["ignore"].as_array_mut().unwrap();
        ignore.retain(|e| e != "re:.*shared_experts.*");
    });
    larder_model::load_model(&dir, None).expect("an unquantized targeted module loads as stored");
}

#[test]
fn unsupported_schemes_are_refused_by_field() {
    let w = "quantization_config.config_groups.group_0.weights";
    let cases: Vec<(&str, SchemeEdit, String)> = vec![
        (INT4, Box::new(|q| q["quant_method"] = json!("awq")), "quant_method".into()),
        (
            INT4,
            Box::new(|q| q["format"] = json!("float-quantized")),
            "quantization_config.format".into(),
        ),
        (INT4, Box::new(|q| q["format"] = json!("mxfp4-pack-quantized")), format!("{w}.type")),
        (
            INT4,
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["symmetric"] = json!(false)),
            format!("{w}.symmetric"),
        ),
        (
            INT4,
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["group_size"] = json!(12)),
            format!("{w}.group_size"),
        ),
        (
            INT4,
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["num_bits"] = json!(8)),
            format!("{w}.num_bits"),
        ),
        (
            INT4,
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["strategy"] = json!("channel")),
            format!("{w}.strategy"),
        ),
        (
            INT4,
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["zero_point"] = json!(8)),
            format!("{w}.zero_point"),
        ),
        (
            INT4,
            Box::new(|q| q["config_groups"]["group_0"]["input_activations"] = json!({"num_bits": 8, "type": "float"})),
            "quantization_config.config_groups.group_0.input_activations".into(),
        ),
        (
            MXFP4,
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["group_size"] = json!(16)),
            format!("{w}.group_size"),
        ),
        (
            INT4,
            Box::new(|q| q["config_groups"]["group_1"] = q["config_groups"]["group_0"].clone()),
            "quantization_config.config_groups".into(),
        ),
        (
            INT4,
            Box::new(|q| q["kv_cache_scheme"] = json!({"num_bits": 8})),
            "quantization_config.kv_cache_scheme".into(),
        ),
        (
            INT4,
            Box::new(|q| q["quantization_status"] = json!("frozen")),
            "quantization_config.quantization_status".into(),
        ),
    ];
    for (i, (fixture, change, field)) in cases.into_iter().enumerate() {
        let dir = copy_fixture(fixture, &format!("scheme{i}"));
        edit_config(&dir, |v| change(&mut v["quantization_config"]));
        let msg = load_error(&dir);
        assert_names(&msg, &["config.json", &field]);
    }
}
