//! torchvision's `ImageFolder`: `root/<class>/**/<image>`, classes sorted by name, images in the
//! order `sorted(os.walk(...))` gives, torchvision's extensions.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use image::RgbImage;

use crate::dataset::Dataset;
use crate::{DataError, ImageLimits, load_rgb};

/// The file extensions torchvision's `ImageFolder` accepts, compared case-insensitively.
pub const IMAGE_EXTENSIONS: [&str; 9] = [
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

pub struct ImageFolder {
    root: PathBuf,
    samples: Vec<(PathBuf, usize)>,
    classes: Vec<String>,
    limits: ImageLimits,
}

impl ImageFolder {
    /// Lists `root`. A missing root, a root without class folders and a class folder without
    /// images are errors naming the path, as in torchvision.
    pub fn open(root: &Path, limits: ImageLimits) -> Result<Self, DataError> {
        if !root.is_dir() {
            return Err(DataError::Missing {
                what: "image folder".into(),
                path: root.to_path_buf(),
                hint: "point the data path at a folder laid out as <root>/<class>/<image>".into(),
            });
        }
        let mut class_dirs: Vec<(String, PathBuf)> = std::fs::read_dir(root)
            .map_err(DataError::io(root))?
            .filter_map(Result::ok)
            .filter(|entry| entry.path().is_dir())
            .map(|entry| {
                (
                    entry.file_name().to_string_lossy().into_owned(),
                    entry.path(),
                )
            })
            .collect();
        class_dirs.sort();
        if class_dirs.is_empty() {
            return Err(DataError::Missing {
                what: "class folders".into(),
                path: root.to_path_buf(),
                hint: format!(
                    "an image folder holds one folder per class: {}/<class>/<image>",
                    root.display()
                ),
            });
        }
        let mut samples = Vec::new();
        for (label, (_, dir)) in class_dirs.iter().enumerate() {
            let images = images_in(dir)?;
            if images.is_empty() {
                return Err(DataError::Missing {
                    what: "images".into(),
                    path: dir.clone(),
                    hint: format!(
                        "every class folder needs at least one image with one of the extensions {}; remove the empty folder or fill it",
                        IMAGE_EXTENSIONS.join(", ")
                    ),
                });
            }
            samples.extend(images.into_iter().map(|path| (path, label)));
        }
        Ok(Self {
            root: root.to_path_buf(),
            samples,
            classes: class_dirs.into_iter().map(|(name, _)| name).collect(),
            limits,
        })
    }

    /// Image files under `root` with labels given elsewhere (a CSV's rows: `csv_labels`), each
    /// `(path, index into classes)`.
    pub(crate) fn listed(
        root: &Path,
        samples: Vec<(PathBuf, usize)>,
        classes: Vec<String>,
        limits: ImageLimits,
    ) -> Self {
        Self {
            root: root.to_path_buf(),
            samples,
            classes,
            limits,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, index: usize) -> &Path {
        &self.samples[index].0
    }
}

impl ImageFolder {
    /// The image files in the class folders of `root`, counted without listing them in order;
    /// `None` where `root` cannot be read.
    pub fn count(root: &Path) -> Option<usize> {
        let classes = std::fs::read_dir(root).ok()?.filter_map(Result::ok);
        let files = classes
            .filter(|entry| entry.path().is_dir())
            .flat_map(|class| walkdir::WalkDir::new(class.path()).follow_links(true))
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_file() && has_image_extension(entry.path()));
        Some(files.count())
    }
}

/// Every image file below `dir`, following links, ordered as torchvision orders them: by
/// containing folder (as a string), then by file name.
fn images_in(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut found: Vec<(OsString, OsString, PathBuf)> = Vec::new();
    for entry in walkdir::WalkDir::new(dir).follow_links(true) {
        let entry = entry.map_err(|e| DataError::Io {
            path: e.path().unwrap_or(dir).to_path_buf(),
            source: e.into(),
        })?;
        if entry.file_type().is_file() && has_image_extension(entry.path()) {
            let parent = entry.path().parent().unwrap_or(dir).as_os_str().to_owned();
            found.push((parent, entry.file_name().to_owned(), entry.into_path()));
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, _, path)| path).collect())
}

fn has_image_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn image(&self, index: usize) -> Result<RgbImage, DataError> {
        load_rgb(&self.samples[index].0, self.limits)
    }

    fn describe(&self, index: usize) -> String {
        self.samples[index].0.display().to_string()
    }

    fn file(&self, index: usize) -> Option<PathBuf> {
        Some(self.samples[index].0.clone())
    }

    fn label(&self, index: usize) -> usize {
        self.samples[index].1
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch_image(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        RgbImage::new(2, 2).save(path).unwrap();
    }

    #[test]
    fn classes_and_files_come_in_torchvisions_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Expected order, written by hand from torchvision 0.29's ImageFolder on this tree.
        for name in [
            "Zebra/b.png",
            "ant/a.JPG",
            "ant/b.png",
            "ant/sub/a.png",
            "ant/sub-2/a.png",
            "ant/z.png",
        ] {
            touch_image(&root.join(name));
        }
        std::fs::write(root.join("ant/notes.txt"), "not an image").unwrap();
        std::fs::write(root.join("stray.png"), "a file beside the classes").unwrap();

        let folder = ImageFolder::open(root, ImageLimits::default()).unwrap();
        assert_eq!(folder.classes(), ["Zebra", "ant"]);
        let listed: Vec<String> = (0..folder.len())
            .map(|i| {
                let relative = folder.path(i).strip_prefix(root).unwrap();
                format!("{} {}", folder.label(i), relative.display())
            })
            .collect();
        assert_eq!(
            listed,
            [
                "0 Zebra/b.png",
                "1 ant/a.JPG",
                "1 ant/b.png",
                "1 ant/z.png",
                "1 ant/sub/a.png",
                "1 ant/sub-2/a.png",
            ]
        );
        assert_eq!(folder.image(0).unwrap().dimensions(), (2, 2));
    }

    #[test]
    fn missing_roots_empty_roots_and_empty_classes_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let open = |path: &Path| {
            ImageFolder::open(path, ImageLimits::default())
                .err()
                .unwrap()
                .to_string()
        };
        let missing = dir.path().join("nowhere");
        assert!(open(&missing).contains(&*missing.to_string_lossy()));
        assert!(open(dir.path()).contains("class folders"));
        touch_image(&dir.path().join("cat/1.png"));
        std::fs::create_dir(dir.path().join("dog")).unwrap();
        std::fs::write(dir.path().join("dog/readme.txt"), "").unwrap();
        let err = open(dir.path());
        assert!(
            err.contains(&*dir.path().join("dog").to_string_lossy()),
            "{err}"
        );
    }
}
