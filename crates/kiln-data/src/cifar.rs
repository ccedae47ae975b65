//! CIFAR-10 and CIFAR-100 from the official archives, in either of their formats: the Python
//! one that torchvision downloads (`cifar-10-batches-py`, pickled batches) and the binary one
//! (`cifar-10-batches-bin`). A torchvision `./data` folder works as it is.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_pickle::{DeOptions, HashableValue, Value};

use crate::DataError;
use crate::archive::extract_tar_gz;
use crate::dataset::InMemory;

const SIDE: u32 = 32;
const IMAGE_BYTES: usize = 3 * 32 * 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cifar {
    Cifar10,
    Cifar100,
}

/// Where the official archive is and what it must hash to (the SHA-256 of the file the CIFAR
/// page publishes, whose MD5 torchvision checks).
#[derive(Debug, Clone)]
pub struct ArchiveSource {
    pub url: String,
    pub sha256: String,
}

impl Cifar {
    pub fn name(self) -> &'static str {
        match self {
            Cifar::Cifar10 => "CIFAR-10",
            Cifar::Cifar100 => "CIFAR-100",
        }
    }

    /// The folder of the Python format, as the archive unpacks and torchvision expects it.
    pub fn python_folder(self) -> &'static str {
        match self {
            Cifar::Cifar10 => "cifar-10-batches-py",
            Cifar::Cifar100 => "cifar-100-python",
        }
    }

    pub fn binary_folder(self) -> &'static str {
        match self {
            Cifar::Cifar10 => "cifar-10-batches-bin",
            Cifar::Cifar100 => "cifar-100-binary",
        }
    }

    pub fn archive_name(self) -> &'static str {
        match self {
            Cifar::Cifar10 => "cifar-10-python.tar.gz",
            Cifar::Cifar100 => "cifar-100-python.tar.gz",
        }
    }

    /// The official archive of the Python format.
    pub fn official_archive(self) -> ArchiveSource {
        let sha256 = match self {
            Cifar::Cifar10 => "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
            Cifar::Cifar100 => "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
        };
        ArchiveSource {
            url: format!("https://www.cs.toronto.edu/~kriz/{}", self.archive_name()),
            sha256: sha256.into(),
        }
    }

    fn class_count(self) -> usize {
        match self {
            Cifar::Cifar10 => 10,
            Cifar::Cifar100 => 100,
        }
    }
}

/// The train and test parts of a CIFAR data set.
pub struct CifarSplits {
    pub train: InMemory,
    pub test: InMemory,
}

/// Opens CIFAR under `root` (a torchvision data folder, or the format's folder itself). When
/// neither format is there, downloads the official archive if `download` is set.
pub fn open(which: Cifar, root: &Path, download: bool) -> Result<CifarSplits, DataError> {
    open_from(which, root, download, &which.official_archive())
}

/// [`open`] with the archive's address given, so that downloading can be tested offline.
pub fn open_from(
    which: Cifar,
    root: &Path,
    download: bool,
    source: &ArchiveSource,
) -> Result<CifarSplits, DataError> {
    let candidates = |folder: &str| [root.join(folder), root.to_path_buf()];
    for dir in candidates(which.python_folder()) {
        if dir.join(python_files(which).1).is_file() {
            return read_python(which, &dir);
        }
    }
    for dir in candidates(which.binary_folder()) {
        if dir.join(binary_files(which).1).is_file() {
            return read_binary(which, &dir);
        }
    }
    if !download {
        return Err(DataError::Missing {
            what: which.name().into(),
            path: root.to_path_buf(),
            hint: format!(
                "expected {} (torchvision's layout) or {}; set download = true, or fetch {} on a machine with network access and unpack it in {}",
                root.join(which.python_folder()).display(),
                root.join(which.binary_folder()).display(),
                source.url,
                root.display()
            ),
        });
    }
    let archive = root.join(which.archive_name());
    if !kiln_download::is_verified(&archive, &source.sha256) {
        kiln_download::fetch(&source.url, &archive, &source.sha256)?;
    }
    let dir = extract_tar_gz(&archive, root, which.python_folder())?;
    read_python(which, &dir)
}

/// (train files, test file, class-name file) of the Python format.
fn python_files(which: Cifar) -> (Vec<String>, &'static str, &'static str) {
    match which {
        Cifar::Cifar10 => (
            (1..=5).map(|i| format!("data_batch_{i}")).collect(),
            "test_batch",
            "batches.meta",
        ),
        Cifar::Cifar100 => (vec!["train".into()], "test", "meta"),
    }
}

fn binary_files(which: Cifar) -> (Vec<String>, &'static str, &'static str) {
    match which {
        Cifar::Cifar10 => (
            (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
            "test_batch.bin",
            "batches.meta.txt",
        ),
        Cifar::Cifar100 => (vec!["train.bin".into()], "test.bin", "fine_label_names.txt"),
    }
}

fn read_python(which: Cifar, dir: &Path) -> Result<CifarSplits, DataError> {
    let (train_files, test_file, meta_file) = python_files(which);
    let (names_key, labels_key) = match which {
        Cifar::Cifar10 => ("label_names", "labels"),
        Cifar::Cifar100 => ("fine_label_names", "fine_labels"),
    };
    let meta_path = dir.join(meta_file);
    let classes = strings(
        &meta_path,
        field(&meta_path, &unpickle(&meta_path)?, names_key)?,
    )?;
    check_class_count(which, &meta_path, &classes)?;
    let read = |files: &[String]| -> Result<InMemory, DataError> {
        let mut set = empty(classes.clone());
        for name in files {
            let path = dir.join(name);
            let batch = unpickle(&path)?;
            let labels = integers(&path, field(&path, &batch, labels_key)?)?;
            let data = numpy_bytes(&path, field(&path, &batch, "data")?, labels.len())?;
            append(&mut set, &path, &data, &labels, 0, 0)?;
        }
        Ok(set)
    };
    Ok(CifarSplits {
        train: read(&train_files)?,
        test: read(&[test_file.to_string()])?,
    })
}

fn read_binary(which: Cifar, dir: &Path) -> Result<CifarSplits, DataError> {
    let (train_files, test_file, meta_file) = binary_files(which);
    let meta_path = dir.join(meta_file);
    let classes: Vec<String> = std::fs::read_to_string(&meta_path)
        .map_err(DataError::io(&meta_path))?
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(String::from)
        .collect();
    check_class_count(which, &meta_path, &classes)?;
    // CIFAR-100 records carry the coarse label before the fine one.
    let label_bytes = match which {
        Cifar::Cifar10 => 1,
        Cifar::Cifar100 => 2,
    };
    let record = label_bytes + IMAGE_BYTES;
    let read = |files: &[String]| -> Result<InMemory, DataError> {
        let mut set = empty(classes.clone());
        for name in files {
            let path = dir.join(name);
            let bytes = std::fs::read(&path).map_err(DataError::io(&path))?;
            if bytes.is_empty() || bytes.len() % record != 0 {
                return Err(DataError::corrupt(
                    &path,
                    format!(
                        "{} bytes is not a whole number of {record}-byte records: the file is truncated or corrupt; fetch it again",
                        bytes.len()
                    ),
                ));
            }
            let labels: Vec<i64> = bytes
                .chunks_exact(record)
                .map(|r| r[label_bytes - 1] as i64)
                .collect();
            append(&mut set, &path, &bytes, &labels, label_bytes, record)?;
        }
        Ok(set)
    };
    Ok(CifarSplits {
        train: read(&train_files)?,
        test: read(&[test_file.to_string()])?,
    })
}

fn empty(classes: Vec<String>) -> InMemory {
    InMemory {
        width: SIDE,
        height: SIDE,
        pixels: Vec::new(),
        labels: Vec::new(),
        classes,
    }
}

fn check_class_count(which: Cifar, path: &Path, classes: &[String]) -> Result<(), DataError> {
    if classes.len() != which.class_count() {
        return Err(DataError::corrupt(
            path,
            format!(
                "{} class names, {} expected for {}",
                classes.len(),
                which.class_count(),
                which.name()
            ),
        ));
    }
    Ok(())
}

/// Appends images stored CIFAR's way (per image: 1024 red, 1024 green, 1024 blue bytes, each
/// row-major) to `set` as HWC. Image `i` starts at `i * stride + offset` (`stride` 0 means
/// packed).
fn append(
    set: &mut InMemory,
    path: &Path,
    bytes: &[u8],
    labels: &[i64],
    offset: usize,
    stride: usize,
) -> Result<(), DataError> {
    let stride = if stride == 0 { IMAGE_BYTES } else { stride };
    let plane = IMAGE_BYTES / 3;
    set.pixels.reserve(labels.len() * IMAGE_BYTES);
    for (i, &label) in labels.iter().enumerate() {
        if !(0..set.classes.len() as i64).contains(&label) {
            return Err(DataError::corrupt(
                path,
                format!(
                    "image {i} has label {label}, outside 0..{}",
                    set.classes.len()
                ),
            ));
        }
        let image = &bytes[i * stride + offset..][..IMAGE_BYTES];
        for p in 0..plane {
            set.pixels
                .extend_from_slice(&[image[p], image[plane + p], image[2 * plane + p]]);
        }
        set.labels.push(label as u16);
    }
    Ok(())
}

fn unpickle(path: &Path) -> Result<Value, DataError> {
    let file = std::fs::File::open(path).map_err(DataError::io(path))?;
    serde_pickle::value_from_reader(
        std::io::BufReader::new(file),
        DeOptions::new().replace_unresolved_globals(),
    )
    .map_err(|e| {
        DataError::corrupt(
            path,
            format!(
                "not a readable CIFAR batch ({e}): the file is truncated or corrupt; fetch it again"
            ),
        )
    })
}

fn shape_error(path: &Path, what: &str) -> DataError {
    DataError::corrupt(path, format!("unexpected layout: {what}"))
}

/// A key of a pickled dict; the official files (Python 2) have byte-string keys, files written
/// by Python 3 may have text keys.
fn field<'a>(path: &Path, value: &'a Value, key: &str) -> Result<&'a Value, DataError> {
    let Value::Dict(map) = value else {
        return Err(shape_error(path, "the batch is not a dict"));
    };
    let by_bytes = HashableValue::Bytes(key.as_bytes().to_vec());
    let by_text = HashableValue::String(key.to_string());
    map.get(&by_bytes)
        .or_else(|| map.get(&by_text))
        .ok_or_else(|| shape_error(path, &format!("no '{key}' entry")))
}

fn integers(path: &Path, value: &Value) -> Result<Vec<i64>, DataError> {
    let Value::List(items) = value else {
        return Err(shape_error(path, "labels are not a list"));
    };
    items
        .iter()
        .map(|item| match item {
            Value::I64(n) => Ok(*n),
            _ => Err(shape_error(path, "a label is not an integer")),
        })
        .collect()
}

fn strings(path: &Path, value: &Value) -> Result<Vec<String>, DataError> {
    let Value::List(items) = value else {
        return Err(shape_error(path, "class names are not a list"));
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Ok(s.clone()),
            Value::Bytes(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            _ => Err(shape_error(path, "a class name is not a string")),
        })
        .collect()
}

/// The raw bytes of a pickled numpy `uint8` array of shape `(count, 3072)`. Unpickled without
/// numpy, the array is its reconstruction state: `(version, shape, dtype, fortran, bytes)`.
fn numpy_bytes(path: &Path, value: &Value, count: usize) -> Result<Vec<u8>, DataError> {
    let Value::Tuple(state) = value else {
        return Err(shape_error(path, "'data' is not a numpy array"));
    };
    let shape = state.get(1).and_then(|shape| match shape {
        Value::Tuple(dims) => dims
            .iter()
            .map(|d| match d {
                Value::I64(n) => Some(*n as usize),
                _ => None,
            })
            .collect::<Option<Vec<_>>>(),
        _ => None,
    });
    if shape != Some(vec![count, IMAGE_BYTES]) {
        return Err(shape_error(
            path,
            &format!("'data' has shape {shape:?}, expected [{count}, {IMAGE_BYTES}]"),
        ));
    }
    match state.get(4) {
        Some(Value::Bytes(bytes)) if bytes.len() == count * IMAGE_BYTES => Ok(bytes.clone()),
        Some(Value::Bytes(bytes)) => Err(DataError::corrupt(
            path,
            format!(
                "'data' holds {} bytes, {} expected: the file is truncated or corrupt; fetch it again",
                bytes.len(),
                count * IMAGE_BYTES
            ),
        )),
        _ => Err(shape_error(path, "'data' is not a uint8 array")),
    }
}
