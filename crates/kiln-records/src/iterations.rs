//! `iterations.csv`: every optimizer step's training loss and learning rate, for the loss plot
//! per iteration. Rows are per step, not per console reading, so that the file does not depend
//! on when the device was read: a run stopped or killed and resumed writes the same rows as an
//! uninterrupted one. On resume, the rows past the checkpoint (written before a kill) are cut.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::write_atomically;

const HEADER: &str = "iteration,epoch,loss,lr\n";

/// One optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLoss {
    /// Counted from 1.
    pub iteration: usize,
    /// Where the step ends, in epochs (iteration 24 of 24 an epoch is 1.0).
    pub epoch: f64,
    /// The mean loss over the step's images.
    pub loss: f64,
    /// The learning rate the step was taken with.
    pub lr: f64,
}

impl StepLoss {
    fn row(&self) -> String {
        format!(
            "{},{:.4},{},{}\n",
            self.iteration, self.epoch, self.loss, self.lr
        )
    }

    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split(',');
        let step = Self {
            iteration: fields.next()?.parse().ok()?,
            epoch: fields.next()?.parse().ok()?,
            loss: fields.next()?.parse().ok()?,
            lr: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(step)
    }
}

/// The rows of `iterations.csv` at `path` (none where there is no file); a line that does not
/// parse (cut short by a kill) ends them.
pub fn read(path: &Path) -> Vec<StepLoss> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().skip(1).map_while(StepLoss::parse).collect()
}

/// The open file, and its rows so far for the plots.
pub struct IterationLog {
    path: PathBuf,
    file: File,
    rows: Vec<StepLoss>,
}

impl IterationLog {
    /// Starts the file at `path`, or for a run resumed at iteration `resume_at`, keeps its rows
    /// up to that iteration.
    pub fn open(path: &Path, resume_at: Option<usize>) -> std::io::Result<Self> {
        let rows: Vec<StepLoss> = match resume_at {
            Some(at) => (read(path).into_iter())
                .take_while(|s| s.iteration <= at)
                .collect(),
            None => Vec::new(),
        };
        let mut text = String::from(HEADER);
        for step in &rows {
            text += &step.row();
        }
        write_atomically(path, text.as_bytes())?;
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            rows,
        })
    }

    /// Appends steps (to the system's buffers: a killed process loses none of them).
    pub fn append(&mut self, steps: &[StepLoss]) -> std::io::Result<()> {
        let text: String = steps.iter().map(StepLoss::row).collect();
        self.file.write_all(text.as_bytes())?;
        self.rows.extend_from_slice(steps);
        Ok(())
    }

    /// Puts the rows on disk, as a checkpoint is written: a power cut then loses none that
    /// the checkpoint resumes after.
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    pub fn rows(&self) -> &[StepLoss] {
        &self.rows
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(iteration: usize) -> StepLoss {
        StepLoss {
            iteration,
            epoch: iteration as f64 / 4.0,
            loss: 1.0 / iteration as f64,
            lr: 1e-3,
        }
    }

    /// A kill leaves rows past the checkpoint and half a line; resuming at the checkpoint
    /// keeps exactly the rows up to it, and the run then writes what an uninterrupted one does.
    #[test]
    fn a_resumed_log_is_cut_back_to_its_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let whole = dir.path().join("whole.csv");
        let mut log = IterationLog::open(&whole, None).unwrap();
        log.append(&(1..=9).map(step).collect::<Vec<_>>()).unwrap();
        let expected = std::fs::read_to_string(&whole).unwrap();
        assert!(expected.starts_with("iteration,epoch,loss,lr\n1,0.2500,1,0.001\n"));

        let killed = dir.path().join("killed.csv");
        let mut log = IterationLog::open(&killed, None).unwrap();
        log.append(&(1..=7).map(step).collect::<Vec<_>>()).unwrap();
        drop(log);
        let mut file = OpenOptions::new().append(true).open(&killed).unwrap();
        file.write_all(b"8,2.00").unwrap();
        let mut log = IterationLog::open(&killed, Some(5)).unwrap();
        assert_eq!(log.rows(), (1..=5).map(step).collect::<Vec<_>>());
        log.append(&(6..=9).map(step).collect::<Vec<_>>()).unwrap();
        assert_eq!(std::fs::read_to_string(&killed).unwrap(), expected);
        assert_eq!(read(&killed), (1..=9).map(step).collect::<Vec<_>>());
        // A run resumed from a folder without the file starts one.
        let missing = dir.path().join("missing.csv");
        assert!(
            IterationLog::open(&missing, Some(3))
                .unwrap()
                .rows()
                .is_empty()
        );
    }
}
