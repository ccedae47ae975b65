//! What `kiln compare` found, as data: each backend's stage diffs against the reference and its
//! runs against PyTorch's, and the verdict over them. The verdict lives here, beside the
//! tolerances and bounds it applies, so that the binary only prints it and xtask or a test can
//! read the same report (`kiln compare --json`) without deciding again what counts as agreeing.

use serde::Serialize;

use crate::compare::StageDiff;
use crate::trajectory::RunDiff;

/// What happened to one backend.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome<T> {
    Compared(T),
    /// Not compiled in, or no device: a failure unless missing backends are allowed.
    Skipped(String),
    /// The backend started and then failed.
    Failed(String),
}

impl<T> Outcome<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Compared(t) => Outcome::Compared(f(t)),
            Outcome::Skipped(why) => Outcome::Skipped(why),
            Outcome::Failed(why) => Outcome::Failed(why),
        }
    }
}

/// One backend's outcome, named.
#[derive(Debug, Serialize)]
pub struct BackendResult<T> {
    pub backend: String,
    pub result: Outcome<T>,
}

/// A whole comparison: the one-step comparison of every backend with the reference, then (where
/// asked) every backend's runs against PyTorch's.
#[derive(Debug, Serialize)]
pub struct CompareReport {
    pub reference: String,
    /// Every backend but the reference, against it; empty without one to compare.
    pub backends: Vec<BackendResult<Vec<StageDiff>>>,
    /// Every backend that ran above (the reference included), against PyTorch's runs.
    pub trajectories: Vec<BackendResult<Vec<RunDiff>>>,
}

/// The comparison's verdict, the first of these that holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A backend's stage beyond its tolerance, or a backend that failed to run.
    Disagree,
    /// A backend's run beyond PyTorch's bounds, or one that failed to train.
    Strayed,
    /// These backends could not run, and missing backends are not allowed.
    Missing(Vec<String>),
    /// Everything that ran agreed (missing backends allowed).
    Agree,
}

impl CompareReport {
    /// The verdict; `allow_missing` accepts backends that could not run here.
    pub fn verdict(&self, allow_missing: bool) -> Verdict {
        let missing = self.missing();
        if self.disagrees() {
            Verdict::Disagree
        } else if self.strayed() {
            Verdict::Strayed
        } else if !missing.is_empty() && !allow_missing {
            Verdict::Missing(missing)
        } else {
            Verdict::Agree
        }
    }

    /// Whether a backend disagrees with the reference beyond tolerance, or failed.
    pub fn disagrees(&self) -> bool {
        self.backends.iter().any(|b| match &b.result {
            Outcome::Compared(diffs) => diffs.iter().any(|d| !d.passed),
            Outcome::Failed(_) => true,
            Outcome::Skipped(_) => false,
        })
    }

    /// Whether a backend strayed from PyTorch's runs beyond their bounds, or failed.
    pub fn strayed(&self) -> bool {
        self.trajectories.iter().any(|b| match &b.result {
            Outcome::Compared(diffs) => diffs.iter().any(|d| !d.passed()),
            Outcome::Failed(_) => true,
            Outcome::Skipped(_) => false,
        })
    }

    /// The backends that could not run for the one-step comparison (not compiled in, no
    /// device); the runs against PyTorch's leave them out.
    pub fn missing(&self) -> Vec<String> {
        (self.backends.iter())
            .filter(|b| matches!(b.result, Outcome::Skipped(_)))
            .map(|b| b.backend.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Stage;
    use crate::trajectory::Worst;

    fn stage(passed: bool) -> StageDiff {
        StageDiff {
            stage: Stage::Loss,
            max_abs: 0.0,
            max_rel: 0.0,
            worst: String::new(),
            tolerance: 1e-5,
            passed,
        }
    }

    fn run(error: f64) -> RunDiff {
        RunDiff {
            run: "resnet18_sgd".into(),
            schedule: 0.0,
            losses: Worst {
                at: "step 1".into(),
                error,
                bound: 1e-6,
                pytorch: 0.0,
            },
            parameters: Default::default(),
            buffers: Default::default(),
            counters_exact: true,
        }
    }

    fn named<T>(backend: &str, result: Outcome<T>) -> BackendResult<T> {
        BackendResult {
            backend: backend.into(),
            result,
        }
    }

    fn report(
        backends: Vec<BackendResult<Vec<StageDiff>>>,
        trajectories: Vec<BackendResult<Vec<RunDiff>>>,
    ) -> CompareReport {
        CompareReport {
            reference: "flex".into(),
            backends,
            trajectories,
        }
    }

    #[test]
    fn the_verdict_is_disagreement_then_straying_then_missing_backends() {
        let agree = named("ndarray", Outcome::Compared(vec![stage(true)]));
        let disagree = named(
            "ndarray",
            Outcome::Compared(vec![stage(true), stage(false)]),
        );
        let missing = || named("metal", Outcome::Skipped("not compiled in".into()));
        let followed = || named("flex", Outcome::Compared(vec![run(1e-7)]));
        let strayed = || named("flex", Outcome::Compared(vec![run(1e-3)]));

        let all_well = report(vec![agree], vec![followed()]);
        assert_eq!(all_well.verdict(false), Verdict::Agree);
        let one_off = report(vec![disagree, missing()], vec![strayed()]);
        assert_eq!(one_off.verdict(true), Verdict::Disagree);
        let lost = report(vec![missing()], vec![strayed()]);
        assert_eq!(lost.verdict(false), Verdict::Strayed);
        let absent = report(vec![missing()], vec![followed()]);
        assert_eq!(
            absent.verdict(false),
            Verdict::Missing(vec!["metal".into()])
        );
        assert_eq!(absent.verdict(true), Verdict::Agree);
        let failed = report(vec![named("wgpu", Outcome::Failed("panic".into()))], vec![]);
        assert_eq!(failed.verdict(true), Verdict::Disagree);
        let untrained = report(vec![], vec![named("wgpu", Outcome::Failed("panic".into()))]);
        assert_eq!(untrained.verdict(true), Verdict::Strayed);
    }

    #[test]
    fn cuda_is_held_to_tensor_core_tolerances_and_the_rest_to_float32() {
        use crate::compare::Tolerances;
        use kiln_backend::Backend;
        let gradients = |b| Tolerances::for_backend(b).get(Stage::Gradients);
        assert_eq!(gradients(Backend::Cuda), 5e-2);
        for backend in [
            Backend::Flex,
            Backend::NdArray,
            Backend::Wgpu,
            Backend::Metal,
        ] {
            assert_eq!(gradients(backend), 1e-3, "{backend}");
        }
    }

    /// `kiln compare --json`'s shape, which xtask and the tests read.
    #[test]
    fn the_report_serializes_as_compare_json() {
        let report = report(
            vec![named("ndarray", Outcome::Compared(vec![stage(true)]))],
            vec![named("flex", Outcome::Skipped("no device".into()))],
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["reference"], "flex");
        assert_eq!(json["backends"][0]["backend"], "ndarray");
        assert_eq!(
            json["backends"][0]["result"]["compared"][0]["stage"],
            "loss"
        );
        assert_eq!(json["trajectories"][0]["result"]["skipped"], "no device");
    }
}
