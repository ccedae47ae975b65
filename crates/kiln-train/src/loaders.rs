//! The loaders a config describes: the training loader (this machine's share of each batch)
//! and the validation loader.

use kiln_data::{BatchShare, DataError, Loader, LoaderConfig, Pipeline};

use crate::replicas::Placement;
use kiln_config::config::TrainConfig;

/// The train and validation loaders the config describes; the train loader loads `share` of
/// each batch.
pub fn open(
    config: &TrainConfig,
    share: BatchShare,
) -> Result<(Loader, Option<Loader>), DataError> {
    let data = &config.data;
    let limits = data.image_limits();
    let batch_size = config.batch_size.fixed().ok_or_else(|| {
        DataError::Invalid("batch_size = \"auto\" is settled by `kiln train`; give a number".into())
    })?;
    let splits = data.source.open(config.seed, limits)?;
    let classes = (config.model.num_classes).unwrap_or(splits.train.classes().len());
    let mixing = config.mixup.as_ref();
    let loader_config = LoaderConfig {
        batch_size,
        shuffle: true,
        drop_last: data.drop_last,
        workers: data.workers,
        prefetch: data.prefetch,
        seed: config.seed,
        on_bad_image: data.on_bad_image,
        share,
        mixing: mixing.map(|m| m.mixing(config.loss.label_smoothing, classes)),
    };
    let train = Loader::new(
        splits.train,
        Pipeline::new(&data.train_transforms)?.with_max_pixels(data.max_resize_pixels),
        loader_config.clone(),
    )?;
    let val_config = LoaderConfig {
        shuffle: false,
        drop_last: false,
        share: BatchShare::WHOLE,
        mixing: None,
        ..loader_config
    };
    let val = splits
        .val
        .map(|val| {
            let pipeline = Pipeline::new(&data.val_transforms)?;
            Loader::new(
                val,
                pipeline.with_max_pixels(data.max_resize_pixels),
                val_config,
            )
        })
        .transpose()?;
    Ok((train, val))
}

/// The part of each batch this machine loads: all of it, or its share on a multi-machine run.
pub fn share<D>(placement: &Placement<D>) -> BatchShare {
    match &placement.cluster {
        Some(cluster) => BatchShare {
            index: cluster.rank,
            count: cluster.nodes,
        },
        None => BatchShare::WHOLE,
    }
}
