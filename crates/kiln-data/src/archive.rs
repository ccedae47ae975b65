//! Unpacking a downloaded `.tar.gz` without trusting it: only plain files and folders, no path
//! that leaves the target, and nothing visible until the whole archive has been written.

use std::fs::File;
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use tar::{Archive, EntryType};

use crate::DataError;

/// Extracts `archive` into a temporary folder inside `into`, then renames its top folder
/// `folder` to `into/folder`. On any failure the temporary folder is removed and `into/folder`
/// does not exist.
pub fn extract_tar_gz(archive: &Path, into: &Path, folder: &str) -> Result<PathBuf, DataError> {
    let staging = into.join(format!(".{folder}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(DataError::io(&staging))?;
    let result = unpack(archive, &staging).and_then(|()| {
        let unpacked = staging.join(folder);
        if !unpacked.is_dir() {
            return Err(DataError::corrupt(
                archive,
                format!("the archive has no top folder {folder}"),
            ));
        }
        let target = into.join(folder);
        std::fs::rename(&unpacked, &target).map_err(DataError::io(&target))?;
        Ok(target)
    });
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn unpack(archive: &Path, staging: &Path) -> Result<(), DataError> {
    let corrupt = |reason: String| DataError::corrupt(archive, reason);
    let file = File::open(archive).map_err(DataError::io(archive))?;
    let mut tar = Archive::new(GzDecoder::new(file));
    for entry in tar.entries().map_err(|e| corrupt(e.to_string()))? {
        let mut entry = entry.map_err(|e| corrupt(e.to_string()))?;
        let path = entry
            .path()
            .map_err(|e| corrupt(e.to_string()))?
            .into_owned();
        if !path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(corrupt(format!(
                "refusing the entry {}, which points outside the target folder",
                path.display()
            )));
        }
        match entry.header().entry_type() {
            EntryType::Regular | EntryType::Directory => {}
            other => {
                return Err(corrupt(format!(
                    "refusing the entry {} of type {other:?}: only files and folders are extracted",
                    path.display()
                )));
            }
        }
        entry
            .unpack_in(staging)
            .map_err(|e| corrupt(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::GzEncoder};

    fn write_archive(path: &Path, entries: &[(&[u8], &[u8])]) {
        let gz = GzEncoder::new(File::create(path).unwrap(), Compression::fast());
        let mut builder = tar::Builder::new(gz);
        for (name, data) in entries {
            let mut header = tar::Header::new_gnu();
            // Written by hand so that a hostile name such as `../x` gets in unchanged.
            header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name);
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(EntryType::Regular);
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap();
    }

    /// An archive of `data/ok.bin` and one link entry of `kind` to `target`.
    fn write_link_archive(path: &Path, kind: EntryType, target: &str) {
        let gz = GzEncoder::new(File::create(path).unwrap(), Compression::fast());
        let mut builder = tar::Builder::new(gz);
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, "data/ok.bin", &b"1"[..])
            .unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(kind);
        link.set_size(0);
        link.set_mode(0o644);
        builder.append_link(&mut link, "data/link", target).unwrap();
        builder.into_inner().unwrap().finish().unwrap();
    }

    #[test]
    fn absolute_symlink_and_hard_link_entries_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let absolute = dir.path().join("absolute.tar.gz");
        write_archive(&absolute, &[(b"/tmp/kiln-absolute-entry", b"x")]);
        let err = extract_tar_gz(&absolute, dir.path(), "data").unwrap_err();
        assert!(err.to_string().contains("outside the target"), "{err}");
        assert!(!Path::new("/tmp/kiln-absolute-entry").exists());
        for (name, kind) in [
            ("symlink", EntryType::Symlink),
            ("hardlink", EntryType::Link),
        ] {
            let archive = dir.path().join(format!("{name}.tar.gz"));
            write_link_archive(&archive, kind, "/etc/passwd");
            let err = extract_tar_gz(&archive, dir.path(), "data").unwrap_err();
            assert!(
                err.to_string().contains("only files and folders"),
                "{name}: {err}"
            );
            assert!(!dir.path().join("data").exists(), "{name}");
        }
    }

    #[test]
    fn a_good_archive_lands_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.tar.gz");
        write_archive(
            &archive,
            &[(b"data/one.bin", b"1"), (b"data/sub/two.bin", b"22")],
        );
        let out = extract_tar_gz(&archive, dir.path(), "data").unwrap();
        assert_eq!(std::fs::read(out.join("sub/two.bin")).unwrap(), b"22");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "only the archive and the folder remain");
    }

    #[test]
    fn escaping_paths_truncated_archives_and_missing_folders_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let evil = dir.path().join("evil.tar.gz");
        write_archive(
            &evil,
            &[(b"data/ok.bin", b"1"), (b"data/../../escaped", b"x")],
        );
        let err = extract_tar_gz(&evil, dir.path(), "data").unwrap_err();
        assert!(err.to_string().contains("outside the target"), "{err}");
        assert!(!dir.path().join("data").exists());
        assert!(!dir.path().parent().unwrap().join("escaped").exists());

        let good = dir.path().join("good.tar.gz");
        write_archive(&good, &[(b"data/big.bin", &[7u8; 100_000])]);
        let bytes = std::fs::read(&good).unwrap();
        let truncated = dir.path().join("truncated.tar.gz");
        std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
        let err = extract_tar_gz(&truncated, dir.path(), "data").unwrap_err();
        assert!(err.to_string().contains("truncated.tar.gz"), "{err}");
        assert!(!dir.path().join("data").exists());

        let err = extract_tar_gz(&good, dir.path(), "other").unwrap_err();
        assert!(err.to_string().contains("no top folder other"), "{err}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".tar.gz")), "{names:?}");
    }
}
