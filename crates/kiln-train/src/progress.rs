//! Watching a run: a progress bar per epoch on a terminal (loss, learning rate, images/s, ETA),
//! plain lines elsewhere; running-loss lines every `print_every` iterations and at the first;
//! an epoch summary. On a GPU, a notice that kernels are being compiled, and a ticker every
//! 15 s until the first step ends, so that a long first compile never looks like a hang.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::events::{Event, Observer};
use kiln_config::plan;
use kiln_records::epoch::EpochSummary;

/// How often the ticker speaks while the first step runs.
const FIRST_STEP_TICK: Duration = Duration::from_secs(15);

const GIB: f64 = (1u64 << 30) as f64;

pub struct Console {
    print_every: usize,
    bar: Option<ProgressBar>,
    terminal: bool,
    /// Model replicas of the run, for the images/s per device.
    replicas: usize,
    /// Images since the last running-loss line.
    window_images: usize,
    /// Whether the device compiles kernels on first use (CUDA, wgpu).
    compiles_kernels: bool,
    ticker: Option<FirstStepTicker>,
    /// Lines about the device to show when the run starts (no cuDNN on CUDA, ...).
    notes: Vec<String>,
    /// The devices as people know them, shown when the run starts.
    device: Option<String>,
}

/// A thread that says every 15 s that the first step is still running.
struct FirstStepTicker {
    stopped: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl FirstStepTicker {
    fn start() -> Self {
        let stopped = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stopped.clone();
        let start = Instant::now();
        let thread = std::thread::Builder::new()
            .name("kiln-first-step".into())
            .spawn(move || {
                let (lock, wake) = &*flag;
                let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !*done {
                    let (guard, timeout) = wake
                        .wait_timeout(done, FIRST_STEP_TICK)
                        .unwrap_or_else(|e| e.into_inner());
                    done = guard;
                    if !*done && timeout.timed_out() {
                        eprintln!(
                            "still compiling and tuning GPU kernels for the first step ({} s so far)",
                            start.elapsed().as_secs()
                        );
                    }
                }
            })
            .ok();
        Self { stopped, thread }
    }
}

impl Drop for FirstStepTicker {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stopped;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Default for Console {
    fn default() -> Self {
        Self::new()
    }
}

impl Console {
    /// Bars when standard error is a terminal, lines otherwise. What it shows of the devices
    /// and how often it shows the loss come with the run's [`Event::Opened`].
    pub fn new() -> Self {
        Self {
            print_every: 1,
            bar: None,
            terminal: std::io::stderr().is_terminal(),
            replicas: 1,
            window_images: 0,
            compiles_kernels: false,
            ticker: None,
            notes: Vec::new(),
            device: None,
        }
    }

    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn bar_for(&mut self, epoch: usize, epochs: usize, batches: usize) -> &ProgressBar {
        self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::new(batches as u64);
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ETA {eta}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(format!("epoch {}/{}", epoch + 1, epochs));
            bar
        })
    }
}

impl Console {
    fn started(
        &mut self,
        run_dir: &Path,
        train_images: usize,
        val_images: Option<usize>,
        iterations_per_epoch: usize,
        resumed_from: Option<&Path>,
    ) {
        for note in std::mem::take(&mut self.notes) {
            self.line(format!("note: {note}"));
        }
        if let Some(from) = resumed_from {
            self.line(format!("resuming from {}", from.display()));
        }
        if let Some(device) = &self.device {
            self.line(format!("device: {device}"));
        }
        let val = val_images.map_or("no validation set".into(), |n| {
            format!("{n} validation images")
        });
        let devices = match self.replicas {
            1 => String::new(),
            n => format!(" on {n} devices"),
        };
        self.line(format!(
            "training{devices} on {train_images} images ({iterations_per_epoch} iterations an epoch), {val}; run directory {}",
            run_dir.display()
        ));
    }

    fn planned(
        &self,
        batch_size: usize,
        auto: Option<plan::AutoBatch>,
        per_device: usize,
        estimate_bytes: Option<u64>,
        budget: Option<plan::MemoryBudget>,
    ) {
        let batch = match auto {
            Some(_) => format!("batch_size \"auto\": {batch_size}"),
            None => format!("batch_size {batch_size}"),
        };
        let share = match per_device == batch_size {
            true => String::new(),
            false => format!(" ({per_device} per device)"),
        };
        let estimate = estimate_bytes.map_or(String::new(), |bytes| {
            format!("; about {} of memory per device", plan::bytes(bytes))
        });
        let budget = budget.map_or(String::new(), |b| {
            format!(" ({}{})", plan::bytes(b.bytes), b.source)
        });
        self.line(format!("{batch}{share}{estimate}{budget}"));
        if let Some(auto) = auto {
            self.line(format!("batch_size \"auto\" chose {batch_size}: {auto}"));
        }
    }

    fn first_step(&mut self) {
        if self.compiles_kernels {
            self.line(
                "compiling GPU kernels (the first run on this device takes longer; later runs reuse them)"
                    .into(),
            );
            self.ticker = Some(FirstStepTicker::start());
        }
    }

    /// The epoch's bar, on a terminal: where the epoch is and, when read, the loss.
    fn show_on_bar(
        &mut self,
        epoch: usize,
        epochs: usize,
        batch: usize,
        batches: usize,
        lr: f64,
        loss: Option<crate::Reading>,
    ) {
        let bar = self.bar_for(epoch, epochs, batches);
        bar.set_position(batch as u64);
        if let Some(reading) = loss {
            bar.set_message(format!("loss {:.4} lr {lr:.2e}", reading.loss));
        }
    }

    /// A loss read from the device: the first step's line, then one every `print_every`.
    fn reading(&mut self, epoch: usize, iteration: usize, lr: f64, reading: crate::Reading) {
        self.ticker = None;
        let rate = self.window_images as f64 / reading.seconds.max(1e-9);
        self.window_images = 0;
        if iteration == 1 {
            let compiling = match self.compiles_kernels {
                true => ", kernel compilation included",
                false => "",
            };
            self.line(format!(
                "[epoch {}, iteration 1] loss {:.4}, lr {lr:.3e}; the first step took {:.1} s{compiling}",
                epoch + 1,
                reading.loss,
                reading.seconds
            ));
        } else if iteration.is_multiple_of(self.print_every) {
            self.line(format!(
                "[epoch {}, iteration {iteration}] running loss {:.4}, lr {lr:.3e}, {rate:.0} img/s",
                epoch + 1,
                reading.loss
            ));
        }
    }

    fn epoch(&mut self, summary: &EpochSummary) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let val = match (summary.val_loss, summary.val_top1, summary.val_top5) {
            (Some(loss), Some(top1), Some(top5)) => format!(
                ", validation loss {loss:.4} top-1 {:.2}% top-5 {:.2}%",
                top1 * 100.0,
                top5 * 100.0
            ),
            _ => String::new(),
        };
        let skipped = match summary.skipped_images {
            0 => String::new(),
            n => format!(", {n} images skipped"),
        };
        let memory = summary
            .peak_memory_bytes
            .map(|b| format!(", peak memory {:.2} GiB", b as f64 / GIB))
            .unwrap_or_default();
        let ema = match (summary.ema_val_loss, summary.ema_val_top1) {
            (Some(loss), Some(top1)) => {
                format!(", EMA loss {loss:.4} top-1 {:.2}%", top1 * 100.0)
            }
            _ => String::new(),
        };
        let grad_norm = match (summary.grad_norm_mean, summary.grad_norm_max) {
            (Some(mean), Some(max)) => {
                format!(", gradient norm mean {mean:.3} max {max:.3}")
            }
            _ => String::new(),
        };
        let per_device = match self.replicas {
            1 => String::new(),
            n => format!(" ({:.0} per device)", summary.images_per_s / n as f64),
        };
        self.line(format!(
            "epoch {}: train loss {:.4} accuracy {:.2}%{val}{ema}{grad_norm}, {:.1} s, {:.0} img/s{per_device}{memory}{skipped}",
            summary.epoch,
            summary.train_loss,
            summary.train_accuracy * 100.0,
            summary.seconds,
            summary.images_per_s
        ));
    }

    fn stopped(&mut self, checkpoint: &Path) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
        let run = checkpoint
            .parent()
            .and_then(|p| p.parent())
            .unwrap_or(checkpoint);
        self.line(format!(
            "stopped; checkpoint written to {}. Resume with: kiln train --resume {}",
            checkpoint.display(),
            run.display()
        ));
    }
}

/// One small function per kind of event, each printing what it always printed.
impl Observer for Console {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Opened {
                device,
                notes,
                compiles_kernels,
                print_every,
            } => {
                self.device = Some(device.to_string());
                self.notes = notes.to_vec();
                self.compiles_kernels = compiles_kernels;
                self.print_every = print_every.max(1);
            }
            Event::Started {
                run_dir,
                train_images,
                val_images,
                iterations_per_epoch,
                replicas,
                resumed_from,
            } => {
                self.replicas = replicas;
                let (images, per_epoch) = (train_images, iterations_per_epoch);
                self.started(run_dir, images, val_images, per_epoch, resumed_from);
            }
            Event::Planned {
                batch_size,
                auto,
                per_device,
                estimate_bytes,
                budget,
            } => self.planned(batch_size, auto, per_device, estimate_bytes, budget),
            Event::FirstStep => self.first_step(),
            Event::Iteration {
                epoch,
                epochs,
                batch,
                batches,
                iteration,
                lr,
                images,
                loss,
            } => {
                self.window_images += images;
                if self.terminal {
                    self.show_on_bar(epoch, epochs, batch, batches, lr, loss);
                }
                if let Some(reading) = loss {
                    self.reading(epoch, iteration, lr, reading);
                }
            }
            Event::Skipped(error) => self.line(format!("warning: skipped an image: {error}")),
            Event::Epoch(summary) => self.epoch(summary),
            Event::Checkpoint(path) => self.line(format!("checkpoint {}", path.display())),
            Event::CheckpointSkipped { path, reason } => self.line(format!(
                "warning: checkpoint {} is damaged ({reason}); resuming from an earlier one",
                path.display()
            )),
            Event::StoppedEarly(stop) => self.line(stop.to_string()),
            Event::Stopped(path) => self.stopped(path),
            Event::Finished { model } => {
                self.line(format!("finished; model written to {}", model.display()))
            }
        }
    }
}
