//! `LARDER_KERNEL` is honoured or refused, never silently replaced: a path
//! this CPU lacks and an unknown name are errors naming the variable, the
//! value and the paths this CPU has; unset or empty means the default path.

use larder_tensor::kernels::{default_path, kernel_from_value, KernelEnvError, KernelPath};

/// A path this CPU cannot run, if any.
fn missing_path() -> Option<KernelPath> {
    [KernelPath::Neon, KernelPath::Avx512, KernelPath::Avx2]
        .into_iter()
        .find(|p| !p.is_supported())
}

#[test]
fn supported_paths_are_honoured_and_empty_is_the_default() {
    for p in KernelPath::available() {
        assert_eq!(kernel_from_value(p.name()), Ok(p));
    }
    assert_eq!(kernel_from_value(""), Ok(default_path()));
    assert_ne!(default_path(), KernelPath::Avx512, "AVX-512 stays opt-in");
}

#[test]
fn a_path_this_cpu_lacks_is_an_error_listing_what_it_has() {
    let Some(p) = missing_path() else { return };
    let e = kernel_from_value(p.name()).unwrap_err();
    assert!(matches!(e, KernelEnvError::Unsupported { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&format!("LARDER_KERNEL={}", p.name())), "{msg}");
    for have in KernelPath::available() {
        assert!(msg.contains(have.name()), "{msg}");
    }
}

#[test]
fn an_unknown_name_is_an_error_listing_the_valid_ones() {
    let msg = kernel_from_value("avx9000").unwrap_err().to_string();
    assert!(msg.contains("LARDER_KERNEL=\"avx9000\""), "{msg}");
    assert!(msg.contains("scalar, avx2, avx512, neon"), "{msg}");
}
