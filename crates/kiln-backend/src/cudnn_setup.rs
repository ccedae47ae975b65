//! cuDNN, NVIDIA's library of tuned convolutions, which kiln runs a ResNet's convolutions
//! through on CUDA (kiln-kernels): 6 to 10 times faster than cubecl's own kernels on an H200,
//! and with nothing to compile. cudarc opens it at run time by name (`libcudnn.so.9`), which
//! finds the system's packages but not NVIDIA's pip wheels (`nvidia-cudnn-cu12`/`-cu13`, which
//! PyTorch installs), whose folder is not on the library path. This module finds the library
//! in either place, so that the probe can open it by path first and `kiln devices` can say
//! which one runs, or what to install.

use std::path::{Path, PathBuf};

use crate::cuda_setup::files_named;

/// The cuDNN that a CUDA run opens, and what it needs opened before it.
#[derive(Debug, Clone, PartialEq)]
pub struct CudnnFiles {
    /// `libcudnn.so.9`: cuDNN's entry library, the one cudarc opens.
    pub library: PathBuf,
    /// Libraries to open first, in this order: cuDNN's own parts beside it (which it opens by
    /// name when first asked for a convolution) and, for the wheels, cuBLAS's.
    pub companions: Vec<PathBuf>,
    /// Where it was found, for `kiln devices`.
    pub origin: String,
}

/// cuDNN 9's library, the only cuDNN kiln opens (kiln-kernels calls its API by this name).
pub const SONAME: &str = "libcudnn.so.9";

/// The first cuDNN 9 found, in the order the dynamic loader would try: `library_path`
/// (`$LD_LIBRARY_PATH`, then the system's folders), then each toolkit's libraries, then NVIDIA's
/// wheels in `site_packages`.
pub fn find(
    library_path: &[PathBuf],
    toolkits: &[(PathBuf, String)],
    site_packages: &[PathBuf],
) -> Option<CudnnFiles> {
    let on_path = library_path
        .iter()
        .map(|dir| (dir.clone(), dir.display().to_string(), Vec::new()));
    let in_toolkits = toolkits.iter().flat_map(|(root, origin)| {
        ["lib64", "lib"].map(|lib| (root.join(lib), origin.clone(), Vec::new()))
    });
    let in_wheels = site_packages.iter().map(|site| {
        let nvidia = site.join("nvidia");
        let cublas = [nvidia.join("cu13/lib"), nvidia.join("cublas/lib")];
        (
            nvidia.join("cudnn/lib"),
            format!("NVIDIA's pip wheel in {}", site.display()),
            cublas.to_vec(),
        )
    });
    on_path
        .chain(in_toolkits)
        .chain(in_wheels)
        .find_map(|(dir, origin, cublas_dirs)| {
            let library = dir.join(SONAME);
            library.is_file().then(|| {
                let mut companions: Vec<PathBuf> = cublas_dirs
                    .iter()
                    .flat_map(|d| libraries(d, &["libcublasLt.so.", "libcublas.so."]))
                    .collect();
                companions.extend(
                    libraries(&dir, &["libcudnn_"])
                        .into_iter()
                        .filter(|p| p.to_string_lossy().ends_with(".so.9")),
                );
                CudnnFiles {
                    library,
                    companions,
                    origin,
                }
            })
        })
}

/// The folders the dynamic loader searches by itself: `$LD_LIBRARY_PATH`'s, then the usual
/// system ones (where Debian's and NVIDIA's packages install cuDNN).
pub fn library_path() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/local/lib",
        ]
        .map(PathBuf::from),
    );
    dirs.retain(|d| !d.as_os_str().is_empty());
    dirs
}

/// The files in `dir` whose names start with one of `prefixes`, sorted.
fn libraries(dir: &Path, prefixes: &[&str]) -> Vec<PathBuf> {
    files_named(dir, |name| prefixes.iter().any(|p| name.starts_with(p)))
}

/// `cudnnGetVersion()`'s number as people write it: 91900 is 9.19.0 (cuDNN 9 counts minor
/// versions in hundreds, cuDNN 8 in thousands).
pub fn version_name(version: usize) -> String {
    let (major, rest) = if version >= 90000 {
        (version / 10000, version % 10000)
    } else {
        (version / 1000, version % 1000)
    };
    format!("{major}.{}.{}", rest / 100, rest % 100)
}

/// Whether the library opened as cuDNN 9 is cuDNN 9 (`cudnnGetVersion()`); the line saying what
/// was found otherwise.
pub fn require_9(version: usize) -> Result<(), String> {
    match version {
        90000..100000 => Ok(()),
        _ => Err(format!(
            "{SONAME} is cuDNN {}, not cuDNN 9: convolutions and batch norm run on cubecl's kernels instead; install cuDNN 9 (`pip install nvidia-cudnn-cu12` or -cu13) and put its libcudnn.so.9 first on LD_LIBRARY_PATH",
            version_name(version)
        )),
    }
}

/// The pip command that installs cuDNN 9 for a driver of this CUDA version (cuDriverGetVersion's
/// `major * 1000 + minor * 10`).
pub fn install_command(driver_version: Option<i32>) -> &'static str {
    match driver_version {
        Some(v) if v < 13000 => "pip install nvidia-cudnn-cu12",
        _ => "pip install nvidia-cudnn-cu13",
    }
}

/// The line a CUDA run shows when it has no cuDNN: what runs instead, what that costs, and the
/// command that fixes it.
pub fn missing_line(driver_version: Option<i32>) -> String {
    format!(
        "no cuDNN {} found: convolutions and batch norm run on cubecl's kernels instead, 6-10x slower than PyTorch on an H200 and minutes of compiling on first use; install it with `{}` (or put libcudnn.so.9 on LD_LIBRARY_PATH)",
        SONAME.trim_start_matches("libcudnn.so."),
        install_command(driver_version)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    #[test]
    fn the_library_path_comes_before_toolkits_and_wheels() {
        let dir = tempfile::tempdir().unwrap();
        let system = dir.path().join("usr/lib/x86_64-linux-gnu");
        touch(&system.join("libcudnn.so.9"));
        touch(&system.join("libcudnn_cnn.so.9"));
        let toolkit = dir.path().join("cuda");
        touch(&toolkit.join("lib64/libcudnn.so.9"));
        let found = find(
            &[dir.path().join("empty"), system.clone()],
            &[(toolkit, "/usr/local/cuda".into())],
            &[],
        )
        .unwrap();
        assert_eq!(found.library, system.join("libcudnn.so.9"));
        assert_eq!(found.companions, vec![system.join("libcudnn_cnn.so.9")]);
    }

    #[test]
    fn a_wheel_brings_its_parts_and_cublas_first() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("venv/lib/python3.12/site-packages");
        let lib = site.join("nvidia/cudnn/lib");
        for name in [
            "libcudnn.so.9",
            "libcudnn_graph.so.9",
            "libcudnn_cnn.so.9",
            "libcudnn_engines_precompiled.so.9",
        ] {
            touch(&lib.join(name));
        }
        touch(&site.join("nvidia/cu13/lib/libcublasLt.so.13"));
        touch(&site.join("nvidia/cu13/lib/libnvrtc.so.13"));
        // cuDNN 8 is another API: not taken.
        let old = dir.path().join("old");
        touch(&old.join("libcudnn.so.8"));
        let found = find(&[old], &[], std::slice::from_ref(&site)).unwrap();
        assert_eq!(found.library, lib.join("libcudnn.so.9"));
        assert!(found.origin.contains("pip wheel"), "{}", found.origin);
        assert_eq!(
            found.companions,
            vec![
                site.join("nvidia/cu13/lib/libcublasLt.so.13"),
                lib.join("libcudnn_cnn.so.9"),
                lib.join("libcudnn_engines_precompiled.so.9"),
                lib.join("libcudnn_graph.so.9"),
            ]
        );
    }

    #[test]
    fn nothing_found_says_what_to_install() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(find(&[dir.path().into()], &[], &[dir.path().into()]), None);
        assert!(missing_line(Some(13000)).contains("pip install nvidia-cudnn-cu13"));
        assert!(missing_line(Some(12080)).contains("pip install nvidia-cudnn-cu12"));
        assert!(missing_line(None).contains("cubecl's kernels"));
    }

    #[test]
    fn only_cudnn_9_is_taken() {
        assert!(require_9(91900).is_ok());
        let old = require_9(8907).unwrap_err();
        assert!(old.contains("cuDNN 8.9.7, not cuDNN 9"), "{old}");
        assert!(require_9(100000).is_err());
    }

    #[test]
    fn versions_read_as_people_write_them() {
        assert_eq!(version_name(91900), "9.19.0");
        assert_eq!(version_name(90100), "9.1.0");
        assert_eq!(version_name(8907), "8.9.7");
    }
}
