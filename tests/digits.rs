//! The shipped digits are a real, learnable data set: a small ResNet trained on them with the
//! loader's batches reaches at least 95% validation accuracy on the CPU (flex) in a few epochs.
//!
//! The loop here is the plainest one that shows it; the training engine has its own tests.

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_data::{Loader, LoaderConfig, Pipeline, Source};
use kiln_models::{ResNet, ResNetConfig, Stem};
use kiln_train::batch::Uploaded;

const EPOCHS: u64 = 6;

#[test]
fn a_small_resnet_learns_the_shipped_digits() {
    let accuracy = train_and_validate::<Autodiff<Flex>>(Default::default());
    assert!(accuracy >= 0.95, "validation accuracy {accuracy}");
}

/// Trains for four epochs and returns the validation accuracy.
fn train_and_validate<B: AutodiffBackend>(device: B::Device) -> f64 {
    B::seed(&device, 0);
    let splits = Source::Digits {}
        .open(0, Default::default())
        .expect("the digits are built in");
    let val_set = splits.val.expect("the digits have a validation part");
    let train = Loader::new(
        splits.train,
        Pipeline::new(&[]).unwrap(),
        LoaderConfig::new(32, 0),
    )
    .unwrap();
    let val_config = LoaderConfig {
        shuffle: false,
        ..LoaderConfig::new(100, 0)
    };
    let val = Loader::new(val_set, Pipeline::new(&[]).unwrap(), val_config).unwrap();

    let mut model = ResNetConfig::new(18)
        .with_num_classes(10)
        .with_stem(Stem::Cifar)
        .with_width(16)
        .init::<B>(&device)
        .unwrap();
    let mut optimizer = AdamConfig::new().with_epsilon(1e-8).init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    // Adam at 2e-3, decaying linearly to zero, so that the last epochs settle.
    let total_steps = EPOCHS as f64 * train.len() as f64;
    let mut step = 0.0;
    for epoch in 0..EPOCHS {
        for batch in Uploaded::<B, _>::new(train.epoch(epoch), device.clone()) {
            let batch = batch.unwrap();
            let loss = loss_fn.forward(model.forward(batch.images), batch.labels);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(2e-3 * (1.0 - step / total_steps), model, grads);
            step += 1.0;
        }
        println!(
            "epoch {epoch}: validation accuracy {:.4}",
            accuracy(&model.valid(), &val, &device)
        );
    }

    let accuracy = accuracy(&model.valid(), &val, &device);
    println!("digits validation accuracy after {EPOCHS} epochs: {accuracy:.4}");
    accuracy
}

/// The share of `loader`'s images that `model` classifies correctly.
fn accuracy<B: Backend>(model: &ResNet<B>, loader: &Loader, device: &B::Device) -> f64 {
    let (mut correct, mut total) = (0usize, 0usize);
    for batch in Uploaded::<B, _>::new(loader.epoch(0), device.clone()) {
        let batch = batch.unwrap();
        let predicted = model.forward(batch.images).argmax(1).flatten::<1>(0, 1);
        let hits: i64 = predicted
            .equal(batch.labels.clone())
            .int()
            .sum()
            .into_scalar()
            .elem();
        correct += hits as usize;
        total += batch.skipped.len() + batch.labels.dims()[0];
    }
    assert_eq!(total, loader.dataset().len());
    correct as f64 / total as f64
}
