//! Files replaced whole or not at all, so that a run killed mid-write leaves the previous file.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to a temporary file beside `path` and renames it into place.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    let partial = PathBuf::from(name);
    let result = (|| {
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&partial, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}
