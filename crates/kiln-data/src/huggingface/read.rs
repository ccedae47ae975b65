//! One split of a Hugging Face data set, read from its parquet files: the image column as
//! `datasets` writes it (`struct<bytes: binary, path: string>`, or plain binary), the label
//! column an integer, the class names from the `ClassLabel` feature in the files' `huggingface`
//! metadata.
//!
//! The images' encoded bytes are held in memory, in one buffer (CIFAR-10's train split is
//! 120 MB of PNG), and decoded by the loader's workers. Reading a row lazily from its row group
//! would decode the row group's pages up to that row for each image (row groups of 100 to 1,000
//! images), in the loader's shuffled order; a set larger than memory is better written to tar
//! shards once (`kiln shard`), which are read in place.

use std::fs::File;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use image::RgbImage;
use parquet::basic::Type as PhysicalType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;
use serde_json::Value;

use crate::dataset::Dataset;
use crate::image_io::decode_rgb;
use crate::{DataError, ImageLimits};

/// The columns a source names, where it names them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParquetColumns {
    pub image: Option<String>,
    pub label: Option<String>,
}

/// A split's images (encoded, as in the files) and labels.
pub struct HuggingFace {
    files: Vec<PathBuf>,
    /// The index of each file's first row.
    starts: Vec<usize>,
    /// Every image's bytes, one after the other; image `i` ends at `ends[i]`.
    bytes: Vec<u8>,
    ends: Vec<usize>,
    labels: Vec<u32>,
    classes: Vec<String>,
    limits: ImageLimits,
}

/// What a split's first file says of its columns: which hold the images and labels, and the
/// labels' class names.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub image: String,
    pub label: String,
    pub classes: Vec<String>,
}

impl HuggingFace {
    /// Reads the split in `files` (in order). Its class names must be `classes` where given
    /// (validation, which must use the training split's).
    pub fn read(
        files: &[PathBuf],
        columns: &ParquetColumns,
        classes: Option<&[String]>,
        limits: ImageLimits,
    ) -> Result<Self, DataError> {
        let mut set = HuggingFace {
            files: files.to_vec(),
            starts: Vec::with_capacity(files.len()),
            bytes: Vec::new(),
            ends: Vec::new(),
            labels: Vec::new(),
            classes: Vec::new(),
            limits,
        };
        let mut schema: Option<Schema> = None;
        for file in files {
            set.starts.push(set.labels.len());
            // The parquet crate may panic on a damaged file; it is one bad file, not a bug.
            let read = catch_unwind(AssertUnwindSafe(|| {
                set.read_file(file, columns, &mut schema)
            }));
            read.unwrap_or_else(|panic| Err(not_parquet(file, panic_text(panic))))?;
        }
        let schema = schema.ok_or_else(|| DataError::Invalid("a split without files".into()))?;
        if let Some(classes) = classes
            && classes != schema.classes
        {
            return Err(DataError::Invalid(format!(
                "{}: its class names ({}) differ from the training split's ({}); labels would not match",
                files[0].display(),
                schema.classes.join(", "),
                classes.join(", ")
            )));
        }
        set.classes = schema.classes;
        Ok(set)
    }

    /// Appends `file`'s rows; the first file settles the schema, the others must agree.
    fn read_file(
        &mut self,
        file: &Path,
        columns: &ParquetColumns,
        schema: &mut Option<Schema>,
    ) -> Result<(), DataError> {
        let reader = open(file)?;
        let found = file_schema(file, &reader, columns)?;
        match schema {
            None => *schema = Some(found.clone()),
            Some(first) if *first != found => {
                return Err(DataError::Invalid(format!(
                    "{}: its image and label columns or class names ({}, {}: {}) differ from the split's first file ({}, {}: {}); the files of a split must agree",
                    file.display(),
                    found.image,
                    found.label,
                    found.classes.join(", "),
                    first.image,
                    first.label,
                    first.classes.join(", ")
                )));
            }
            Some(_) => {}
        }
        let root = reader.metadata().file_metadata().schema();
        let projection = Type::group_type_builder(root.name())
            .with_fields(
                root.get_fields()
                    .iter()
                    .filter(|f| f.name() == found.image || f.name() == found.label)
                    .cloned()
                    .collect(),
            )
            .build()
            .map_err(|e| not_parquet(file, e.to_string()))?;
        let rows = reader
            .get_row_iter(Some(projection))
            .map_err(|e| not_parquet(file, e.to_string()))?;
        let first = self.labels.len();
        for (row_index, row) in rows.enumerate() {
            let row = row.map_err(|e| not_parquet(file, e.to_string()))?;
            let mut label = None;
            for (name, field) in row.get_column_iter() {
                if *name == found.image {
                    if let Some(bytes) = image_bytes(field) {
                        self.bytes.extend_from_slice(bytes);
                    }
                    self.ends.push(self.bytes.len());
                } else if *name == found.label {
                    label = Some(integer(field));
                }
            }
            let label = match label.flatten() {
                Some(label) if label >= 0 && (label as usize) < found.classes.len() => label,
                other => {
                    let what = match other {
                        Some(-1) => "label -1 (no label, as the test splits of competitions have); train and validate on a labelled split".to_string(),
                        Some(label) => format!("label {label}, past its {} class names", found.classes.len()),
                        None => format!("no label in column `{}`", found.label),
                    };
                    return Err(DataError::Corrupt {
                        path: file.to_path_buf(),
                        reason: format!("row {row_index} has {what}"),
                    });
                }
            };
            self.labels.push(label as u32);
        }
        let rows = reader.metadata().file_metadata().num_rows();
        if (self.labels.len() - first) as i64 != rows || self.ends.len() != self.labels.len() {
            return Err(not_parquet(
                file,
                format!(
                    "its footer says {rows} rows, {} were read",
                    self.labels.len() - first
                ),
            ));
        }
        Ok(())
    }

    /// Where image `index` is: its file and row.
    fn place(&self, index: usize) -> (&Path, usize) {
        let file = self.starts.partition_point(|&s| s <= index) - 1;
        (&self.files[file], index - self.starts[file])
    }

    /// The split's files, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

impl HuggingFace {
    fn bytes(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.bytes[start..self.ends[index]]
    }
}

impl Dataset for HuggingFace {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn image(&self, index: usize) -> Result<RgbImage, DataError> {
        let bytes = self.bytes(index);
        let name = PathBuf::from(self.describe(index));
        if bytes.is_empty() {
            return Err(DataError::Unreadable {
                path: name,
                reason: "the row holds no image bytes (an image kept by path only, which datasets embeds on push_to_hub)".into(),
            });
        }
        if bytes.len() as u64 > self.limits.max_file_bytes {
            return Err(DataError::Unreadable {
                path: name,
                reason: format!(
                    "the image is {} bytes, over the limit of {} (data.max_file_bytes raises it)",
                    bytes.len(),
                    self.limits.max_file_bytes
                ),
            });
        }
        decode_rgb(bytes, &name, self.limits)
    }

    fn label(&self, index: usize) -> usize {
        self.labels[index] as usize
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }

    fn describe(&self, index: usize) -> String {
        let (file, row) = self.place(index);
        format!("{} (row {row})", file.display())
    }

    /// The bytes as the file holds them, in a format kiln's image folders read.
    fn encoded(&self, index: usize) -> Option<(Vec<u8>, &'static str)> {
        let bytes = self.bytes(index);
        let extension = match image::guess_format(bytes).ok()? {
            image::ImageFormat::Jpeg => "jpg",
            image::ImageFormat::Png => "png",
            image::ImageFormat::WebP => "webp",
            image::ImageFormat::Bmp => "bmp",
            image::ImageFormat::Tiff => "tiff",
            image::ImageFormat::Pnm => "ppm",
            _ => return None,
        };
        Some((bytes.to_vec(), extension))
    }
}

/// `file`'s footer read: a reader for its rows.
fn open(file: &Path) -> Result<SerializedFileReader<File>, DataError> {
    let handle = File::open(file).map_err(DataError::io(file))?;
    SerializedFileReader::new(handle).map_err(|e| not_parquet(file, e.to_string()))
}

/// The class names and row count of the split in `files`, from their footers alone: what a
/// source says of itself before it is opened.
pub fn peek(
    files: &[PathBuf],
    columns: &ParquetColumns,
) -> Result<(Vec<String>, usize), DataError> {
    let mut rows = 0;
    let mut classes = None;
    for file in files {
        let reader = catch_unwind(AssertUnwindSafe(|| open(file)))
            .unwrap_or_else(|panic| Err(not_parquet(file, panic_text(panic))))?;
        if classes.is_none() {
            classes = Some(file_schema(file, &reader, columns)?.classes);
        }
        rows += reader.metadata().file_metadata().num_rows().max(0) as usize;
    }
    Ok((classes.unwrap_or_default(), rows))
}

fn not_parquet(file: &Path, reason: String) -> DataError {
    DataError::Corrupt {
        path: file.to_path_buf(),
        reason: format!(
            "not a whole parquet file ({reason}); it may be truncated or damaged: delete it (from the Hugging Face cache, its snapshot link and blob) and download it again"
        ),
    }
}

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the parquet reader failed".into())
}

/// The image column, the label column and its class names of `file`: named by `columns`, or
/// found from the `huggingface` metadata's features (`Image`, `ClassLabel`).
fn file_schema(
    file: &Path,
    reader: &SerializedFileReader<File>,
    columns: &ParquetColumns,
) -> Result<Schema, DataError> {
    let metadata = reader.metadata().file_metadata();
    let fields = metadata.schema().get_fields();
    let names: Vec<String> = fields.iter().map(|f| f.name().to_string()).collect();
    let features = metadata
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|kv| kv.key == "huggingface"))
        .and_then(|kv| serde_json::from_str::<Value>(kv.value.as_deref()?).ok())
        .and_then(|v| v.get("info")?.get("features").cloned());
    let feature_type = |name: &str| -> Option<String> {
        Some(
            features
                .as_ref()?
                .get(name)?
                .get("_type")?
                .as_str()?
                .to_string(),
        )
    };
    let field = |name: &str| fields.iter().find(|f| f.name() == name);
    let no_image = || DataError::NoImageColumn {
        file: file.to_path_buf(),
        columns: names.clone(),
    };
    let several = |what: &str, key: &str, found: &[&String]| {
        DataError::Invalid(format!(
            "{} has several {what} columns ({}); name the one to use with data.source.{key} = \"{}\"",
            file.display(),
            found
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            found[0]
        ))
    };

    let image = match &columns.image {
        Some(name) => {
            let Some(found) = field(name) else {
                return Err(no_image());
            };
            if !holds_images(found) {
                return Err(DataError::Invalid(format!(
                    "{}: column `{name}` (data.source.image_column) holds no images: datasets writes an Image column as struct {{bytes, path}} (its columns: {})",
                    file.display(),
                    names.join(", ")
                )));
            }
            name.clone()
        }
        None => {
            let typed: Vec<&String> = names
                .iter()
                .filter(|n| feature_type(n).as_deref() == Some("Image"))
                .collect();
            // Without features (a file pyarrow wrote), the columns shaped as datasets' images.
            let candidates: Vec<&String> = if typed.is_empty() {
                names
                    .iter()
                    .filter(|n| field(n).is_some_and(|f| f.is_group() && holds_images(f)))
                    .collect()
            } else {
                typed
            };
            match candidates.as_slice() {
                [] => return Err(no_image()),
                [one] if field(one).is_some_and(holds_images) => one.to_string(),
                [_] => return Err(no_image()),
                several_found => return Err(several("image", "image_column", several_found)),
            }
        }
    };

    let (label, taken) = match &columns.label {
        Some(name) => {
            if field(name).is_none() {
                return Err(DataError::Invalid(format!(
                    "{} has no column `{name}` (data.source.label_column; its columns: {})",
                    file.display(),
                    names.join(", ")
                )));
            }
            (name.clone(), "data.source.label_column names it")
        }
        None => {
            let typed: Vec<&String> = names
                .iter()
                .filter(|n| feature_type(n).as_deref() == Some("ClassLabel"))
                .collect();
            match typed.as_slice() {
                [one] => (one.to_string(), "its feature is a ClassLabel"),
                [] => match ["label", "labels"].iter().find(|n| field(n).is_some()) {
                    Some(name) => (name.to_string(), "it is named so"),
                    None => {
                        return Err(DataError::Invalid(format!(
                            "{} has no ClassLabel column and none named label (its columns: {}); name the column of class labels with data.source.label_column = \"...\"",
                            file.display(),
                            names.join(", ")
                        )));
                    }
                },
                several_found => return Err(several("ClassLabel", "label_column", several_found)),
            }
        }
    };
    let names_of = features
        .as_ref()
        .and_then(|f| f.get(&label))
        .filter(|f| f.get("_type").and_then(Value::as_str) == Some("ClassLabel"))
        .and_then(|f| f.get("names")?.as_array().cloned());
    let integer_column = field(&label).is_some_and(|f| {
        f.is_primitive()
            && matches!(
                f.get_physical_type(),
                PhysicalType::INT32 | PhysicalType::INT64
            )
    });
    let classes: Option<Vec<String>> = names_of
        .filter(|_| integer_column)
        .and_then(|names| names.iter().map(|n| n.as_str().map(String::from)).collect());
    let Some(classes) = classes.filter(|c| !c.is_empty()) else {
        let physical = field(&label)
            .filter(|f| f.is_primitive())
            .map(|f| format!("{:?}", f.get_physical_type()).to_lowercase())
            .unwrap_or_else(|| "a group".into());
        let found = match feature_type(&label) {
            Some(kind) if kind == "Value" => {
                let dtype = features
                    .as_ref()
                    .and_then(|f| f.get(&label)?.get("dtype")?.as_str().map(String::from))
                    .unwrap_or(physical);
                format!("a plain {dtype} (feature Value)")
            }
            Some(kind) if kind == "ClassLabel" => {
                "a ClassLabel without names, or not of integers".into()
            }
            Some(kind) => {
                let article = if kind.starts_with(['A', 'E', 'I', 'O', 'U']) {
                    "an"
                } else {
                    "a"
                };
                format!("{article} {kind} feature")
            }
            None => format!("a {physical} column without datasets' features"),
        };
        return Err(DataError::NotClassLabel {
            file: file.to_path_buf(),
            column: label,
            taken,
            found,
            columns: names,
        });
    };
    Ok(Schema {
        image,
        label,
        classes,
    })
}

/// Whether a column holds images as `datasets` writes them: `struct<bytes: binary, ...>`, or
/// binary.
fn holds_images(field: &Arc<Type>) -> bool {
    let binary = |t: &Type| t.is_primitive() && t.get_physical_type() == PhysicalType::BYTE_ARRAY;
    if field.is_group() {
        field
            .get_fields()
            .iter()
            .any(|f| f.name() == "bytes" && binary(f))
    } else {
        binary(field)
    }
}

/// An image cell's encoded bytes: the `bytes` of datasets' struct, or a binary cell.
fn image_bytes(field: &Field) -> Option<&[u8]> {
    match field {
        Field::Bytes(bytes) => Some(bytes.data()),
        Field::Group(row) => row.get_column_iter().find_map(|(name, field)| match field {
            Field::Bytes(bytes) if name == "bytes" => Some(bytes.data()),
            _ => None,
        }),
        _ => None,
    }
}

fn integer(field: &Field) -> Option<i64> {
    Some(match *field {
        Field::Byte(v) => v.into(),
        Field::Short(v) => v.into(),
        Field::Int(v) => v.into(),
        Field::Long(v) => v,
        Field::UByte(v) => v.into(),
        Field::UShort(v) => v.into(),
        Field::UInt(v) => v.into(),
        Field::ULong(v) => i64::try_from(v).ok()?,
        _ => return None,
    })
}
