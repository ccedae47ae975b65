//! The other PyTorch program, "ResNet-50 on an ImageFolder with Resize/CenterCrop/Normalize, SGD
//! with momentum, all GPUs", with kiln's library API: torchvision's pretrained ResNet-50
//! fine-tuned on `<root>/train/<class>/<image>`, validated on `<root>/val`.
//!
//!   cargo run --release --features cuda --example imagefolder_resnet50 -- path/to/root

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use kiln::{BackendChoice, Console, DeviceSelection, Start, TrainRequest};
use kiln_config::TrainConfig;
use kiln_config::config::OptimizerConfig;
use kiln_data::Source;
use kiln_data::Transform::{CenterCrop, Normalize, Resize, ToTensor};
use kiln_data::transforms::{IMAGENET_MEAN, IMAGENET_STD};

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: imagefolder_resnet50 <root>")?,
    );
    let folders = Source::ImageFolder {
        train: root.join("train"),
        val: Some(root.join("val")),
        val_fraction: None,
    };
    let sgd = OptimizerConfig {
        momentum: 0.9,
        ..OptimizerConfig::sgd(0.01)
    };
    let mut config = TrainConfig::new(folders, sgd, 10, 64);
    config.name = "imagefolder-resnet50".into();
    config.model.name = "resnet50".into();
    config.model.pretrained = Some("torchvision".into());
    let eval_transforms = vec![
        Resize {
            size: 256,
            interpolation: Default::default(),
        },
        CenterCrop { size: 224 },
        ToTensor,
        Normalize {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        },
    ];
    config.data.train_transforms = eval_transforms.clone();
    config.data.val_transforms = eval_transforms;
    config.data.workers = 8;

    kiln::panics::install_hook();
    let request = TrainRequest {
        start: Start::Built { config: &config },
        overrides: &[],
        backend: Some(BackendChoice::Auto),
        devices: Some(DeviceSelection::All),
        cluster: None,
        stop: Arc::new(AtomicBool::new(false)),
    };
    kiln::train(request, &mut Console::new())?;
    Ok(())
}
