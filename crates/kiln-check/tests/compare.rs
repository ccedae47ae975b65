//! The comparison on the two CPU backends, and that it catches a difference when there is one.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::TensorData;
use kiln_check::compare::{self, Capture, CompareSpec, Stage, Tolerances};
use kiln_models::{ResNetConfig, Stem};

fn spec(depth: usize) -> CompareSpec {
    CompareSpec {
        model: ResNetConfig::new(depth)
            .with_width(4)
            .with_num_classes(5)
            .with_stem(Stem::Cifar)
            .with_zero_init_residual(depth >= 50),
        image_size: 16,
        batch: 3,
        steps: 2,
        seed: 11,
    }
}

fn capture_both(spec: &CompareSpec) -> (Capture, Capture) {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("w.safetensors");
    compare::save_initial_weights::<Flex>(spec, &Default::default(), &weights).unwrap();
    let flex = compare::capture::<Autodiff<Flex>>(spec, &weights, &Default::default()).unwrap();
    let ndarray =
        compare::capture::<Autodiff<NdArray>>(spec, &weights, &Default::default()).unwrap();
    (flex, ndarray)
}

#[test]
fn flex_and_ndarray_agree_on_every_stage_for_both_block_kinds() {
    for depth in [18, 50] {
        let (flex, ndarray) = capture_both(&spec(depth));
        let stages: Vec<Stage> = flex.stages.keys().copied().collect();
        assert_eq!(stages.len(), 9, "every stage is captured");
        assert!(
            flex.stages[&Stage::Gradients].len() > 20,
            "a gradient for every parameter"
        );
        assert!(flex.stages[&Stage::BatchNormStatistics].contains_key("bn1.running_var"));
        for diff in compare::diff(&flex, &ndarray, &Tolerances::float32()) {
            assert!(
                diff.passed,
                "resnet{depth} {}: {:.2e} at {}",
                diff.stage.name(),
                diff.max_rel,
                diff.worst
            );
        }
    }
}

#[test]
fn the_steps_move_the_parameters_so_the_comparison_means_something() {
    let (flex, _) = capture_both(&spec(18));
    let after_sgd = &flex.stages[&Stage::SgdSteps]["conv1.weight"];
    let after_adamw = &flex.stages[&Stage::AdamwSteps]["conv1.weight"];
    let moved = compare::diff(
        &single(Stage::SgdSteps, "conv1.weight", after_sgd.clone()),
        &single(Stage::SgdSteps, "conv1.weight", after_adamw.clone()),
        &Tolerances::float32(),
    );
    assert!(
        moved[0].max_rel > 1e-3,
        "SGD and AdamW land in different places"
    );
}

fn single(stage: Stage, name: &str, data: TensorData) -> Capture {
    let mut capture = Capture::default();
    capture
        .stages
        .entry(stage)
        .or_default()
        .insert(name.to_string(), data);
    capture
}

#[test]
fn a_difference_beyond_tolerance_fails_and_names_the_tensor() {
    let reference = single(
        Stage::Gradients,
        "layer1.0.conv1.weight",
        TensorData::new(vec![1.0f32, -2.0, 0.5, 0.0], [2, 2]),
    );
    let close = single(
        Stage::Gradients,
        "layer1.0.conv1.weight",
        TensorData::new(vec![1.0f32, -2.0 + 1e-5, 0.5, 1e-6], [2, 2]),
    );
    let far = single(
        Stage::Gradients,
        "layer1.0.conv1.weight",
        TensorData::new(vec![1.0f32, -2.0, 0.5 + 0.01, 0.0], [2, 2]),
    );
    let tolerances = Tolerances::float32();

    let ok = &compare::diff(&reference, &close, &tolerances)[0];
    assert!(ok.passed);
    assert!((ok.max_abs - 1e-5).abs() < 1e-6, "max abs {}", ok.max_abs);
    assert!(
        (ok.max_rel - 5e-6).abs() < 1e-6,
        "relative to the largest magnitude, 2"
    );

    let bad = &compare::diff(&reference, &far, &tolerances)[0];
    assert!(!bad.passed);
    assert_eq!(bad.worst, "layer1.0.conv1.weight");
    assert!((bad.max_rel - 5e-3).abs() < 1e-4);
}

#[test]
fn missing_tensors_wrong_shapes_and_nan_fail() {
    let reference = single(Stage::Loss, "loss", TensorData::new(vec![1.0f32, 2.0], [2]));
    let tolerances = Tolerances::float32();
    let missing = &compare::diff(&reference, &Capture::default(), &tolerances)[0];
    assert!(!missing.passed);
    assert_eq!(missing.worst, "loss (missing)");

    let reshaped = single(
        Stage::Loss,
        "loss",
        TensorData::new(vec![1.0f32, 2.0], [1, 2]),
    );
    let wrong = &compare::diff(&reference, &reshaped, &tolerances)[0];
    assert!(!wrong.passed);
    assert_eq!(wrong.worst, "loss (wrong shape)");

    let nan = single(
        Stage::Loss,
        "loss",
        TensorData::new(vec![1.0f32, f32::NAN], [2]),
    );
    assert!(!compare::diff(&reference, &nan, &tolerances)[0].passed);
}

/// `capture` with the update of `name` after `stage`'s steps scaled by `factor`: a wrong
/// update on one tensor (a momentum or a learning rate off for one parameter group).
fn mutated(capture: &Capture, stage: Stage, name: &str, factor: f32) -> Capture {
    let initial = capture.initial[name].to_vec::<f32>().unwrap();
    let after = &capture.stages[&stage][name];
    let wrong: Vec<f32> = (after.to_vec::<f32>().unwrap().iter())
        .zip(&initial)
        .map(|(a, i)| i + (a - i) * factor)
        .collect();
    let mut capture = Capture {
        stages: capture.stages.clone(),
        initial: capture.initial.clone(),
    };
    let data = TensorData::new(wrong, after.shape.clone());
    capture
        .stages
        .get_mut(&stage)
        .unwrap()
        .insert(name.into(), data);
    capture
}

#[test]
fn a_wrong_update_on_one_small_tensor_fails_on_every_backend_kind() {
    let (flex, ndarray) = capture_both(&spec(18));
    // Small tensors whose updates are tiny beside the network's largest weight, which was the
    // scale of every error after the steps before each tensor had its own.
    for (stage, name) in [
        (Stage::SgdSteps, "layer3.1.bn2.bias"),
        (Stage::AdamwSteps, "layer2.0.bn1.weight"),
        (Stage::AdamwSteps, "fc.bias"),
    ] {
        let wrong = mutated(&ndarray, stage, name, 0.9);
        for tolerances in [Tolerances::float32(), Tolerances::tensor_cores()] {
            let diffs = compare::diff(&flex, &wrong, &tolerances);
            let diff = diffs.iter().find(|d| d.stage == stage).unwrap();
            assert!(
                !diff.passed && diff.worst == name,
                "{name} 10% off passed {}: {:.2e} at {}",
                stage.name(),
                diff.max_rel,
                diff.worst
            );
        }
    }
    // A buffer is compared with its own magnitude, apart from the parameters.
    let mut wrong = mutated(&ndarray, Stage::AdamwSteps, "fc.bias", 1.0);
    let buffers = wrong.stages.get_mut(&Stage::SgdBuffers).unwrap();
    let mean = buffers["layer1.0.bn1.running_mean"]
        .to_vec::<f32>()
        .unwrap();
    let shape = buffers["layer1.0.bn1.running_mean"].shape.clone();
    let shifted = mean.iter().map(|m| m * 1.05).collect::<Vec<f32>>();
    buffers.insert(
        "layer1.0.bn1.running_mean".into(),
        TensorData::new(shifted, shape),
    );
    let diffs = compare::diff(&flex, &wrong, &Tolerances::tensor_cores());
    let failed: Vec<Stage> = diffs
        .iter()
        .filter(|d| !d.passed)
        .map(|d| d.stage)
        .collect();
    assert_eq!(failed, vec![Stage::SgdBuffers]);
}
