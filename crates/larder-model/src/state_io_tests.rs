//! Tests of the state file format: exact round trips on GQA, MLA and KDA
//! fixtures, and every kind of bad file refused.

use std::path::Path;

use super::*;
use crate::arch::load_model;

const IDS: &[u32] = &[360, 386, 74, 15, 315, 217, 285, 254];

fn model(name: &str) -> DecoderModel {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
    load_model(&dir, None).unwrap()
}

fn encode(identity: u128, state: &SequenceState, snaps: &[StateSnapshot]) -> Vec<u8> {
    let mut out = Vec::new();
    let n = write_state(&mut out, identity, &IDS[..state.len()], state, snaps).unwrap();
    assert_eq!(n, out.len() as u64);
    assert_eq!(encoded_len(&IDS[..state.len()], state, snaps), n);
    out
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn round_trips_continue_bit_identically() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny", "kimi_linear_tiny", "kimi_linear_mla_first"] {
        let m = model(name);
        let fresh = m.forward(IDS, &mut m.new_state(), None).unwrap().into_vec();
        let vocab = fresh.len() / IDS.len();
        let mut state = m.new_state();
        m.forward(&IDS[..3], &mut state, None).unwrap();
        let snap = state.snapshot();
        m.forward(&IDS[3..5], &mut state, None).unwrap();
        let bytes = encode(7, &state, std::slice::from_ref(&snap));
        let header = read_header(&bytes[..], bytes.len() as u64).unwrap();
        assert_eq!(
            (header.tokens.as_slice(), header.snapshot_lens.as_slice()),
            (&IDS[..5], &[3][..]),
            "{name}"
        );
        let saved = read_state(&bytes[..], bytes.len() as u64, &m, 7).unwrap();
        assert_eq!(saved.snapshots, vec![snap], "{name}");
        let mut back = saved.state;
        let again = m.forward(&IDS[5..], &mut back, None).unwrap().into_vec();
        assert!(same_bits(&again, &fresh[5 * vocab..]), "{name}: continuing a reloaded state");
        // And from the reloaded snapshot (a restore for recurrent models).
        let mut back = read_state(&bytes[..], bytes.len() as u64, &m, 7).unwrap();
        back.state.restore(&back.snapshots[0]).unwrap();
        let again = m.forward(&IDS[3..], &mut back.state, None).unwrap().into_vec();
        assert!(
            same_bits(&again, &fresh[3 * vocab..]),
            "{name}: continuing from a reloaded snapshot"
        );
    }
}

#[test]
fn bad_files_are_refused() {
    let m = model("qwen3_moe_tiny");
    let mut state = m.new_state();
    m.forward(&IDS[..4], &mut state, None).unwrap();
    let bytes = encode(7, &state, &[]);
    let read = |b: &[u8]| read_state(b, b.len() as u64, &m, 7).map(|_| ()).unwrap_err();
    for cut in [0, 10, 40, bytes.len() / 2, bytes.len() - 1] {
        let e = read(&bytes[..cut]);
        assert!(matches!(e, StateIoError::Truncated(_) | StateIoError::Digest), "cut at {cut}: {e}");
    }
    let mut flipped = bytes.clone();
    let mid = bytes.len() - 40;
    flipped[mid] ^= 1;
    assert!(matches!(read(&flipped), StateIoError::Digest));
    let mut magic = bytes.clone();
    magic[0] = b'X';
    assert!(matches!(read(&magic), StateIoError::Magic));
    let other = read_state(&bytes[..], bytes.len() as u64, &m, 8).unwrap_err();
    assert!(matches!(other, StateIoError::OtherModel { .. }), "{other}");
    // A state of another shape (same identity claimed): refused by dims.
    let mla = model("deepseek_v3_tiny");
    let mut s = mla.new_state();
    mla.forward(&IDS[..2], &mut s, None).unwrap();
    let e = read(&encode(7, &s, &[]));
    assert!(matches!(e, StateIoError::Shape(_)), "{e}");
}

#[test]
fn dims_are_stored_per_layer_whatever_they_are() {
    // A latent-style layer (v_dim 0) and an odd one round-trip as stored.
    let mut s = SequenceState::new(vec![LayerState::Kv(KvLayer::new(3, 0)), LayerState::Kv(KvLayer::new(1, 5))]);
    for l in [0, 1] {
        if let Some(LayerState::Kv(kv)) = s.layer_mut(l) {
            let (k, v) = kv.dims();
            kv.push(&vec![1.5; k], &vec![-2.0; v]);
            kv.push(&vec![0.25; k], &vec![3.0; v]);
        }
    }
    s.commit(2);
    let mut out = Vec::new();
    write_state(&mut out, 1, &[4, 5], &s, &[]).unwrap();
    let mut src = Src::new(&out[..], out.len() as u64).unwrap();
    header(&mut src).unwrap();
    let back = read_layers(&mut src).unwrap();
    src.finish().unwrap();
    for l in [0, 1] {
        match (s.layer(l), back.layer(l)) {
            (Some(LayerState::Kv(a)), Some(LayerState::Kv(b))) => {
                assert_eq!(a.dims(), b.dims());
                assert_eq!(a.parts(), b.parts());
            }
            _ => panic!("layer {l} is KV"),
        }
    }
}
