//! Hugging Face data sets: the parquet files of a data set repository on the Hub
//! (`datasets.load_dataset("uoft-cs/cifar10")`'s), found first in the Hugging Face cache, else
//! downloaded into it ([`hub`]); which file holds which config and split from their paths
//! ([`layout`]); their images and labels read into a [`HuggingFace`] split ([`read`]).

pub mod hub;
pub mod layout;
pub mod read;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use hub::HubSettings;
pub use read::{HuggingFace, ParquetColumns};

use crate::{DataError, ImageLimits};
use layout::ParquetFiles;

/// What a source asks of a repository.
#[derive(Debug, Clone, PartialEq)]
pub struct Request<'a> {
    pub repo: &'a str,
    /// A branch, a tag, a commit or `refs/convert/parquet` (the Hub's parquet conversion).
    pub revision: &'a str,
    pub config: Option<&'a str>,
    pub train: &'a str,
    pub val: Val<'a>,
    pub columns: ParquetColumns,
}

/// Which split validates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val<'a> {
    /// `validation` where there is one, else `test`, else none: what the Hub's sets name them.
    Default,
    Named(&'a str),
    None,
}

/// The splits' files: found in the cache or downloaded.
struct Found {
    train: Vec<PathBuf>,
    val: Option<Vec<PathBuf>>,
}

/// The training split and, where there is one, the validation split of `request`.
pub fn open(
    request: &Request,
    settings: &HubSettings,
    limits: ImageLimits,
) -> Result<(HuggingFace, Option<HuggingFace>), DataError> {
    let found = locate(request, settings)?;
    let train = HuggingFace::read(&found.train, &request.columns, None, limits)?;
    let val = match &found.val {
        Some(files) => Some(HuggingFace::read(
            files,
            &request.columns,
            Some(crate::Dataset::classes(&train)),
            limits,
        )?),
        None => None,
    };
    Ok((train, val))
}

/// The class names and training rows of `request`, from the cache's files' footers alone (no
/// download); `None` where the cache does not hold its training split.
pub fn peek(request: &Request, cache: &std::path::Path) -> Option<(Vec<String>, usize)> {
    let snapshot = hub::cached_snapshot(cache, request.repo, request.revision)?;
    let layout = ParquetFiles::new(hub::snapshot_files(&snapshot));
    let (_, splits) = layout.config(request.repo, request.config, "").ok()?;
    let files: Vec<PathBuf> = splits
        .get(request.train)?
        .iter()
        .map(|f| snapshot.join(f))
        .collect();
    read::peek(&files, &request.columns).ok()
}

/// The train (and validation) files: those the cache holds where it holds every split asked
/// for, else downloaded (unless `settings` forbid the network).
fn locate(request: &Request, settings: &HubSettings) -> Result<Found, DataError> {
    hub::check_repo_name(request.repo)?;
    let snapshot = hub::cached_snapshot(&settings.cache, request.repo, request.revision);
    // A snapshot without parquet files is one whose downloads failed (or another kind of
    // repository at that name): as good as none.
    let cached = snapshot
        .map(|s| (ParquetFiles::new(hub::snapshot_files(&s)), s))
        .filter(|(layout, _)| !layout.is_empty());
    if let Some((layout, snapshot)) = &cached {
        let listed = format!("the Hugging Face cache ({})", snapshot.display());
        let chosen = choose(request, layout, &listed);
        // Offline, the cache's answer is the answer; online, a cache that lacks a split may be
        // one that holds part of the repository, and the Hub is asked.
        if chosen.is_ok() || settings.offline.is_some() {
            let (train, val) = chosen?;
            let paths = |files: Vec<String>| files.iter().map(|f| snapshot.join(f)).collect();
            return Ok(Found {
                train: paths(train),
                val: val.map(paths),
            });
        }
    }
    if let Some(why) = settings.offline {
        return Err(DataError::HubNotCached {
            repo: request.repo.to_string(),
            cache: settings.cache.clone(),
            why,
        });
    }
    let remote = hub::Remote::new(request.repo, request.revision, settings)?;
    let layout = ParquetFiles::new(remote.files()?);
    let listed = format!("{} at {}", settings.endpoint, request.revision);
    let (train, val) = choose(request, &layout, &listed)?;
    let download = |files: Vec<String>| -> Result<Vec<PathBuf>, DataError> {
        files.iter().map(|f| remote.download(f)).collect()
    };
    Ok(Found {
        train: download(train)?,
        val: val.map(download).transpose()?,
    })
}

/// The files of the train split and of the validation split, in `layout` (listed in `listed`).
type Chosen = (Vec<String>, Option<Vec<String>>);

fn choose(request: &Request, layout: &ParquetFiles, listed: &str) -> Result<Chosen, DataError> {
    if layout.is_empty() {
        return Err(DataError::HubLayout {
            repo: request.repo.to_string(),
            what: format!(
                "{listed} holds no parquet files at revision {}; kiln reads a data set's parquet files: for a repository of other files (a loading script, images, CSV) use the Hub's parquet conversion, data.source.revision = \"refs/convert/parquet\"",
                request.revision
            ),
        });
    }
    let (_, splits) = layout.config(request.repo, request.config, listed)?;
    let split = |name: &str, key: &'static str| -> Result<Vec<String>, DataError> {
        splits
            .get(name)
            .cloned()
            .ok_or_else(|| no_split(request, splits, name, key))
    };
    let train = split(request.train, "train")?;
    let val = match request.val {
        Val::Named(name) => Some(split(name, "val")?),
        Val::Default => ["validation", "test"]
            .iter()
            .find_map(|name| splits.get(*name).cloned()),
        Val::None => None,
    };
    Ok((train, val))
}

fn no_split(
    request: &Request,
    splits: &BTreeMap<String, Vec<String>>,
    name: &str,
    key: &'static str,
) -> DataError {
    DataError::HubSplit {
        repo: request.repo.to_string(),
        split: name.to_string(),
        found: splits.keys().cloned().collect(),
        key,
    }
}
