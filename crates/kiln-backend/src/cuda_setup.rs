//! What CUDA kernels need at run time besides the driver. cubecl compiles every kernel with NVRTC
//! when it is first used, and every kernel includes CUDA's headers (`cuda_runtime.h`, and CCCL's
//! `cuda/barrier` on Hopper). cubecl looks for them only in `$CUDA_PATH`, `/usr/local/cuda`,
//! `/opt/cuda` and `/usr`, and panics on its device thread when they are not there. Most machines
//! with a driver and PyTorch have no toolkit but do have NVIDIA's pip wheels, which carry the
//! headers and NVRTC; this module finds them, in a toolkit or in those wheels, so that a run
//! can point cubecl at them (or say in one line what to install) before any kernel compiles.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Headers (and NVRTC, where it sits beside them) that cubecl can compile against.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaHeaders {
    /// The folder to give cubecl as `CUDA_PATH`: it holds `include/cuda_runtime.h`.
    pub cuda_path: PathBuf,
    /// `libnvrtc.so.*` found with the headers, if any (else the system's is used).
    pub nvrtc: Option<PathBuf>,
    /// Where they came from, for `kiln devices`.
    pub origin: String,
}

/// Where to look, so that tests can search fake layouts.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// `$CUDA_PATH`, then `$CUDA_HOME`, then the usual toolkit folders, then nvcc's.
    pub toolkits: Vec<(PathBuf, String)>,
    /// Python `site-packages` folders that may hold NVIDIA's wheels.
    pub site_packages: Vec<PathBuf>,
    /// Where a CUDA 12 wheel layout (headers, CCCL and NVRTC in separate packages) is assembled
    /// into one folder that `CUDA_PATH` can name.
    pub assemble_in: PathBuf,
}

impl Search {
    /// This machine's places, in the order they are tried.
    pub fn of_this_machine(cache: &Path) -> Self {
        let env = |key: &str| {
            std::env::var_os(key)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let mut toolkits = Vec::new();
        for key in ["CUDA_PATH", "CUDA_HOME"] {
            if let Some(path) = env(key) {
                toolkits.push((path, format!("${key}")));
            }
        }
        for dir in ["/usr/local/cuda", "/opt/cuda"] {
            toolkits.push((PathBuf::from(dir), dir.to_string()));
        }
        if let Some(nvcc) = find_in_path("nvcc")
            && let Some(root) = nvcc.parent().and_then(Path::parent)
        {
            toolkits.push((root.to_path_buf(), format!("nvcc at {}", nvcc.display())));
        }
        Self {
            toolkits,
            site_packages: site_packages(),
            assemble_in: cache.join("cuda-wheels"),
        }
    }
}

/// The first place with the headers, or every place looked at.
pub fn find(search: &Search) -> Result<CudaHeaders, Vec<String>> {
    let mut looked = Vec::new();
    for (root, origin) in &search.toolkits {
        if root.join("include/cuda_runtime.h").is_file() {
            return Ok(CudaHeaders {
                cuda_path: root.clone(),
                nvrtc: find_nvrtc(&[root.join("lib64"), root.join("lib")]),
                origin: origin.clone(),
            });
        }
        looked.push(root.display().to_string());
    }
    for site in &search.site_packages {
        let nvidia = site.join("nvidia");
        // CUDA 13 wheels: one toolkit-shaped folder.
        let cu13 = nvidia.join("cu13");
        if cu13.join("include/cuda_runtime.h").is_file() {
            return Ok(CudaHeaders {
                nvrtc: find_nvrtc(&[cu13.join("lib")]),
                cuda_path: cu13,
                origin: format!("NVIDIA's CUDA 13 pip wheels in {}", site.display()),
            });
        }
        // CUDA 12 wheels: a package each for the runtime headers, NVRTC and CCCL.
        let runtime = nvidia.join("cuda_runtime/include");
        if runtime.join("cuda_runtime.h").is_file() {
            let cuda_path = assemble_cuda12(&nvidia, &search.assemble_in)
                .map_err(|e| vec![format!("{} (cannot assemble it: {e})", nvidia.display())])?;
            return Ok(CudaHeaders {
                nvrtc: find_nvrtc(&[nvidia.join("cuda_nvrtc/lib")]),
                cuda_path,
                origin: format!("NVIDIA's CUDA 12 pip wheels in {}", site.display()),
            });
        }
        looked.push(nvidia.display().to_string());
    }
    Err(looked)
}

/// A folder shaped like a toolkit over the CUDA 12 wheels: `include/` links every header of
/// the runtime and NVRTC packages, `include/cccl` links CCCL's headers (where cubecl looks for
/// them), `lib` links NVRTC's libraries. Built under a temporary name and renamed, so that two
/// processes assembling it at once both end with a whole folder.
fn assemble_cuda12(nvidia: &Path, parent: &Path) -> std::io::Result<PathBuf> {
    let key = nvidia
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    let target = parent.join(format!("cu12-{key:016x}"));
    if target.join("include/cuda_runtime.h").exists() {
        return Ok(target);
    }
    std::fs::create_dir_all(parent)?;
    let staging = parent.join(format!(".cu12-{key:016x}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(staging.join("include"))?;
    for package in ["cuda_runtime", "cuda_nvrtc"] {
        let Ok(entries) = std::fs::read_dir(nvidia.join(package).join("include")) else {
            continue;
        };
        for entry in entries.flatten() {
            let link = staging.join("include").join(entry.file_name());
            if !link.exists() {
                symlink(&entry.path(), &link)?;
            }
        }
    }
    let cccl = nvidia.join("cuda_cccl/include");
    if cccl.is_dir() {
        symlink(&cccl, &staging.join("include/cccl"))?;
    }
    let nvrtc = nvidia.join("cuda_nvrtc/lib");
    if nvrtc.is_dir() {
        symlink(&nvrtc, &staging.join("lib"))?;
    }
    match std::fs::rename(&staging, &target) {
        Ok(()) => Ok(target),
        Err(_) if target.join("include/cuda_runtime.h").exists() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(target)
        }
        Err(e) => Err(e),
    }
}

#[cfg(unix)]
fn symlink(original: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(original, link)
}

#[cfg(not(unix))]
fn symlink(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::Error::other(
        "CUDA wheels are assembled on Linux only",
    ))
}

/// The newest `libnvrtc.so.N` (or `libnvrtc.so`) in the first of `dirs` that has one.
fn find_nvrtc(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().find_map(|dir| {
        files_named(dir, |n| n == "libnvrtc.so" || n.starts_with("libnvrtc.so.")).pop()
    })
}

/// The `libnvrtc-builtins` libraries beside NVRTC, which NVRTC opens by name.
pub fn nvrtc_builtins(nvrtc: &Path) -> Vec<PathBuf> {
    let Some(dir) = nvrtc.parent() else {
        return Vec::new();
    };
    files_named(dir, |n| {
        n.starts_with("libnvrtc-builtins") && n.contains(".so")
    })
}

/// The files in `dir` whose names `keep` accepts, sorted (none where `dir` cannot be read).
pub(crate) fn files_named(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&keep))
        .collect();
    found.sort();
    found
}

/// The pip command that brings the headers, NVRTC and CCCL for a driver of this CUDA major
/// version (cuDriverGetVersion's `major * 1000 + minor * 10`).
pub fn install_command(driver_version: Option<i32>) -> String {
    match driver_version {
        Some(v) if v < 13000 => {
            "pip install nvidia-cuda-runtime-cu12 nvidia-cuda-nvrtc-cu12 nvidia-cuda-cccl-cu12"
                .into()
        }
        _ => "pip install nvidia-cuda-runtime nvidia-cuda-nvrtc nvidia-cuda-cccl".into(),
    }
}

/// `site-packages` folders of the Python environments a user is likely to have: the active
/// virtual environment or conda environment, and what `python3` reports (given 5 seconds).
fn site_packages() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for key in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = std::env::var_os(key).filter(|v| !v.is_empty()) {
            dirs.extend(python_lib_dirs(Path::new(&prefix)));
        }
    }
    let script = "import site, sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))";
    if let Some(out) = run_briefly(Command::new("python3").args(["-c", script])) {
        dirs.extend(out.lines().map(PathBuf::from).filter(|p| p.is_dir()));
    }
    let mut unique = Vec::new();
    for dir in dirs {
        if !unique.contains(&dir) {
            unique.push(dir);
        }
    }
    unique
}

/// `prefix/lib/python3.*/site-packages`.
fn python_lib_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(prefix.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// A program's standard output, or `None` if it fails or takes more than five seconds.
fn run_briefly(command: &mut Command) -> Option<String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if start.elapsed() > Duration::from_secs(5) => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    Some(out)
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    fn search(root: &Path, toolkits: Vec<PathBuf>, sites: Vec<PathBuf>) -> Search {
        Search {
            toolkits: toolkits
                .into_iter()
                .map(|p| (p.clone(), p.display().to_string()))
                .collect(),
            site_packages: sites,
            assemble_in: root.join("cache/cuda-wheels"),
        }
    }

    #[test]
    fn a_toolkit_comes_first_with_its_nvrtc() {
        let dir = tempfile::tempdir().unwrap();
        let toolkit = dir.path().join("cuda-12.8");
        touch(&toolkit.join("include/cuda_runtime.h"));
        touch(&toolkit.join("lib64/libnvrtc.so.12"));
        let site = dir.path().join("site-packages");
        touch(&site.join("nvidia/cu13/include/cuda_runtime.h"));
        let missing = dir.path().join("no-cuda");
        let found = find(&search(
            dir.path(),
            vec![missing, toolkit.clone()],
            vec![site],
        ))
        .unwrap();
        assert_eq!(found.cuda_path, toolkit);
        assert_eq!(found.nvrtc, Some(toolkit.join("lib64/libnvrtc.so.12")));
    }

    #[test]
    fn cuda13_wheels_are_used_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("venv/lib/python3.12/site-packages");
        let cu13 = site.join("nvidia/cu13");
        touch(&cu13.join("include/cuda_runtime.h"));
        touch(&cu13.join("include/cccl/cuda/barrier"));
        touch(&cu13.join("lib/libnvrtc.so.13"));
        touch(&cu13.join("lib/libnvrtc-builtins.so.13.0"));
        let found = find(&search(
            dir.path(),
            vec![dir.path().join("none")],
            vec![site],
        ))
        .unwrap();
        assert_eq!(found.cuda_path, cu13);
        assert!(found.origin.contains("CUDA 13"), "{}", found.origin);
        let nvrtc = found.nvrtc.unwrap();
        assert_eq!(nvrtc, cu13.join("lib/libnvrtc.so.13"));
        assert_eq!(
            nvrtc_builtins(&nvrtc),
            vec![cu13.join("lib/libnvrtc-builtins.so.13.0")]
        );
    }

    #[test]
    fn cuda12_wheels_are_assembled_where_cubecl_looks() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty-site");
        std::fs::create_dir_all(&empty).unwrap();
        let site = dir.path().join("site-packages");
        let nvidia = site.join("nvidia");
        touch(&nvidia.join("cuda_runtime/include/cuda_runtime.h"));
        touch(&nvidia.join("cuda_runtime/include/crt/host_defines.h"));
        touch(&nvidia.join("cuda_nvrtc/include/nvrtc.h"));
        touch(&nvidia.join("cuda_nvrtc/lib/libnvrtc.so.12"));
        touch(&nvidia.join("cuda_cccl/include/cuda/barrier"));
        let search = search(dir.path(), vec![], vec![empty, site]);
        let found = find(&search).unwrap();
        let root = &found.cuda_path;
        assert!(root.starts_with(dir.path().join("cache/cuda-wheels")));
        // What cubecl reads: $CUDA_PATH/include and $CUDA_PATH/include/cccl.
        for header in [
            "include/cuda_runtime.h",
            "include/crt/host_defines.h",
            "include/nvrtc.h",
            "include/cccl/cuda/barrier",
        ] {
            assert!(root.join(header).is_file(), "{header} missing in {root:?}");
        }
        assert_eq!(
            found.nvrtc,
            Some(nvidia.join("cuda_nvrtc/lib/libnvrtc.so.12"))
        );
        // A second search reuses the folder.
        assert_eq!(find(&search).unwrap().cuda_path, *root);
    }

    #[test]
    fn nothing_found_lists_every_place() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site-packages");
        touch(&site.join("nvidia/cublas/lib/libcublas.so.12"));
        let looked = find(&search(
            dir.path(),
            vec![dir.path().join("cuda")],
            vec![site],
        ))
        .unwrap_err();
        assert_eq!(looked.len(), 2);
        assert!(looked[1].ends_with("nvidia"), "{looked:?}");
        assert!(install_command(Some(12080)).contains("-cu12"));
        assert!(!install_command(Some(13000)).contains("-cu12"));
    }
}
