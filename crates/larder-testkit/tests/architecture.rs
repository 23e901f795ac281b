//! The workspace's architecture, checked in CI (issue 38): no import cycle
//! between the source files of any crate, and dependencies between the
//! crates pointing one way (larder_testkit::architecture).

use std::path::PathBuf;

use larder_testkit::architecture::{import_cycles, layering_violations};
use larder_testkit::workspace_root;

/// Every `src` folder of the workspace's crates and apps.
fn sources() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut srcs = Vec::new();
    for group in ["crates", "apps"] {
        for entry in std::fs::read_dir(root.join(group)).unwrap().flatten() {
            let src = entry.path().join("src");
            if src.is_dir() {
                srcs.push(src);
            }
        }
    }
    srcs.sort();
    srcs
}

#[test]
fn no_import_cycle_between_the_files_of_any_crate() {
    let srcs = sources();
    assert!(srcs.len() >= 8, "found only {srcs:?}");
    let cycles = import_cycles(&srcs);
    assert!(
        cycles.is_empty(),
        "import cycles (break them by moving what both sides need into a lower module):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn dependencies_between_crates_point_one_way() {
    let manifests: Vec<PathBuf> = sources().iter().map(|s| s.with_file_name("Cargo.toml")).collect();
    let wrong = layering_violations(&manifests);
    assert!(wrong.is_empty(), "dependencies that point the wrong way:\n{}", wrong.join("\n"));
}
