//! cuDNN's algorithm choices kept in kiln's cache, so that a later process on the same GPU model
//! and cuDNN does not search again: each search waits for the stream and times every algorithm of
//! its pass, three searches per convolution shape (about 60 for a ResNet-50 step, most of its
//! start once its kernels are cached). One JSON file per GPU model and cuDNN version, beside
//! cubecl's kernels for that GPU: `<cache>/kernels/cuda-<gpu>/cudnn-<version>.json`.
//!
//! A save merges what other processes wrote since, then replaces the file with a rename, so that
//! a process killed while writing leaves the old one. A file that cannot be read costs only the
//! searches again: never an error for a run. Nothing here touches cuDNN, so it is tested on any
//! machine.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::plan::{AlgoKey, Choice};

/// The format's version: a file of another is not read (and is replaced by the next save).
const FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    key: AlgoKey,
    choice: Choice,
}

/// The file. `gpu` and `cudnn` repeat its name's parts for a reader.
#[derive(Debug, Serialize, Deserialize)]
struct File {
    format: u32,
    gpu: String,
    cudnn: String,
    choices: Vec<Entry>,
}

/// One GPU model's file of choices under one cuDNN version.
#[derive(Debug)]
pub(crate) struct Store {
    pub path: PathBuf,
    gpu: String,
    cudnn: String,
}

impl Store {
    /// The file for `gpu` (its name as the driver gives it) and cuDNN `version` under kiln's
    /// cache `root`.
    pub(crate) fn new(root: &Path, gpu: &str, cudnn: &str) -> Self {
        let folder = kiln_download::kernel_folder(root, "cuda", gpu);
        Store {
            path: folder.join(format!("cudnn-{cudnn}.json")),
            gpu: gpu.into(),
            cudnn: cudnn.into(),
        }
    }

    /// The choices kept (their keys' device is 0), none where there is no file yet; `Err` says
    /// why a file there was not read.
    pub(crate) fn load(&self) -> Result<Vec<(AlgoKey, Choice)>, String> {
        let file = self.read()?;
        Ok(file
            .map(|f| f.choices.into_iter().map(|e| (e.key, e.choice)).collect())
            .unwrap_or_default())
    }

    fn read(&self) -> Result<Option<File>, String> {
        let path = self.path.display();
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{path}: {e}")),
        };
        let file: File = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        if file.format != FORMAT {
            let format = file.format;
            return Err(format!("{path}: format {format}, this kiln reads {FORMAT}"));
        }
        Ok(Some(file))
    }

    /// Adds (or replaces) `key`'s choice, keeping every other choice in the file.
    pub(crate) fn save(&self, key: AlgoKey, choice: Choice) -> Result<(), String> {
        // One save at a time in this process: the devices of a multi-GPU run search the same
        // shapes at once, and two read-merge-write rounds side by side would lose one's choice.
        static SAVING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = SAVING.lock().unwrap_or_else(PoisonError::into_inner);
        // What cannot be read is replaced: it would be searched again anyway.
        let mut choices = self
            .read()
            .ok()
            .flatten()
            .map_or_else(Vec::new, |f| f.choices);
        let key = AlgoKey { device: 0, ..key };
        choices.retain(|e| e.key != key);
        choices.push(Entry { key, choice });
        let file = File {
            format: FORMAT,
            gpu: self.gpu.clone(),
            cudnn: self.cudnn.clone(),
            choices,
        };
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
        let failed = |e: std::io::Error| format!("{}: {e}", self.path.display());
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(failed)?;
        }
        // A partial file of its own for every save (of this process, and of this thread): two
        // savers at once each rename a whole file into place, the last one's.
        static SAVES: AtomicU64 = AtomicU64::new(0);
        let mut partial = self.path.as_os_str().to_owned();
        let save = SAVES.fetch_add(1, Ordering::Relaxed);
        partial.push(format!(".partial-{}-{save}", std::process::id()));
        fs::write(&partial, text)
            .and_then(|()| fs::rename(&partial, &self.path))
            .map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::{ConvDims, ConvPass, DataType, MathType};
    use super::*;
    use burn::tensor::ops::ConvOptions;

    fn key(channels: usize, pass: ConvPass) -> AlgoKey {
        let options = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        AlgoKey {
            device: 3,
            pass,
            data: DataType::F32,
            geometry: ConvDims::new([8, channels, 16, 16], [channels, channels, 3, 3], &options)
                .unwrap(),
            tf32: true,
            aligned: true,
        }
    }

    fn saved(algo: u32) -> Choice {
        Choice {
            algo,
            math: MathType::Default,
            workspace: 4096 * algo as usize,
        }
    }

    #[test]
    fn each_gpu_model_and_cudnn_version_has_its_file() {
        let root = Path::new("/cache/kiln");
        assert_eq!(
            Store::new(root, "NVIDIA H200", "9.19.0").path,
            Path::new("/cache/kiln/kernels/cuda-nvidia-h200/cudnn-9.19.0.json")
        );
        assert_ne!(
            Store::new(root, "NVIDIA H200", "9.19.0").path,
            Store::new(root, "NVIDIA H100 80GB HBM3", "9.19.0").path
        );
        assert_ne!(
            Store::new(root, "NVIDIA H200", "9.19.0").path,
            Store::new(root, "NVIDIA H200", "9.10.2").path
        );
    }

    #[test]
    fn choices_come_back_as_saved_without_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path(), "NVIDIA H200", "9.19.0");
        let file = &store.path;
        assert_eq!(
            store.load().unwrap(),
            vec![],
            "no file yet: nothing, no error"
        );
        let (a, b) = (
            key(64, ConvPass::Forward),
            key(64, ConvPass::BackwardFilter),
        );
        store.save(a, saved(1)).unwrap();
        store.save(b, saved(5)).unwrap();
        let loaded = store.load().unwrap();
        let at_zero = |k: AlgoKey| AlgoKey { device: 0, ..k };
        assert_eq!(loaded, vec![(at_zero(a), saved(1)), (at_zero(b), saved(5))]);
        // A key chosen again is replaced, not doubled.
        store.save(a, saved(2)).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.len(), 2);
        assert!(loaded.contains(&(at_zero(a), saved(2))));
        let names: Vec<_> = fs::read_dir(file.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1, "no partial file left: {names:?}");
    }

    #[test]
    fn a_save_keeps_what_another_process_saved_since() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path(), "NVIDIA H200", "9.19.0");
        let other_process = Store::new(dir.path(), "NVIDIA H200", "9.19.0");
        store.save(key(64, ConvPass::Forward), saved(1)).unwrap();
        // This process read the file before the other one saved; its save reads it again.
        let before = store.load().unwrap();
        other_process
            .save(key(128, ConvPass::Forward), saved(2))
            .unwrap();
        store.save(key(256, ConvPass::Forward), saved(0)).unwrap();
        assert_eq!(before.len(), 1);
        assert_eq!(store.load().unwrap().len(), 3);
    }

    #[test]
    fn an_unreadable_file_is_an_error_to_log_and_the_next_save_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path(), "NVIDIA H200", "9.19.0");
        let file = &store.path;
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        // A write cut off half-way (by hand: kiln renames whole files into place).
        fs::write(file, r#"{"format": 1, "gpu": "NVIDIA H200", "choi"#).unwrap();
        let why = store.load().unwrap_err();
        assert!(why.contains("cudnn-9.19.0.json"), "{why}");
        store.save(key(64, ConvPass::Forward), saved(1)).unwrap();
        assert_eq!(store.load().unwrap().len(), 1);

        let other_format = r#"{"format": 2, "gpu": "x", "cudnn": "y", "choices": []}"#;
        fs::write(file, other_format).unwrap();
        let why = store.load().unwrap_err();
        assert!(why.contains("format 2"), "{why}");
    }

    #[test]
    fn the_file_reads_as_cudnn_terms() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path(), "NVIDIA H200", "9.19.0");
        let file = &store.path;
        store
            .save(key(64, ConvPass::BackwardData), saved(1))
            .unwrap();
        let text = fs::read_to_string(file).unwrap();
        for part in [
            r#""gpu": "NVIDIA H200""#,
            r#""pass": "backward_data""#,
            r#""data": "f32""#,
            r#""math": "default""#,
            r#""workspace": 4096"#,
        ] {
            assert!(text.contains(part), "{part} not in {text}");
        }
        assert!(
            !text.contains("device"),
            "the file is the GPU model's: {text}"
        );
    }

    /// The devices of a multi-GPU run save their first searches at once, from threads of one
    /// process: every save lands and no choice is lost.
    #[test]
    fn saves_from_many_threads_at_once_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path(), "NVIDIA H200", "9.19.0");
        let threads: Vec<_> = (0..8)
            .map(|thread| {
                let store = Store::new(dir.path(), "NVIDIA H200", "9.19.0");
                std::thread::spawn(move || {
                    for i in 0..12 {
                        let channels = 8 + thread * 100 + i;
                        store
                            .save(key(channels, ConvPass::Forward), saved(1))
                            .unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("every save succeeds");
        }
        assert_eq!(store.load().unwrap().len(), 8 * 12);
        let names: Vec<_> = fs::read_dir(store.path.parent().unwrap())
            .unwrap()
            .collect();
        assert_eq!(names.len(), 1, "no partial file left: {names:?}");
    }
}
