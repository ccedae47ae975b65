//! WebDataset's tar shards: a data set as POSIX tar files of `key.<image>` and `key.cls`
//! members (the image's bytes as they were, the class index as text), named with brace ranges
//! (`train-{000000..000127}.tar`), as timm, OpenCLIP and torchvision's references read them at
//! scale, and a `manifest.json` beside them (classes, counts, SHA-256) that [`write`] adds.
//!
//! kiln reads shards in place, without unpacking: opening one reads its headers (seeking over the
//! members' bytes) into an index of `(shard, offset, size, label)`, and an image is one read at
//! its offset. Shards therefore take part in the loader like any other data set: shuffled
//! whole from the seed, shared out over machines, devices and workers so that an epoch sees every
//! sample once, and resumed exactly at (epoch, position). The price is random reads into the
//! shards, which local disks and mounted file systems serve; a sequential stream with a shuffle
//! buffer (WebDataset's way on object storage) is not offered.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use image::RgbImage;
use serde::{Deserialize, Serialize};

use crate::dataset::Dataset;
use crate::image_folder::IMAGE_EXTENSIONS;
use crate::image_io::decode_rgb;
use crate::{DataError, ImageLimits};

/// The file beside the shards that names their classes and counts.
pub const MANIFEST: &str = "manifest.json";

/// The shard files a WebDataset pattern names: `{000000..000127}` is a zero-padded range,
/// `{a,b}` a list; a pattern without braces is one file.
pub fn expand(pattern: &str) -> Result<Vec<PathBuf>, DataError> {
    if !pattern.contains('{') {
        return Ok(vec![PathBuf::from(pattern)]);
    }
    let files = bracoxide::explode(pattern).map_err(|e| {
        DataError::Invalid(format!(
            "`{pattern}` is not a shard pattern ({e}); write ranges as train-{{000000..000127}}.tar"
        ))
    })?;
    Ok(files.into_iter().map(PathBuf::from).collect())
}

/// One sample's image inside a shard.
struct Member {
    shard: u32,
    offset: u64,
    size: u64,
    label: u32,
    /// The member's name in its shard, for messages.
    name: String,
}

/// The samples of a set of shards, in shard order and, within a shard, in member order.
pub struct Shards {
    files: Vec<PathBuf>,
    members: Vec<Member>,
    classes: Vec<String>,
    limits: ImageLimits,
}

impl Shards {
    /// Indexes the shards `pattern` names. A missing shard, one that is not a tar archive, a
    /// truncated one and a sample without its label are errors naming the shard.
    pub fn open(pattern: &str, limits: ImageLimits) -> Result<Self, DataError> {
        Self::open_with(pattern, None, limits)
    }

    /// [`Self::open`], labelling with `classes` where given (validation shards, which must use
    /// the training shards' classes), else with the manifest's, else `0..=` the highest label.
    pub fn open_with(
        pattern: &str,
        classes: Option<&[String]>,
        limits: ImageLimits,
    ) -> Result<Self, DataError> {
        let files = expand(pattern)?;
        let manifest = files.first().and_then(|f| Manifest::beside(f));
        let mut members = Vec::new();
        for (shard, file) in files.iter().enumerate() {
            let listed = manifest.as_ref().and_then(|m| m.samples_of(file));
            index_shard(file, shard as u32, listed, &mut members)?;
        }
        if members.is_empty() {
            return Err(DataError::Invalid(format!(
                "the shards `{pattern}` hold no images (members named key.jpg, key.png, ... with key.cls)"
            )));
        }
        let (classes, from) = match (classes, manifest) {
            (Some(classes), _) => (classes.to_vec(), "the training shards"),
            (None, Some(manifest)) => (manifest.classes, MANIFEST),
            (None, None) => {
                let top = members.iter().map(|m| m.label).max().unwrap_or(0);
                ((0..=top).map(|c| c.to_string()).collect(), "")
            }
        };
        if let Some(m) = members.iter().find(|m| m.label as usize >= classes.len()) {
            return Err(DataError::Corrupt {
                path: files[m.shard as usize].clone(),
                reason: format!(
                    "{}'s class {} is past the {} classes of {from}",
                    m.name,
                    m.label,
                    classes.len()
                ),
            });
        }
        Ok(Self {
            files,
            members,
            classes,
            limits,
        })
    }

    /// The shard files, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

impl Dataset for Shards {
    fn len(&self) -> usize {
        self.members.len()
    }

    fn image(&self, index: usize) -> Result<RgbImage, DataError> {
        let member = &self.members[index];
        let name = self.files[member.shard as usize].join(&member.name);
        let unreadable = |reason: String| DataError::Unreadable {
            path: name.clone(),
            reason,
        };
        if member.size > self.limits.max_file_bytes {
            return Err(unreadable(format!(
                "the member is {} bytes, over the limit of {} (data.max_file_bytes raises it)",
                member.size, self.limits.max_file_bytes
            )));
        }
        let mut file = File::open(&self.files[member.shard as usize])
            .map_err(|e| unreadable(e.to_string()))?;
        let mut bytes = vec![0; member.size as usize];
        file.seek(SeekFrom::Start(member.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| unreadable(e.to_string()))?;
        decode_rgb(&bytes, &name, self.limits)
    }

    fn label(&self, index: usize) -> usize {
        self.members[index].label as usize
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }

    fn describe(&self, index: usize) -> String {
        let member = &self.members[index];
        format!(
            "{}:{}",
            self.files[member.shard as usize].display(),
            member.name
        )
    }
}

/// A key's members while its shard is read: the image's (offset, size, name) and the label.
struct Pending {
    key: String,
    image: Option<(u64, u64, String)>,
    label: Option<u32>,
}

/// Adds the samples of shard `file` to `members`; `listed`: how many the manifest says it holds.
fn index_shard(
    file: &Path,
    shard: u32,
    listed: Option<usize>,
    members: &mut Vec<Member>,
) -> Result<(), DataError> {
    let corrupt = |reason: String| DataError::Corrupt {
        path: file.to_path_buf(),
        reason,
    };
    let length = match std::fs::metadata(file) {
        Ok(meta) => meta.len(),
        Err(_) => {
            return Err(DataError::Missing {
                what: "shard".into(),
                path: file.to_path_buf(),
                hint: "check the shard pattern's range and folder (a brace range names every file it covers)".into(),
            });
        }
    };
    let handle = File::open(file).map_err(DataError::io(file))?;
    let mut archive = tar::Archive::new(handle);
    let entries = archive
        .entries_with_seek()
        .map_err(|e| corrupt(format!("not a tar archive: {e}")))?;
    // Each key's image member and label, in the order keys first appear.
    let mut samples: Vec<Pending> = Vec::new();
    let mut slots: HashMap<String, usize> = HashMap::new();
    let mut end = 0;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            corrupt(format!(
                "truncated or not a tar archive ({e}); write it again"
            ))
        })?;
        end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry
            .path()
            .map_err(|e| corrupt(e.to_string()))?
            .to_string_lossy()
            .into_owned();
        let Some((key, extension)) = split_key(&name) else {
            continue;
        };
        let slot = *slots.entry(key.to_string()).or_insert_with(|| {
            samples.push(Pending {
                key: key.to_string(),
                image: None,
                label: None,
            });
            samples.len() - 1
        });
        let extension = extension.to_ascii_lowercase();
        if extension == "cls" {
            let mut text = String::new();
            entry
                .read_to_string(&mut text)
                .map_err(|e| corrupt(format!("cannot read {name}: {e}")))?;
            let label = text.trim().parse().map_err(|_| {
                corrupt(format!("{name} holds {:?}, not a class index", text.trim()))
            })?;
            samples[slot].label = Some(label);
        } else if IMAGE_EXTENSIONS.contains(&extension.as_str()) {
            samples[slot].image = Some((entry.raw_file_position(), entry.size(), name));
        }
    }
    // A whole archive ends with two zero blocks after its last member.
    if length < end + 1024 {
        return Err(corrupt(format!(
            "truncated: its last member ends at byte {end} of a {length}-byte file without the archive's end; write it again"
        )));
    }
    let before = members.len();
    for Pending { key, image, label } in samples {
        let Some((offset, size, name)) = image else {
            continue;
        };
        let label = label.ok_or_else(|| {
            corrupt(format!(
                "sample {key} has no {key}.cls with its class index"
            ))
        })?;
        members.push(Member {
            shard,
            offset,
            size,
            label,
            name,
        });
    }
    if let Some(listed) = listed
        && listed != members.len() - before
    {
        return Err(corrupt(format!(
            "it holds {} samples where {MANIFEST} lists {listed}; write it again",
            members.len() - before
        )));
    }
    Ok(())
}

/// A member's WebDataset key and extension: the path up to the first dot of its file name, and
/// the rest (`a/b.seg.png` is key `a/b`, extension `seg.png`).
fn split_key(name: &str) -> Option<(&str, &str)> {
    let start = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[start..].find('.')? + start;
    Some((&name[..dot], &name[dot + 1..]))
}

/// What [`write`] records beside the shards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub classes: Vec<String>,
    pub splits: BTreeMap<String, SplitManifest>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitManifest {
    /// The brace pattern of the split's shards, relative to the manifest's folder.
    pub pattern: String,
    pub samples: usize,
    pub shards: Vec<ShardManifest>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardManifest {
    pub file: String,
    pub samples: usize,
    pub bytes: u64,
    pub sha256: String,
}

impl Manifest {
    /// The number of samples the manifest lists for the shard file `shard`, if it lists it.
    fn samples_of(&self, shard: &Path) -> Option<usize> {
        let name = shard.file_name()?.to_str()?;
        self.splits
            .values()
            .flat_map(|split| &split.shards)
            .find(|s| s.file == name)
            .map(|s| s.samples)
    }

    /// The manifest in the folder of `shard`, if there is a readable one.
    pub fn beside(shard: &Path) -> Option<Self> {
        let folder = shard.parent().unwrap_or(Path::new("."));
        let text = std::fs::read_to_string(folder.join(MANIFEST)).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// Writes `splits` (name and data set, such as `train` and `val`) as shards of at most
/// `max_bytes` each into `out`, with the manifest. Image files keep their bytes (a JPEG stays
/// the same JPEG); images decoded in memory (CIFAR, digits) are stored as PNG, losslessly.
/// Each shard is written under a temporary name and renamed when whole.
pub fn write(
    splits: &[(&str, &dyn Dataset)],
    out: &Path,
    max_bytes: u64,
) -> Result<Manifest, DataError> {
    std::fs::create_dir_all(out).map_err(DataError::io(out))?;
    let classes = splits
        .first()
        .map_or(Vec::new(), |(_, d)| d.classes().to_vec());
    let mut manifest = Manifest {
        classes,
        splits: BTreeMap::new(),
    };
    for (split, dataset) in splits {
        let shards = write_split(split, *dataset, out, max_bytes)?;
        let last = shards.len().saturating_sub(1);
        let pattern = match shards.len() {
            1 => shards[0].file.clone(),
            _ => format!("{split}-{{{:06}..{last:06}}}.tar", 0),
        };
        let samples = shards.iter().map(|s| s.samples).sum();
        manifest.splits.insert(
            split.to_string(),
            SplitManifest {
                pattern,
                samples,
                shards,
            },
        );
    }
    let path = out.join(MANIFEST);
    let text = serde_json::to_string_pretty(&manifest).expect("a manifest serializes");
    std::fs::write(&path, text).map_err(DataError::io(&path))?;
    Ok(manifest)
}

fn write_split(
    split: &str,
    dataset: &dyn Dataset,
    out: &Path,
    max_bytes: u64,
) -> Result<Vec<ShardManifest>, DataError> {
    let mut shards = Vec::new();
    let mut writer: Option<ShardWriter> = None;
    for index in 0..dataset.len() {
        let (bytes, extension) = encoded(dataset, index)?;
        // The image's header and blocks and the label's; the archive's end takes 1024 more.
        let size = 512 + (bytes.len() as u64).div_ceil(512) * 512 + 1024;
        if writer
            .as_ref()
            .is_some_and(|w| w.samples > 0 && w.bytes + size + 1024 > max_bytes)
        {
            shards.push(writer.take().expect("checked").finish()?);
        }
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(ShardWriter::create(out, split, shards.len())?),
        };
        let key = format!("{index:08}");
        w.add(&format!("{key}.{extension}"), &bytes)?;
        w.add(
            &format!("{key}.cls"),
            dataset.label(index).to_string().as_bytes(),
        )?;
        w.samples += 1;
    }
    if let Some(w) = writer {
        shards.push(w.finish()?);
    }
    Ok(shards)
}

/// Image `index` as file bytes and their extension: the file's own where it has one that
/// readers know as an image's, or the bytes the data set holds, else the decoded image as PNG.
fn encoded(dataset: &dyn Dataset, index: usize) -> Result<(Vec<u8>, String), DataError> {
    let kept = dataset.file(index).and_then(|file| {
        let extension = file.extension()?.to_str()?.to_ascii_lowercase();
        IMAGE_EXTENSIONS
            .contains(&extension.as_str())
            .then_some((file, extension))
    });
    if let Some((file, extension)) = kept {
        let bytes = std::fs::read(&file).map_err(DataError::io(&file))?;
        return Ok((bytes, extension));
    }
    if let Some((bytes, extension)) = dataset.encoded(index) {
        return Ok((bytes, extension.into()));
    }
    let image = dataset.image(index)?;
    let mut bytes = Vec::new();
    image
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .map_err(|e| {
            DataError::Invalid(format!("cannot encode {}: {e}", dataset.describe(index)))
        })?;
    Ok((bytes, "png".into()))
}

/// One shard being written: a tar under a temporary name, and what the manifest says of it.
struct ShardWriter {
    builder: tar::Builder<std::io::BufWriter<File>>,
    temporary: PathBuf,
    path: PathBuf,
    samples: usize,
    bytes: u64,
}

impl ShardWriter {
    fn create(out: &Path, split: &str, number: usize) -> Result<Self, DataError> {
        let path = out.join(format!("{split}-{number:06}.tar"));
        let temporary = path.with_extension("tar.partial");
        let file = File::create(&temporary).map_err(DataError::io(&temporary))?;
        Ok(Self {
            builder: tar::Builder::new(std::io::BufWriter::new(file)),
            temporary,
            path,
            samples: 0,
            bytes: 0,
        })
    }

    fn add(&mut self, name: &str, bytes: &[u8]) -> Result<(), DataError> {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        self.builder
            .append_data(&mut header, name, bytes)
            .map_err(DataError::io(&self.temporary))?;
        self.bytes += 512 + (bytes.len() as u64).div_ceil(512) * 512;
        Ok(())
    }

    fn finish(self) -> Result<ShardManifest, DataError> {
        let temporary = self.temporary.clone();
        let mut file = self
            .builder
            .into_inner()
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .map_err(DataError::io(&temporary))?;
        file.flush()
            .and_then(|_| file.sync_all())
            .map_err(DataError::io(&temporary))?;
        std::fs::rename(&temporary, &self.path).map_err(DataError::io(&self.path))?;
        let sha256 = kiln_download::sha256_file(&self.path)?;
        let bytes = std::fs::metadata(&self.path)
            .map_err(DataError::io(&self.path))?
            .len();
        Ok(ShardManifest {
            file: self
                .path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            samples: self.samples,
            bytes,
            sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Synthetic;

    #[test]
    fn patterns_expand_as_webdataset_writes_them() {
        assert_eq!(
            expand("d/train-{000008..000010}.tar").unwrap(),
            [
                "d/train-000008.tar",
                "d/train-000009.tar",
                "d/train-000010.tar"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(expand("one.tar").unwrap(), [PathBuf::from("one.tar")]);
        assert_eq!(split_key("a/b.seg.png"), Some(("a/b", "seg.png")));
        assert_eq!(split_key("dir.v2/x.jpg"), Some(("dir.v2/x", "jpg")));
        assert_eq!(split_key("README"), None);
    }

    #[test]
    fn written_shards_read_back_the_same_samples() {
        let dir = tempfile::tempdir().unwrap();
        let train = Synthetic::new(10, 5, 4, 3, 7).unwrap();
        let val = Synthetic::new(3, 5, 4, 3, 8).unwrap();
        // Two samples a shard (each about 2 KiB with its headers).
        let manifest = write(&[("train", &train), ("val", &val)], dir.path(), 6200).unwrap();
        let split = &manifest.splits["train"];
        assert!(split.shards.len() > 2, "{split:?}");
        assert_eq!(split.samples, 10);
        assert_eq!(
            split.pattern,
            format!("train-{{000000..{:06}}}.tar", split.shards.len() - 1)
        );
        let pattern = dir.path().join(&split.pattern);
        let read = Shards::open(pattern.to_str().unwrap(), ImageLimits::default()).unwrap();
        assert_eq!(read.len(), 10);
        assert_eq!(read.classes(), train.classes());
        for i in 0..10 {
            assert_eq!(read.image(i).unwrap(), train.image(i).unwrap(), "image {i}");
            assert_eq!(read.label(i), train.label(i));
        }
        assert!(
            read.describe(4).contains("00000004.png"),
            "{}",
            read.describe(4)
        );
        let shard = dir.path().join(&split.shards[0].file);
        assert_eq!(
            kiln_download::sha256_file(&shard).unwrap(),
            split.shards[0].sha256
        );
        assert_eq!(manifest.splits["val"].pattern, "val-{000000..000001}.tar");
    }

    #[test]
    fn two_machines_with_two_workers_each_see_every_sample_once_an_epoch() {
        use crate::{BatchShare, InMemory, Loader, LoaderConfig, Pipeline};
        use std::sync::Arc;
        // 1x1 images whose red value is their index.
        let count = 40;
        let numbered = InMemory {
            width: 1,
            height: 1,
            pixels: (0..count).flat_map(|i| [i as u8, 0, 0]).collect(),
            labels: (0..count).map(|i| (i % 3) as u16).collect(),
            classes: ["a", "b", "c"].map(String::from).to_vec(),
        };
        let dir = tempfile::tempdir().unwrap();
        let manifest = write(&[("train", &numbered)], dir.path(), 4096).unwrap();
        let pattern = dir.path().join(&manifest.splits["train"].pattern);
        let shards =
            Arc::new(Shards::open(pattern.to_str().unwrap(), ImageLimits::default()).unwrap());
        assert!(shards.files().len() > 2);
        for epoch in 0..2 {
            let mut seen = Vec::new();
            for machine in 0..2 {
                let mut config = LoaderConfig::new(6, 9);
                config.workers = 2;
                config.share = BatchShare {
                    index: machine,
                    count: 2,
                };
                let loader =
                    Loader::new(shards.clone(), Pipeline::new(&[]).unwrap(), config).unwrap();
                for batch in loader.epoch(epoch) {
                    let batch = batch.unwrap();
                    // CHW floats: each image's red value first of its three.
                    seen.extend(
                        batch
                            .images
                            .chunks(3)
                            .map(|c| (c[0] * 255.0).round() as usize),
                    );
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..count).collect::<Vec<_>>(), "epoch {epoch}");
        }
    }

    #[test]
    fn validation_shards_take_the_training_classes_without_a_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let train = Synthetic::new(12, 3, 3, 4, 1).unwrap();
        let manifest = write(&[("train", &train)], dir.path(), 1 << 20).unwrap();
        std::fs::remove_file(dir.path().join(MANIFEST)).unwrap();
        let pattern = dir.path().join(&manifest.splits["train"].pattern);
        let pattern = pattern.to_str().unwrap();
        let classes = ["a", "b", "c", "d", "e"].map(String::from);
        let val = Shards::open_with(pattern, Some(&classes), ImageLimits::default()).unwrap();
        assert_eq!(val.classes(), classes);
        let error = Shards::open_with(pattern, Some(&classes[..1]), ImageLimits::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("past the 1 classes of the training shards"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_or_truncated_shard_is_one_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let train = Synthetic::new(4, 5, 4, 2, 1).unwrap();
        let manifest = write(&[("train", &train)], dir.path(), 1 << 20).unwrap();
        assert_eq!(manifest.splits["train"].pattern, "train-000000.tar");
        let shard = dir.path().join("train-000000.tar");
        let pattern = dir.path().join("train-{000000..000001}.tar");
        let error = Shards::open(pattern.to_str().unwrap(), ImageLimits::default())
            .err()
            .unwrap()
            .to_string();
        assert!(error.starts_with("shard not found"), "{error}");
        assert!(error.contains("train-000001.tar"), "{error}");

        let bytes = std::fs::read(&shard).unwrap();
        for cut in [bytes.len() / 2, 700] {
            std::fs::write(&shard, &bytes[..cut]).unwrap();
            let error = Shards::open(shard.to_str().unwrap(), ImageLimits::default())
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains("train-000000.tar"), "{error}");
            assert!(error.contains("truncated"), "{error}");
        }
    }
}
