//! The comparison on the two CPU backends, and that it catches a difference when there is one.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::TensorData;
use kiln_check::compare::{self, Capture, CompareSpec, Stage, Tolerances};
use kiln_check::trajectory;
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

/// PyTorch's runs (`tests/fixtures/trajectory/make_trajectories.py`).
fn trajectories() -> trajectory::Fixture {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/trajectory"
    );
    trajectory::Fixture::load(std::path::Path::new(dir)).unwrap()
}

/// How far kiln may be from PyTorch's float64 run in the first ten steps: every loss, and every
/// parameter relative to its update after the tenth. Past the first ten, these narrow networks
/// are chaotic in float32 (PyTorch's own float32 run from weights one rounding away from the
/// stored ones ends 1e-1 away on the ResNet-18 SGD run), so the later steps are reported, not
/// bounded here; see README, "Training runs against PyTorch".
const FIRST_LOSSES: f64 = 1e-6;
const TENTH_PARAMETERS: f64 = 1e-4;

/// Every run's learning rates and step counts are PyTorch's on both CPU backends, and its first
/// ten steps follow PyTorch's float64 run closely; the rest is printed.
#[test]
fn flex_and_ndarray_follow_pytorchs_training_runs_step_by_step() {
    let fixture = trajectories();
    let runs: Vec<&str> = fixture.runs().map(|(name, _)| name).collect();
    assert_eq!(runs.len(), 4, "{runs:?}");
    for run in runs {
        let setup = fixture.setup(run).unwrap();
        let reference = fixture.runs().find(|(name, _)| *name == run).unwrap().1;
        for (backend, trained) in [
            ("flex", train::<Autodiff<Flex>>(&fixture, run, &setup)),
            ("ndarray", train::<Autodiff<NdArray>>(&fixture, run, &setup)),
        ] {
            let diff = trajectory::diff(&fixture, run, &setup, &trained).unwrap();
            println!("{backend} {run}: {}", summary(&diff));
            assert!(diff.schedule <= 1e-9, "{backend} {run}: {diff:#?}");
            assert!(diff.counters_exact, "{backend} {run}: {diff:#?}");
            let first = first_losses(&trained, reference);
            assert!(first <= FIRST_LOSSES, "{backend} {run}: {first:.1e}");
            let tenth = diff.parameters[&10].error;
            assert!(tenth <= TENTH_PARAMETERS, "{backend} {run}: {diff:#?}");
        }
    }
}

fn train<B: burn::tensor::backend::AutodiffBackend>(
    fixture: &trajectory::Fixture,
    run: &str,
    setup: &trajectory::Setup,
) -> trajectory::Trajectory {
    trajectory::train::<B>(fixture, run, setup, &Default::default()).unwrap()
}

/// The largest relative error of the first ten losses.
fn first_losses(trained: &trajectory::Trajectory, reference: &trajectory::RunReference) -> f64 {
    (trained.losses.iter().zip(&reference.losses))
        .take(10)
        .map(|(kiln, exact)| (kiln - exact).abs() / exact.abs())
        .fold(0.0, f64::max)
}

fn summary(diff: &trajectory::RunDiff) -> String {
    let parameters: Vec<String> = (diff.parameters.iter())
        .map(|(step, w)| format!("step {step} {:.1e} (bound {:.1e})", w.error, w.bound))
        .collect();
    format!(
        "losses {:.1e} (bound {:.1e}), parameters {}",
        diff.losses.error,
        diff.losses.bound,
        parameters.join(", ")
    )
}

/// A wrong optimizer or schedule, each small, lands far outside what the first ten steps allow:
/// what the comparison proves is not loose.
#[test]
fn a_missing_weight_decay_a_wrong_dampening_or_a_schedule_one_step_off_fails() {
    let fixture = trajectories();
    let run = "resnet18_sgd";
    let right = fixture.setup(run).unwrap();
    let mut no_weight_decay = right.clone();
    no_weight_decay.config.optimizer.weight_decay = None;
    let mut dampening = right.clone();
    dampening.config.optimizer.dampening = 0.1;
    let mut late = right.clone();
    late.lrs.insert(0, late.lrs[0]);
    late.lrs.pop();
    for (name, setup) in [
        ("no weight decay", no_weight_decay),
        ("dampening 0.1", dampening),
        ("schedule one step late", late),
    ] {
        let trained = train::<Autodiff<Flex>>(&fixture, run, &setup);
        let diff = trajectory::diff(&fixture, run, &setup, &trained).unwrap();
        let tenth = diff.parameters[&10].error;
        assert!(
            tenth > 10.0 * TENTH_PARAMETERS,
            "{name}: {tenth:.1e} at step 10: {diff:#?}"
        );
        assert!(!diff.trajectory_passed(), "{name} passed: {diff:#?}");
    }
}
