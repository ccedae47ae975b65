//! `kiln train` and `kiln eval` as a user runs them: the quickstart reaches its accuracy, every
//! shipped config runs one iteration on tiny synthetic data, config mistakes get one line.

mod common;

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor};
use common::{epoch_figures, errors, kiln, strs, train_args, train_on_flex};

/// The single run directory under `runs`.
fn run_dir(runs: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

/// The outputs of the ONNX model at `path` on `values` of `shape`, run by tract.
fn run_onnx(path: &Path, shape: [usize; 4], values: Vec<f32>) -> Vec<f32> {
    use tract_onnx::prelude::*;
    let plan = (tract_onnx::onnx().model_for_path(path).unwrap())
        .into_optimized()
        .unwrap()
        .into_runnable()
        .unwrap();
    let input = tract_ndarray::Array4::from_shape_vec(shape, values).unwrap();
    let outputs = plan.run(tvec!(Tensor::from(input).into())).unwrap();
    outputs[0]
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect()
}

/// The `metadata_props` of the ONNX model at `path`, read with tract's own messages.
fn onnx_metadata(path: &Path) -> std::collections::HashMap<String, String> {
    use tract_onnx::prelude::*;
    let proto = tract_onnx::onnx().proto_model_for_path(path).unwrap();
    (proto.metadata_props.into_iter())
        .map(|p| (p.key, p.value))
        .collect()
}

#[test]
fn the_quickstart_reaches_95_percent_on_the_shipped_digits() {
    let runs = tempfile::tempdir().unwrap();
    let output = train_on_flex("configs/quickstart.toml", &[], runs.path());
    assert!(output.status.success(), "{:?}", errors(&output));
    let run = run_dir(runs.path());
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    let top1 = last["val_top1"].as_f64().unwrap();
    println!("quickstart validation top-1: {top1:.4}");
    assert!(top1 >= 0.95, "validation top-1 {top1}");
    for file in [
        "config.toml",
        "metrics.jsonl",
        "metrics.csv",
        "loss.svg",
        "accuracy.svg",
        "lr.svg",
        "model.safetensors",
        "summary.txt",
        "confusion.csv",
        "per_class.csv",
        "confusion.svg",
        "best/confusion.csv",
        "best/per_class.csv",
        "best/confusion.svg",
    ] {
        assert!(run.join(file).is_file(), "{file} is missing");
    }
    // The last epoch's confusion matrix gives its top-1: the diagonal over the whole.
    let confusion = std::fs::read_to_string(run.join("confusion.csv")).unwrap();
    let rows: Vec<Vec<u64>> = (confusion.lines().skip(1))
        .map(|l| l.split(',').skip(1).map(|n| n.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 10, "{confusion}");
    let total: u64 = rows.iter().flatten().sum();
    let diagonal: u64 = (0..10).map(|i| rows[i][i]).sum();
    assert!(
        (diagonal as f64 / total as f64 - top1).abs() < 1e-9,
        "{confusion}"
    );
    let macro_f1 = last["val_macro_f1"].as_f64().unwrap();
    assert!(macro_f1 > 0.9 && macro_f1 <= 1.0, "{last}");

    // `kiln eval` on the run gives the same validation accuracy from the exported model.
    let output = kiln(&["eval", "--run", &run.to_string_lossy(), "--backend", "flex"]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!("top-1 {:.2}%", top1 * 100.0)),
        "{text}"
    );
    // And prints the per-class table: a row per digit, the macro F1 the run recorded.
    assert!(
        text.contains("precision") && text.contains("support"),
        "{text}"
    );
    assert!(text.contains(&format!("macro F1 {macro_f1:.4}")), "{text}");

    // `--mistakes` writes the model's mistakes as a page of thumbnails beside the run's.
    let output = kiln(&[
        "eval",
        "--run",
        &run.to_string_lossy(),
        "--backend",
        "flex",
        "--mistakes",
        "8",
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let page = std::fs::read_to_string(run.join("mistakes.html")).unwrap();
    let images = page.matches("<img src=\"data:image/png;base64,").count();
    assert!((8..=16).contains(&images), "{images} images");
    assert!(page.contains("Least confident right answers"), "{page}");
    // The run's own page shows the per-step loss, the matrix's counts and the mistakes.
    let report = std::fs::read_to_string(run.join("report.html")).unwrap();
    for shown in [
        "train, smoothed",
        "class=\"cell\"",
        "Most confident mistakes",
    ] {
        assert!(report.contains(shown), "{shown}");
    }

    // `kiln export` writes model.onnx: another runtime (tract) computes kiln's logits from it,
    // and its metadata holds the run's class names and normalization.
    let output = kiln(&["export", "--run", &run.to_string_lossy()]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let onnx = run.join("model.onnx");
    let metadata = onnx_metadata(&onnx);
    let classes: Vec<String> = serde_json::from_str(&metadata["classes"]).unwrap();
    let written = std::fs::read_to_string(run.join("classes.txt")).unwrap();
    assert_eq!(classes, written.lines().collect::<Vec<_>>());
    assert_eq!(classes.len(), 10);
    assert!(metadata["normalize"].contains("\"mean\""), "{metadata:?}");
    let config = kiln_config::TrainConfig::load(&run.join("config.toml"), &[]).unwrap();
    let device = Default::default();
    let model = kiln_train::step::build_model::<Flex>(&config.model, 10, &device).unwrap();
    let (model, _) = kiln_models::weights::load(model, &run.join("model.safetensors")).unwrap();
    let images = Tensor::<Flex, 4>::random([5, 3, 8, 8], Distribution::Normal(0.0, 1.0), &device);
    let expected = model
        .forward(images.clone())
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let actual = run_onnx(&onnx, [5, 3, 8, 8], images.into_data().to_vec().unwrap());
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in expected.iter().zip(actual.iter()) {
        assert!((a - b).abs() <= 1e-4 * scale, "kiln {a}, ONNX {b}");
    }
}

/// The quickstart's epochs (`metrics.jsonl`) trained on flex from `initial.pth` with `settings`,
/// in the quickstart's recipe of PyTorch's curve (six epochs of 32 at 2e-3).
fn quickstart_from_pytorchs_weights(settings: &[&str]) -> Vec<serde_json::Value> {
    let recipe = ["epochs=6", "batch_size=32", "optimizer.lr=2e-3"];
    let runs = tempfile::tempdir().unwrap();
    let mut sets = vec!["model.pretrained=tests/fixtures/quickstart/initial.pth"];
    sets.extend(recipe);
    sets.extend(settings);
    let output = train_on_flex("configs/quickstart.toml", &sets, runs.path());
    assert!(output.status.success(), "{:?}", errors(&output));
    let metrics = std::fs::read_to_string(run_dir(runs.path()).join("metrics.jsonl")).unwrap();
    (metrics.lines())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// PyTorch's quickstart (`tests/fixtures/quickstart/make_quickstart_curve.py`) from the same
/// initial weights, on kiln's batches and learning rates (`examples/replay_batches.rs`). Every
/// epoch, kiln's training loss and validation top-1 must lie within the envelope that float32
/// rounding alone spreads PyTorch's runs over (float64, channels-last, and twenty runs from
/// weights one rounding step away), widened to twice its width; the same run at half the
/// learning rate must leave it, or the band would prove nothing.
#[test]
fn the_quickstart_follows_pytorchs_curve_from_the_same_weights_and_batches() {
    let curve = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/quickstart/curve.json"
    );
    let curve: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(curve).unwrap()).unwrap();
    let envelope = curve["envelope"].as_array().unwrap();
    let outside = |epochs: &[serde_json::Value]| -> Vec<String> {
        assert_eq!(epochs.len(), envelope.len());
        let mut outside = Vec::new();
        for (epoch, bounds) in epochs.iter().zip(envelope) {
            for measure in ["train_loss", "val_top1"] {
                let value = epoch[measure].as_f64().unwrap();
                let low = bounds[measure][0].as_f64().unwrap();
                let high = bounds[measure][1].as_f64().unwrap();
                let margin = (high - low) / 2.0;
                if value < low - margin || value > high + margin {
                    outside.push(format!(
                        "epoch {} {measure} {value:.4}, PyTorch {low:.4}..{high:.4}",
                        epoch["epoch"]
                    ));
                }
            }
        }
        outside
    };
    let kiln_run = quickstart_from_pytorchs_weights(&[]);
    for (epoch, bounds) in kiln_run.iter().zip(envelope) {
        println!(
            "epoch {}: train loss {:.4} (PyTorch {}), validation top-1 {:.4} (PyTorch {})",
            epoch["epoch"],
            epoch["train_loss"],
            bounds["train_loss"],
            epoch["val_top1"],
            bounds["val_top1"]
        );
    }
    let strayed = outside(&kiln_run);
    assert!(strayed.is_empty(), "kiln left PyTorch's band: {strayed:#?}");
    let slower = quickstart_from_pytorchs_weights(&["optimizer.lr=1e-3"]);
    assert!(
        !outside(&slower).is_empty(),
        "half the learning rate stayed within PyTorch's band"
    );
}

/// A run checkpointed on flex continues on ndarray: a checkpoint holds the weights and the
/// optimizer's state apart from any backend.
#[test]
fn a_checkpoint_written_on_one_backend_resumes_on_another() {
    let runs = tempfile::tempdir().unwrap();
    let sets = [
        "data.source={ kind = \"synthetic\", train_size = 22, val_size = 8, image_size = 8, num_classes = 3 }",
        "epochs=1",
        "batch_size=4",
        "model.width=4",
    ];
    let output = train_on_flex("configs/quickstart.toml", &sets, runs.path());
    assert!(output.status.success(), "{:?}", errors(&output));
    let run = run_dir(runs.path());
    let resumed = kiln(&[
        "train",
        "--resume",
        &run.to_string_lossy(),
        "--backend",
        "ndarray",
        "--set",
        "epochs=2",
    ]);
    assert!(resumed.status.success(), "{:?}", errors(&resumed));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let epochs: Vec<serde_json::Value> = (metrics.lines())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(epochs.len(), 2, "{metrics}");
    assert_eq!(epochs[1]["iteration"], 12, "{metrics}");
    assert!(epochs[1]["train_loss"].as_f64().unwrap().is_finite());
}

#[test]
fn every_shipped_config_runs_one_iteration_on_synthetic_data() {
    let configs: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
    assert!(configs.len() >= 4, "{configs:?}");
    for config in configs {
        let runs = tempfile::tempdir().unwrap();
        let sets = [
            "data.source={ kind = \"synthetic\", train_size = 2, val_size = 2, image_size = 32, num_classes = 3 }",
            "epochs=1",
            "batch_size=2",
            "model.width=4",
            "model.pretrained=",
            "data.workers=1",
        ];
        let mut args = train_args(&config.to_string_lossy(), "flex", &sets, runs.path());
        args.extend(["--devices".into(), "0".into()]);
        let output = kiln(&strs(&args));
        assert!(
            output.status.success(),
            "{}: {:?}",
            config.display(),
            errors(&output)
        );
        let history = std::fs::read_to_string(run_dir(runs.path()).join("metrics.jsonl")).unwrap();
        let epoch: serde_json::Value =
            serde_json::from_str(history.lines().next().unwrap()).unwrap();
        assert_eq!(epoch["iteration"], 1, "{}", config.display());
        // A config with the weights' average validates it too.
        let text = std::fs::read_to_string(&config).unwrap();
        if text.contains("[ema]") {
            assert!(
                epoch["ema_val_top1"].is_number(),
                "{}: {epoch}",
                config.display()
            );
        }
    }
}

/// Two short epochs of the CIFAR recipe: the weights' average is validated beside the weights,
/// the gradient norm is recorded (with clipping asked for), and accuracy says it counts mixed
/// images by their dominant label.
#[test]
fn the_cifar_recipe_shows_each_part_in_its_metrics() {
    let runs = tempfile::tempdir().unwrap();
    let sets = [
        "data.source={ kind = \"synthetic\", train_size = 16, val_size = 8, image_size = 32, num_classes = 3 }",
        "epochs=2",
        "batch_size=8",
        "model.width=4",
        "data.workers=1",
        "ema.warmup_epochs=1",
        "schedule.warmup_epochs=1",
        "optimizer.clip_grad_norm=5.0",
    ];
    let output = train_on_flex("configs/cifar10-resnet18-recipe.toml", &sets, runs.path());
    assert!(output.status.success(), "{:?}", errors(&output));
    let run = run_dir(runs.path());
    let history = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let epochs: Vec<serde_json::Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(epochs.len(), 2);
    let last = &epochs[1];
    let number = |key: &str| {
        last[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {last}"))
    };
    // Averaging began with epoch 2: the average is not the weights.
    assert_ne!(number("ema_val_loss"), number("val_loss"), "{last}");
    assert!(number("ema_val_top1") >= 0.0);
    assert!(number("grad_norm_mean") > 0.0 && number("grad_norm_max") >= number("grad_norm_mean"));
    let summary = std::fs::read_to_string(run.join("summary.txt")).unwrap();
    assert!(summary.contains("dominant label"), "{summary}");
}

/// `kiln lr-find` on the quickstart suggests a sensible rate, writes its two files where asked
/// and leaves no run behind; bad arguments are one line.
#[test]
fn lr_find_on_the_quickstart_suggests_a_sensible_rate() {
    let dir = tempfile::tempdir().unwrap();
    let runs_dir = format!("logging.runs_dir={}", dir.path().join("runs").display());
    let out = dir.path().join("out");
    let output = kiln(&[
        "lr-find",
        "--config",
        "configs/quickstart.toml",
        "--backend",
        "flex",
        "--out",
        &out.to_string_lossy(),
        "--set",
        &runs_dir,
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    let suggested: f64 = text
        .split("suggested learning rate: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{text}"))
        .parse()
        .unwrap();
    assert!((1e-4..=1e-1).contains(&suggested), "{text}");
    let csv = std::fs::read_to_string(out.join("lr-find.csv")).unwrap();
    assert!(csv.lines().count() > 20, "{csv}");
    assert!(out.join("lr-find.svg").is_file());
    assert!(
        !dir.path().join("runs").exists(),
        "a run directory was left"
    );

    for bad in [["--steps", "1"], ["--start", "0"]] {
        let mut args = vec!["lr-find", "--config", "configs/quickstart.toml"];
        args.extend(bad);
        let output = kiln(&args);
        assert!(!output.status.success(), "{bad:?}");
        assert_eq!(errors(&output).len(), 1, "{bad:?}: {:?}", errors(&output));
    }
}

#[test]
fn config_mistakes_end_with_one_line_naming_the_key() {
    let runs = tempfile::tempdir().unwrap();
    for (set, expected) in [
        ("optimizer.lrr=0.1", "lrr"),
        ("batch_size=0", "batch_size"),
        ("optimizer.lr=-0.5", "optimizer.lr"),
        (
            "data.source={ kind = \"image_folder\", train = \"/nonexistent/train\" }",
            "/nonexistent/train",
        ),
    ] {
        let output = train_on_flex("configs/quickstart.toml", &[set], runs.path());
        assert_eq!(output.status.code(), Some(1), "{set}");
        let lines = errors(&output);
        assert_eq!(lines.len(), 1, "{set}: {lines:?}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(expected),
            "{lines:?}"
        );
    }
    // Nothing ran, so no run directory was left behind.
    assert_eq!(std::fs::read_dir(runs.path()).unwrap().count(), 0);
}

/// `data.workers = 100000` used to abort the process from the thread limit ("failed to set up
/// alternative stack guard page"); the request is lowered, with the reason.
#[test]
fn too_many_loader_workers_are_lowered_with_a_warning() {
    let runs = tempfile::tempdir().unwrap();
    let sets = [
        "data.source={ kind = \"synthetic\", train_size = 8, val_size = 4, image_size = 8, num_classes = 2 }",
        "epochs=1",
        "data.workers=100000",
    ];
    let output = train_on_flex("configs/quickstart.toml", &sets, runs.path());
    let lines = errors(&output);
    assert!(output.status.success(), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("data.workers = 100000") && l.contains("using")),
        "{lines:?}"
    );
}

/// The highest `[epoch E, iteration I]` a process printed (every iteration is printed).
fn last_iteration(console: &str) -> Option<usize> {
    console
        .lines()
        .filter_map(|line| line.split("iteration ").nth(1))
        .filter_map(|rest| rest.split(']').next()?.parse().ok())
        .max()
}

/// `kill -9` at seeded random moments (checkpoint writes included: one is written every two
/// steps), then `--resume`, twelve times, then once more to the end: its metrics are the
/// uninterrupted run's, and no resume redoes more than the two steps since the last checkpoint.
/// The moments are counted in the run's own steps (a seeded number of steps into each process,
/// then a seeded part of a step), so that as many kills land on a loaded machine as on an idle
/// one; one kill in four lands in a process's start instead.
#[test]
fn a_run_killed_at_random_moments_and_resumed_ends_as_an_uninterrupted_one() {
    let runs = tempfile::tempdir().unwrap();
    let sets = [
        "data.source={ kind = \"synthetic\", train_size = 96, val_size = 16, image_size = 16, num_classes = 3 }",
        "epochs=6",
        "batch_size=8",
        "model.width=8",
        "data.workers=1",
        "checkpoints.every_steps=2",
        "logging.print_every=1",
    ];
    let start = |runs: &Path| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"));
        command
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(train_args("configs/quickstart.toml", "flex", &sets, runs))
            .args(["--devices", "0"]);
        command
    };
    let whole = runs.path().join("whole");
    let clock = std::time::Instant::now();
    let output = start(&whole).output().unwrap();
    let step_seconds = clock.elapsed().as_secs_f64() / 72.0;
    assert!(output.status.success(), "{:?}", errors(&output));
    let expected = epoch_figures(&run_dir(&whole));
    assert_eq!(expected.len(), 6);

    let killed = runs.path().join("killed");
    // A small linear congruential generator: the same moments every time.
    let mut state = 0x2545_f491u64;
    let mut uniform = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut kills, mut finished) = (0, false);
    let mut last_printed: Option<usize> = None;
    for _ in 0..40 {
        let existing = std::fs::read_dir(&killed).map_or(0, |d| d.count());
        let mut command = match existing {
            0 => start(&killed),
            _ => {
                let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"));
                command
                    .current_dir(env!("CARGO_MANIFEST_DIR"))
                    .args(["train", "--resume"])
                    .arg(run_dir(&killed));
                command
            }
        };
        let moment = match uniform() < 0.25 {
            true => KillAt::Start(step_seconds * 6.0 * uniform()),
            false => KillAt::Steps(1 + (uniform() * 8.0) as usize, step_seconds * uniform()),
        };
        let (status, stdout) = run_until(&mut command, (kills < 12).then_some(moment));
        // Killed (rather than finished just before the signal).
        kills += usize::from(status.code().is_none());
        // A resume starts at the step after its checkpoint: at most two steps are done again.
        if let (Some(before), Some(first)) = (last_printed, first_iteration(&stdout)) {
            assert!(
                first + 2 > before,
                "resumed at iteration {first} after {before} had been printed"
            );
        }
        if let Some(last) = last_iteration(&stdout) {
            last_printed = Some(last_printed.map_or(last, |l: usize| l.max(last)));
        }
        if status.success() {
            finished = true;
            break;
        }
        // Killed before the first checkpoint: nothing to resume, so start again.
        if stdout.contains("no checkpoint") || stdout.contains("not a kiln run directory") {
            std::fs::remove_dir_all(&killed).unwrap();
            last_printed = None;
        } else if status.code().is_some() {
            panic!("kiln failed: {stdout}");
        }
    }
    println!("{kills} kills landed");
    assert!(finished, "the run never finished");
    assert!(kills >= 5, "only {kills} kills landed");
    assert_eq!(epoch_figures(&run_dir(&killed)), expected);
    // Every step's loss as the uninterrupted run wrote it: the rows a kill left past the
    // checkpoint were cut on resume.
    let steps = |runs: &Path| std::fs::read_to_string(run_dir(runs).join("iterations.csv"));
    assert_eq!(steps(&killed).unwrap(), steps(&whole).unwrap());
}

/// When a process is killed: `Start(s)` seconds after it starts, or `Steps(n, s)` seconds
/// after it printed its `n`-th iteration.
#[derive(Clone, Copy)]
enum KillAt {
    Start(f64),
    Steps(usize, f64),
}

/// Runs `command` until it ends, or kills it at `moment`; returns its status and everything it
/// printed (the console's lines go to standard error), standard output first.
fn run_until(
    command: &mut std::process::Command,
    moment: Option<KillAt>,
) -> (std::process::ExitStatus, String) {
    use std::io::BufRead;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, heard) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line.contains("iteration "));
            text += &line;
            text.push('\n');
        }
        text
    });
    let pause = |seconds: f64| std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    match moment {
        Some(KillAt::Start(seconds)) => pause(seconds),
        Some(KillAt::Steps(steps, seconds)) => {
            // Iterations printed so far; the channel closes when the process ends.
            let printed = heard
                .iter()
                .filter(|&iteration| iteration)
                .take(steps)
                .count();
            if printed == steps {
                pause(seconds);
            }
        }
        None => {}
    }
    if moment.is_some() && child.try_wait().unwrap().is_none() {
        child.kill().unwrap();
    }
    let output = child.wait_with_output().unwrap();
    let stderr = reader.join().unwrap();
    (
        output.status,
        format!("{}{stderr}", String::from_utf8_lossy(&output.stdout)),
    )
}

/// The lowest iteration a process printed.
fn first_iteration(console: &str) -> Option<usize> {
    console
        .lines()
        .filter_map(|line| line.split("iteration ").nth(1))
        .filter_map(|rest| rest.split(']').next()?.parse().ok())
        .min()
}

#[test]
fn the_quickstart_from_its_shards_trains_as_from_the_shipped_digits() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    let written = kiln(&[
        "shard",
        "--config",
        "configs/quickstart.toml",
        "--out",
        shards.to_str().unwrap(),
        "--size",
        "64KiB",
    ]);
    assert!(written.status.success(), "{:?}", errors(&written));
    let stdout = String::from_utf8_lossy(&written.stdout);
    assert!(stdout.contains("train: 1500 images in"), "{stdout}");
    let source = stdout.lines().last().unwrap();
    assert!(source.contains("train-{000000.."), "{source}");

    let quickstart = std::fs::read_to_string("configs/quickstart.toml").unwrap();
    let from_shards = quickstart.replace("source = { kind = \"digits\" }", source);
    assert_ne!(from_shards, quickstart);
    let config = dir.path().join("shards.toml");
    std::fs::write(&config, from_shards).unwrap();
    let train = |config: &str, runs: &str| {
        let runs = dir.path().join(runs);
        let output = train_on_flex(config, &["epochs=2"], &runs);
        assert!(output.status.success(), "{:?}", errors(&output));
        epoch_figures(&run_dir(&runs))
    };
    let digits = train("configs/quickstart.toml", "runs-digits");
    assert_eq!(digits.len(), 2);
    let clock = std::time::Instant::now();
    assert_eq!(train(config.to_str().unwrap(), "runs-shards"), digits);
    let duration = clock.elapsed();

    // `kiln report` of the two runs: one page naming what differs, their data source (and the
    // folder each was written into) alone.
    let page = dir.path().join("compare.html");
    let runs = ["runs-digits", "runs-shards"].map(|r| run_dir(&dir.path().join(r)));
    let output = kiln(&[
        "report",
        &runs[0].to_string_lossy(),
        &runs[1].to_string_lossy(),
        "--out",
        &page.to_string_lossy(),
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let page = std::fs::read_to_string(&page).unwrap();
    let differences = page.split("<table class=\"differences\">").nth(1).unwrap();
    let keys: Vec<&str> = (differences.split("</table>").next().unwrap())
        .split("<tr><td><code>")
        .skip(1)
        .map(|row| row.split('<').next().unwrap())
        .collect();
    let source = |k: &&str| k.starts_with("data.source.");
    assert!(keys.iter().any(source), "{keys:?}");
    assert!(
        keys.iter().all(|k| source(k) || *k == "logging.runs_dir"),
        "{keys:?}"
    );
    assert!(
        page.contains("runs-digits/") && page.contains("/report.html\""),
        "{page}"
    );

    // Killed in the middle and resumed, a run from shards ends as the uninterrupted one.
    let killed = dir.path().join("runs-killed");
    let sets = ["epochs=2", "checkpoints.every_steps=5"];
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(train_args(config.to_str().unwrap(), "flex", &sets, &killed))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(duration.mul_f64(0.6));
    child.kill().unwrap();
    assert!(child.wait().unwrap().code().is_none(), "not killed mid-run");
    let run = run_dir(&killed);
    assert!(
        epoch_figures(&run).len() < 2,
        "killed after the run had ended"
    );
    let resumed = kiln(&[
        "train",
        "--resume",
        run.to_str().unwrap(),
        "--backend",
        "flex",
    ]);
    assert!(resumed.status.success(), "{:?}", errors(&resumed));
    assert!(
        errors(&resumed)
            .iter()
            .any(|l| l.starts_with("resuming from"))
    );
    assert_eq!(epoch_figures(&run), digits);
}
