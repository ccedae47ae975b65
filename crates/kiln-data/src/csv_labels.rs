//! Kaggle's layout: a CSV of `filename,label` rows beside a folder of images. Classes are the
//! distinct labels sorted as ImageFolder sorts its class folders; images keep the file's order.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::image_folder::{IMAGE_EXTENSIONS, ImageFolder};
use crate::{DataError, ImageLimits};

/// Which columns of the CSV's header hold the image's path (relative to the images' folder)
/// and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Columns<'a> {
    pub path: &'a str,
    pub label: &'a str,
}

/// The images listed in `file` under `root`, labelled by `classes` where given (validation,
/// which must use the training classes), else by the file's own sorted labels.
pub fn open(
    file: &Path,
    root: &Path,
    columns: &Columns,
    classes: Option<&[String]>,
    limits: ImageLimits,
) -> Result<ImageFolder, DataError> {
    let rows = read_rows(file, columns)?;
    let classes: Vec<String> = match classes {
        Some(classes) => classes.to_vec(),
        None => rows
            .iter()
            .map(|row| row.label.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
    };
    let mut samples = Vec::with_capacity(rows.len());
    let mut missing = Vec::new();
    for row in rows {
        let Some(label) = classes.iter().position(|c| *c == row.label) else {
            return Err(DataError::Invalid(format!(
                "{} line {}: label `{}` is not one of the training set's classes ({}); a validation list may only use those",
                file.display(),
                row.line,
                row.label,
                classes.join(", ")
            )));
        };
        match find_image(root, &row.path) {
            Some(path) => samples.push((path, label)),
            None => missing.push(row),
        }
    }
    if let Some(first) = missing.first() {
        return Err(DataError::Missing {
            what: format!(
                "{} of the {} images that {} lists, the first `{}` (line {}),",
                missing.len(),
                missing.len() + samples.len(),
                file.display(),
                first.path,
                first.line
            ),
            path: root.to_path_buf(),
            hint: "point data.source.root at the folder the file's paths are relative to, or remove the rows of missing images".into(),
        });
    }
    Ok(ImageFolder::listed(root, samples, classes, limits))
}

/// The distinct labels of `file`, sorted: its class count without looking for the images.
pub fn classes(file: &Path, columns: &Columns) -> Result<Vec<String>, DataError> {
    let labels: BTreeSet<String> = read_rows(file, columns)?
        .into_iter()
        .map(|row| row.label)
        .collect();
    Ok(labels.into_iter().collect())
}

/// The number of rows of `file`.
pub fn count(file: &Path, columns: &Columns) -> Result<usize, DataError> {
    Ok(read_rows(file, columns)?.len())
}

struct Row {
    path: String,
    label: String,
    line: u64,
}

fn read_rows(file: &Path, columns: &Columns) -> Result<Vec<Row>, DataError> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_path(file)
        .map_err(|e| csv_error(file, e))?;
    let header = reader.headers().map_err(|e| csv_error(file, e))?.clone();
    let column = |name: &str, key: &str| {
        header.iter().position(|h| h == name).ok_or_else(|| {
            DataError::Invalid(format!(
                "{} has no column `{name}` (its header: {}); set data.source.{key} to the one that holds {}",
                file.display(),
                header.iter().collect::<Vec<_>>().join(", "),
                if key == "path_column" { "the image paths" } else { "the labels" }
            ))
        })
    };
    let (path_at, label_at) = (
        column(columns.path, "path_column")?,
        column(columns.label, "label_column")?,
    );
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| csv_error(file, e))?;
        let line = record.position().map_or(0, |p| p.line());
        let field = |at: usize| record.get(at).unwrap_or_default().to_string();
        let (path, label) = (field(path_at), field(label_at));
        if path.is_empty() || label.is_empty() {
            return Err(DataError::Invalid(format!(
                "{} line {line}: an empty {}; every row needs an image path and a label",
                file.display(),
                if path.is_empty() {
                    "image path"
                } else {
                    "label"
                }
            )));
        }
        rows.push(Row { path, label, line });
    }
    if rows.is_empty() {
        return Err(DataError::Invalid(format!(
            "{} lists no images (a header and no rows)",
            file.display()
        )));
    }
    Ok(rows)
}

/// `root/name`, or with one of the image extensions added where the file lists bare ids (as
/// many Kaggle competitions do).
fn find_image(root: &Path, name: &str) -> Option<PathBuf> {
    let path = root.join(name);
    if path.is_file() {
        return Some(path);
    }
    if path.extension().is_some() {
        return None;
    }
    IMAGE_EXTENSIONS
        .iter()
        .map(|ext| path.with_extension(ext))
        .find(|p| p.is_file())
}

fn csv_error(file: &Path, error: csv::Error) -> DataError {
    match error.kind() {
        csv::ErrorKind::Io(e) if e.kind() == std::io::ErrorKind::NotFound => DataError::Missing {
            what: "label file".into(),
            path: file.to_path_buf(),
            hint: "point data.source.file at a CSV with a header row, such as filename,label"
                .into(),
        },
        _ => DataError::Corrupt {
            path: file.to_path_buf(),
            reason: format!("not a readable CSV: {error}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dataset;
    use image::RgbImage;

    const COLUMNS: Columns = Columns {
        path: "filename",
        label: "label",
    };

    fn image(path: &Path, shade: u8) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        RgbImage::from_pixel(3, 2, image::Rgb([shade; 3]))
            .save(path)
            .unwrap();
    }

    #[test]
    fn rows_in_order_and_classes_sorted_as_image_folder_sorts_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("images");
        image(&root.join("a.png"), 10);
        image(&root.join("sub/b.jpg"), 20);
        image(&root.join("c.png"), 30);
        let file = dir.path().join("labels.csv");
        std::fs::write(
            &file,
            "label,filename\n dog , a.png\ncat,sub/b.jpg\nZebra,c\n",
        )
        .unwrap();
        let set = open(&file, &root, &COLUMNS, None, ImageLimits::default()).unwrap();
        assert_eq!(set.classes(), ["Zebra", "cat", "dog"]);
        assert_eq!(set.len(), 3);
        assert_eq!((set.label(0), set.label(1), set.label(2)), (2, 1, 0));
        assert_eq!(set.path(2), root.join("c.png"));
        assert_eq!(set.image(1).unwrap().dimensions(), (3, 2));
        assert_eq!(classes(&file, &COLUMNS).unwrap().len(), 3);
    }

    #[test]
    fn a_missing_column_image_or_class_is_one_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        image(&root.join("a.png"), 1);
        let file = root.join("labels.csv");
        std::fs::write(&file, "id,class\na.png,x\n").unwrap();
        let error = open(&file, root, &COLUMNS, None, ImageLimits::default())
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("no column `filename`"), "{error}");
        assert!(error.contains("id, class"), "{error}");
        assert!(error.contains("data.source.path_column"), "{error}");

        std::fs::write(&file, "filename,label\na.png,x\ngone.png,y\nalso.png,y\n").unwrap();
        let error = open(&file, root, &COLUMNS, None, ImageLimits::default())
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("2 of the 3 images"), "{error}");
        assert!(error.contains("`gone.png` (line 3)"), "{error}");

        std::fs::write(&file, "filename,label\na.png,unknown\n").unwrap();
        let train = ["x".to_string()];
        let error = open(&file, root, &COLUMNS, Some(&train), ImageLimits::default())
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("line 2: label `unknown`"), "{error}");

        let error = open(
            &root.join("none.csv"),
            root,
            &COLUMNS,
            None,
            ImageLimits::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(error.starts_with("label file not found"), "{error}");
    }
}
