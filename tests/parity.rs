//! PyTorch parity: kiln's ResNets against the reference files that
//! `tests/fixtures/make_resnet_fixtures.py` writes (PyTorch is not needed to run this), through
//! `kiln::check::parity_on` (`kiln_check::parity` says what is compared and how closely).
//!
//! Every compiled backend with a device is checked against PyTorch's float64 answer: eval logits,
//! train logits and loss within 1e-4, every gradient within 1e-3 (or twice PyTorch's own float32
//! error where that is larger), and the batch-norm buffers after the train-mode forward. The
//! checks run in the library, which the binary already compiled for every backend: generic here,
//! they were the slowest of the test build's units (eight CPU minutes).
//!
//! Set `KILN_REQUIRE_WGPU=1` (CI does) to fail instead of skipping when no wgpu adapter exists.

use std::path::Path;

use kiln::check::{Outcome, parity_model_on, parity_on};
use kiln_backend::{Backend, probe};
use kiln_models::ResNetConfig;

/// Runs one fixture on every CPU backend compiled in, and on wgpu where an adapter exists.
fn check_everywhere(fixture: &'static str, depth: usize) {
    check_model_everywhere(fixture, &kiln_check::parity::fixture_model(depth));
}

/// [`check_everywhere`] for a fixture of any network of the family.
fn check_model_everywhere(fixture: &'static str, model: &ResNetConfig) {
    let probe = probe();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let require_wgpu = std::env::var_os("KILN_REQUIRE_WGPU").is_some();
    let mut tested = 0;
    let mut failures = Vec::new();
    for backend in [Backend::Flex, Backend::NdArray, Backend::Wgpu] {
        let report = match parity_model_on(backend, &probe, &fixtures, fixture, model) {
            Outcome::Compared(report) => report,
            Outcome::Skipped(why)
                if backend == Backend::Wgpu && require_wgpu && backend.is_compiled() =>
            {
                panic!("KILN_REQUIRE_WGPU is set but wgpu is unusable: {why}")
            }
            Outcome::Skipped(why) => {
                eprintln!("{fixture}: skipping {backend}: {why}");
                continue;
            }
            Outcome::Failed(why) => panic!("{fixture} on {backend}: {why}"),
        };
        eprintln!(
            "{fixture} on {backend}, worst relative errors: {}",
            report.summary()
        );
        tested += 1;
        failures.extend(
            report
                .failures
                .into_iter()
                .map(|f| format!("{backend}: {f}")),
        );
    }
    assert!(tested > 0, "no backend could run the parity test");
    assert!(
        failures.is_empty(),
        "{fixture} differs from PyTorch:\n{}",
        failures.join("\n")
    );
}

#[test]
fn resnet18_structure_matches_pytorch() {
    check_everywhere("resnet18_w4", 18);
}

#[test]
fn resnet50_structure_matches_pytorch() {
    check_everywhere("resnet50_w4", 50);
}

/// ResNeXt's grouped 3x3 convolutions (torchvision's Bottleneck with groups; at width 4 the
/// 32 groups are 2 of 4 channels in layer 1), forward and gradients, on every backend.
#[test]
fn resnext50_32x4d_structure_matches_pytorch() {
    let model = ResNetConfig::from_name("resnext50_32x4d")
        .unwrap()
        .with_num_classes(10)
        .with_width(4);
    check_model_everywhere("resnext50_32x4d_w4", &model);
}

/// Wide ResNet's twice-as-wide inner 3x3 convolutions (torchvision's Bottleneck with
/// `base_width` 128), forward and gradients, on every backend.
#[test]
fn wide_resnet50_2_structure_matches_pytorch() {
    let model = ResNetConfig::from_name("wide_resnet50_2")
        .unwrap()
        .with_num_classes(10)
        .with_width(4);
    check_model_everywhere("wide_resnet50_2_w4", &model);
}

/// timm's ResNet-D (its own class and names: the deep stem, average-pool shortcuts, one over a
/// 7x7 map rounding up), on every backend.
#[test]
fn resnet50d_structure_matches_timm() {
    let model = ResNetConfig::from_name("resnet50d")
        .unwrap()
        .with_num_classes(10)
        .with_width(4);
    check_model_everywhere("resnet50d_w4", &model);
}

/// The same check with PyTorch's answer changed a little in one place: the loss 1e-3 off, or
/// one gradient 1% off (in PyTorch's float64 and float32 answers both, or the float32 run's
/// distance from float64 would widen the bound), each fails, naming what differs.
#[test]
fn a_small_difference_from_pytorch_fails_and_is_named() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let bytes = std::fs::read(fixtures.join("resnet18_w4_expected.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (keys, factor, named) in [
        (&["loss"][..], 1.001f32, "loss"),
        (
            &["grad.layer2.0.conv1.weight", "grad32.layer2.0.conv1.weight"],
            1.01,
            "gradients layer2.0.conv1.weight",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            fixtures.join("resnet18_w4.pth"),
            dir.path().join("resnet18_w4.pth"),
        )
        .unwrap();
        let tensors: Vec<(String, Vec<u8>, safetensors::Dtype, Vec<usize>)> = (file.tensors())
            .into_iter()
            .map(|(name, view)| {
                let mut data = view.data().to_vec();
                if keys.contains(&name.as_str()) {
                    assert_eq!(view.dtype(), safetensors::Dtype::F32);
                    for chunk in data.chunks_exact_mut(4) {
                        let value = f32::from_le_bytes(chunk.try_into().unwrap()) * factor;
                        chunk.copy_from_slice(&value.to_le_bytes());
                    }
                }
                (name, data, view.dtype(), view.shape().to_vec())
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = (tensors.iter())
            .map(|(name, data, dtype, shape)| {
                let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data);
                (name.clone(), view.unwrap())
            })
            .collect();
        safetensors::serialize_to_file(
            views,
            None,
            &dir.path().join("resnet18_w4_expected.safetensors"),
        )
        .unwrap();
        let report = match parity_on(Backend::Flex, &probe(), dir.path(), "resnet18_w4", 18) {
            Outcome::Compared(report) => report,
            other => panic!("flex did not run: {other:?}"),
        };
        assert!(
            report.failures.len() == 1 && report.failures[0].starts_with(named),
            "{keys:?} x{factor}: {:?}",
            report.failures
        );
    }
}
