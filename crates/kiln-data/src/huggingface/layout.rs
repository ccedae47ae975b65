//! Which parquet file of a Hub data set repository holds which config and split, from its path
//! alone, as `datasets` and the Hub name them:
//!
//! - `push_to_hub`: `data/<split>-00000-of-00002.parquet` for the default config,
//!   `<config>/<split>-00000-of-00001.parquet` for a named one (uoft-cs/cifar10's
//!   `plain_text/train-00000-of-00001.parquet`); datasets 2.x added a fingerprint,
//!   `train-00000-of-00001-5f3e2a1b9c8d7e6f.parquet`.
//! - the Hub's parquet conversion (revision `refs/convert/parquet`): `<config>/<split>/0000.parquet`,
//!   and `<config>/partial-<split>/...` where it converted only the first part of a large set
//!   (a split of its own here, so that training on part of a set is asked for by name).
//! - a file per split: `<split>.parquet`, `data/<split>.parquet`, `<split>/<anything>.parquet`.
//!
//! A repository whose README maps configs to other files (`configs: data_files:`) is not read.

use std::collections::BTreeMap;

use crate::DataError;

/// The config `datasets` calls a repository's only config when it has no name (files at the top
/// or under `data/`).
pub const DEFAULT_CONFIG: &str = "default";

/// A repository's parquet files: config -> split -> files (paths in the repository, sorted, so
/// that `train-00000-of-00002` comes before `train-00001-of-00002`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ParquetFiles {
    pub configs: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl ParquetFiles {
    /// The layout of `paths` (a repository's files, `/`-separated); files that are not parquet
    /// or sit where no layout puts them are left out.
    pub fn new<S: AsRef<str>>(paths: impl IntoIterator<Item = S>) -> Self {
        let mut layout = ParquetFiles::default();
        for path in paths {
            let path = path.as_ref();
            if let Some((config, split)) = place(path) {
                let splits = layout.configs.entry(config).or_default();
                splits.entry(split).or_default().push(path.to_string());
            }
        }
        for files in layout.configs.values_mut().flat_map(|s| s.values_mut()) {
            files.sort();
        }
        layout
    }

    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    /// The splits of config `wanted`, or of the only config when none is named. `repo` and
    /// `listed` (where the files were listed) name them in errors.
    pub fn config(
        &self,
        repo: &str,
        wanted: Option<&str>,
        listed: &str,
    ) -> Result<(&str, &BTreeMap<String, Vec<String>>), DataError> {
        let names = || self.configs.keys().cloned().collect::<Vec<_>>().join(", ");
        let layout_error = |what: String| DataError::HubLayout {
            repo: repo.to_string(),
            what,
        };
        match wanted {
            Some(name) => self
                .configs
                .get_key_value(name)
                .map(|(name, splits)| (name.as_str(), splits))
                .ok_or_else(|| {
                    layout_error(format!(
                        "no config `{name}` in {listed} (its configs: {}); name one of them with data.source.config = \"...\"",
                        names()
                    ))
                }),
            None => match self.configs.len() {
                1 => {
                    let (name, splits) = self.configs.iter().next().expect("one config");
                    Ok((name.as_str(), splits))
                }
                _ => Err(layout_error(format!(
                    "{listed} has several configs ({}); name one with data.source.config = \"...\"",
                    names()
                ))),
            },
        }
    }
}

/// `(config, split)` of a file at `path` in a repository, where a layout of `datasets` or the
/// Hub puts it.
pub fn place(path: &str) -> Option<(String, String)> {
    let stem = path.strip_suffix(".parquet")?;
    let parts: Vec<&str> = stem.split('/').collect();
    if parts.iter().any(|p| p.is_empty() || p.starts_with('.')) {
        return None;
    }
    let config = |dir: &str| {
        if dir == "data" {
            DEFAULT_CONFIG.to_string()
        } else {
            dir.to_string()
        }
    };
    match parts.as_slice() {
        [name] => Some((DEFAULT_CONFIG.into(), split_of(name)?)),
        [dir, name] => match split_of(name) {
            Some(split) => Some((config(dir), split)),
            // `train/0000.parquet`: a folder per split, without a config.
            None => Some((DEFAULT_CONFIG.into(), dir.to_string())),
        },
        [dir, split, _] => Some((config(dir), split.to_string())),
        _ => None,
    }
}

/// The split a file's name (without `.parquet`) gives: `train` of `train-00000-of-00004` (with
/// or without datasets 2.x's fingerprint after it) or of `train`; none for a bare number
/// (`0000`, the Hub conversion's name for a file inside its split's folder).
fn split_of(name: &str) -> Option<String> {
    if name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let parts: Vec<&str> = name.split('-').collect();
    let digits = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit());
    let hex = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit());
    // <split>-NNNNN-of-NNNNN[-fingerprint]; the split's own name may hold dashes.
    for tail in [3, 4] {
        if parts.len() > tail {
            let (head, rest) = parts.split_at(parts.len() - tail);
            let sharded = digits(rest[0], 5) && rest[1] == "of" && digits(rest[2], 5);
            if sharded && (tail == 3 || hex(rest[3])) {
                return Some(head.join("-"));
            }
        }
    }
    Some(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_placed_as_datasets_and_the_hub_lay_them_out() {
        let placed = |path: &str| place(path).map(|(c, s)| format!("{c}/{s}"));
        for (path, expected) in [
            // uoft-cs/cifar10, and push_to_hub's default config.
            (
                "plain_text/train-00000-of-00001.parquet",
                Some("plain_text/train"),
            ),
            ("data/test-00003-of-00004.parquet", Some("default/test")),
            // datasets 2.x's fingerprint; a split name with a dash in it.
            (
                "data/train-00000-of-00001-5f3e2a1b9c8d7e6f.parquet",
                Some("default/train"),
            ),
            (
                "data/fine-tune-00000-of-00001.parquet",
                Some("default/fine-tune"),
            ),
            // The Hub's parquet conversion, partial or whole.
            ("plain_text/train/0000.parquet", Some("plain_text/train")),
            (
                "default/partial-train/0001.parquet",
                Some("default/partial-train"),
            ),
            // A file or a folder per split.
            ("train.parquet", Some("default/train")),
            ("data/validation.parquet", Some("default/validation")),
            ("test/0000.parquet", Some("default/test")),
            // Not data files.
            ("README.md", None),
            (".cache/train.parquet", None),
            ("a/b/c/d.parquet", None),
        ] {
            assert_eq!(placed(path).as_deref(), expected, "{path}");
        }
    }

    #[test]
    fn a_config_is_taken_when_alone_or_named() {
        let layout = ParquetFiles::new([
            "a/train-00001-of-00002.parquet",
            "a/train-00000-of-00002.parquet",
            "b/test/0000.parquet",
            "README.md",
        ]);
        let err = layout
            .config("x/y", None, "the cache")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("several configs (a, b)") && err.contains("config = "),
            "{err}"
        );
        let (name, splits) = layout.config("x/y", Some("a"), "the cache").unwrap();
        assert_eq!(name, "a");
        assert_eq!(
            splits["train"],
            [
                "a/train-00000-of-00002.parquet",
                "a/train-00001-of-00002.parquet"
            ]
        );
        let err = layout
            .config("x/y", Some("c"), "the cache")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no config `c`") && err.contains("a, b"),
            "{err}"
        );
        let one = ParquetFiles::new(["data/train-00000-of-00001.parquet"]);
        assert_eq!(
            one.config("x/y", None, "the cache").unwrap().0,
            DEFAULT_CONFIG
        );
    }
}
