//! Full-size torchvision (and timm's ResNet-D) weights: load, match eval logits, export. Ignored by default: it needs
//! `KILN_TORCHVISION_DIR` pointing at the files `tests/fixtures/torchvision_full_size.py write`
//! made (too large to commit); see that script for the whole round trip.

use std::path::PathBuf;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use kiln_models::{ResNetConfig, weights};

fn read(path: PathBuf, key: &str) -> TensorData {
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(key).unwrap();
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    TensorData::new(values, view.shape().to_vec())
}

#[test]
#[ignore = "needs full-size files: see tests/fixtures/torchvision_full_size.py"]
fn torchvision_weights_round_trip() {
    let dir = std::env::var_os("KILN_TORCHVISION_DIR")
        .map(PathBuf::from)
        .expect("set KILN_TORCHVISION_DIR to the folder the script wrote");
    let device = Default::default();
    let input = Tensor::<Flex, 4>::from_data(read(dir.join("input.safetensors"), "input"), &device);
    for name in [
        "resnet18",
        "resnet50",
        "resnext50_32x4d",
        "wide_resnet50_2",
        "resnet50d",
    ] {
        let model = ResNetConfig::from_name(name)
            .unwrap()
            .init::<Flex>(&device)
            .unwrap();
        let (model, report) = weights::load(model, &dir.join(format!("{name}.pth"))).unwrap();
        assert_eq!(report, weights::LoadReport::default(), "{name}");
        let logits = model
            .forward(input.clone())
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let expected = read(dir.join(format!("{name}_logits.safetensors")), "logits")
            .to_vec::<f32>()
            .unwrap();
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        let error = logits
            .iter()
            .zip(&expected)
            .fold(0f32, |m, (a, e)| m.max((a - e).abs()))
            / scale;
        eprintln!("{name}: relative eval logit error {error:.2e}");
        assert!(error < 1e-4, "{name}: {error}");
        weights::save_safetensors(&model, &dir.join(format!("kiln_{name}.safetensors"))).unwrap();
    }
}
