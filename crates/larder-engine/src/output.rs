//! Output files the user names (`--trace FILE`, `--out FILE`): the one check
//! every command runs on such a path before any work ([`OutputFile::check`]),
//! and the atomic write that then replaces it ([`OutputFile::write_with`]).
//!
//! The rules (docs/design.md §2, "Output files"):
//!
//! 1. Never an input of the run ([`RunInputs`]): no file inside the model's
//!    folder (a checkpoint's shards, config and tokenizer; a store's
//!    manifest, and its layer and mirror files on every drive), the lazy
//!    cache folder, a draft model, a state folder, nor a file the run reads
//!    or writes under another flag. Paths are compared as canonical paths
//!    (symlinks seen through) and an existing file also by device and inode,
//!    against every file in those folders (hard links, the blobs a Hugging
//!    Face snapshot links to).
//! 2. Only a regular file: a folder, device node, FIFO or socket, or a
//!    symlink to one or to nothing, is refused and never opened.
//! 3. An existing file must hold what is written: a route trace (its first
//!    line is a trace header) where a trace is written, the same report (its
//!    `"larder_report"` field; a report written before that field existed:
//!    the report's keys) where a JSON report is. An empty file counts as no
//!    file: replacing it loses nothing (e.g. one `mktemp` made).
//! 4. A file of the right kind is replaced only when the user said so
//!    ([`OVERWRITE_FLAG`]).
//!
//! Writing goes to `<name>.partial` beside the target, created new (O_EXCL:
//! it never follows a link or reuses a file; a stale one left by a crash is
//! unlinked first), synced, and renamed over the target once rules 2 to 4
//! hold again for what is there now. So `larder serve --trace`, rewriting
//! its own file every few seconds, replaces only the trace it wrote.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use larder_router::TraceHeader;
use larder_store::Manifest;

/// The flag that lets a command replace an existing output of its kind.
pub(crate) const OVERWRITE_FLAG: &str = "--overwrite";
/// The top-level field naming what a JSON report is (`"larder_report": "bench io"`).
pub(crate) const REPORT_FIELD: &str = "larder_report";

/// Bytes read at most to find a trace's first line.
const HEADER_LIMIT: u64 = 1 << 20;
/// A larger file is no JSON report of larder's.
const REPORT_LIMIT: u64 = 64 << 20;
/// Entries looked at, at most, when searching input folders for a file.
const WALK_LIMIT: usize = 200_000;
/// Folder depth searched below an input folder.
const WALK_DEPTH: usize = 16;

/// A JSON report a command writes (`larder bench io --out FILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportKind {
    /// Its `"larder_report"` value: the command, e.g. `bench io`.
    pub name: &'static str,
    /// Top-level keys every report of this kind has, for reports written
    /// before the `"larder_report"` field existed.
    pub legacy_keys: &'static [&'static str],
}

/// What an output file holds, so which existing file it may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// A route trace (`larder_router::Trace`).
    RouteTrace,
    /// A JSON report.
    Report(ReportKind),
}

impl OutputKind {
    /// "a route trace", "a `larder bench io` report".
    fn describe(self) -> String {
        match self {
            OutputKind::RouteTrace => "a route trace".to_string(),
            OutputKind::Report(k) => format!("a `larder {}` report", k.name),
        }
    }
}

/// Why an output path is refused or could not be written. Each names the
/// flag and the path as given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    #[error("{flag} {path}: names no file; give a file name")]
    NoFileName { flag: String, path: PathBuf },
    #[error("{flag} {path}: the folder {folder} {why}")]
    NoFolder {
        flag: String,
        path: PathBuf,
        folder: PathBuf,
        why: &'static str,
    },
    #[error("{flag} {path}: is {what}; larder writes only regular files (name a file)")]
    NotRegular { flag: String, path: PathBuf, what: String },
    #[error("{flag} {path}: {relation}; write it elsewhere")]
    Input { flag: String, path: PathBuf, relation: String },
    #[error("{flag} {path}: exists and is not {kind} ({why}); larder replaces only a file of the kind it writes: name another path")]
    OtherKind {
        flag: String,
        path: PathBuf,
        kind: String,
        why: String,
    },
    #[error("{flag} {path}: already holds {kind}; pass {OVERWRITE_FLAG} to replace it, or name another path")]
    Exists { flag: String, path: PathBuf, kind: String },
    #[error("{flag} {path}: exists, and {input} holds more than {WALK_LIMIT} entries to compare it with; name a new file")]
    Unchecked { flag: String, path: PathBuf, input: String },
    #[error("{flag} {path}: {source}")]
    Io { flag: String, path: PathBuf, source: io::Error },
}

/// What a run reads (and what else it writes): the paths an output may not be.
#[derive(Debug, Clone, Default)]
pub struct RunInputs {
    inputs: Vec<Input>,
}

/// One input: a folder (everything in it) or one file.
#[derive(Debug, Clone)]
struct Input {
    /// How messages name it: "--model /m", "the layer files of --model /m (/d/larder-x)".
    name: String,
    path: PathBuf,
    folder: bool,
    /// What it is to the run: [`INPUT`] or [`OTHER_OUTPUT`].
    role: &'static str,
}

const INPUT: &str = "an input of this run";
const OTHER_OUTPUT: &str = "another output of this run";

impl RunInputs {
    pub fn new() -> RunInputs {
        RunInputs::default()
    }

    /// A model `flag` names: a checkpoint folder or packed store (all of it,
    /// and a store's layer and mirror files on other drives), or a file in
    /// one (config.json: its folder). Nothing for a path that does not exist
    /// here (a remote source: its local files are under `--cache-dir`).
    pub fn model(mut self, flag: &str, path: &Path) -> RunInputs {
        let name = format!("{flag} {}", path.display());
        if path.is_dir() {
            for folder in store_file_folders(path) {
                let files = format!("the layer files of {name} ({})", folder.display());
                self = self.push(files, folder, true, INPUT);
            }
            self.push(name, path.to_path_buf(), true, INPUT)
        } else if path.is_file() {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            self.push(format!("the folder of {name}"), folder.to_path_buf(), true, INPUT)
        } else {
            self
        }
    }

    /// A folder the run reads or owns (`--cache-dir`, `--state-dir`), whether
    /// or not it exists yet.
    pub fn folder(self, flag: &str, path: &Path) -> RunInputs {
        self.push(format!("{flag} {}", path.display()), path.to_path_buf(), true, INPUT)
    }

    /// A file the run reads (`--heat FILE`).
    pub fn file(self, flag: &str, path: &Path) -> RunInputs {
        self.push(format!("{flag} {}", path.display()), path.to_path_buf(), false, INPUT)
    }

    /// A file the run writes under another flag: two outputs of one run are
    /// never the same file.
    pub fn other_output(self, flag: &str, path: &Path) -> RunInputs {
        self.push(format!("{flag} {}", path.display()), path.to_path_buf(), false, OTHER_OUTPUT)
    }

    fn push(mut self, name: String, path: PathBuf, folder: bool, role: &'static str) -> RunInputs {
        self.inputs.push(Input { name, path, folder, role });
        self
    }

    /// Refuses `target` (canonical; `existing`: its metadata when it exists)
    /// where it is, or is inside, one of the inputs.
    fn check(&self, flag: &str, given: &Path, target: &Path, existing: Option<&Metadata>) -> Result<(), OutputError> {
        let refuse = |relation: String| OutputError::Input {
            flag: flag.to_string(),
            path: given.to_path_buf(),
            relation,
        };
        for input in &self.inputs {
            let real = canonical_lenient(&input.path);
            if input.folder && target.starts_with(&real) {
                return Err(refuse(format!("is inside {}, {}", input.name, input.role)));
            }
            if !input.folder && target == real {
                return Err(refuse(format!("is {}, {}", input.name, input.role)));
            }
            let Some(meta) = existing else { continue };
            if !input.folder {
                if fs::metadata(&input.path).is_ok_and(|m| same_file(&m, meta)) {
                    return Err(refuse(format!("is the same file as {} (a link to it), {}", input.name, input.role)));
                }
                continue;
            }
            match find_same_file(&real, meta) {
                Search::Found(file) => {
                    return Err(refuse(format!(
                        "is the same file as {} (a link to it), in {}, {}",
                        file.display(),
                        input.name,
                        input.role
                    )))
                }
                Search::TooMany => {
                    return Err(OutputError::Unchecked {
                        flag: flag.to_string(),
                        path: given.to_path_buf(),
                        input: input.name.clone(),
                    })
                }
                Search::NotFound => {}
            }
        }
        Ok(())
    }
}

/// The folders holding a packed store's layer and mirror files (on each of
/// its drives); none for a checkpoint folder or a store that does not open
/// (loading it says why).
fn store_file_folders(root: &Path) -> Vec<PathBuf> {
    if !Manifest::is_store(root) {
        return Vec::new();
    }
    let Ok(index) = Manifest::read(root).and_then(|m| m.index(root)) else {
        return Vec::new();
    };
    let mut folders: Vec<PathBuf> = index.files.iter().filter_map(|f| f.parent().map(Path::to_path_buf)).collect();
    folders.sort();
    folders.dedup();
    folders
}

/// Whether two metadata describe one file (device and inode).
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// The outcome of searching a folder for a file.
enum Search {
    Found(PathBuf),
    NotFound,
    TooMany,
}

/// Searches `root` (subfolders to [`WALK_DEPTH`], symlinked files followed,
/// symlinked folders not) for a file that is `meta`'s file.
fn find_same_file(root: &Path, meta: &Metadata) -> Search {
    let mut folders = vec![(root.to_path_buf(), 0)];
    let mut seen = 0;
    while let Some((folder, depth)) = folders.pop() {
        let Ok(entries) = fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            seen += 1;
            if seen > WALK_LIMIT {
                return Search::TooMany;
            }
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                if depth < WALK_DEPTH {
                    folders.push((path, depth + 1));
                }
                continue;
            }
            if fs::metadata(&path).is_ok_and(|m| m.is_file() && same_file(&m, meta)) {
                return Search::Found(path);
            }
        }
    }
    Search::NotFound
}

/// `path` made absolute with its longest existing ancestor canonical (the
/// rest appended as given): a path that need not exist, comparable with
/// canonical ones.
fn canonical_lenient(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_or_else(|_| path.to_path_buf(), |d| d.join(path))
    };
    let mut rest = Vec::new();
    let mut at = absolute.as_path();
    loop {
        if let Ok(real) = fs::canonicalize(at) {
            return rest.iter().rev().fold(real, |p, name| p.join(name));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return absolute,
        }
    }
}

/// What is at an output's target.
enum Found {
    Absent,
    /// An empty regular file.
    Empty(Metadata),
    /// A regular file with content.
    File(Metadata),
}

/// An output file that passed the checks: write it with [`OutputFile::write_with`].
#[derive(Debug, Clone)]
pub struct OutputFile {
    flag: String,
    /// The path as the user gave it (for messages).
    given: PathBuf,
    /// Its canonical folder and name, a final symlink resolved: where the file is written.
    target: PathBuf,
    /// What it holds; `None`: a file in a folder the command owns.
    kind: Option<OutputKind>,
    /// Whether a file of `kind` there may be replaced: `--overwrite`, or
    /// this run wrote it.
    may_replace: bool,
}

impl OutputFile {
    /// Checks the output `flag` names at `path`, before any work: the rules
    /// of the module doc. `overwrite`: the user passed [`OVERWRITE_FLAG`].
    pub fn check(flag: &str, path: &Path, kind: OutputKind, overwrite: bool, inputs: &RunInputs) -> Result<OutputFile, OutputError> {
        let target = resolve(flag, path, FinalLink::Follow)?;
        let out = OutputFile {
            flag: flag.to_string(),
            given: path.to_path_buf(),
            target,
            kind: Some(kind),
            may_replace: overwrite,
        };
        let found = out.inspect()?;
        let existing = match &found {
            Found::Absent => None,
            Found::Empty(m) | Found::File(m) => Some(m),
        };
        inputs.check(flag, path, &out.target, existing)?;
        out.check_replaceable(&found)?;
        Ok(out)
    }

    /// A file inside a folder the command creates and owns (`larder bench
    /// run --out DIR`'s results): any regular file there is replaced, and
    /// nothing else (a folder, device, FIFO, socket or symlink) is.
    pub fn in_owned_folder(flag: &str, path: &Path) -> Result<OutputFile, OutputError> {
        let out = OutputFile {
            flag: flag.to_string(),
            given: path.to_path_buf(),
            target: resolve(flag, path, FinalLink::Refuse)?,
            kind: None,
            may_replace: true,
        };
        out.inspect()?;
        Ok(out)
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.given
    }

    /// Writes the file atomically: `fill` writes the content to a new
    /// `<name>.partial` beside it, which is synced and renamed over the
    /// target once what is there now may still be replaced.
    pub fn write_with(&mut self, fill: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), OutputError> {
        let partial = larder_tensor::safetensors_write::partial_path(&self.target);
        let mut out = BufWriter::new(create_new_partial(&partial).map_err(|e| self.io(e))?);
        let written = fill(&mut out).and_then(|()| out.flush()).and_then(|()| out.get_ref().sync_all());
        drop(out);
        let placed = written
            .map_err(|e| self.io(e))
            .and_then(|()| self.inspect())
            .and_then(|found| self.check_replaceable(&found))
            .and_then(|()| fs::rename(&partial, &self.target).map_err(|e| self.io(e)));
        if let Err(e) = placed {
            let _ = fs::remove_file(&partial);
            return Err(e);
        }
        if let Some(folder) = self.target.parent() {
            if let Ok(f) = File::open(folder) {
                let _ = f.sync_all();
            }
        }
        self.may_replace = true;
        Ok(())
    }

    /// What is at the target now; refuses anything but a regular file.
    fn inspect(&self) -> Result<Found, OutputError> {
        let meta = match fs::symlink_metadata(&self.target) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Absent),
            Err(e) => return Err(self.io(e)),
        };
        if !meta.is_file() {
            return Err(OutputError::NotRegular {
                flag: self.flag.clone(),
                path: self.given.clone(),
                what: describe_file_type(&meta).to_string(),
            });
        }
        Ok(if meta.len() == 0 { Found::Empty(meta) } else { Found::File(meta) })
    }

    /// Refuses a file with content unless it is of this output's kind and
    /// may be replaced.
    fn check_replaceable(&self, found: &Found) -> Result<(), OutputError> {
        let (Found::File(_), Some(kind)) = (found, self.kind) else {
            return Ok(());
        };
        if let Err(why) = recognize(kind, &self.target) {
            return Err(OutputError::OtherKind {
                flag: self.flag.clone(),
                path: self.given.clone(),
                kind: kind.describe(),
                why,
            });
        }
        if !self.may_replace {
            return Err(OutputError::Exists {
                flag: self.flag.clone(),
                path: self.given.clone(),
                kind: kind.describe(),
            });
        }
        Ok(())
    }

    fn io(&self, source: io::Error) -> OutputError {
        OutputError::Io {
            flag: self.flag.clone(),
            path: self.given.clone(),
            source,
        }
    }
}

/// What [`resolve`] does with a path whose last component is a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FinalLink {
    /// Resolve it: the file it names is checked and written (the checks
    /// then see what the link points to).
    Follow,
    /// Keep it: the target is the link itself, which [`OutputFile::inspect`]
    /// refuses.
    Refuse,
}

/// The canonical folder of `path` joined with its file name (a final
/// symlink resolved or kept, `final_link`): the one place the file is
/// checked and written.
fn resolve(flag: &str, path: &Path, final_link: FinalLink) -> Result<PathBuf, OutputError> {
    let Some(Component::Normal(name)) = path.components().next_back() else {
        return Err(OutputError::NoFileName {
            flag: flag.to_string(),
            path: path.to_path_buf(),
        });
    };
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let no_folder = |why| OutputError::NoFolder {
        flag: flag.to_string(),
        path: path.to_path_buf(),
        folder: folder.to_path_buf(),
        why,
    };
    let real_folder = fs::canonicalize(folder).map_err(|_| no_folder("does not exist"))?;
    if !real_folder.is_dir() {
        return Err(no_folder("is not a folder"));
    }
    let joined = real_folder.join(name);
    match fs::symlink_metadata(&joined) {
        Ok(m) if m.file_type().is_symlink() && final_link == FinalLink::Follow => {
            fs::canonicalize(&joined).map_err(|_| OutputError::NotRegular {
                flag: flag.to_string(),
                path: path.to_path_buf(),
                what: "a symlink to nothing".to_string(),
            })
        }
        _ => Ok(joined),
    }
}

/// "a folder", "a FIFO", ...: what a file that is not regular is.
fn describe_file_type(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_symlink() {
        "a symlink"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// `Ok` when the regular file at `path` holds `kind`; else why not.
fn recognize(kind: OutputKind, path: &Path) -> Result<(), String> {
    let file = File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    match kind {
        OutputKind::RouteTrace => recognize_trace(file),
        OutputKind::Report(report) => recognize_report(file, report),
    }
}

/// A route trace: its first line is a trace header.
fn recognize_trace(file: File) -> Result<(), String> {
    let mut first = Vec::new();
    BufReader::new(file.take(HEADER_LIMIT))
        .read_until(b'\n', &mut first)
        .map_err(|e| format!("cannot read it: {e}"))?;
    let line = std::str::from_utf8(&first).map_err(|_| "its first line is not text".to_string())?;
    TraceHeader::parse_line(line.trim_end()).map(|_| ())
}

/// A JSON report of `report`'s kind: its `"larder_report"` field, or all its
/// legacy keys where it has no such field.
fn recognize_report(file: File, report: ReportKind) -> Result<(), String> {
    let mut bytes = Vec::new();
    file.take(REPORT_LIMIT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > REPORT_LIMIT {
        return Err(format!("larger than {} MiB", REPORT_LIMIT >> 20));
    }
    let doc: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
    let fields = doc.as_object().ok_or("not a JSON object")?;
    match fields.get(REPORT_FIELD) {
        Some(serde_json::Value::String(name)) if name == report.name => Ok(()),
        Some(other) => Err(format!("its {REPORT_FIELD} is {other}")),
        None if report.legacy_keys.iter().all(|k| fields.contains_key(*k)) => Ok(()),
        None => Err(format!("it has no {REPORT_FIELD} field nor that report's keys")),
    }
}

/// Creates `partial` new (never through a link or into an existing file);
/// a stale one (a file or link a crashed run left) is unlinked first, which
/// never touches another name's data. Anything else there is refused.
fn create_new_partial(partial: &Path) -> io::Result<File> {
    let create = || OpenOptions::new().write(true).create_new(true).open(partial);
    match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(partial)?;
            if !(meta.is_file() || meta.file_type().is_symlink()) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is in the way ({}); remove it", partial.display(), describe_file_type(&meta)),
                ));
            }
            fs::remove_file(partial)?;
            create()
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: ReportKind = ReportKind {
        name: "bench test",
        legacy_keys: &["a", "b"],
    };

    fn trace_line() -> &'static str {
        r#"{"larder_trace":1,"model":"m","experts":8,"top_k":2,"moe_layers":[1],"expert_bytes":[10],"lookahead":0}"#
    }

    /// A fresh folder under the system's temp folder, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(test: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!("larder-output-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn check(path: &Path, kind: OutputKind, overwrite: bool, inputs: &RunInputs) -> Result<OutputFile, OutputError> {
        OutputFile::check("--out", path, kind, overwrite, inputs)
    }

    #[test]
    fn recognizes_traces_and_reports_by_their_first_line_or_field() {
        let dir = TempDir::new("recognize");
        let path = dir.path().join("f");
        let cases: [(&str, OutputKind, bool); 7] = [
            (trace_line(), OutputKind::RouteTrace, true),
            ("{\"larder_trace\":1}", OutputKind::RouteTrace, false),
            ("\u{8}\0\0\0\0\0\0\0{\"a\":1}", OutputKind::RouteTrace, false),
            (r#"{"larder_report":"bench test","x":1}"#, OutputKind::Report(REPORT), true),
            (r#"{"larder_report":"bench io","a":1,"b":2}"#, OutputKind::Report(REPORT), false),
            (r#"{"a":1,"b":2}"#, OutputKind::Report(REPORT), true),
            (r#"{"a":1}"#, OutputKind::Report(REPORT), false),
        ];
        for (text, kind, want) in cases {
            fs::write(&path, text).unwrap();
            assert_eq!(recognize(kind, &path).is_ok(), want, "{text}");
        }
    }

    #[test]
    fn refuses_inputs_other_files_and_replaces_only_with_overwrite() {
        let dir = TempDir::new("refuse");
        let model = dir.path().join("model");
        fs::create_dir(&model).unwrap();
        fs::write(model.join("config.json"), "{}").unwrap();
        let inputs = RunInputs::new().model("--model", &model);
        let refused = |path: &Path, overwrite: bool| check(path, OutputKind::RouteTrace, overwrite, &inputs).unwrap_err().to_string();

        let e = refused(&model.join("config.json"), true);
        assert!(e.contains("is inside --model") && e.contains("--out"), "{e}");
        assert!(refused(&model.join("new.jsonl"), true).contains("is inside --model"));
        let link = dir.path().join("hard");
        fs::hard_link(model.join("config.json"), &link).unwrap();
        assert!(refused(&link, true).contains("the same file as"), "{}", refused(&link, true));
        let sym = dir.path().join("sym");
        std::os::unix::fs::symlink(model.join("config.json"), &sym).unwrap();
        assert!(refused(&sym, true).contains("is inside --model"));
        std::os::unix::fs::symlink(dir.path().join("nothing"), dir.path().join("dangling")).unwrap();
        assert!(refused(&dir.path().join("dangling"), true).contains("a symlink to nothing"));
        assert!(refused(dir.path(), true).contains("a folder"));
        assert!(refused(Path::new("/dev/null"), true).contains("a character device"));
        assert!(refused(&dir.path().join("missing/t.jsonl"), false).contains("does not exist"));
        assert!(refused(&dir.path().join(".."), false).contains("names no file"));

        let other = dir.path().join("notes.txt");
        fs::write(&other, "keep me").unwrap();
        assert!(refused(&other, true).contains("is not a route trace"));

        let trace = dir.path().join("t.jsonl");
        fs::write(&trace, format!("{}\n", trace_line())).unwrap();
        assert!(refused(&trace, false).contains("--overwrite"));
        let mut out = check(&trace, OutputKind::RouteTrace, true, &inputs).unwrap();
        out.write_with(|w| w.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&trace).unwrap(), b"new");
        // The file is no longer a trace, so even this output may not replace it again.
        assert!(out
            .write_with(|w| w.write_all(b"x"))
            .unwrap_err()
            .to_string()
            .contains("not a route trace"));
        assert!(!dir.path().join("t.jsonl.partial").exists());

        let empty = dir.path().join("empty");
        fs::write(&empty, "").unwrap();
        check(&empty, OutputKind::RouteTrace, false, &inputs).unwrap();
    }

    #[test]
    fn a_new_file_is_written_once_then_rewritten_by_its_writer_only() {
        let dir = TempDir::new("rewrite");
        let path = dir.path().join("t.jsonl");
        let inputs = RunInputs::new().file("--heat", &dir.path().join("heat.json"));
        let mut out = check(&path, OutputKind::RouteTrace, false, &inputs).unwrap();
        let line = format!("{}\n", trace_line());
        out.write_with(|w| w.write_all(line.as_bytes())).unwrap();
        out.write_with(|w| w.write_all(line.as_bytes())).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), line);
        // A second output of the run at the same path is refused.
        let second = RunInputs::new().other_output("--trace", &path);
        let e = OutputFile::check("--out", &path, OutputKind::Report(REPORT), true, &second).unwrap_err();
        assert!(
            e.to_string().contains("is --trace") && e.to_string().contains("another output"),
            "{e}"
        );
        // A file the run reads is refused by identity too.
        let heat = dir.path().join("heat.json");
        fs::write(&heat, "{}").unwrap();
        let link = dir.path().join("heat-link.json");
        fs::hard_link(&heat, &link).unwrap();
        let e = OutputFile::check("--out", &link, OutputKind::Report(REPORT), true, &inputs).unwrap_err();
        assert!(e.to_string().contains("the same file as --heat"), "{e}");
        // A stale partial (even a link to elsewhere) is unlinked, never written through.
        let victim = dir.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("t.jsonl.partial")).unwrap();
        out.write_with(|w| w.write_all(line.as_bytes())).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
    }

    #[test]
    fn a_file_in_an_owned_folder_is_replaced_but_never_through_a_link() {
        let dir = TempDir::new("owned");
        let path = dir.path().join("results.json");
        fs::write(&path, "old, of any kind").unwrap();
        let mut out = OutputFile::in_owned_folder("--out", &path).unwrap();
        out.write_with(|w| w.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        let link = dir.path().join("summary.md");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = OutputFile::in_owned_folder("--out", &link).unwrap_err().to_string();
        assert!(e.contains("a symlink"), "{e}");
    }

    #[test]
    fn lenient_canonical_paths_keep_the_missing_tail() {
        let dir = TempDir::new("lenient");
        let real = fs::canonicalize(dir.path()).unwrap();
        assert_eq!(canonical_lenient(&dir.path().join("a/b")), real.join("a/b"));
    }
}
