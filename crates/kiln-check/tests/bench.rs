//! A benchmark row measured on flex, and kiln's rows joined with PyTorch's in the table.

use burn::backend::{Autodiff, Flex};
use kiln_backend::MemoryMeter;
use kiln_check::bench::{self, Budget, Measurement, Mode, Target, Workload};

#[test]
fn a_training_row_on_flex_has_throughput_time_and_memory() {
    let mut workload = Workload::parse("resnet18-cifar").unwrap();
    workload.model = workload.model.with_width(8);
    let budget = Budget {
        warmup: 1,
        min_steps: 2,
        min_seconds: 0.0,
        max_steps: 10,
    };
    let target = Target {
        backend: "flex",
        device: "CPU",
        device_class: "cpu",
    };
    let mut memory = MemoryMeter::process();
    for mode in [Mode::Train, Mode::Infer] {
        let row = bench::measure::<Autodiff<Flex>>(
            &workload,
            4,
            mode,
            budget,
            &bench::Extras {
                passes: true,
                kernels: None,
            },
            &target,
            &Default::default(),
            &mut memory,
        )
        .unwrap();
        assert_eq!(row.steps, 2);
        assert_eq!((row.batch, row.image_size, row.mode), (4, 32, mode));
        assert!(row.step_ms > 0.0);
        // Four images a step: throughput and step time describe the same steps.
        let implied = 4.0 * 1000.0 / row.step_ms;
        assert!(
            row.images_per_s > implied / 3.0 && row.images_per_s < implied * 3.0,
            "{} img/s against {implied} from the median step",
            row.images_per_s
        );
        if cfg!(target_os = "linux") {
            assert!(row.peak_memory_bytes.unwrap() > 1 << 20);
        }
        // A training step's host time: the training thread's part of one step, and CPU time.
        match (mode, row.host) {
            (Mode::Train, Some(host)) => {
                assert!(
                    host.enqueue_ms > 0.0 && host.enqueue_ms <= row.step_ms * 1.5,
                    "{host:?}"
                );
                assert!(host.cpu_ms > 0.0, "{host:?}");
            }
            (Mode::Infer, None) => {}
            other => panic!("host time of {mode:?}: {other:?}"),
        }
        // The parts of a training step: each took time, and together about one step.
        match (mode, row.passes) {
            (Mode::Train, Some(p)) => {
                let parts = [p.forward_ms, p.backward_ms, p.optimizer_ms];
                assert!(parts.iter().all(|&ms| ms > 0.0), "{parts:?}");
                let sum: f64 = parts.iter().sum();
                assert!(
                    sum > row.step_ms / 3.0 && sum < row.step_ms * 3.0,
                    "{sum} against {}",
                    row.step_ms
                );
            }
            (Mode::Infer, None) => {}
            (mode, passes) => panic!("{mode:?} measured passes {passes:?}"),
        }
    }
}

#[test]
fn workloads_are_torchvision_networks_at_their_usual_sizes() {
    let cifar = Workload::parse("resnet18-cifar").unwrap();
    assert_eq!((cifar.image_size, cifar.model.num_classes), (32, 10));
    let imagenet = Workload::parse("resnet50").unwrap();
    assert_eq!(
        (imagenet.image_size, imagenet.model.num_classes),
        (224, 1000)
    );
    assert_eq!(imagenet.default_batches(), vec![16, 64]);
    let err = Workload::parse("vgg16").unwrap_err();
    assert!(err.contains("resnet18 ... resnet152"), "{err}");
}

fn row(framework: &str, variant: &str, batch: usize, images_per_s: f64) -> Measurement {
    Measurement {
        framework: framework.into(),
        variant: variant.into(),
        device_class: "cpu".into(),
        device: "CPU".into(),
        model: "resnet18-cifar".into(),
        image_size: 32,
        batch,
        mode: Mode::Train,
        images_per_s,
        step_ms: 1000.0 * batch as f64 / images_per_s,
        steps: 3,
        peak_memory_bytes: Some(3 << 29),
        passes: None,
        host: None,
        kernels: None,
    }
}

#[test]
fn the_table_puts_pytorch_beside_kiln_with_the_ratio() {
    let kiln = [
        row("kiln", "flex", 32, 42.0),
        row("kiln", "flex", 128, 10.0),
    ];
    let pytorch = [
        row("pytorch", "eager", 32, 84.0),
        row("pytorch", "eager", 64, 80.0),
    ];
    let table = bench::markdown(&kiln, &pytorch);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].contains("PyTorch eager img/s | kiln / PyTorch"));
    assert!(
        lines[2].contains("| 42.0 |") && lines[2].contains("| 84.0 | 0.50x | 1.50 GiB |"),
        "{}",
        lines[2]
    );
    // No PyTorch row at batch 128: empty cells, not a wrong match.
    assert!(lines[3].ends_with("| | | |"), "{}", lines[3]);
}
