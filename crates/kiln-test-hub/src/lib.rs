//! A Hugging Face Hub on loopback, serving model and dataset repositories as huggingface.co
//! does, and plain files as download.pytorch.org does, so that kiln's download paths are tested
//! end to end without the internet. A dev-dependency of kiln's tests; never in a shipped crate.
//!
//! - `GET /<owner>/<name>/resolve/<rev>/<file>` (a model) and
//!   `GET /datasets/<owner>/<name>/resolve/<rev>/<file>` (a data set) answer as the Hub does: a
//!   small file with its git hash as `ETag`; a large (LFS) file, `.safetensors` or `.parquet`,
//!   with a `302` to a CDN address (absolute, here `/cdn/[datasets/]<owner>/<name>/<sha256>` on
//!   the same server) carrying
//!   `X-Linked-Etag` (its SHA-256) and `X-Linked-Size`; `X-Repo-Commit` on both.
//! - `GET /api/datasets/<owner>/<name>/revision/<rev>` lists a data set's files (`siblings`) and
//!   its commit.
//! - A renamed model repository answers with a relative `307` to its new name; an unknown
//!   repository with `401` (`X-Error-Code: RepoNotFound`, as the Hub answers without a token);
//!   an unknown file with `404` (`EntryNotFound`).
//! - `Range: bytes=a-b` requests get `206` and `Content-Range`.
//! - A file can be set to break off halfway (a truncated download) or to arrive with other bytes
//!   than its hash says (a damaged one).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// repo -> file -> contents.
type Repos = BTreeMap<String, BTreeMap<String, File>>;

#[derive(Debug, Default)]
struct State {
    models: Repos,
    datasets: Repos,
    /// A model repository's old name -> its new name.
    renamed: BTreeMap<String, String>,
    /// Plain files by path (`/models/resnet50-0676ba61.pth`, as download.pytorch.org).
    statics: BTreeMap<String, File>,
    /// Every request's path, in order.
    requests: Vec<String>,
}

/// A running loopback Hub. It serves until the process ends.
#[derive(Clone)]
pub struct TestHub {
    /// `http://127.0.0.1:<port>`, for `HF_ENDPOINT`.
    pub endpoint: String,
    state: Arc<Mutex<State>>,
}

/// The commit hash every repository is at.
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

    /// Serves `bytes` as model repository `repo`'s `file`.
    pub fn add(&self, repo: &str, file: &str, bytes: Vec<u8>) {
        self.add_with(repo, file, bytes, Fault::None);
    }

    pub fn add_with(&self, repo: &str, file: &str, bytes: Vec<u8>, fault: Fault) {
        let mut state = self.state.lock().unwrap();
        insert(&mut state.models, repo, file, File { bytes, fault });
    }

    /// Serves `bytes` as dataset repository `repo`'s `file` (`plain_text/train-00000-of-00001.parquet`).
    pub fn add_dataset(&self, repo: &str, file: &str, bytes: Vec<u8>, fault: Fault) {
        let mut state = self.state.lock().unwrap();
        insert(&mut state.datasets, repo, file, File { bytes, fault });
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
        // A client that stops mid-request must not hold a thread forever.
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
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

    fn respond(&self, stream: &mut TcpStream, path: &str, range: Range) -> std::io::Result<()> {
        let state = self.state.lock().unwrap();
        if let Some(file) = state.statics.get(path).cloned() {
            drop(state);
            return body(stream, &file, range, &[]);
        }
        if let Some(rest) = path.strip_prefix("/cdn/")
            && let Some((repo, sha)) = rest.rsplit_once('/')
        {
            let repos = match repo.strip_prefix("datasets/") {
                Some(_) => &state.datasets,
                None => &state.models,
            };
            let found = repos
                .get(repo.trim_start_matches("datasets/"))
                .and_then(|files| files.values().find(|f| sha256(&f.bytes) == sha))
                .cloned();
            drop(state);
            return match found {
                Some(file) => body(stream, &file, range, &[("ETag", format!("\"{sha}\""))]),
                None => status(stream, 404, &[("X-Error-Code", "EntryNotFound".into())]),
            };
        }
        if let Some(rest) = path.strip_prefix("/api/datasets/") {
            let Some((repo, _revision)) = rest.split_once("/revision/") else {
                return status(stream, 404, &[]);
            };
            let Some(files) = state.datasets.get(repo) else {
                return not_found(stream);
            };
            let siblings: Vec<String> = files
                .keys()
                .map(|f| format!("{{\"rfilename\": \"{f}\"}}"))
                .collect();
            let listing = format!(
                "{{\"id\": \"{repo}\", \"sha\": \"{COMMIT}\", \"siblings\": [{}]}}",
                siblings.join(", ")
            );
            let file = File {
                bytes: listing.into_bytes(),
                fault: Fault::None,
            };
            drop(state);
            return body(stream, &file, None, &[]);
        }
        let (repos, rest, cdn) = match path.strip_prefix("/datasets/") {
            Some(rest) => (&state.datasets, rest, "cdn/datasets"),
            None => (&state.models, path.trim_start_matches('/'), "cdn"),
        };
        let Some((repo, revision_file)) = rest.split_once("/resolve/") else {
            return status(stream, 404, &[]);
        };
        let Some((_revision, file)) = revision_file.split_once('/') else {
            return status(stream, 404, &[]);
        };
        if let Some(new) = state.renamed.get(repo) {
            let location = format!("/{new}/resolve/{revision_file}");
            return status(
                stream,
                307,
                &[("Location", location), ("X-Repo-Commit", COMMIT.into())],
            );
        }
        let Some(files) = repos.get(repo) else {
            return not_found(stream);
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
        if file.ends_with(".safetensors") || file.ends_with(".parquet") {
            let sha = sha256(&found.bytes);
            let location = format!("{}/{cdn}/{repo}/{sha}", self.endpoint);
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

fn insert(repos: &mut Repos, repo: &str, file: &str, contents: File) {
    let files = repos.entry(repo.to_string()).or_default();
    files.insert(file.to_string(), contents);
}

/// The first and, when given, last byte of a `Range` request.
type Range = Option<(u64, Option<u64>)>;

/// `bytes=a-b` or `bytes=a-`.
fn parse_range(value: &str) -> Range {
    let (start, end) = value.strip_prefix("bytes=")?.split_once('-')?;
    Some((start.parse().ok()?, end.parse().ok()))
}

/// The Hub's answer for a repository it does not have, to a client without a token.
fn not_found(stream: &mut TcpStream) -> std::io::Result<()> {
    status(stream, 401, &[("X-Error-Code", "RepoNotFound".into())])
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
    range: Range,
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

/// A file's SHA-256 in hex, as the Hub names LFS files.
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
