//! A Hugging Face Hub for tests, on loopback: model repositories served as the Hub serves them,
//! so that the Hub client is tested without the internet. Test support shared by kiln-models'
//! tests and the binary's; not kiln's API.
//!
//! `GET /<owner>/<name>/resolve/main/<file>` answers as huggingface.co does: a small file with its
//! git hash as `ETag`, a `.safetensors` file with a `302` to a CDN address (absolute, here on the
//! same server) carrying `X-Linked-Etag` (its SHA-256) and `X-Linked-Size`; `X-Repo-Commit`
//! on both; a renamed repository with a relative `307` to its new name; an unknown repository
//! with `401` (`X-Error-Code: RepoNotFound`, as the Hub answers without a token) and an unknown
//! file with `404` (`EntryNotFound`). `Range: bytes=a-b` requests get `206` and
//! `Content-Range`. A file can be set to break off halfway through (a truncated download) or
//! to arrive with other bytes than its hash says (a damaged one).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// How a file is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    /// The body stops halfway, the connection closed, after a `Content-Length` of the whole.
    Truncated,
    /// The bytes sent differ from those the `ETag` hashes (a byte flipped).
    Corrupted,
}

#[derive(Debug, Clone)]
struct File {
    bytes: Vec<u8>,
    fault: Fault,
}

#[derive(Debug, Default)]
struct State {
    /// repo -> file -> contents.
    repos: BTreeMap<String, BTreeMap<String, File>>,
    /// Old name -> new name.
    renamed: BTreeMap<String, String>,
    /// Plain files by path (`/models/resnet50-0676ba61.pth`, as download.pytorch.org).
    statics: BTreeMap<String, File>,
    /// Every request's path, in order.
    requests: Vec<String>,
}

/// A running loopback Hub. It serves until the process ends.
#[derive(Clone)]
pub struct TestHub {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
}

/// A fixed commit hash for every repository.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl TestHub {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
        let state = Arc::new(Mutex::new(State::default()));
        let hub = TestHub { endpoint, state };
        let server = hub.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let server = server.clone();
                std::thread::spawn(move || server.answer(stream));
            }
        });
        hub
    }

    /// Serves `bytes` as `repo`'s `file`.
    pub fn add(&self, repo: &str, file: &str, bytes: Vec<u8>) {
        self.add_with(repo, file, bytes, Fault::None);
    }

    pub fn add_with(&self, repo: &str, file: &str, bytes: Vec<u8>, fault: Fault) {
        let mut state = self.state.lock().unwrap();
        let files = state.repos.entry(repo.to_string()).or_default();
        files.insert(file.to_string(), File { bytes, fault });
    }

    /// Serves `bytes` at `path` as a plain web server (no Hub headers).
    pub fn add_static(&self, path: &str, bytes: Vec<u8>, fault: Fault) {
        let mut state = self.state.lock().unwrap();
        state
            .statics
            .insert(path.to_string(), File { bytes, fault });
    }

    /// `old` answers with a relative redirect to `new`, as the Hub does for a renamed repository.
    pub fn rename(&self, old: &str, new: &str) {
        let mut state = self.state.lock().unwrap();
        state.renamed.insert(old.to_string(), new.to_string());
    }

    /// The paths requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    fn answer(&self, stream: TcpStream) {
        let mut reader = BufReader::new(match stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        });
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let mut range = None;
        let mut header = String::new();
        while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("range")
            {
                range = parse_range(value.trim());
            }
            header.clear();
        }
        self.state.lock().unwrap().requests.push(path.clone());
        let mut stream = stream;
        let _ = self.respond(&mut stream, &path, range);
    }

    fn respond(
        &self,
        stream: &mut TcpStream,
        path: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> std::io::Result<()> {
        let state = self.state.lock().unwrap();
        if let Some(file) = state.statics.get(path).cloned() {
            drop(state);
            return body(stream, &file, range, &[]);
        }
        if let Some(sha) = path.strip_prefix("/cdn/") {
            let found = state
                .repos
                .values()
                .flat_map(|f| f.values())
                .find(|f| sha256(&f.bytes) == sha);
            return match found.cloned() {
                Some(file) => {
                    drop(state);
                    body(stream, &file, range, &[("ETag", format!("\"{sha}\""))])
                }
                None => status(stream, 404, &[("X-Error-Code", "EntryNotFound".into())]),
            };
        }
        let Some((repo, file)) = path.trim_start_matches('/').split_once("/resolve/main/") else {
            return status(stream, 404, &[]);
        };
        if let Some(new) = state.renamed.get(repo) {
            let location = format!("/{new}/resolve/main/{file}");
            return status(
                stream,
                307,
                &[("Location", location), ("X-Repo-Commit", COMMIT.into())],
            );
        }
        let Some(files) = state.repos.get(repo) else {
            return status(stream, 401, &[("X-Error-Code", "RepoNotFound".into())]);
        };
        let Some(found) = files.get(file).cloned() else {
            return status(
                stream,
                404,
                &[
                    ("X-Error-Code", "EntryNotFound".into()),
                    ("X-Repo-Commit", COMMIT.into()),
                ],
            );
        };
        drop(state);
        if file.ends_with(".safetensors") {
            let sha = sha256(&found.bytes);
            let location = format!("{}/cdn/{sha}", self.endpoint);
            return status(
                stream,
                302,
                &[
                    ("Location", location),
                    ("X-Linked-Etag", format!("\"{sha}\"")),
                    ("X-Linked-Size", found.bytes.len().to_string()),
                    ("X-Repo-Commit", COMMIT.into()),
                ],
            );
        }
        let etag = git_hash(&found.bytes);
        body(
            stream,
            &found,
            range,
            &[
                ("ETag", format!("\"{etag}\"")),
                ("X-Repo-Commit", COMMIT.into()),
            ],
        )
    }
}

/// `bytes=a-b` or `bytes=a-`.
fn parse_range(value: &str) -> Option<(u64, Option<u64>)> {
    let (start, end) = value.strip_prefix("bytes=")?.split_once('-')?;
    Some((start.parse().ok()?, end.parse().ok()))
}

fn status(stream: &mut TcpStream, code: u16, headers: &[(&str, String)]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {code} {}\r\n", reason(code));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes())
}

fn body(
    stream: &mut TcpStream,
    file: &File,
    range: Option<(u64, Option<u64>)>,
    headers: &[(&str, String)],
) -> std::io::Result<()> {
    let mut bytes = file.bytes.clone();
    if file.fault == Fault::Corrupted
        && let Some(b) = bytes.last_mut()
    {
        *b ^= 0xff;
    }
    let total = bytes.len() as u64;
    let (code, start, end) = match range {
        Some((start, end)) if start < total.max(1) => {
            let end = end
                .unwrap_or(total.saturating_sub(1))
                .min(total.saturating_sub(1));
            (206, start, end + 1)
        }
        _ => (200, 0, total),
    };
    let part = &bytes[start as usize..end.max(start) as usize];
    let mut head = format!("HTTP/1.1 {code} {}\r\n", reason(code));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if code == 206 {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{total}\r\n",
            end - 1
        ));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        part.len()
    ));
    stream.write_all(head.as_bytes())?;
    if file.fault == Fault::Truncated && part.len() > 1 {
        stream.write_all(&part[..part.len() / 2])?;
        return stream.shutdown(std::net::Shutdown::Both);
    }
    stream.write_all(part)
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        307 => "Temporary Redirect",
        401 => "Unauthorized",
        _ => "Not Found",
    }
}

pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A stand-in for git's blob hash (40 hex digits), which the Hub gives small files as ETag.
fn git_hash(bytes: &[u8]) -> String {
    sha256(bytes)[..40].to_string()
}
