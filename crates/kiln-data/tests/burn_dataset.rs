//! burn-dataset's `Dataset` both ways: kiln's sources as burn data sets (composed with burn's
//! own transforms), and burn data sets through kiln's loader and config, by registration.

use std::sync::Arc;

use image::{Rgb, RgbImage};
use kiln_data::burn_dataset::transform::{PartialDataset, ShuffledDataset};
use kiln_data::burn_dataset::{Dataset as BurnDataset, InMemDataset};
use kiln_data::{
    Dataset, FromBurn, ImageData, ImageLimits, LabelledImage, Loader, LoaderConfig, Pipeline,
    SharedDataset, Source, Splits, Transform,
};

fn source(text: &str) -> Source {
    #[derive(serde::Deserialize)]
    struct Config {
        source: Source,
    }
    toml::from_str::<Config>(&format!("source = {text}"))
        .unwrap()
        .source
}

/// Items as a burn user builds them: `count` 5x3 images of three classes, every other one as
/// PNG bytes.
fn items(count: usize) -> Vec<LabelledImage> {
    (0..count)
        .map(|i| {
            let pixels = RgbImage::from_fn(5, 3, |x, y| {
                Rgb([(i * 40) as u8, x as u8 * 50, y as u8 * 80])
            });
            let image = if i % 2 == 0 {
                let mut png = Vec::new();
                pixels
                    .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                    .unwrap();
                ImageData::Encoded(png.into())
            } else {
                ImageData::Pixels(pixels)
            };
            LabelledImage {
                image,
                label: i % 3,
            }
        })
        .collect()
}

fn classes() -> Vec<String> {
    ["a", "b", "c"].map(String::from).to_vec()
}

#[test]
fn a_registered_burn_data_set_opens_as_a_config_source() {
    let train: SharedDataset =
        Arc::new(FromBurn::new(InMemDataset::new(items(10)), classes()).unwrap());
    let val: SharedDataset =
        Arc::new(FromBurn::new(InMemDataset::new(items(4)), classes()).unwrap());
    kiln_data::register(
        "tests/registered",
        Splits {
            train,
            val: Some(val),
        },
    );
    let registered = source(r#"{ kind = "registered", name = "tests/registered" }"#);
    assert_eq!(
        (registered.class_count(), registered.train_size()),
        (Some(3), Some(10))
    );
    let splits = registered.open(0, ImageLimits::default()).unwrap();
    assert_eq!((splits.train.len(), splits.val.unwrap().len()), (10, 4));
    assert_eq!(splits.train.classes(), classes());
    for i in 0..10 {
        let image = splits.train.image(i).unwrap();
        assert_eq!(image.get_pixel(4, 2).0, [(i * 40) as u8, 200, 160]);
        assert_eq!(splits.train.label(i), i % 3);
    }
    let batches: Vec<_> = Loader::new(
        splits.train,
        Pipeline::new(&[Transform::ToTensor]).unwrap(),
        LoaderConfig::new(4, 1),
    )
    .unwrap()
    .epoch(0)
    .map(Result::unwrap)
    .collect();
    assert_eq!(batches.iter().map(|b| b.labels.len()).sum::<usize>(), 10);
    assert_eq!(batches[0].shape, [4, 3, 3, 5]);

    let missing = source(r#"{ kind = "registered", name = "tests/nowhere" }"#);
    assert_eq!(missing.class_count(), None);
    let err = missing
        .open(0, ImageLimits::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("`tests/nowhere`") && err.contains("kiln_data::register(\"tests/nowhere\""),
        "{err}"
    );
}

#[test]
fn kiln_sources_compose_with_burns_transforms_and_come_back() {
    let digits = Source::Digits {}.open(0, ImageLimits::default()).unwrap();
    let train = digits.train;
    // burn's own selection and shuffle, over kiln's data set.
    let first = PartialDataset::new(train.clone(), 0, 100);
    assert_eq!(BurnDataset::len(&first), 100);
    let shuffled = ShuffledDataset::new(first, 7u64);
    let back = FromBurn::new(shuffled, train.classes().to_vec()).unwrap();
    assert_eq!(Dataset::len(&back), 100);
    let mut seen: Vec<usize> = Vec::new();
    for i in 0..100 {
        let pixels = back.image(i).unwrap();
        let found = (0..100)
            .find(|&j| train.image(j).unwrap() == pixels && train.label(j) == back.label(i))
            .expect("every item is one of the first 100 digits");
        seen.push(found);
    }
    seen.sort();
    seen.dedup();
    assert!(
        seen.len() > 90,
        "a permutation (digits repeat rarely): {}",
        seen.len()
    );
    // Past the end, burn's `get` is `None`.
    assert!(BurnDataset::get(&train, train.len()).is_none());
}
