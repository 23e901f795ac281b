//! The workspace's architecture checks, as CI runs them
//! (`tests/architecture.rs`):
//!
//! - [`import_cycles`]: no import cycle between the source files of any
//!   crate. Read from the text, as a reader sees it: an edge is a
//!   `crate::a::b` or `super::x` path, or an item of a grouped
//!   `use crate::{...}`, resolved to the longest matching module file; `mod`
//!   declarations and `pub use` re-exports are API surface, not use, and
//!   test modules (`tests.rs`, `*_tests.rs`, what follows `#[cfg(test)]`)
//!   are skipped.
//! - [`layering_violations`]: dependencies between larder crates point one
//!   way (tensor <- router <- model <- engine <- serve, store under the
//!   engine beside the model, spec over the model), the server depends on
//!   the engine only, and no inference crate depends on the tools, bench or
//!   test crates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module: its path inside its crate (`["scheduler", "disk_tier"]`).
type Module = Vec<String>;

/// Every cycle (a strongly connected component of more than one file) in
/// each `src` folder, as `"<src>: a, b, c"`, sorted.
pub fn import_cycles(srcs: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for src in srcs {
        let modules = modules(src);
        let graph: BTreeMap<Module, BTreeSet<Module>> = modules
            .iter()
            .map(|(m, file)| {
                let text = std::fs::read_to_string(file).unwrap_or_default();
                (m.clone(), edges(&modules, m, &text))
            })
            .collect();
        for scc in strongly_connected(&graph) {
            if scc.len() > 1 {
                let names: Vec<String> = scc.iter().map(|m| m.join("::")).collect();
                out.push(format!("{}: {}", src.display(), names.join(", ")));
            }
        }
    }
    out.sort();
    out
}

/// The module files of `src` (test modules left out).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap_or(&path).with_extension("");
            let mut m: Module = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if m.last().is_some_and(|l| matches!(l.as_str(), "lib" | "main" | "mod")) {
                m.pop();
            }
            if m.last().is_some_and(|l| l == "tests" || l.ends_with("_tests")) {
                continue;
            }
            found.insert(m, path);
        }
    }
    found
}

/// The modules `module`'s `text` uses (itself left out).
fn edges(modules: &BTreeMap<Module, PathBuf>, module: &Module, text: &str) -> BTreeSet<Module> {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    let body: String = text
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            let t = t.strip_prefix("pub(crate) ").or_else(|| t.strip_prefix("pub ")).unwrap_or(t);
            !(t.starts_with("mod ")
                || l.trim_start().starts_with("pub use ")
                || l.trim_start().starts_with("pub(crate) use ")
                || t.starts_with("//"))
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths: Vec<(usize, Vec<String>)> = Vec::new();
    for (ups, group) in grouped_uses(&body) {
        paths.extend(identifier_paths(&group).into_iter().map(|p| (ups, p)));
    }
    paths.extend(qualified_paths(&body));
    paths
        .into_iter()
        .filter_map(|(ups, path)| {
            // ups: 0 for `crate::`, n for n `super::`s.
            let base: Module = match ups {
                0 => Vec::new(),
                n => module[..module.len().saturating_sub(n)].to_vec(),
            };
            let full: Module = base.into_iter().chain(path).collect();
            (1..=full.len()).rev().map(|n| full[..n].to_vec()).find(|m| modules.contains_key(m))
        })
        .filter(|m| m != module)
        .collect()
}

/// The `{...}` groups of `use crate::{...};` and `use super::{...};`, with
/// how many `super`s lead them (0 for `crate`).
fn grouped_uses(body: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find("use ") {
        let after = &rest[i + 4..];
        let (ups, tail) = match leading_base(after) {
            Some(x) => x,
            None => {
                rest = after;
                continue;
            }
        };
        if let Some(group) = tail.strip_prefix('{') {
            let end = group.find("};").unwrap_or(group.len());
            out.push((ups, group[..end].to_string()));
        }
        rest = after;
    }
    out
}

/// `crate::` (0) or `super::super::` (2) at the start of `s`, and what follows.
fn leading_base(s: &str) -> Option<(usize, &str)> {
    if let Some(t) = s.strip_prefix("crate::") {
        return Some((0, t));
    }
    let mut ups = 0;
    let mut t = s;
    while let Some(next) = t.strip_prefix("super::") {
        ups += 1;
        t = next;
    }
    (ups > 0).then_some((ups, t))
}

/// Every `a::b::c` path of lowercase identifiers in `s` (a use group).
fn identifier_paths(s: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts = is_ident_start(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1]));
        if !starts {
            i += 1;
            continue;
        }
        let (path, end) = read_path(s, i, true);
        if !path.is_empty() {
            out.push(path);
        }
        // Past the identifier either way.
        i = end.max(i + 1);
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
    }
    out
}

/// Every `crate::a::B` / `super::x` path in `body`, with its `super` count.
fn qualified_paths(body: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Only at an ASCII `c` or `s` after a non-identifier byte (a char boundary).
        let boundary = matches!(bytes[i], b'c' | b's') && (i == 0 || !is_ident(bytes[i - 1]));
        if boundary {
            if let Some((ups, tail)) = leading_base(&body[i..]) {
                let start = body.len() - tail.len();
                if start < bytes.len() && is_ident_start(bytes[start]) {
                    let (path, end) = read_path(body, start, false);
                    out.push((ups, path));
                    i = end;
                    continue;
                }
            }
        }
        i += 1;
    }
    out
}

/// The path starting at `i`: lowercase segments joined by `::`, then one
/// last identifier of any case (`lowercase_only`: lowercase segments only).
fn read_path(s: &str, mut i: usize, lowercase_only: bool) -> (Vec<String>, usize) {
    let bytes = s.as_bytes();
    let mut path = Vec::new();
    loop {
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        let seg = &s[start..i];
        let lower = seg.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !lower && lowercase_only {
            break;
        }
        path.push(seg.to_string());
        if !lower || !s[i..].starts_with("::") || !s[i + 2..].bytes().next().is_some_and(is_ident_start) {
            break;
        }
        i += 2;
    }
    (path, i)
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Tarjan's strongly connected components of `graph`.
fn strongly_connected(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'g> {
        graph: &'g BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        on_stack: BTreeSet<&'g Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flatten() {
            let Some((w, _)) = graph.get_key_value(w) else { continue };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            scc.sort();
            s.out.push(scc);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The larder crates each crate may depend on (`[dependencies]`, target
/// sections included; dev-dependencies are free). `None`: any.
fn allowed(krate: &str) -> Option<&'static [&'static str]> {
    const TENSOR: &[&str] = &[];
    const ROUTER: &[&str] = &["larder-tensor"];
    const MODEL: &[&str] = &["larder-tensor", "larder-router"];
    const STORE: &[&str] = &["larder-tensor"];
    const SPEC: &[&str] = &["larder-tensor", "larder-router", "larder-model"];
    const ENGINE: &[&str] = &["larder-tensor", "larder-router", "larder-model", "larder-store", "larder-spec"];
    const SERVE: &[&str] = &["larder-engine"];
    const TESTKIT: &[&str] = &[];
    match krate {
        "larder-tensor" => Some(TENSOR),
        "larder-router" => Some(ROUTER),
        "larder-model" => Some(MODEL),
        "larder-store" => Some(STORE),
        "larder-spec" => Some(SPEC),
        "larder-engine" => Some(ENGINE),
        "larder-serve" => Some(SERVE),
        "larder-testkit" => Some(TESTKIT),
        _ => None,
    }
}

/// Every dependency between larder crates that points the wrong way, as
/// `"<crate> depends on <other>"`; `manifests` are the crates' Cargo.toml files.
pub fn layering_violations(manifests: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for manifest in manifests {
        let text = std::fs::read_to_string(manifest).unwrap_or_default();
        let name = package_name(&text).unwrap_or_default();
        let Some(ok) = allowed(&name) else { continue };
        for dep in larder_dependencies(&text) {
            if !ok.contains(&dep.as_str()) {
                out.push(format!("{name} depends on {dep} ({})", manifest.display()));
            }
        }
    }
    out.sort();
    out
}

fn package_name(toml: &str) -> Option<String> {
    let package = toml.split("[package]").nth(1)?;
    let line = package.lines().find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('"').nth(1)?.to_string())
}

/// The larder crates of a Cargo.toml's `[dependencies]` sections (plain and
/// per target), not its dev- or build-dependencies.
fn larder_dependencies(toml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in toml.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_deps = t == "[dependencies]" || (t.starts_with("[target.") && t.ends_with(".dependencies]"));
            continue;
        }
        if in_deps && t.starts_with("larder-") {
            let name: String = t.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_uses_and_qualified_names() {
        let groups = grouped_uses("use crate::{error::EngineError, experts::{self, StoreExperts}};\nuse super::x::Y;");
        assert_eq!(groups.len(), 1);
        let paths = identifier_paths(&groups[0].1);
        assert!(paths.contains(&vec!["error".to_string()]) || paths.contains(&vec!["error".to_string(), "EngineError".to_string()]));
        let q = qualified_paths("let a = crate::store::lock(&x); super::super::io::read();");
        assert_eq!(q[0], (0, vec!["store".to_string(), "lock".to_string()]));
        assert_eq!(q[1], (2, vec!["io".to_string(), "read".to_string()]));
    }

    #[test]
    fn a_cycle_is_found_and_re_exports_are_not_edges() {
        let dir = std::env::temp_dir().join(format!("larder-testkit-cycles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\nmod c;\npub use a::A;\n").unwrap();
        std::fs::write(dir.join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
        std::fs::write(dir.join("b.rs"), "pub struct B;\nfn f() { crate::a::g(); }\n").unwrap();
        std::fs::write(dir.join("c.rs"), "pub use crate::a::A;\n#[cfg(test)]\nmod t { use crate::b::B; }\n").unwrap();
        let cycles = import_cycles(std::slice::from_ref(&dir));
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(cycles[0].ends_with(": a, b"), "{cycles:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dependencies_are_read_from_the_dependency_sections_only() {
        let toml = "[package]\nname = \"larder-serve\"\n[dependencies]\nlarder-engine.workspace = true\nserde = \"1\"\n\
                    [target.'cfg(unix)'.dependencies]\nlarder-store = { path = \"x\" }\n[dev-dependencies]\nlarder-model.workspace = true\n";
        assert_eq!(package_name(toml).as_deref(), Some("larder-serve"));
        assert_eq!(larder_dependencies(toml), vec!["larder-engine", "larder-store"]);
    }
}
