//! A data set repository's files: from the Hugging Face cache `huggingface_hub` fills and reads
//! (`datasets--ORG--NAME/{refs,snapshots,blobs}`), else from the Hub through the `hf-hub`
//! client, into that same cache (as kiln-models fetches timm's weights).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};

use crate::DataError;

/// Where a data set's files are looked for and fetched from. [`HubSettings::from_env`] reads
/// them from the environment as `huggingface_hub` does; tests give them explicitly.
#[derive(Debug, Clone, PartialEq)]
pub struct HubSettings {
    /// The Hugging Face cache (its `hub` folder).
    pub cache: PathBuf,
    /// The Hub's address, without a trailing `/`.
    pub endpoint: String,
    /// Why the network may not be used, where it may not.
    pub offline: Option<&'static str>,
    /// A token for private and gated repositories.
    pub token: Option<String>,
    /// Whether hf-hub draws a progress bar on standard error.
    pub progress: bool,
}

impl HubSettings {
    /// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    /// `~/.cache/huggingface/hub`; `$HF_ENDPOINT`, else `https://huggingface.co`;
    /// `HF_HUB_OFFLINE` or `HF_DATASETS_OFFLINE` (1, ON, YES or TRUE) forbid the network;
    /// `$HF_TOKEN`, else the token `huggingface-cli login` saved; a progress bar on a terminal.
    pub fn from_env() -> Self {
        let env = |key| {
            std::env::var_os(key)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let cache = env("HF_HUB_CACHE")
            .or_else(|| env("HF_HOME").map(|p| p.join("hub")))
            .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("huggingface/hub")))
            .or_else(|| env("HOME").map(|p| p.join(".cache/huggingface/hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .map(|e| e.trim_end_matches('/').to_string())
            .unwrap_or_else(|| "https://huggingface.co".into());
        let set = |key| {
            std::env::var(key).is_ok_and(|v| {
                ["1", "ON", "YES", "TRUE"].contains(&v.trim().to_uppercase().as_str())
            })
        };
        let offline = if set("HF_HUB_OFFLINE") {
            Some("HF_HUB_OFFLINE is set")
        } else if set("HF_DATASETS_OFFLINE") {
            Some("HF_DATASETS_OFFLINE is set")
        } else {
            None
        };
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        let token = token.or_else(|| Cache::new(cache.clone()).token());
        HubSettings {
            cache,
            endpoint,
            offline,
            token,
            progress: std::io::stderr().is_terminal(),
        }
    }

    /// Offline, with the cache at `cache`: what a test (or a machine without network) uses.
    pub fn offline(cache: impl Into<PathBuf>) -> Self {
        HubSettings {
            cache: cache.into(),
            endpoint: "https://huggingface.co".into(),
            offline: Some("HF_HUB_OFFLINE is set"),
            token: None,
            progress: false,
        }
    }
}

/// `owner/name` (or a bare `name`) of the letters, digits, `-`, `_` and `.` the Hub allows.
pub fn check_repo_name(repo: &str) -> Result<(), DataError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() <= 2 && parts.iter().all(|p| part_ok(p)) {
        Ok(())
    } else {
        Err(DataError::HubName {
            repo: repo.to_string(),
        })
    }
}

/// A revision as a cache stores it: a branch or tag (`main`, `refs/convert/parquet`) resolved
/// by `refs/`, or a commit.
fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The repository's folder in the cache.
pub fn repo_folder(cache: &Path, repo: &str) -> PathBuf {
    let repo = Repo::with_revision(repo.to_string(), RepoType::Dataset, "main".into());
    cache.join(repo.folder_name())
}

/// The cached snapshot of `repo` at `revision`: `snapshots/<commit>`, the commit read from
/// `refs/<revision>` (as `huggingface_hub` writes it) unless the revision is one.
pub fn cached_snapshot(cache: &Path, repo: &str, revision: &str) -> Option<PathBuf> {
    let folder = repo_folder(cache, repo);
    let commit = if is_commit(revision) {
        revision.to_string()
    } else {
        let text = std::fs::read_to_string(folder.join("refs").join(revision)).ok()?;
        text.trim().to_string()
    };
    let snapshot = folder.join("snapshots").join(commit);
    snapshot.is_dir().then_some(snapshot)
}

/// The files of a snapshot folder, as paths in the repository (`/`-separated), following the
/// cache's links into `blobs/`.
pub fn snapshot_files(snapshot: &Path) -> Vec<String> {
    walkdir::WalkDir::new(snapshot)
        .follow_links(true)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| {
            let relative = e.path().strip_prefix(snapshot).ok()?;
            let parts: Option<Vec<&str>> = relative
                .components()
                .map(|c| c.as_os_str().to_str())
                .collect();
            Some(parts?.join("/"))
        })
        .collect()
}

/// One repository at one revision on the Hub, through hf-hub's blocking client.
pub struct Remote<'a> {
    repo: &'a str,
    revision: &'a str,
    settings: &'a HubSettings,
    api: Api,
}

impl<'a> Remote<'a> {
    pub fn new(
        repo: &'a str,
        revision: &'a str,
        settings: &'a HubSettings,
    ) -> Result<Self, DataError> {
        let api = ApiBuilder::from_cache(Cache::new(settings.cache.clone()))
            .with_endpoint(settings.endpoint.clone())
            .with_progress(settings.progress)
            .with_token(settings.token.clone())
            .build()
            .map_err(|e| DataError::HubNetwork {
                repo: repo.to_string(),
                file: "the file list".into(),
                endpoint: settings.endpoint.clone(),
                reason: e.to_string(),
            })?;
        Ok(Remote {
            repo,
            revision,
            settings,
            api,
        })
    }

    fn hub_repo(&self) -> Repo {
        Repo::with_revision(
            self.repo.to_string(),
            RepoType::Dataset,
            self.revision.to_string(),
        )
    }

    /// The repository's files at the revision (the Hub's `siblings`).
    pub fn files(&self) -> Result<Vec<String>, DataError> {
        let info = self.api.repo(self.hub_repo()).info();
        match info {
            Ok(info) => Ok(info.siblings.into_iter().map(|s| s.rfilename).collect()),
            Err(error) => Err(self.error("the file list", error)),
        }
    }

    /// Downloads `file` into the cache (a blob and the snapshot's link to it, hf-hub's way) and
    /// checks it; returns its path in the snapshot. A download that fails or arrives damaged
    /// leaves nothing of itself in the cache.
    pub fn download(&self, file: &str) -> Result<PathBuf, DataError> {
        let downloaded = self.api.repo(self.hub_repo()).download(file);
        self.remove_partial_downloads();
        match downloaded {
            Ok(path) => self.checked(file, path),
            Err(error) => Err(self.error(file, error)),
        }
    }

    /// `path` where its blob holds what its name says: the Hub names a large (LFS) file's blob
    /// by its SHA-256, as every parquet file of a data set is. A damaged blob is removed with
    /// its link.
    fn checked(&self, file: &str, path: PathBuf) -> Result<PathBuf, DataError> {
        let blob = std::fs::canonicalize(&path).map_err(DataError::io(&path))?;
        let expected = blob
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_lowercase);
        let Some(expected) = expected else {
            // A small file's blob is named by git's hash; parquet's footer checks it whole.
            return Ok(path);
        };
        let actual = kiln_download::sha256_file(&blob).map_err(|e| DataError::Io {
            path: blob.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        if actual == expected {
            return Ok(path);
        }
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&blob);
        Err(DataError::HubDamaged {
            repo: self.repo.to_string(),
            file: file.to_string(),
            expected,
            actual,
        })
    }

    /// hf-hub keeps an interrupted download as `blobs/<etag>.part` to resume it, and its lock
    /// as `blobs/<etag>.lock`; kiln does not resume, and leaves neither in the cache.
    fn remove_partial_downloads(&self) {
        let blobs = repo_folder(&self.settings.cache, self.repo).join("blobs");
        let Ok(entries) = std::fs::read_dir(&blobs) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "part" || e == "lock") {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// One line for what went wrong: no such repository (the Hub answers 401 to an unknown
    /// name without a token, 404 with one), or the network.
    fn error(&self, file: &str, error: ApiError) -> DataError {
        let status = match &error {
            ApiError::RequestError(request) => match **request {
                ureq::Error::Status(status, _) => Some(status),
                _ => None,
            },
            _ => None,
        };
        match status {
            Some(status @ (401 | 404)) => DataError::HubUnknownRepo {
                repo: self.repo.to_string(),
                endpoint: self.settings.endpoint.clone(),
                status,
            },
            _ => DataError::HubNetwork {
                repo: self.repo.to_string(),
                file: file.to_string(),
                endpoint: self.settings.endpoint.clone(),
                reason: error.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names_are_checked() {
        for good in ["uoft-cs/cifar10", "ylecun/mnist", "beans", "a.b/c_d-e"] {
            assert!(check_repo_name(good).is_ok(), "{good}");
        }
        for bad in ["", "x/", "/x", "x/../y", "a/b/c", "a b/c", "x/.y"] {
            let err = check_repo_name(bad).unwrap_err().to_string();
            assert!(err.contains("<owner>/<name>"), "{bad}: {err}");
        }
    }

    #[test]
    fn snapshots_are_found_by_ref_or_commit() {
        let dir = tempfile::tempdir().unwrap();
        let folder = repo_folder(dir.path(), "org/name");
        assert!(folder.ends_with("datasets--org--name"));
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(folder.join("snapshots").join(commit).join("data")).unwrap();
        std::fs::create_dir_all(folder.join("refs/refs/convert")).unwrap();
        // huggingface_hub writes the commit without a newline; a hand-made ref may have one.
        std::fs::write(
            folder.join("refs/refs/convert/parquet"),
            format!("{commit}\n"),
        )
        .unwrap();
        std::fs::write(
            folder.join("snapshots").join(commit).join("data/x.parquet"),
            b"",
        )
        .unwrap();
        let found = cached_snapshot(dir.path(), "org/name", "refs/convert/parquet").unwrap();
        assert_eq!(snapshot_files(&found), ["data/x.parquet"]);
        assert_eq!(cached_snapshot(dir.path(), "org/name", commit), Some(found));
        assert_eq!(cached_snapshot(dir.path(), "org/name", "main"), None);
        assert_eq!(cached_snapshot(dir.path(), "org/other", "main"), None);
    }
}
