//! torchvision's ImageNet weights by name: found in a cache, or downloaded and hash-checked.
//!
//! A file is looked for in kiln's cache (`$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else
//! `~/.cache/kiln`, under `weights/`), then in PyTorch's own hub cache, so weights a user already
//! has from torchvision are reused. torchvision names each file with the first hex digits of its
//! SHA-256, and every copy is checked against them before use.

use std::path::{Path, PathBuf};

use kiln_download::{DownloadError, fetch, is_verified};

const BASE_URL: &str = "https://download.pytorch.org/models";

/// torchvision's `IMAGENET1K_V1` weight files, by depth.
const TORCHVISION_FILES: [(usize, &str); 5] = [
    (18, "resnet18-f37072fd.pth"),
    (34, "resnet34-b627a593.pth"),
    (50, "resnet50-0676ba61.pth"),
    (101, "resnet101-63fe2227.pth"),
    (152, "resnet152-394f9c45.pth"),
];

#[derive(Debug, thiserror::Error)]
pub enum PretrainedError {
    #[error("torchvision has no pretrained ResNet-{0}")]
    UnknownDepth(usize),
    #[error("no ResNet-{depth} weights in the cache and downloads are off; place {file} in {}", dir.display())]
    NotCached {
        depth: usize,
        file: &'static str,
        dir: PathBuf,
    },
    #[error(transparent)]
    Download(#[from] DownloadError),
}

/// Where kiln keeps downloaded weights.
pub fn cache_dir() -> PathBuf {
    kiln_download::cache_root().join("weights")
}

/// PyTorch's hub cache, where torchvision puts the same files.
fn torch_hub_dir() -> Option<PathBuf> {
    let env = |key| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("TORCH_HOME")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("torch")))
        .or_else(|| env("HOME").map(|p| p.join(".cache/torch")))
        .map(|p| p.join("hub/checkpoints"))
}

/// The file name and the SHA-256 prefix it carries, e.g. `("resnet18-f37072fd.pth", "f37072fd")`.
pub fn torchvision_file(depth: usize) -> Result<(&'static str, &'static str), PretrainedError> {
    let (_, file) = TORCHVISION_FILES
        .iter()
        .find(|(d, _)| *d == depth)
        .ok_or(PretrainedError::UnknownDepth(depth))?;
    let hash = file
        .trim_end_matches(".pth")
        .rsplit('-')
        .next()
        .unwrap_or_default();
    Ok((file, hash))
}

/// A verified local copy of torchvision's ImageNet weights for `depth`, downloading it into
/// `cache` when `download` allows and no verified copy exists.
pub fn torchvision_weights(
    depth: usize,
    cache: &Path,
    download: bool,
) -> Result<PathBuf, PretrainedError> {
    let places: Vec<PathBuf> = std::iter::once(cache.to_path_buf())
        .chain(torch_hub_dir())
        .collect();
    find_or_fetch(depth, &places, download)
}

/// The first verified copy in `places`, else a download into the first of them.
fn find_or_fetch(
    depth: usize,
    places: &[PathBuf],
    download: bool,
) -> Result<PathBuf, PretrainedError> {
    let (file, hash) = torchvision_file(depth)?;
    let cache = places
        .first()
        .map(PathBuf::as_path)
        .unwrap_or(Path::new("."));
    for dir in places {
        let path = dir.join(file);
        if is_verified(&path, hash) {
            return Ok(path);
        }
    }
    if !download {
        return Err(PretrainedError::NotCached {
            depth,
            file,
            dir: cache.to_path_buf(),
        });
    }
    let dest = cache.join(file);
    fetch(&format!("{BASE_URL}/{file}"), &dest, hash)?;
    Ok(dest)
}

/// The 1000 ImageNet class names in torchvision's order.
pub fn imagenet_classes() -> Vec<&'static str> {
    include_str!("imagenet_classes.txt").lines().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_carry_their_hash() {
        assert_eq!(
            torchvision_file(50).unwrap(),
            ("resnet50-0676ba61.pth", "0676ba61")
        );
        assert!(torchvision_file(20).is_err());
    }

    #[test]
    fn cached_copies_are_used_only_when_their_hash_matches() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = torchvision_file(18).unwrap();
        std::fs::write(dir.path().join(file), b"not the real weights").unwrap();
        let err = find_or_fetch(18, &[dir.path().to_path_buf()], false).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("resnet18-f37072fd.pth")
                && message.contains(&*dir.path().to_string_lossy()),
            "{message}"
        );
    }

    #[test]
    fn imagenet_has_a_thousand_classes() {
        let classes = imagenet_classes();
        assert_eq!(classes.len(), 1000);
        assert_eq!(classes[0], "tench");
        assert_eq!(classes[999], "toilet tissue");
    }
}
