//! The run directory `runs/<name>-<timestamp>/`: the resolved config, metrics as JSON lines and
//! CSV, SVG plots refreshed every epoch, checkpoints, the final model and a summary. Every
//! step's loss (`iterations.csv`) is kept by `iterations`.

use std::path::{Path, PathBuf};

use crate::confusion::{Confusion, heat_map};
use crate::epoch::EpochSummary;
use crate::figures::Figures;
use crate::write_atomically;
use kiln_config::config::{ConfigError, TrainConfig};

#[derive(Debug)]
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    /// Creates `runs_dir/<name>-<timestamp>` for `config`'s run. The loop records the config
    /// there once it is settled ([`RunDir::record_config`]).
    pub fn create(runs_dir: &Path, config: &TrainConfig) -> std::io::Result<Self> {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        let safe_name: String = config
            .name
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        std::fs::create_dir_all(runs_dir)?;
        // Claimed with one `create_dir`, which only one process can win: the processes of a
        // launched run start in the same second and may share `runs_dir`.
        let mut path = runs_dir.join(format!("{safe_name}-{stamp}"));
        for n in 2.. {
            match std::fs::create_dir(&path) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    path = runs_dir.join(format!("{safe_name}-{stamp}-{n}"));
                }
                Err(e) => return Err(e),
            }
        }
        std::fs::create_dir_all(path.join("checkpoints"))?;
        Ok(Self { path })
    }

    /// Writes the config the run trains with, as settled for its devices.
    pub fn record_config(&self, config: &TrainConfig) -> std::io::Result<()> {
        write_atomically(&self.config_path(), config.to_toml().as_bytes())
    }

    /// An existing run directory, for `--resume`.
    pub fn open(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
        }
    }

    /// Whether nothing but the config has been written: no metrics, no checkpoint.
    pub fn is_empty(&self) -> bool {
        !self.path.join("metrics.jsonl").exists()
            && std::fs::read_dir(self.checkpoints()).map_or(true, |mut d| d.next().is_none())
    }

    /// Removes the directory if nothing but the config was written, so that a new run that
    /// failed before recording anything (a bad data path, a missing driver) leaves no empty
    /// run behind. Whether it did.
    pub fn remove_if_empty(&self) -> bool {
        self.is_empty() && std::fs::remove_dir_all(&self.path).is_ok()
    }

    pub fn config_path(&self) -> PathBuf {
        self.path.join("config.toml")
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.path.join("checkpoints")
    }

    pub fn model_path(&self) -> PathBuf {
        self.path.join("model.safetensors")
    }

    /// The class names in the model's output order, one per line (`kiln predict --classes`
    /// and `kiln export` read it).
    pub fn classes_path(&self) -> PathBuf {
        self.path.join("classes.txt")
    }

    pub fn write_classes(&self, names: &[String]) -> std::io::Result<()> {
        write_atomically(&self.classes_path(), (names.join("\n") + "\n").as_bytes())
    }

    /// The class names `write_classes` wrote.
    pub fn classes(&self) -> std::io::Result<Vec<String>> {
        let text = std::fs::read_to_string(self.classes_path())?;
        Ok(text.lines().map(String::from).collect())
    }

    /// The epoch summaries recorded so far.
    pub fn history(&self) -> Vec<EpochSummary> {
        std::fs::read_to_string(self.path.join("metrics.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Rewrites the metrics to hold exactly `history`: the epochs a resumed run keeps.
    pub fn write_history(&self, history: &[EpochSummary]) -> std::io::Result<()> {
        let mut jsonl = Vec::new();
        for summary in history {
            serde_json::to_writer(&mut jsonl, summary)?;
            jsonl.push(b'\n');
        }
        write_atomically(&self.path.join("metrics.jsonl"), &jsonl)?;
        let mut csv = String::from(
            "epoch,iteration,lr,train_loss,train_accuracy,val_loss,val_top1,val_top5,seconds,images_per_s,skipped_images,peak_memory_bytes,grad_norm_mean,grad_norm_max,ema_val_loss,ema_val_top1,ema_val_top5,val_macro_f1\n",
        );
        let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
        for s in history {
            csv += &format!(
                "{},{},{},{},{},{},{},{},{:.3},{:.1},{},{},{},{},{},{},{},{}\n",
                s.epoch,
                s.iteration,
                s.lr,
                s.train_loss,
                s.train_accuracy,
                opt(s.val_loss),
                opt(s.val_top1),
                opt(s.val_top5),
                s.seconds,
                s.images_per_s,
                s.skipped_images,
                s.peak_memory_bytes
                    .map(|b| b.to_string())
                    .unwrap_or_default(),
                opt(s.grad_norm_mean),
                opt(s.grad_norm_max),
                opt(s.ema_val_loss),
                opt(s.ema_val_top1),
                opt(s.ema_val_top5),
                opt(s.val_macro_f1),
            );
        }
        write_atomically(&self.path.join("metrics.csv"), csv.as_bytes())
    }

    /// `loss.svg`, `accuracy.svg` and `lr.svg`.
    pub fn write_plots(&self, figures: &Figures) -> std::io::Result<()> {
        for (file, svg) in [
            ("loss.svg", &figures.loss),
            ("accuracy.svg", &figures.accuracy),
            ("lr.svg", &figures.lr),
        ] {
            write_atomically(&self.path.join(file), svg.as_bytes())?;
        }
        Ok(())
    }

    /// The last epoch's `mistakes.csv` (see `mistakes`), and where it is the best epoch so
    /// far, the same in `best/`.
    pub fn write_mistakes(&self, csv: &str, best: bool) -> std::io::Result<()> {
        write_atomically(&self.path.join("mistakes.csv"), csv.as_bytes())?;
        if best {
            std::fs::create_dir_all(self.path.join("best"))?;
            write_atomically(&self.path.join("best/mistakes.csv"), csv.as_bytes())?;
        }
        Ok(())
    }

    /// The per-class results of the epoch just validated: `confusion.csv`, `per_class.csv` and
    /// `confusion.svg`, and where it is the best epoch so far, the same in `best/`.
    pub fn write_per_class(
        &self,
        confusion: &Confusion,
        names: &[String],
        epoch: usize,
        best: bool,
    ) -> std::io::Result<()> {
        let mut places = vec![self.path.clone()];
        if best {
            places.push(self.path.join("best"));
        }
        for dir in places {
            std::fs::create_dir_all(&dir)?;
            write_atomically(&dir.join("confusion.csv"), confusion.csv(names).as_bytes())?;
            write_atomically(
                &dir.join("per_class.csv"),
                confusion.per_class_csv(names).as_bytes(),
            )?;
            // A convenience like the other plots: the CSV files are the record.
            let title = format!("validation, epoch {epoch}");
            let _ = heat_map(&dir.join("confusion.svg"), confusion, names, &title);
        }
        Ok(())
    }

    /// A few lines for people: where things are and how the run ended.
    pub fn write_summary(&self, text: &str) -> std::io::Result<()> {
        write_atomically(&self.path.join("summary.txt"), text.as_bytes())
    }
}

/// Where `kiln train` starts: a new run directory for a config file or a config built in code,
/// or a stopped run to resume.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    New { config: &'a Path },
    Built { config: &'a TrainConfig },
    Resume { run: &'a Path },
}

/// A run ready to train: its config (with the overrides), its directory, and whether it
/// resumes from the directory's latest checkpoint.
#[derive(Debug)]
pub struct OpenRun {
    pub config: TrainConfig,
    pub run: RunDir,
    pub resume: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenRunError {
    #[error("{} is not a kiln run directory (it has no config.toml)", .0.display())]
    NotARun(PathBuf),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("creating a run directory in {}", runs.display())]
    Create {
        runs: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Opens the run `start` names with `overrides` applied: a new directory under the config's
/// `logging.runs_dir`, or an existing one, whose recorded config the
/// overrides may change only where the saved position keeps its meaning
/// ([`TrainConfig::check_resume_change`]).
pub fn open_run(start: Start<'_>, overrides: &[String]) -> Result<OpenRun, OpenRunError> {
    let config = match start {
        Start::Resume { run: dir } => {
            let run = RunDir::open(dir);
            if !run.config_path().is_file() {
                return Err(OpenRunError::NotARun(dir.to_path_buf()));
            }
            let config = TrainConfig::load(&run.config_path(), overrides)?;
            config.check_resume_change(&TrainConfig::load(&run.config_path(), &[])?)?;
            return Ok(OpenRun {
                config,
                run,
                resume: true,
            });
        }
        Start::New { config: path } => TrainConfig::load(path, overrides)?,
        Start::Built { config } if overrides.is_empty() => config.clone(),
        Start::Built { config } => {
            TrainConfig::parse(&config.to_toml(), Path::new("(built config)"), overrides)?
        }
    };
    let runs = &config.logging.runs_dir;
    let run = RunDir::create(runs, &config).map_err(|source| OpenRunError::Create {
        runs: runs.clone(),
        source,
    })?;
    Ok(OpenRun {
        config,
        run,
        resume: false,
    })
}

/// What `kiln eval` evaluates: a run's model (or other weights) with the run's config, or
/// weights with a config.
#[derive(Debug, Clone, Copy)]
pub enum EvalSource<'a> {
    Run {
        run: &'a Path,
        weights: Option<&'a Path>,
    },
    Config {
        config: &'a Path,
        weights: &'a Path,
    },
}

/// The config (with `overrides`) and the weights that `source` names; a run's weights are its
/// final model unless others are given.
pub fn eval_inputs(
    source: EvalSource<'_>,
    overrides: &[String],
) -> Result<(TrainConfig, PathBuf), ConfigError> {
    match source {
        EvalSource::Run { run, weights } => {
            let run = RunDir::open(run);
            let config = TrainConfig::load(&run.config_path(), overrides)?;
            Ok((
                config,
                weights.map_or_else(|| run.model_path(), Path::to_path_buf),
            ))
        }
        EvalSource::Config { config, weights } => {
            Ok((TrainConfig::load(config, overrides)?, weights.to_path_buf()))
        }
    }
}

/// The text of `summary.txt`; `ending` says why the run ended early, if it did.
pub fn summary_text(
    config: &TrainConfig,
    run: &RunDir,
    last: Option<&EpochSummary>,
    model: &Path,
    ending: Option<&str>,
) -> String {
    let mut text = format!(
        "run {} ({}: {}, {} epochs, batch {})\n",
        run.path.display(),
        config.name,
        config.model.name,
        config.epochs,
        config.batch_size
    );
    if let Some(s) = last {
        // Under mixup and CutMix an image has two labels; accuracy counts the heavier one.
        let counted = match config.mixup {
            Some(_) => " (against each mixed image's dominant label)",
            None => "",
        };
        text += &format!(
            "final train loss {:.4}, accuracy {:.2}%{counted}\n",
            s.train_loss,
            s.train_accuracy * 100.0
        );
        if let (Some(loss), Some(top1), Some(top5)) = (s.val_loss, s.val_top1, s.val_top5) {
            text += &format!(
                "final validation loss {loss:.4}, top-1 {:.2}%, top-5 {:.2}%\n",
                top1 * 100.0,
                top5 * 100.0
            );
        }
    }
    if let Some(ending) = ending {
        text += &format!("{ending}\n");
    }
    text += &format!(
        "model: {} (torchvision names)\nmetrics: metrics.jsonl, metrics.csv, iterations.csv (every step); plots: loss.svg, accuracy.svg, lr.svg; all of it on one page: report.html\nper class (last epoch; best epoch in best/): confusion.csv, per_class.csv, confusion.svg, mistakes.csv\ncheckpoints: checkpoints/\n",
        model.display()
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config whose runs go under `runs`.
    fn config_in(dir: &Path, runs: &Path) -> PathBuf {
        let path = dir.join("run.toml");
        let text = format!(
            "name = \"t\"\nepochs = 1\nbatch_size = 4\n[data]\nsource = {{ kind = \"digits\" }}\n\
             [optimizer]\nname = \"sgd\"\nlr = 0.1\n[logging]\nruns_dir = {:?}\n",
            runs.display().to_string()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_new_run_gets_a_directory_and_a_resumed_one_keeps_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let file = config_in(dir.path(), &runs);
        let overrides = ["epochs=3".to_string()];
        let new = open_run(Start::New { config: &file }, &overrides).unwrap();
        assert!(!new.resume);
        // The loop records the config once it is settled; until then the folder is empty.
        assert!(new.run.path.starts_with(&runs) && !new.run.config_path().exists());
        assert_eq!(new.config.epochs, 3);
        new.run.record_config(&new.config).unwrap();

        let resumed = open_run(Start::Resume { run: &new.run.path }, &[]).unwrap();
        assert!(resumed.resume);
        assert_eq!(
            (resumed.run.path, resumed.config.epochs),
            (new.run.path.clone(), 3)
        );
        let more = ["epochs=5".to_string()];
        let longer = open_run(Start::Resume { run: &new.run.path }, &more).unwrap();
        assert_eq!(longer.config.epochs, 5);
        let moved = ["seed=9".to_string()];
        let err = open_run(Start::Resume { run: &new.run.path }, &moved).unwrap_err();
        assert!(err.to_string().contains("--set seed:"), "{err}");

        let err = open_run(Start::Resume { run: dir.path() }, &[]).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("is not a kiln run directory (it has no config.toml)"),
            "{err}"
        );
    }

    /// A config built in code starts a run as a file's does, `--set` included.
    #[test]
    fn a_built_config_starts_a_run_with_the_overrides_applied() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let file = config_in(dir.path(), &runs);
        let built = TrainConfig::load(&file, &[]).unwrap();
        let start = Start::Built { config: &built };
        let new = open_run(start, &["epochs=4".to_string()]).unwrap();
        assert!(!new.resume && new.run.path.starts_with(&runs));
        assert_eq!((new.config.epochs, built.epochs), (4, 1));
        let plain = open_run(start, &[]).unwrap();
        assert_eq!(plain.config, built);
    }

    #[test]
    fn a_run_directory_is_removed_only_while_nothing_but_its_config_is_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let file = config_in(dir.path(), &runs);
        let empty = open_run(Start::New { config: &file }, &[]).unwrap().run;
        assert!(empty.remove_if_empty());
        assert!(!empty.path.exists());

        let used = open_run(Start::New { config: &file }, &[]).unwrap().run;
        std::fs::write(used.path.join("metrics.jsonl"), "{}\n").unwrap();
        assert!(!used.remove_if_empty());
        assert!(used.path.exists());
        let checkpointed = open_run(Start::New { config: &file }, &[]).unwrap().run;
        std::fs::create_dir(checkpointed.checkpoints().join("epoch-1")).unwrap();
        assert!(!checkpointed.remove_if_empty());
    }

    #[test]
    fn eval_takes_a_runs_config_and_model_or_the_weights_given() {
        let dir = tempfile::tempdir().unwrap();
        let file = config_in(dir.path(), &dir.path().join("runs"));
        let new = open_run(Start::New { config: &file }, &[]).unwrap();
        new.run.record_config(&new.config).unwrap();
        let run = new.run;
        let source = EvalSource::Run {
            run: &run.path,
            weights: None,
        };
        let (config, weights) = eval_inputs(source, &["seed=3".to_string()]).unwrap();
        assert_eq!((config.seed, weights), (3, run.model_path()));
        let other = dir.path().join("w.pth");
        let source = EvalSource::Run {
            run: &run.path,
            weights: Some(&other),
        };
        assert_eq!(eval_inputs(source, &[]).unwrap().1, other);
        let source = EvalSource::Config {
            config: &file,
            weights: &other,
        };
        let (config, weights) = eval_inputs(source, &[]).unwrap();
        assert_eq!((config.name.as_str(), weights), ("t", other));
    }
}
