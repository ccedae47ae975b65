//! Watching a run: a progress bar per epoch on a terminal (loss, learning rate, images/s, ETA),
//! plain lines elsewhere; running-loss lines every `print_every` iterations; an epoch summary.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::engine::{Event, Observer};
use crate::plan;

const GIB: f64 = (1u64 << 30) as f64;

pub struct Console {
    print_every: usize,
    bar: Option<ProgressBar>,
    terminal: bool,
    /// Model replicas of the run, for the images/s per device.
    replicas: usize,
    /// Loss summed over the iterations since the last running-loss line.
    window_loss: f64,
    window_steps: usize,
    window_images: usize,
    window_start: Instant,
}

impl Console {
    /// Bars when standard error is a terminal, lines otherwise.
    pub fn new(print_every: usize) -> Self {
        Self {
            print_every: print_every.max(1),
            bar: None,
            terminal: std::io::stderr().is_terminal(),
            replicas: 1,
            window_loss: 0.0,
            window_steps: 0,
            window_images: 0,
            window_start: Instant::now(),
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

impl Observer for Console {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Started {
                run_dir,
                train_images,
                val_images,
                iterations_per_epoch,
                replicas,
                resumed_from,
            } => {
                self.replicas = replicas;
                if let Some(from) = resumed_from {
                    self.line(format!("resuming from {}", from.display()));
                }
                let val = val_images.map_or("no validation set".into(), |n| {
                    format!("{n} validation images")
                });
                let devices = match replicas {
                    1 => String::new(),
                    n => format!(" on {n} devices"),
                };
                self.line(format!(
                    "training{devices} on {train_images} images ({iterations_per_epoch} iterations an epoch), {val}; run directory {}",
                    run_dir.display()
                ));
                self.window_start = Instant::now();
            }
            Event::Planned {
                batch_size,
                auto,
                per_device,
                estimate_bytes,
                budget,
            } => {
                let batch = match auto {
                    true => format!("batch_size \"auto\": {batch_size}"),
                    false => format!("batch_size {batch_size}"),
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
            }
            Event::Iteration {
                epoch,
                epochs,
                batch,
                batches,
                iteration,
                loss,
                lr,
                images,
            } => {
                self.window_loss += loss;
                self.window_steps += 1;
                self.window_images += images;
                let rate =
                    self.window_images as f64 / self.window_start.elapsed().as_secs_f64().max(1e-9);
                if self.terminal {
                    let bar = self.bar_for(epoch, epochs, batches);
                    bar.set_position(batch as u64);
                    bar.set_message(format!("loss {loss:.4} lr {lr:.2e} {rate:.0} img/s"));
                }
                if iteration % self.print_every == 0 {
                    let mean = self.window_loss / self.window_steps as f64;
                    self.line(format!(
                        "[epoch {}, iteration {iteration}] running loss {mean:.4}, lr {lr:.3e}, {rate:.0} img/s",
                        epoch + 1
                    ));
                    self.window_loss = 0.0;
                    self.window_steps = 0;
                    self.window_images = 0;
                    self.window_start = Instant::now();
                }
            }
            Event::Skipped(error) => self.line(format!("warning: skipped an image: {error}")),
            Event::Epoch(summary) => {
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
                let per_device = match self.replicas {
                    1 => String::new(),
                    n => format!(" ({:.0} per device)", summary.images_per_s / n as f64),
                };
                self.line(format!(
                    "epoch {}: train loss {:.4} accuracy {:.2}%{val}, {:.1} s, {:.0} img/s{per_device}{memory}{skipped}",
                    summary.epoch,
                    summary.train_loss,
                    summary.train_accuracy * 100.0,
                    summary.seconds,
                    summary.images_per_s
                ));
            }
            Event::Checkpoint(path) => self.line(format!("checkpoint {}", path.display())),
            Event::Stopped(path) => {
                if let Some(bar) = self.bar.take() {
                    bar.abandon();
                }
                let run = path.parent().and_then(|p| p.parent()).unwrap_or(path);
                self.line(format!(
                    "stopped; checkpoint written to {}. Resume with: kiln train --resume {}",
                    path.display(),
                    run.display()
                ));
            }
            Event::Finished { model } => {
                self.line(format!("finished; model written to {}", model.display()))
            }
        }
    }
}
