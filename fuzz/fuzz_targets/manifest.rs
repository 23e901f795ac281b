//! Fuzzes a packed store's `manifest.json`: `Manifest::read` (format,
//! version, manifest digest, fields), then the expert location index
//! (`Manifest::index`, which checks drives, files and record bounds).
//! The manifest digest is a checksum, not a signature (anyone can recompute
//! it), so any input that deserializes is also sealed (`Manifest::seal`),
//! read back and indexed, with the drive folders and layer files it names
//! created (16 KiB each) when they stay inside the scratch store folder.
//! Any input is a manifest or an error, never a panic or a huge allocation.
#![no_main]

use std::path::{Component, Path};

use larder_store::Manifest;
use libfuzzer_sys::fuzz_target;

/// A relative path with no `..`: safe to create under the scratch folder.
fn inside(p: &str) -> bool {
    let p = Path::new(p);
    p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Creates the drive folders and layer files `m` names, where safe.
fn populate(dir: &Path, m: &Manifest) {
    let mut made = 0;
    for le in &m.layers {
        for ee in &le.experts {
            let Some(drive) = m.drives.get(ee.drive) else { continue };
            if made >= 16 || !inside(&drive.path) || !inside(&ee.file) || ee.file.is_empty() {
                continue;
            }
            let path = dir.join(&drive.path).join(&ee.file);
            if let Some(parent) = path.parent() {
                if std::fs::create_dir_all(parent).is_ok() && !path.exists() {
                    let _ = std::fs::write(&path, [0u8; 16384]);
                    made += 1;
                }
            }
        }
    }
    for d in &m.drives {
        if inside(&d.path) {
            let _ = std::fs::create_dir_all(dir.join(&d.path));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = larder_fuzz::scratch_dir("manifest");
    larder_fuzz::write(dir, "manifest.json", data);
    if let Ok(manifest) = Manifest::read(dir) {
        populate(dir, &manifest);
        let _ = manifest.index(dir);
    }
    let Ok(mut manifest) = serde_json::from_slice::<Manifest>(data) else {
        return;
    };
    manifest.seal();
    let Ok(text) = serde_json::to_vec(&manifest) else { return };
    larder_fuzz::write(dir, "manifest.json", &text);
    populate(dir, &manifest);
    if let Ok(m) = Manifest::read(dir) {
        let _ = m.index(dir);
    }
});
