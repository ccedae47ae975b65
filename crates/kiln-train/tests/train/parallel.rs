//! Data parallel and accumulated steps are the same update as one device on the whole batch.
//!
//! Batch norm is frozen here: with per-device batch statistics (PyTorch DDP's default) the
//! forward pass itself depends on how the batch is split, so no split could match. Frozen, each
//! image's loss depends on that image alone, and any difference is the engine's. With `sync_bn`
//! the statistics are the whole batch's again, and training batch norm matches too.

use crate::common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use common::{B, flat_parameters, take_turn, train_on_cpu};
use kiln_config::TrainConfig;
use kiln_data::HostBatch;
use kiln_models::weights;
use kiln_records::RunDir;
use kiln_train::optim::AnyOptimizer;
use kiln_train::replicas::{Placement, Replicas};
use kiln_train::step::{build_model, loss_function};
use kiln_train::{RunEnd, Silent};

const CONFIG: &str = r#"
name = "dp"
seed = 5
epochs = 2
batch_size = 5
[model]
name = "resnet18"
stem = "cifar"
width = 4
freeze_batch_norm = true
[data]
source = { kind = "synthetic", train_size = 20, image_size = 8, num_classes = 3 }
workers = 0
train_transforms = [{ op = "random_crop", size = 8, padding = 1 }, { op = "random_horizontal_flip" }]
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
weight_decay = 5e-4
"#;

fn config(runs: &Path, overrides: &[&str]) -> TrainConfig {
    common::parse(CONFIG, runs, overrides)
}

/// Trains on `replicas` copies of the CPU device and returns every parameter, flattened.
fn trained(config: &TrainConfig, replicas: usize) -> Vec<f32> {
    let run = RunDir::create(&config.logging.runs_dir, config).unwrap();
    let outcome = train_on_cpu(
        config,
        &run,
        false,
        replicas,
        &mut Silent,
        &AtomicBool::new(false),
    )
    .unwrap();
    let RunEnd::Finished { model, .. } = outcome else {
        panic!("the run did not finish");
    };
    parameters(config, Some(&model))
}

/// The parameters of the config's model: as initialized, or loaded from `weights_file`.
fn parameters(config: &TrainConfig, weights_file: Option<&Path>) -> Vec<f32> {
    let device = Default::default();
    B::seed(&device, config.seed);
    let mut model = build_model::<Flex>(&config.model, 3, &device).unwrap();
    if let Some(path) = weights_file {
        model = weights::load(model, path).unwrap().0;
    }
    flat_parameters(&model)
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts that `actual` matches `expected` to float rounding, and that training moved the
/// weights far more than that (so a match is not a run that did nothing).
fn assert_same_training(config: &TrainConfig, expected: &[f32], actual: &[f32]) {
    let initial = parameters(config, None);
    let moved = max_difference(&initial, expected);
    let difference = max_difference(expected, actual);
    assert!(moved > 1e-2, "training moved the weights by only {moved}");
    assert!(
        difference < 2e-5,
        "the parameters differ by {difference} (training moved them by {moved})"
    );
}

#[test]
fn two_replicas_train_as_one_device_on_the_whole_batch() {
    let _turn = take_turn();
    let runs = tempfile::tempdir().unwrap();
    // Batches of 5 split 3 + 2: the uneven weighting is part of what is checked.
    let config = config(runs.path(), &[]);
    let one = trained(&config, 1);
    let two = trained(&config, 2);
    assert_same_training(&config, &one, &two);
}

/// Clipping (on the all-reduced gradients), balanced class weights and the weights' average
/// (kept by replica 0, exported here) give the same model on two replicas as on one device;
/// so do mixup and CutMix (per image) with RandAugment and random erasing, which the loader does
/// before the batch is shared out.
#[test]
fn two_replicas_with_the_recipe_train_as_one_device() {
    let _turn = take_turn();
    let runs = tempfile::tempdir().unwrap();
    let recipe = [
        "optimizer.clip_grad_norm = 0.3",
        "loss.class_weights = \"balanced\"",
        "ema.decay = 0.5",
        "ema.every = 1",
        "ema.export = true",
    ];
    let config = config(runs.path(), &recipe);
    let one = trained(&config, 1);
    let two = trained(&config, 2);
    assert_same_training(&config, &one, &two);
    // The export is the average, not the weights.
    let plain = trained(&self::config(runs.path(), &recipe[..4]), 1);
    assert!(
        max_difference(&one, &plain) > 1e-3,
        "the export is not the average"
    );

    let mixing = [
        "optimizer.clip_grad_norm = 0.3",
        "ema.every = 1",
        "loss.label_smoothing = 0.1",
        "mixup.mixup_alpha = 0.8",
        "mixup.cutmix_alpha = 1.0",
        "mixup.mode = 'elem'",
        "data.train_transforms = [{ op = 'rand_augment' }, { op = 'to_tensor' }, \
            { op = 'random_erasing', p = 1.0 }]",
    ];
    let mixed = self::config(runs.path(), &mixing);
    let one = trained(&mixed, 1);
    assert_same_training(&mixed, &one, &trained(&mixed, 2));
    let unmixed = trained(&self::config(runs.path(), &mixing[..3]), 1);
    assert!(
        max_difference(&one, &unmixed) > 1e-3,
        "mixing changes the training"
    );
}

#[test]
fn accumulating_k_batches_is_one_k_times_larger_batch() {
    let _turn = take_turn();
    let runs = tempfile::tempdir().unwrap();
    let large = config(runs.path(), &["batch_size = 10"]);
    let accumulated = config(runs.path(), &["batch_size = 5", "accumulate = 2"]);
    let expected = trained(&large, 1);
    let actual = trained(&accumulated, 1);
    assert_same_training(&large, &expected, &actual);
    // And with two replicas on top: 2 batches of 5, each split 3 + 2.
    let both = trained(&accumulated, 2);
    assert_same_training(&large, &expected, &both);
}

#[test]
fn with_sync_bn_two_replicas_train_batch_norm_as_one_device() {
    let _turn = take_turn();
    let runs = tempfile::tempdir().unwrap();
    // Three steps at a small learning rate: with batch norm training on 5 images of 8x8, a step
    // multiplies float rounding differences by about 7 (measured), so longer runs at lr 0.1
    // part ways whatever the engine does. Leaving out the all-reduce in the statistics'
    // backward pass makes the first step alone differ by 0.36.
    let training = [
        "model.freeze_batch_norm = false",
        "epochs = 1",
        "data.source.train_size = 15",
        "optimizer.lr = 0.01",
    ];
    let one = trained(&config(runs.path(), &training), 1);
    let synced = config(
        runs.path(),
        &[&training[..], &["device.sync_bn = true"]].concat(),
    );
    // The running statistics are among the parameters compared, so they are the whole batch's.
    assert_same_training(&synced, &one, &trained(&synced, 2));
    // Per-device statistics (the default) train differently: the comparison can tell.
    let per_device = trained(&config(runs.path(), &training), 2);
    assert!(max_difference(&one, &per_device) > 1e-3);
}

#[test]
fn with_sync_bn_a_batch_that_leaves_a_replica_empty_runs_unsynced() {
    let _turn = take_turn();
    let runs = tempfile::tempdir().unwrap();
    // 11 images: the last batch is one image, all on the first replica. A synced layer would
    // wait for the second replica forever; unsynced, the one image's statistics are the batch's.
    let training = [
        "model.freeze_batch_norm = false",
        "epochs = 1",
        "data.source.train_size = 11",
        "optimizer.lr = 0.01",
    ];
    let one = trained(&config(runs.path(), &training), 1);
    let synced = config(
        runs.path(),
        &[&training[..], &["device.sync_bn = true"]].concat(),
    );
    let two = trained(&synced, 2);
    // Normalizing a single 1x1 value divides rounding differences by sqrt(eps): a looser bound
    // than the 2e-5 of longer batches, far below what a wrong update moves.
    let difference = max_difference(&one, &two);
    assert!(difference < 1e-4, "the parameters differ by {difference}");
}

#[test]
fn a_replica_that_fails_ends_the_step_with_its_error_while_the_other_waits_for_it() {
    let _turn = take_turn();
    let runs = tempfile::tempdir().unwrap();
    let config = config(runs.path(), &[]);
    let device = Default::default();
    let model = build_model::<B>(&config.model, 3, &device).unwrap();
    let placement = Placement {
        devices: vec![device; 2],
        cluster: None,
    };
    let optimizer = config.optimizer.clone();
    let mut replicas = Replicas::new(
        model,
        move || AnyOptimizer::new(&optimizer),
        |device| loss_function::<B>(&config, None, device),
        &placement,
        false,
    )
    .unwrap();
    let batch = || HostBatch {
        images: vec![0.5; 4 * 3 * 8 * 8],
        shape: [4, 3, 8, 8],
        labels: vec![0, 1, 2, 0],
        indices: vec![0, 1, 2, 3],
        targets: None,
        skipped: Vec::new(),
    };
    // One healthy step, then replica 1 fails while replica 0 goes into the gradients'
    // all-reduce, where it would wait for replica 1 for ever.
    replicas.load(vec![batch()]).unwrap();
    replicas.step(0.1, Default::default()).unwrap();
    assert_eq!(replicas.take_stats().unwrap().len(), 1);
    replicas.load(vec![batch()]).unwrap();
    replicas.inject_failure(1, "device lost").unwrap();
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(replicas.step(0.1, Default::default()).map(|_| ()));
    });
    // A guard against a hang, not a speed check: the failure must arrive, not time out.
    let error = result
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the step hung instead of ending with the failed replica's error")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("replica 1") && error.contains("device lost"),
        "{error}"
    );
}
