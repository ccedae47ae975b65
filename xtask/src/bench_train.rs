//! `kiln train` as a user times it, against the same training written in PyTorch, in rounds that
//! alternate the two (these machines are noisy; compare within a round's neighbourhood):
//!
//! - `cargo xtask bench quickstart`: `kiln train --config configs/quickstart.toml` (the loader,
//!   validation and checkpoints included) against `xtask/scripts/bench_torch_quickstart.py`: the
//!   epochs (training and validation, as kiln's epoch line counts them) and the whole process.
//! - `cargo xtask bench train`: `kiln train --config configs/cifar10-resnet18-sgd.toml` (ResNet-18
//!   with the CIFAR stem, random crops and flips, the config's loader workers) at each batch size
//!   against `xtask/scripts/bench_torch_train.py` (torchvision's CIFAR10 and transforms, a
//!   DataLoader): the last epoch's training images per second, validation included as in kiln's
//!   epoch line. The data are random images in CIFAR-10's binary format, which both read.
//!
//! Each writes its table to `target/bench/`, naming the CPU.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use rand::{Rng, SeedableRng};

pub fn quickstart(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args, &["--rounds"])?;
    let rounds = options.number("--rounds", 3)?;
    let kiln = crate::build_kiln(root, &[])?;
    let python = torch_python(root);
    // kiln writes its run directories under the working directory.
    let runs = root.join("target/bench/quickstart-runs");
    std::fs::create_dir_all(&runs)?;
    let config = root.join("configs/quickstart.toml");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let mut command = Command::new(&kiln);
        command
            .args(["train", "--config"])
            .arg(&config)
            .current_dir(&runs);
        ours.push(timed(command).context("kiln train failed")?);
        if let Some(python) = &python {
            let mut command = Command::new(python);
            command.arg(root.join("xtask/scripts/bench_torch_quickstart.py"));
            theirs.push(timed(command).context("the PyTorch quickstart failed")?);
        }
        println!("round {round} of {rounds} done");
    }
    let _ = std::fs::remove_dir_all(&runs);

    let seconds = |runs: &[Timing], f: fn(&Timing) -> f64| {
        runs.iter()
            .map(|t| format!("{:.1}", f(t)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut table = format!(
        "The quickstart on {}, {rounds} rounds:\n\n\
         | | epochs (s) | whole process (s) |\n|---|---:|---:|\n",
        machine(),
    );
    for (name, runs) in [("kiln", &ours), ("PyTorch", &theirs)] {
        if !runs.is_empty() {
            table += &format!(
                "| {name} | {} | {} |\n",
                seconds(runs, Timing::epoch_sum),
                seconds(runs, |t| t.whole)
            );
        }
    }
    if !theirs.is_empty() {
        table += &format!(
            "\nkiln / PyTorch (medians, speed): {:.2}x on the epochs, {:.2}x for the whole process\n",
            median(&theirs, Timing::epoch_sum) / median(&ours, Timing::epoch_sum),
            median(&theirs, |t| t.whole) / median(&ours, |t| t.whole),
        );
    }
    write_table(root, "quickstart.md", &table)
}

pub fn cifar(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args, &["--rounds", "--batches", "--images", "--epochs"])?;
    let rounds = options.number("--rounds", 2)?;
    let images = options.number("--images", 1280)?;
    let epochs = options.number("--epochs", 2)?;
    let batches: Vec<usize> = match options.value("--batches") {
        None => vec![32, 128],
        Some(list) => (list.split(','))
            .map(|b| b.trim().parse().context("--batches takes numbers: 32,128"))
            .collect::<anyhow::Result<_>>()?,
    };
    if images == 0 || epochs == 0 || batches.contains(&0) {
        bail!("--images, --epochs and --batches must be at least 1");
    }
    let kiln = crate::build_kiln(root, &[])?;
    let python = torch_python(root);
    let data = root.join("target/bench/cifar10");
    write_random_cifar10(&data, images, images.div_ceil(5))?;
    let config = root.join("configs/cifar10-resnet18-sgd.toml");
    let workers = 4; // the config's `data.workers`, which PyTorch's DataLoader is given too
    let runs = root.join("target/bench/train-runs");

    // Per batch size: kiln's and PyTorch's last-epoch images/s, one per round.
    let mut rates: Vec<(usize, Vec<f64>, Vec<f64>)> =
        batches.iter().map(|&b| (b, vec![], vec![])).collect();
    for round in 1..=rounds {
        for (batch, ours, theirs) in &mut rates {
            let _ = std::fs::remove_dir_all(&runs);
            std::fs::create_dir_all(&runs)?;
            let mut command = Command::new(&kiln);
            command
                .args(["train", "--config"])
                .arg(&config)
                .args(["--backend", "flex"])
                .args(["--set", &format!("epochs={epochs}")])
                .args(["--set", &format!("batch_size={batch}")])
                .args(["--set", &format!("data.source.root={}", data.display())])
                .args(["--set", "data.source.download=false"])
                .args(["--set", &format!("data.workers={workers}")])
                .current_dir(&runs);
            timed(command).context("kiln train failed")?;
            ours.push(kiln_last_epoch_rate(&runs)?);
            if let Some(python) = &python {
                let mut command = Command::new(python);
                command
                    .arg(root.join("xtask/scripts/bench_torch_train.py"))
                    .arg("--root")
                    .arg(&data)
                    .args(["--batch", &batch.to_string()])
                    .args(["--epochs", &epochs.to_string()])
                    .args(["--workers", &workers.to_string()]);
                let timing = timed(command).context("the PyTorch training failed")?;
                theirs.push(
                    timing
                        .last_rate
                        .context("no img/s in PyTorch's epoch line")?,
                );
            }
            println!(
                "round {round} of {rounds}, batch {batch}: kiln {:.1} img/s{}",
                ours.last().unwrap_or(&0.0),
                (theirs.last()).map_or(String::new(), |r| format!(", PyTorch {r:.1} img/s"))
            );
        }
    }
    let _ = std::fs::remove_dir_all(&runs);

    let list = |values: &[f64]| {
        (values.iter())
            .map(|v| format!("{v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut table = format!(
        "`kiln train --config configs/cifar10-resnet18-sgd.toml` (ResNet-18, CIFAR stem, 32x32, \
         random crop and flip, {workers} loader workers) on flex against the same training in \
         PyTorch {}, {images} training and {} validation images, epoch {epochs} of {epochs}, \
         {rounds} rounds, on {}; training images per second over the epoch (validation included):\n\n\
         | batch | kiln img/s | PyTorch img/s | kiln / PyTorch |\n|---:|---:|---:|---:|\n",
        torch_version(python.as_deref()),
        images.div_ceil(5),
        machine(),
    );
    for (batch, ours, theirs) in &rates {
        let ratio = match theirs.is_empty() {
            true => "".into(),
            false => format!("{:.2}x", median(ours, |&r| r) / median(theirs, |&r| r)),
        };
        table += &format!(
            "| {batch} | {} | {} | {ratio} |\n",
            list(ours),
            list(theirs)
        );
    }
    table += "\n(ratio: medians)\n";
    write_table(root, "train.md", &table)
}

/// Flags with a value each, from those allowed.
struct Options(Vec<(String, String)>);

impl Options {
    fn parse(args: &[String], allowed: &[&str]) -> anyhow::Result<Self> {
        let mut pairs = Vec::new();
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            if !allowed.contains(&flag.as_str()) {
                bail!(
                    "unknown option {flag}: this bench takes {}",
                    allowed.join(", ")
                );
            }
            let value = rest
                .next()
                .with_context(|| format!("{flag} needs a value"))?;
            pairs.push((flag.clone(), value.clone()));
        }
        Ok(Self(pairs))
    }

    fn value(&self, flag: &str) -> Option<&str> {
        (self.0.iter().rev())
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, flag: &str, default: usize) -> anyhow::Result<usize> {
        self.value(flag).map_or(Ok(default), |v| {
            v.parse().with_context(|| format!("{flag} takes a number"))
        })
    }
}

/// The Python to run PyTorch's side with, if torch and torchvision import there.
fn torch_python(root: &Path) -> Option<std::path::PathBuf> {
    let python = crate::python(root);
    if crate::torch_importable(&python) {
        return Some(python);
    }
    println!(
        "torch is not importable from {}: kiln's figures only",
        python.display()
    );
    None
}

fn torch_version(python: Option<&Path>) -> String {
    let version = python.and_then(|python| {
        let out = (Command::new(python))
            .args(["-c", "import torch; print(torch.__version__)"])
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    version.unwrap_or_else(|| "(not run)".into())
}

fn write_table(root: &Path, name: &str, table: &str) -> anyhow::Result<()> {
    print!("\n{table}");
    let out = root.join("target/bench").join(name);
    std::fs::write(&out, table)?;
    println!("written to {}", out.display());
    Ok(())
}

fn median<T>(values: &[T], f: fn(&T) -> f64) -> f64 {
    let mut values: Vec<f64> = values.iter().map(f).collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Random images in CIFAR-10's binary format (`cifar-10-batches-bin`: five training files, a
/// test file, the class names), labels cycling over the ten classes.
fn write_random_cifar10(root: &Path, train: usize, test: usize) -> anyhow::Result<()> {
    const CLASSES: [&str; 10] = [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ];
    let dir = root.join("cifar-10-batches-bin");
    std::fs::create_dir_all(&dir)?;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(0);
    let mut records = |count: usize| -> Vec<u8> {
        let mut bytes = vec![0u8; count * 3073];
        for (i, record) in bytes.chunks_exact_mut(3073).enumerate() {
            record[0] = (i % CLASSES.len()) as u8;
            rng.fill(&mut record[1..]);
        }
        bytes
    };
    // The training images split over the five files as evenly as they go.
    for file in 0..5 {
        let count = train / 5 + usize::from(file < train % 5);
        std::fs::write(
            dir.join(format!("data_batch_{}.bin", file + 1)),
            records(count),
        )?;
    }
    std::fs::write(dir.join("test_batch.bin"), records(test))?;
    std::fs::write(dir.join("batches.meta.txt"), CLASSES.join("\n") + "\n")?;
    Ok(())
}

/// The last epoch's training images per second from the one run directory that kiln made in
/// `cwd` (`runs/NAME-TIME/metrics.jsonl`, at full precision).
fn kiln_last_epoch_rate(cwd: &Path) -> anyhow::Result<f64> {
    let runs = cwd.join("runs");
    let run = (std::fs::read_dir(&runs)?)
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.join("metrics.jsonl").is_file())
        .with_context(|| format!("no run directory with metrics.jsonl in {}", runs.display()))?;
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    let last = (metrics.lines().rev())
        .find(|line| !line.trim().is_empty())
        .context("metrics.jsonl is empty")?;
    let summary: serde_json::Value = serde_json::from_str(last)?;
    summary["images_per_s"]
        .as_f64()
        .context("metrics.jsonl's last line has no images_per_s")
}

struct Timing {
    /// Each epoch line's seconds.
    epochs: Vec<f64>,
    /// The last epoch line's images per second, where it gives them.
    last_rate: Option<f64>,
    /// The process, start to exit.
    whole: f64,
}

impl Timing {
    fn epoch_sum(&self) -> f64 {
        self.epochs.iter().sum()
    }
}

fn timed(mut command: Command) -> anyhow::Result<Timing> {
    let start = Instant::now();
    let output = command.output().context("cannot start it")?;
    let whole = start.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!(
            "{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // kiln writes its progress, epoch lines included, to stderr; the scripts print to stdout.
    let output = [output.stdout, output.stderr].concat();
    let output = String::from_utf8_lossy(&output);
    let lines: Vec<(f64, Option<f64>)> = output.lines().filter_map(epoch_figures).collect();
    if lines.is_empty() {
        bail!("no epoch lines in its output:\n{output}");
    }
    Ok(Timing {
        epochs: lines.iter().map(|(seconds, _)| *seconds).collect(),
        last_rate: lines.last().and_then(|(_, rate)| *rate),
        whole,
    })
}

/// The seconds and images per second in an epoch line, `epoch N: ..., 2.1 s, 728 img/s, ...`,
/// as kiln and the PyTorch scripts print them.
fn epoch_figures(line: &str) -> Option<(f64, Option<f64>)> {
    let (head, rest) = line.split_once(": ")?;
    head.strip_prefix("epoch ")?.parse::<usize>().ok()?;
    let fields = || rest.split(", ");
    let seconds = fields().find_map(|field| field.strip_suffix(" s")?.parse().ok())?;
    let rate = fields().find_map(|field| field.strip_suffix(" img/s")?.parse().ok());
    Some((seconds, rate))
}

/// The processor's name as Linux gives it, and the threads there are.
fn machine() -> String {
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "an unnamed CPU".into());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{name} ({threads} threads)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_lines_of_all_programs_give_their_figures() {
        let kiln = "epoch 3: train loss 0.0587 accuracy 98.33%, validation loss 0.0912 top-1 97.31% top-5 100.00%, 2.1 s, 728 img/s, peak memory 0.04 GiB";
        assert_eq!(epoch_figures(kiln), Some((2.1, Some(728.0))));
        assert_eq!(
            epoch_figures("epoch 1: validation top-1 93.94%, 0.94 s"),
            Some((0.94, None))
        );
        let torch = "epoch 2: train loss 2.3051, validation top-1 10.16%, 31.40 s, 40.8 img/s";
        assert_eq!(epoch_figures(torch), Some((31.4, Some(40.8))));
        assert_eq!(
            epoch_figures("[epoch 4, iteration 160] running loss 0.0246, 80 img/s"),
            None
        );
        assert_eq!(
            epoch_figures("checkpoint runs/x/checkpoints/epoch-0003"),
            None
        );
    }

    #[test]
    fn random_cifar10_is_what_kiln_data_reads() {
        let dir = std::env::temp_dir().join(format!("kiln-bench-cifar-{}", std::process::id()));
        write_random_cifar10(&dir, 23, 7).unwrap();
        let splits = kiln_data::cifar::open(kiln_data::cifar::Cifar::Cifar10, &dir, false);
        let _ = std::fs::remove_dir_all(&dir);
        let splits = splits.unwrap();
        use kiln_data::Dataset;
        assert_eq!((splits.train.len(), splits.test.len()), (23, 7));
        // Five files of 5, 5, 5, 4 and 4 images, labels counting on within each.
        assert_eq!(splits.train.label(7), 2);
        assert_eq!(splits.train.label(18), 3);
        assert_eq!(splits.train.label(19), 0);
        assert_eq!(splits.train.classes().len(), 10);
        assert_eq!(splits.test.image(6).unwrap().dimensions(), (32, 32));
    }
}
