//! Disk tier tests: a reloaded state (whole, rolled back, or at a snapshot)
//! continues bit-identically on GQA, MLA and Kimi Linear fixtures and across
//! a reopen; bad files are refused and removed; the quota holds; a full disk
//! fails a save and nothing else; an unwritable folder is refused at open.

use std::path::{Path, PathBuf};

use larder_model::{load_model, DecoderModel};

use super::*;

const IDS: &[u32] = &[360, 386, 74, 15, 315, 217, 285, 254, 415, 327];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

fn temp(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-disk-tier-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

fn open(dir: &Path, name: &str, m: &DecoderModel, quota: u64) -> DiskTier {
    let config = DiskTierConfig {
        dir: dir.to_path_buf(),
        quota,
    };
    DiskTier::open(config, &fixture(name), m).unwrap()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Runs `n` ids into a fresh state, snapshotting at 5 (when it cannot roll back).
fn run(m: &DecoderModel, n: usize) -> (SequenceState, ReturnPoints) {
    let mut state = m.new_state();
    let mut points = ReturnPoints::new();
    m.forward(&IDS[..5], &mut state, None).unwrap();
    points.record(&state);
    m.forward(&IDS[5..n], &mut state, None).unwrap();
    (state, points)
}

#[test]
fn reloaded_states_continue_bit_identically_after_a_reopen() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny", "kimi_linear_tiny", "kimi_linear_mla_first"] {
        let m = load_model(&fixture(name), None).unwrap();
        let fresh = m.forward(IDS, &mut m.new_state(), None).unwrap().into_vec();
        let vocab = fresh.len() / IDS.len();
        let dir = temp(name);
        let (state, points) = run(&m, 8);
        open(&dir, name, &m, 1 << 30).save(&IDS[..8], &state, &points);
        drop((state, points));

        let mut tier = open(&dir, name, &m, 1 << 30);
        assert_eq!(tier.stats().files, 1, "{name}: found after a reopen");
        // The whole state (a longer feed), then a diverging one sharing 6 ids.
        let hit = tier.lookup(IDS).unwrap();
        assert_eq!((hit.reuse, hit.whole), (8, true), "{name}");
        let (mut s, _) = tier.load(hit, &m).unwrap();
        let again = m.forward(&IDS[8..], &mut s, None).unwrap().into_vec();
        assert!(same_bits(&again, &fresh[8 * vocab..]), "{name}: whole state reloaded");

        let mut diverging = IDS[..6].to_vec();
        diverging.extend([7, 8, 9]);
        let hit = tier.lookup(&diverging).unwrap();
        let want = if m.new_state().can_rollback() { 6 } else { 5 };
        assert_eq!((hit.reuse, hit.whole), (want, false), "{name}: rolled back, or at the snapshot");
        let (mut s, points) = tier.load(hit, &m).unwrap();
        assert!(points.is_empty(), "{name}: a partial reuse takes no snapshot");
        let fresh_div = m.forward(&diverging, &mut m.new_state(), None).unwrap().into_vec();
        let again = m.forward(&diverging[want..], &mut s, None).unwrap().into_vec();
        assert!(same_bits(&again, &fresh_div[want * vocab..]), "{name}: partial reload");
        let stats = tier.stats();
        assert_eq!((stats.hits, stats.bad_files), (2, 0), "{name}");
        assert!(stats.bytes_read >= 2 * stats.bytes_on_disk, "{name}");
        let _ = fs::remove_dir_all(&dir);
    }
}

#[test]
fn corrupt_truncated_and_foreign_files_are_never_used() {
    let m = load_model(&fixture("qwen3_moe_tiny"), None).unwrap();
    let dir = temp("bad");
    let (state, points) = run(&m, 8);
    let mut tier = open(&dir, "qwen3_moe_tiny", &m, 1 << 30);
    tier.save(&IDS[..8], &state, &points);
    let path = tier.entries[0].path.clone();
    let good = fs::read(&path).unwrap();

    // A flipped byte deep in the values: the header indexes, the load refuses it.
    let mut bad = good.clone();
    let at = bad.len() - 100;
    bad[at] ^= 0x40;
    fs::write(&path, &bad).unwrap();
    let mut tier = open(&dir, "qwen3_moe_tiny", &m, 1 << 30);
    let hit = tier.lookup(IDS).unwrap();
    assert!(tier.load(hit, &m).is_none());
    let warnings = tier.take_warnings();
    assert!(
        warnings.len() == 1 && warnings[0].contains(&path.display().to_string()) && warnings[0].contains("digest"),
        "{warnings:?}"
    );
    assert!(!path.exists() && tier.lookup(IDS).is_none(), "removed and forgotten");

    // Cut short: refused (here already at open, the header is cut).
    fs::write(&path, &good[..20]).unwrap();
    let mut tier = open(&dir, "qwen3_moe_tiny", &m, 1 << 30);
    assert!(tier.lookup(IDS).is_none() && !path.exists());
    assert_eq!(tier.take_warnings().len(), 1);

    // A file of another model in the folder is left alone and unused.
    fs::write(&path, &good).unwrap();
    let mla = load_model(&fixture("deepseek_v3_tiny"), None).unwrap();
    let mut other = open(&dir, "deepseek_v3_tiny", &mla, 1 << 30);
    assert!(other.lookup(IDS).is_none() && path.exists() && other.take_warnings().is_empty());

    // A half-written temporary file never looks valid, and is cleared at open.
    let tmp = dir.join(".x.state.1.tmp");
    fs::write(&tmp, &good[..good.len() / 2]).unwrap();
    let tier = open(&dir, "qwen3_moe_tiny", &m, 1 << 30);
    assert_eq!(tier.stats().files, 1);
    assert!(!tmp.exists());
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_quota_keeps_the_most_recently_used_files() {
    let m = load_model(&fixture("qwen3_moe_tiny"), None).unwrap();
    let dir = temp("quota");
    let (state, points) = run(&m, 6);
    let one = state_io::encoded_len(&IDS[..6], &state, points.snapshots());
    let mut tier = open(&dir, "qwen3_moe_tiny", &m, 2 * one + one / 2);
    let mut a = IDS[..6].to_vec();
    for k in 0..3 {
        a[0] = 1000 + k;
        tier.save(&a, &state, &points);
    }
    let stats = tier.stats();
    assert_eq!((stats.files, stats.bytes_on_disk), (2, 2 * one));
    a[0] = 1000;
    assert!(tier.lookup(&[a.clone(), vec![1]].concat()).is_none(), "the oldest went");
    // Larger than the quota: not saved.
    let mut small = open(&dir, "qwen3_moe_tiny", &m, one - 1);
    small.save(&IDS[..6], &state, &points);
    assert_eq!(small.stats().files, 0);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_full_disk_fails_the_save_only() {
    let m = load_model(&fixture("qwen3_moe_tiny"), None).unwrap();
    let dir = temp("enospc");
    fs::create_dir_all(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs at {} (needs root)", dir.display());
        return;
    }
    let (state, points) = run(&m, 10);
    let mut tier = open(&dir, "qwen3_moe_tiny", &m, 1 << 30);
    // Fill the disk (the write stops at ENOSPC) so the save cannot fit.
    let filler = dir.join("filler");
    let _ = fs::write(&filler, vec![1u8; 64 << 10]);
    tier.save(IDS, &state, &points);
    let stats = tier.stats();
    let warnings = tier.take_warnings();
    let _ = fs::remove_file(&filler);
    let left: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with(super::super::identity::CONTENT_DIGESTS))
        .collect();
    let _ = std::process::Command::new("umount").arg(&dir).status();
    assert_eq!((stats.files, stats.save_failures), (0, 1));
    assert!(warnings.len() == 1 && warnings[0].contains("could not save"), "{warnings:?}");
    assert!(left.is_empty(), "the temporary file is removed: {left:?}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_folder_is_refused_at_open() {
    let m = load_model(&fixture("qwen3_moe_tiny"), None).unwrap();
    // A path under a regular file can never be created, even as root.
    let file = temp("notdir");
    fs::write(&file, b"x").unwrap();
    let config = DiskTierConfig {
        dir: file.join("states"),
        quota: 1 << 20,
    };
    let e = DiskTier::open(config, &fixture("qwen3_moe_tiny"), &m).err().unwrap().to_string();
    assert!(e.contains(&file.display().to_string()), "{e}");
    let _ = fs::remove_file(&file);
}

#[test]
fn state_quota_default_is_a_tenth_of_free_space() {
    assert_eq!(state_quota_of(100 << 30), 10 << 30);
    assert_eq!(state_quota_of(0), 64 << 20);
}
