//! Hugging Face data sets, from files the real `datasets` and `pyarrow` wrote
//! (`tests/fixtures/make_hf_fixtures.py`) in a Hugging Face cache folder, and through a loopback
//! Hub (kiln-test-hub) for the download path. The cache and the Hub are given explicitly (`HubSettings`), so no
//! test reads or sets the environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn_dataset::InMemDataset;
use kiln_data::huggingface::{self, ParquetColumns, Request, Val};
use kiln_data::{
    BatchShare, DataError, Dataset, FromBurn, HostBatch, HubSettings, ImageData, ImageLimits,
    LabelledImage, Loader, LoaderConfig, OnBadImage, Pipeline, SharedDataset, Source, Transform,
};
use kiln_test_hub::{COMMIT, Fault, TestHub};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/huggingface/hub"
);
const CLASSES: [&str; 3] = ["red", "green", "blue"];

/// The fixture script's pixel: image `i` (of class `i % 3`) at (x, y), channel c.
fn pixel(i: u32, x: u32, y: u32, c: u32) -> u8 {
    ((i * 37 + x * 11 + y * 5 + c * 71 + (i % 3) * 90) % 256) as u8
}

/// Whether `set` holds images `first..` of the script, 6x4, labelled `i % 3`.
fn assert_images(set: &dyn Dataset, first: u32) {
    for index in 0..set.len() {
        let i = first + index as u32;
        let image = set.image(index).unwrap();
        assert_eq!(image.dimensions(), (6, 4), "{}", set.describe(index));
        for (x, y, p) in image.enumerate_pixels() {
            let expected = [0, 1, 2].map(|c| pixel(i, x, y, c));
            assert_eq!(p.0, expected, "{} at ({x}, {y})", set.describe(index));
        }
        assert_eq!(set.label(index), (i % 3) as usize);
    }
}

/// A copy of the fixture cache in a temporary folder, with kiln/tiny's snapshot files turned
/// into links into `blobs/`, as `huggingface_hub` leaves them.
fn cache() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let hub = dir.path().join("hub");
    copy_dir(Path::new(FIXTURES), &hub);
    let tiny = hub.join("datasets--kiln--tiny");
    std::fs::create_dir_all(tiny.join("blobs")).unwrap();
    for entry in walkdir::WalkDir::new(tiny.join("snapshots")) {
        let entry = entry.unwrap();
        if entry.file_type().is_file() {
            let blob = tiny
                .join("blobs")
                .join(kiln_download::sha256_file(entry.path()).unwrap());
            std::fs::rename(entry.path(), &blob).unwrap();
            std::os::unix::fs::symlink(&blob, entry.path()).unwrap();
        }
    }
    (dir, hub)
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.unwrap();
        let target = to.join(entry.path().strip_prefix(from).unwrap());
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn source(text: &str) -> Source {
    #[derive(serde::Deserialize)]
    struct Config {
        source: Source,
    }
    toml::from_str::<Config>(&format!("source = {text}"))
        .unwrap()
        .source
}

fn open(text: &str, hub: &Path) -> Result<kiln_data::Splits, DataError> {
    source(text).open_with(0, ImageLimits::default(), &HubSettings::offline(hub))
}

fn error(text: &str, hub: &Path) -> String {
    open(text, hub).err().expect("an error").to_string()
}

#[test]
fn a_data_set_in_the_cache_opens_offline_with_its_class_names() {
    let (_dir, hub) = cache();
    let splits = open(r#"{ kind = "huggingface", repo = "kiln/tiny" }"#, &hub).unwrap();
    // No validation split: the test split validates.
    let val = splits.val.unwrap();
    assert_eq!((splits.train.len(), val.len()), (12, 6));
    assert_eq!(splits.train.classes(), CLASSES);
    assert_eq!(val.classes(), CLASSES);
    // Snappy, in three row groups; the snapshot's files are links into blobs/.
    assert_images(splits.train.as_ref(), 0);
    assert_images(val.as_ref(), 100);
    let described = splits.train.describe(11);
    assert!(
        described.ends_with("plain_text/train-00000-of-00001.parquet (row 11)"),
        "{described}"
    );
    // What a config's checks read before opening: from the footers only.
    let request = Request {
        repo: "kiln/tiny",
        revision: "main",
        config: None,
        train: "train",
        val: Val::Default,
        columns: ParquetColumns::default(),
    };
    let peeked = huggingface::peek(&request, &hub).unwrap();
    assert_eq!(peeked, (CLASSES.map(String::from).to_vec(), 12));
    assert_eq!(huggingface::peek(&request, &hub.join("elsewhere")), None);
}

#[test]
fn every_layout_and_compression_reads_the_same_images() {
    let (_dir, hub) = cache();
    // The Hub's parquet conversion: train as datasets' to_parquet writes it (image bytes
    // uncompressed and PLAIN, labels snappy, content-defined pages), test uncompressed.
    let converted = open(
        r#"{ kind = "huggingface", repo = "kiln/tiny", revision = "refs/convert/parquet", config = "plain_text" }"#,
        &hub,
    )
    .unwrap();
    assert_images(converted.train.as_ref(), 0);
    assert_images(converted.val.unwrap().as_ref(), 100);
    // push_to_hub's default config, zstd, the train split in two files: validation is
    // preferred over test, and the test file's name carries datasets 2.x's fingerprint.
    let layouts = open(r#"{ kind = "huggingface", repo = "kiln/layouts" }"#, &hub).unwrap();
    assert_eq!(layouts.train.len(), 12);
    assert_images(layouts.train.as_ref(), 0);
    assert!(
        layouts
            .train
            .describe(6)
            .contains("train-00001-of-00002.parquet (row 0)")
    );
    assert_images(layouts.val.unwrap().as_ref(), 200);
    let test = open(
        r#"{ kind = "huggingface", repo = "kiln/layouts", val = "test", config = "default" }"#,
        &hub,
    )
    .unwrap();
    assert_images(test.val.unwrap().as_ref(), 100);
    // Columns named as found.
    let named = open(
        r#"{ kind = "huggingface", repo = "kiln/tiny", image_column = "img", label_column = "label" }"#,
        &hub,
    )
    .unwrap();
    assert_images(named.train.as_ref(), 0);
}

#[test]
fn splits_configs_and_fractions_are_chosen_or_named_in_the_error() {
    let (_dir, hub) = cache();
    let err = error(
        r#"{ kind = "huggingface", repo = "kiln/tiny", train = "nope" }"#,
        &hub,
    );
    assert!(
        err.contains("kiln/tiny has no split `nope` (its splits: test, train)")
            && err.contains("data.source.train"),
        "{err}"
    );
    let err = error(
        r#"{ kind = "huggingface", repo = "kiln/tiny", val = "validation" }"#,
        &hub,
    );
    assert!(
        err.contains("`validation`") && err.contains("data.source.val"),
        "{err}"
    );
    let err = error(r#"{ kind = "huggingface", repo = "kiln/multi" }"#, &hub);
    assert!(
        err.contains("several configs (a, b)") && err.contains("data.source.config"),
        "{err}"
    );
    let b = open(
        r#"{ kind = "huggingface", repo = "kiln/multi", config = "b" }"#,
        &hub,
    )
    .unwrap();
    assert_eq!(b.train.classes(), ["x", "y", "z"]);
    assert!(b.val.is_none());
    // A seeded fraction of train, as the image folders hold one out.
    let held = open(
        r#"{ kind = "huggingface", repo = "kiln/tiny", val_fraction = 0.25 }"#,
        &hub,
    )
    .unwrap();
    assert_eq!((held.train.len(), held.val.unwrap().len()), (9, 3));
    let err = error(
        r#"{ kind = "huggingface", repo = "kiln/tiny", val = "test", val_fraction = 0.25 }"#,
        &hub,
    );
    assert!(err.contains("not both"), "{err}");
    let err = error(r#"{ kind = "huggingface", repo = "kiln/../x" }"#, &hub);
    assert!(err.contains("<owner>/<name>"), "{err}");
}

#[test]
fn bad_files_and_columns_are_one_line_naming_what_to_do() {
    let (_dir, hub) = cache();
    let mut seen = Vec::new();
    let mut error = |text: &str| {
        let message = error(text, &hub);
        seen.push(message.clone());
        message
    };
    let err = error(r#"{ kind = "huggingface", repo = "kiln/absent" }"#);
    assert!(
        err.contains("hf:kiln/absent")
            && err.contains(&*hub.display().to_string())
            && err.contains("HF_HUB_OFFLINE")
            && err.contains("huggingface-cli download --repo-type dataset kiln/absent"),
        "{err}"
    );
    let err = error(r#"{ kind = "huggingface", repo = "kiln/noimage" }"#);
    assert!(
        err.contains("has no image column (its columns: text, label)")
            && err.contains("image_column"),
        "{err}"
    );
    let err = error(r#"{ kind = "huggingface", repo = "kiln/intlabel" }"#);
    assert!(
        err.contains("column `label` was taken as the labels (it is named so)")
            && err.contains("a plain int64 (feature Value)")
            && err.contains("label_column = \"...\""),
        "{err}"
    );
    let err = error(r#"{ kind = "huggingface", repo = "kiln/tiny", label_column = "img" }"#);
    assert!(
        err.contains("column `img` was taken as the labels (data.source.label_column names it)"),
        "{err}"
    );
    let err = error(r#"{ kind = "huggingface", repo = "kiln/tiny", label_column = "fine_label" }"#);
    assert!(
        err.contains("no column `fine_label`") && err.contains("img, label"),
        "{err}"
    );
    let err = error(r#"{ kind = "huggingface", repo = "kiln/broken" }"#);
    assert!(
        err.contains("data/train-00000-of-00001.parquet")
            && err.contains("not a whole parquet file")
            && err.contains("download it again"),
        "{err}"
    );
    for message in seen {
        assert_eq!(message.lines().count(), 1, "{message}");
    }
}

#[test]
fn kiln_shard_keeps_the_images_bytes_as_the_files_hold_them() {
    let (_dir, hub) = cache();
    let train = open(r#"{ kind = "huggingface", repo = "kiln/tiny" }"#, &hub)
        .unwrap()
        .train;
    let (png, extension) = train.encoded(4).unwrap();
    assert_eq!((&png[1..4], extension), (&b"PNG"[..], "png"));
    let out = tempfile::tempdir().unwrap();
    let manifest =
        kiln_data::shards::write(&[("train", train.as_ref())], out.path(), 1 << 20).unwrap();
    assert_eq!(manifest.classes, CLASSES);
    let pattern = out.path().join(&manifest.splits["train"].pattern);
    let tar = std::fs::read(&pattern).unwrap();
    assert!(
        tar.windows(png.len()).any(|w| w == png),
        "the PNG as it was"
    );
    let shards =
        kiln_data::shards::Shards::open(pattern.to_str().unwrap(), ImageLimits::default()).unwrap();
    assert_images(&shards, 0);
}

/// A batch of 4 at 6x4, tensors only.
fn loader(set: SharedDataset, config: LoaderConfig) -> Loader {
    Loader::new(set, Pipeline::new(&[Transform::ToTensor]).unwrap(), config).unwrap()
}

#[test]
fn an_image_that_does_not_decode_is_skipped_and_counted() {
    let (_dir, hub) = cache();
    let splits = open(r#"{ kind = "huggingface", repo = "kiln/badimage" }"#, &hub).unwrap();
    let mut config = LoaderConfig::new(4, 1);
    config.shuffle = false;
    let batches: Vec<HostBatch> = loader(splits.train.clone(), config.clone())
        .epoch(0)
        .map(Result::unwrap)
        .collect();
    let skipped: Vec<&DataError> = batches.iter().flat_map(|b| &b.skipped).collect();
    assert_eq!(skipped.len(), 1);
    let message = skipped[0].to_string();
    assert!(
        message.contains("train-00000-of-00001.parquet (row 2)"),
        "{message}"
    );
    let kept: usize = batches.iter().map(|b| b.labels.len()).sum();
    assert_eq!(kept, 5);
    // Stopping at it instead names it too.
    config.on_bad_image = OnBadImage::Error;
    let err = loader(splits.train.clone(), config)
        .epoch(0)
        .find_map(Result::err)
        .unwrap();
    assert!(err.to_string().contains("(row 2)"), "{err}");
    // As a burn data set, the image that does not decode is `None`.
    let burn: &dyn burn_dataset::Dataset<LabelledImage> = &splits.train;
    assert!(burn.get(1).is_some() && burn.get(2).is_none() && burn.get(6).is_none());
}

#[test]
fn shuffles_shares_and_resumption_come_from_the_loader() {
    let (_dir, hub) = cache();
    let train = open(r#"{ kind = "huggingface", repo = "kiln/tiny" }"#, &hub)
        .unwrap()
        .train;
    let config = LoaderConfig::new(4, 9);
    let whole = loader(train.clone(), config.clone());
    let epoch: Vec<HostBatch> = whole.epoch(3).map(Result::unwrap).collect();
    let indices: Vec<usize> = epoch.iter().flat_map(|b| b.indices.clone()).collect();
    let mut sorted = indices.clone();
    sorted.sort();
    assert_eq!(sorted, (0..12).collect::<Vec<_>>());
    assert_ne!(indices, sorted, "shuffled");
    // Resumed at batch 1: the same batches as the epoch's from there.
    let resumed: Vec<HostBatch> = whole.epoch_from(3, 1).map(Result::unwrap).collect();
    assert_eq!(resumed.len(), 2);
    for (a, b) in resumed.iter().zip(&epoch[1..]) {
        assert_eq!((&a.indices, &a.images), (&b.indices, &b.images));
    }
    // Two machines' shares make up each batch.
    for (b, batch) in epoch.iter().enumerate() {
        let mut joined = Vec::new();
        for index in 0..2 {
            let share = BatchShare { index, count: 2 };
            let part = loader(
                train.clone(),
                LoaderConfig {
                    share,
                    ..config.clone()
                },
            );
            joined.extend(part.epoch(3).nth(b).unwrap().unwrap().indices);
        }
        assert_eq!(joined, batch.indices);
    }
}

#[test]
fn a_burn_in_memory_data_set_trains_through_kilns_loader() {
    let (_dir, hub) = cache();
    // Items as a burn user builds them: encoded PNGs (here, the fixture's, through the burn
    // view of kiln's source) and decoded pixels.
    let tiny = open(r#"{ kind = "huggingface", repo = "kiln/tiny" }"#, &hub)
        .unwrap()
        .train;
    let mut items = Vec::new();
    for i in 0..Dataset::len(tiny.as_ref()) {
        let item = burn_dataset::Dataset::get(&tiny, i).unwrap();
        let ImageData::Pixels(pixels) = &item.image else {
            panic!("kiln's items are decoded");
        };
        let image = if i % 2 == 0 {
            let mut png = Vec::new();
            pixels
                .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                .unwrap();
            ImageData::Encoded(png.into())
        } else {
            item.image.clone()
        };
        items.push(LabelledImage {
            image,
            label: item.label,
        });
    }
    let classes = CLASSES.map(String::from).to_vec();
    let set: SharedDataset = Arc::new(FromBurn::new(InMemDataset::new(items), classes).unwrap());
    assert_images(set.as_ref(), 0);
    let mut config = LoaderConfig::new(5, 2);
    config.workers = 2;
    let batches: Vec<HostBatch> = loader(set.clone(), config.clone())
        .epoch(0)
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        batches.iter().map(|b| b.shape).collect::<Vec<_>>(),
        [[5, 3, 4, 6], [5, 3, 4, 6], [2, 3, 4, 6]]
    );
    // The same batches as kiln's own source gives: the adapter adds nothing and loses nothing.
    let direct: Vec<HostBatch> = loader(tiny, config).epoch(0).map(Result::unwrap).collect();
    for (a, b) in batches.iter().zip(&direct) {
        assert_eq!(
            (&a.images, &a.labels, &a.indices),
            (&b.images, &b.labels, &b.indices)
        );
    }
}

// The download path, through a loopback Hub.

/// kiln/tiny's files at main, as the fixture cache holds them, plus a README the layout ignores.
fn tiny_files() -> BTreeMap<String, Vec<u8>> {
    let snapshot = Path::new(FIXTURES)
        .join("datasets--kiln--tiny/snapshots/1111111111111111111111111111111111111111");
    let mut files = BTreeMap::new();
    for file in [
        "plain_text/train-00000-of-00001.parquet",
        "plain_text/test-00000-of-00001.parquet",
    ] {
        files.insert(
            file.to_string(),
            std::fs::read(snapshot.join(file)).unwrap(),
        );
    }
    files.insert("README.md".into(), b"---\nlicense: mit\n---\n".to_vec());
    files
}

/// Files in `folder` and below (links counted as files).
fn files_under(folder: &Path) -> Vec<String> {
    walkdir::WalkDir::new(folder)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| !e.file_type().is_dir())
        .map(|e| e.path().strip_prefix(folder).unwrap().display().to_string())
        .collect()
}

#[test]
fn a_data_set_downloads_into_the_cache_once_then_opens_offline() {
    let server = TestHub::start();
    for (name, fault) in [
        ("kiln/tiny", Fault::None),
        ("kiln/damaged", Fault::Corrupted),
        ("kiln/cut", Fault::Truncated),
    ] {
        for (file, bytes) in tiny_files() {
            server.add_dataset(name, &file, bytes, fault);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    let online = HubSettings {
        cache: cache.clone(),
        endpoint: server.endpoint.clone(),
        offline: None,
        token: None,
        progress: false,
    };
    let tiny = source(r#"{ kind = "huggingface", repo = "kiln/tiny" }"#);
    let splits = tiny.open_with(0, ImageLimits::default(), &online).unwrap();
    assert_images(splits.train.as_ref(), 0);
    assert_images(splits.val.unwrap().as_ref(), 100);
    // Only the splits' files came, as huggingface_hub lays them out: blobs named by their
    // SHA-256, the snapshot's links, the ref.
    let folder = cache.join("datasets--kiln--tiny");
    let mut landed = files_under(&folder);
    landed.sort();
    let blobs: Vec<&String> = landed.iter().filter(|f| f.starts_with("blobs/")).collect();
    assert_eq!(blobs.len(), 2, "{landed:?}");
    assert!(
        landed.contains(&format!(
            "snapshots/{COMMIT}/plain_text/train-00000-of-00001.parquet"
        )) && landed.contains(&format!(
            "snapshots/{COMMIT}/plain_text/test-00000-of-00001.parquet"
        )) && landed.contains(&"refs/main".to_string())
            && !landed
                .iter()
                .any(|f| f.contains("README") || f.ends_with(".part") || f.ends_with(".lock")),
        "{landed:?}"
    );
    assert_eq!(
        std::fs::read_to_string(folder.join("refs/main")).unwrap(),
        COMMIT
    );
    let asked = server.requests().len();
    // Found in the cache: offline, and online without asking the Hub again.
    let offline = HubSettings::offline(&cache);
    let again = tiny.open_with(0, ImageLimits::default(), &offline).unwrap();
    assert_images(again.train.as_ref(), 0);
    tiny.open_with(0, ImageLimits::default(), &online).unwrap();
    assert_eq!(server.requests().len(), asked);

    // An unknown repository: the Hub's 401 without a token.
    let err = source(r#"{ kind = "huggingface", repo = "kiln/absent" }"#)
        .open_with(0, ImageLimits::default(), &online)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("hf:kiln/absent")
            && err.contains(&server.endpoint)
            && err.contains("HTTP 401"),
        "{err}"
    );
    // Damaged and cut downloads fail and leave none of their bytes in the cache.
    for (name, expected) in [("kiln/damaged", "SHA-256"), ("kiln/cut", "")] {
        let err = source(&format!(r#"{{ kind = "huggingface", repo = "{name}" }}"#))
            .open_with(0, ImageLimits::default(), &online)
            .err()
            .unwrap_or_else(|| panic!("{name} opened"))
            .to_string();
        assert!(
            err.contains(name) && err.contains(expected),
            "{name}: {err}"
        );
        let folder = cache.join(format!("datasets--{}", name.replace('/', "--")));
        let left: Vec<String> = files_under(&folder)
            .into_iter()
            .filter(|f| f.starts_with("blobs/") || f.starts_with("snapshots/"))
            .collect();
        assert!(left.is_empty(), "{name}: {left:?}");
        // And offline it is then not in the cache.
        let err = source(&format!(r#"{{ kind = "huggingface", repo = "{name}" }}"#))
            .open_with(0, ImageLimits::default(), &offline)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("not in the Hugging Face cache"),
            "{name}: {err}"
        );
    }
}
