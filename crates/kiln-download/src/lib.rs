//! Fetching a file into place, for pretrained weights and data sets.
//!
//! A download goes to a temporary file beside its destination and is renamed into place only
//! after its SHA-256 checks out, so an interrupted or corrupt download never leaves a file
//! where a later run would trust it. Offline, the error says which file to put where.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("could not download {url} ({reason}); without network access, fetch it on another machine and place it at {}", dest.display())]
    Network {
        url: String,
        dest: PathBuf,
        reason: String,
    },
    #[error(
        "{url} arrived with SHA-256 {actual}, expected one starting with {expected}; the file was discarded (a proxy or a truncated transfer?)"
    )]
    HashMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Where kiln keeps what it fetches or builds once per machine (weights, compiled GPU kernels):
/// `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`.
pub fn cache_root() -> PathBuf {
    let env = |key| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("KILN_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("kiln")))
        .or_else(|| env("HOME").map(|p| p.join(".cache/kiln")))
        .unwrap_or_else(|| PathBuf::from(".kiln-cache"))
}

/// The folder for what `backend` compiles and tunes for one `device` model under kiln's cache
/// `root`: `<root>/kernels/<backend>-<device>`, the device's name as a lowercase path component
/// (compiled kernels and tuning results hold for one GPU model, whatever its index).
pub fn kernel_folder(root: &Path, backend: &str, device: &str) -> PathBuf {
    let device: String = device
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    root.join("kernels")
        .join(format!("{backend}-{}", device.trim_matches('-')))
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> DownloadError + '_ {
    move |source| DownloadError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The SHA-256 of a file, as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, DownloadError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(io_error(path))?;
    Ok(hex(&hasher.finalize()))
}

/// Whether `path` exists and its SHA-256 starts with `sha256_prefix` (torchvision embeds the
/// first hex digits of each weight file's hash in its name).
pub fn is_verified(path: &Path, sha256_prefix: &str) -> bool {
    path.is_file()
        && sha256_file(path).is_ok_and(|hash| hash.starts_with(&sha256_prefix.to_lowercase()))
}

/// Downloads `url` to `dest`, showing progress on a terminal, and keeps it only if its SHA-256
/// starts with `sha256_prefix`.
pub fn fetch(url: &str, dest: &Path, sha256_prefix: &str) -> Result<(), DownloadError> {
    let network = |reason: String| DownloadError::Network {
        url: url.to_string(),
        dest: dest.to_path_buf(),
        reason,
    };
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;

    let mut response = agent()
        .get(url)
        .call()
        .map_err(|e| network(e.to_string()))?;
    let length = response.body().content_length();
    let mut body = response.body_mut().as_reader();

    let partial = partial_path(dest);
    let result = copy_hashing(&mut body, &partial, length, url)
        .map_err(|e| match e {
            CopyError::Read(e) => network(e.to_string()),
            CopyError::Write(e) => e,
        })
        .and_then(|(hash, complete)| {
            if !complete {
                return Err(network(
                    "the connection closed before the whole file arrived".into(),
                ));
            }
            if !hash.starts_with(&sha256_prefix.to_lowercase()) {
                return Err(DownloadError::HashMismatch {
                    url: url.to_string(),
                    expected: sha256_prefix.to_string(),
                    actual: hash,
                });
            }
            std::fs::rename(&partial, dest).map_err(io_error(dest))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// An HTTP client that gives up on a silent network instead of hanging: 30 s to connect, 60 s
/// for the server to answer, 60 s without a byte mid-transfer. A flowing body may take as long
/// as it needs.
fn agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .build();
    ureq::Agent::new_with_config(config)
}

/// A temporary name beside `dest`, unique to this process.
fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(format!(".partial-{}", std::process::id()));
    PathBuf::from(name)
}

/// A failed copy: the connection (worth a retry, or fetching by hand) or the local disk.
enum CopyError {
    Read(io::Error),
    Write(DownloadError),
}

impl From<DownloadError> for CopyError {
    fn from(e: DownloadError) -> Self {
        CopyError::Write(e)
    }
}

/// Streams `body` into `path`, returning its SHA-256 and whether the announced length arrived.
fn copy_hashing(
    body: &mut impl Read,
    path: &Path,
    length: Option<u64>,
    label: &str,
) -> Result<(String, bool), CopyError> {
    let file = File::create(path).map_err(io_error(path))?;
    let mut out = BufWriter::new(file);
    let mut hasher = Sha256::new();
    let bar = progress_bar(length, label);
    let mut buffer = vec![0u8; 1 << 16];
    let mut received = 0u64;
    loop {
        let n = match body.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n]).map_err(io_error(path))?;
        received += n as u64;
        bar.set_position(received);
    }
    let file = out
        .into_inner()
        .map_err(|e| io_error(path)(e.into_error()))?;
    file.sync_all().map_err(io_error(path))?;
    bar.finish_and_clear();
    let complete = length.is_none_or(|expected| expected == received);
    Ok((hex(&hasher.finalize()), complete))
}

/// A byte-count bar on a terminal; nothing when stderr is not one.
fn progress_bar(length: Option<u64>, label: &str) -> indicatif::ProgressBar {
    let bar = match length {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    ) {
        bar.set_style(style);
    }
    bar.set_message(label.rsplit('/').next().unwrap_or(label).to_string());
    bar
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    #[test]
    fn each_device_model_gets_its_own_folder() {
        let root = Path::new("/cache/kiln");
        assert_eq!(
            kernel_folder(root, "cuda", "NVIDIA H200"),
            Path::new("/cache/kiln/kernels/cuda-nvidia-h200")
        );
        assert_eq!(
            kernel_folder(root, "wgpu", "llvmpipe (LLVM 15.0.6, 256 bits)"),
            Path::new("/cache/kiln/kernels/wgpu-llvmpipe--llvm-15-0-6--256-bits")
        );
    }

    /// Serves `body` once on loopback, announcing `announced` bytes, and returns the URL.
    fn serve_once(body: Vec<u8>, announced: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "http://{}/weights/model-abc.pth",
            listener.local_addr().unwrap()
        );
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let header = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {announced}\r\nConnection: close\r\n\r\n"
            );
            let _ = stream.write_all(header.as_bytes());
            let _ = stream.write_all(&body);
        });
        url
    }

    fn sha256(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    #[test]
    fn downloads_and_checks_the_hash() {
        let dir = tempfile::tempdir().unwrap();
        let body = b"pretend weights".repeat(1000);
        let dest = dir.path().join("cache/model.pth");
        fetch(
            &serve_once(body.clone(), body.len()),
            &dest,
            &sha256(&body)[..8],
        )
        .unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), body);
        assert!(is_verified(&dest, &sha256(&body)[..8]));
        assert!(!is_verified(&dest, "00000000"));
    }

    #[test]
    fn a_wrong_hash_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("model.pth");
        let err = fetch(&serve_once(b"tampered".to_vec(), 8), &dest, "deadbeef").unwrap_err();
        assert!(matches!(err, DownloadError::HashMismatch { .. }), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_truncated_transfer_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("model.pth");
        let body = b"half a file".to_vec();
        let err = fetch(&serve_once(body.clone(), 1000), &dest, &sha256(&body)[..8]).unwrap_err();
        assert!(err.to_string().contains("place it at"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn offline_says_which_file_goes_where() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("model.pth");
        // A port that was just free: nothing listens there.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/model.pth");
        let err = fetch(&url, &dest, "00").unwrap_err().to_string();
        assert!(
            err.contains(&url) && err.contains(&*dest.to_string_lossy()),
            "{err}"
        );
        assert!(!dest.exists());
    }
}
