//! The batches a config's run trains and validates on, in kiln's order, and each step's learning
//! rate: what `tests/fixtures/quickstart/make_quickstart_curve.py` replays in PyTorch, so that
//! PyTorch's run and kiln's differ in nothing but the framework. The batches come from the
//! engine's own `loaders` and the rates from its `Schedule`.
//!
//!   cargo run --release --example replay_batches -- configs/quickstart.toml batches.safetensors
//!
//! Writes `train.<epoch>.images` (`[n, 3, h, w]`, float32, normalized as kiln trains on them),
//! `train.<epoch>.labels` and `train.<epoch>.batch_sizes` (int64) for every epoch, `lrs` (each
//! step's, float64), and `val.images` and `val.labels`.

use std::path::Path;

use anyhow::{Context, bail};
use kiln_config::TrainConfig;
use kiln_data::{BatchShare, HostBatch, Loader};
use kiln_train::loaders;
use kiln_train::schedule::Schedule;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// A tensor's name, bytes (little endian), type and shape.
type Entry = (String, Vec<u8>, Dtype, Vec<usize>);

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, out] = args.as_slice() else {
        bail!("usage: replay_batches CONFIG OUT.safetensors");
    };
    let config = TrainConfig::load(Path::new(config), &[])?;
    if config.accumulate != 1 || config.mixup.is_some() {
        bail!("replays steps of one batch with hard labels: no accumulate, no mixup or CutMix");
    }
    let (train, val) = loaders::open(&config, BatchShare::WHOLE)?;
    let val = val.context("the config has no validation data")?;
    let schedule = Schedule::new(
        &config.schedule,
        config.optimizer.lr,
        config.epochs,
        train.len(),
    );

    let mut entries = Vec::new();
    for epoch in 0..config.epochs {
        entries.extend(batches(&train, epoch as u64, &format!("train.{epoch}"))?);
    }
    let steps = config.epochs * train.len();
    let lrs: Vec<f64> = (0..steps).map(|it| schedule.lr(it)).collect();
    entries.push(entry(
        "lrs",
        bytes(&lrs, |v| v.to_le_bytes()),
        Dtype::F64,
        vec![steps],
    ));
    let val_entries = batches(&val, 0, "val")?;
    entries.extend(
        val_entries
            .into_iter()
            .filter(|e| !e.0.ends_with("batch_sizes")),
    );

    let views = entries
        .iter()
        .map(|(name, data, dtype, shape)| {
            Ok((name.clone(), TensorView::new(*dtype, shape.clone(), data)?))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, Path::new(out))
        .with_context(|| format!("cannot write {out}"))?;
    println!(
        "{steps} steps of {} batches per epoch written to {out}",
        train.len()
    );
    Ok(())
}

/// One epoch of `loader`, in its order: the images, the labels and each batch's size.
fn batches(loader: &Loader, epoch: u64, prefix: &str) -> anyhow::Result<Vec<Entry>> {
    let (mut images, mut labels, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
    let mut shape = [0; 4];
    for batch in loader.epoch(epoch) {
        let HostBatch {
            images: pixels,
            shape: batch_shape,
            labels: batch_labels,
            skipped,
            ..
        } = batch?;
        if !skipped.is_empty() {
            bail!("{prefix}: {} images could not be read", skipped.len());
        }
        images.extend(pixels);
        labels.extend(batch_labels);
        sizes.push(batch_shape[0] as i64);
        shape = [
            shape[0] + batch_shape[0],
            batch_shape[1],
            batch_shape[2],
            batch_shape[3],
        ];
    }
    Ok(vec![
        entry(
            &format!("{prefix}.images"),
            bytes(&images, |v| v.to_le_bytes()),
            Dtype::F32,
            shape.to_vec(),
        ),
        entry(
            &format!("{prefix}.labels"),
            bytes(&labels, |v| v.to_le_bytes()),
            Dtype::I64,
            vec![labels.len()],
        ),
        entry(
            &format!("{prefix}.batch_sizes"),
            bytes(&sizes, |v| v.to_le_bytes()),
            Dtype::I64,
            vec![sizes.len()],
        ),
    ])
}

fn entry(name: &str, data: Vec<u8>, dtype: Dtype, shape: Vec<usize>) -> Entry {
    (name.to_string(), data, dtype, shape)
}

/// Little-endian bytes of numbers.
fn bytes<T, const N: usize>(values: &[T], to_le: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(to_le).collect()
}
