//! The classic PyTorch program, "ResNet-18 on CIFAR-10 with Adam", with kiln's library API:
//! torchvision's resnet18 for 10 classes, ToTensor only, Adam at 1e-3, batch 32, 10 epochs, the
//! running loss every 100 mini-batches. The CIFAR-10 archive is downloaded into ./data if it is
//! not there (torchvision's folder is used as it is).
//!
//!   cargo run --release --example cifar10_resnet18

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kiln::{BackendChoice, Console, DeviceSelection, Start, TrainRequest};
use kiln_config::TrainConfig;
use kiln_config::config::OptimizerConfig;
use kiln_data::{Source, Transform};

fn main() -> anyhow::Result<()> {
    let cifar10 = Source::Cifar10 {
        root: "data".into(),
        download: true,
    };
    let mut config = TrainConfig::new(cifar10, OptimizerConfig::adam(1e-3), 10, 32);
    config.name = "cifar10-resnet18".into();
    config.model.name = "resnet18".into();
    config.data.train_transforms = vec![Transform::ToTensor];
    config.data.val_transforms = vec![Transform::ToTensor];
    config.logging.print_every = 100;

    // The binary's panic hook: a device out of memory becomes the run's error, with a batch
    // that fits.
    kiln::panics::install_hook();
    let request = TrainRequest {
        start: Start::Built { config: &config },
        overrides: &[],
        backend: Some(BackendChoice::Auto),
        devices: Some(DeviceSelection::default()),
        cluster: None,
        stop: Arc::new(AtomicBool::new(false)),
    };
    kiln::train(request, &mut Console::new())?;
    Ok(())
}
