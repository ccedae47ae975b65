//! What kiln does with each call of a CUDA library (a cuDNN convolution pass, a cuDNN batch
//! norm, a cuBLAS product) as a pure state machine per key, so that it is tested on any machine.
//!
//! The first call of a key waits for the library thread (it searches cuDNN's algorithms, or
//! checks that the call runs at all) so that a failure can still run burn's kernel instead.
//! From then on a key that ran is launched without waiting: the library call is queued on the
//! CUDA thread like one of cubecl's kernels, and the caller goes on. A key the library does not
//! support runs burn's kernel for good; a call that failed for a reason that may pass (memory
//! near full, a failed sync) runs burn's kernel for a while and is tried again, waiting longer
//! after each failure. A choice searched without its scratch memory is used but never kept on
//! disk, and searched again later.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

/// Why a library call did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The library has nothing for this key (cuDNN's `NOT_SUPPORTED` and `BAD_PARAM`, no
    /// algorithm the settings allow): not asked again in this process.
    Unsupported,
    /// It failed this time (memory, a failed sync, an execution failure): asked again later.
    Transient,
}

/// A call that did not run: why, in words for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub cause: Cause,
    pub why: String,
}

impl Failure {
    pub(crate) fn unsupported(why: impl Into<String>) -> Self {
        Self {
            cause: Cause::Unsupported,
            why: why.into(),
        }
    }

    pub(crate) fn transient(why: impl Into<String>) -> Self {
        Self {
            cause: Cause::Transient,
            why: why.into(),
        }
    }
}

/// The cause of a failed cuDNN 9 call from its `cudnnStatus_t`, read as a plain number (cuDNN 9
/// groups its codes by thousands; one this kiln does not know must not become an invalid enum).
pub(crate) fn cudnn_cause(status: u32) -> Cause {
    match status / 1000 {
        // NOT_INITIALIZED, a sub-library or version mismatch: it will not pass by trying again.
        1 => Cause::Unsupported,
        // BAD_PARAM_*, NOT_SUPPORTED_*: nothing for these shapes, types or pointers.
        2 | 3 => Cause::Unsupported,
        // INTERNAL_ERROR_* (host or device allocation, a kernel cuDNN failed to compile),
        // EXECUTION_FAILED_*, and anything newer.
        _ => Cause::Transient,
    }
}

/// Calls that run burn's kernel after a first transient failure before the next try; doubled
/// with each further failure, up to [`MOST_CALLS_BETWEEN_TRIES`].
const FIRST_CALLS_BETWEEN_TRIES: u32 = 8;
const MOST_CALLS_BETWEEN_TRIES: u32 = 1024;

/// The calls to wait before the next try after `failures` earlier failures in a row.
pub(crate) fn calls_before_retry(failures: u32) -> u32 {
    FIRST_CALLS_BETWEEN_TRIES
        .saturating_mul(1 << failures.min(16))
        .min(MOST_CALLS_BETWEEN_TRIES)
}

/// What is known of one key. `C` is what a call runs with: cuDNN's algorithm choice for a
/// convolution, nothing for a batch norm or a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State<C> {
    /// Ran in this process: launched without waiting from now on.
    Verified(C),
    /// Read from kiln's cache, not yet run in this process: the next call waits for it, to
    /// search again if it fails.
    Kept(C),
    /// Chosen by a search that ran without its scratch memory (perhaps a slower choice):
    /// launched without waiting, never kept on disk, searched again after `calls` more calls.
    Provisional {
        choice: C,
        calls: u32,
        failures: u32,
    },
    /// The library has nothing for this key: burn's kernel, always.
    Unsupported,
    /// The last try failed for a reason that may pass: burn's kernel for `calls` more calls,
    /// then a new try.
    Backoff { calls: u32, failures: u32 },
}

/// What one call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route<C> {
    /// Queue the library call with this choice and go on.
    Launch(C),
    /// Wait for the library thread: run the kept choice if there is one, else search (for a
    /// convolution) or simply run; burn's kernel where that fails.
    Wait { kept: Option<C> },
    /// Run burn's kernel.
    Burn,
}

/// The route of one call of a key in `state` (`None`: not seen yet), and the state it leaves
/// (counting down a wait).
pub(crate) fn route<C: Copy>(state: Option<State<C>>) -> (Route<C>, Option<State<C>>) {
    use State::*;
    match state {
        None => (Route::Wait { kept: None }, None),
        Some(Verified(choice)) => (Route::Launch(choice), state),
        Some(Kept(choice)) => (Route::Wait { kept: Some(choice) }, state),
        Some(Provisional { calls: 0, .. }) => (Route::Wait { kept: None }, state),
        Some(Provisional {
            choice,
            calls,
            failures,
        }) => (
            Route::Launch(choice),
            Some(Provisional {
                choice,
                calls: calls - 1,
                failures,
            }),
        ),
        Some(Unsupported) => (Route::Burn, state),
        Some(Backoff { calls: 0, .. }) => (Route::Wait { kept: None }, state),
        Some(Backoff { calls, failures }) => (
            Route::Burn,
            Some(Backoff {
                calls: calls - 1,
                failures,
            }),
        ),
    }
}

/// How a waited call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallOutcome<C> {
    /// It ran `choice`. `searched`: measured by this call (not a kept choice, and not a call
    /// without choices); `full_scratch`: the search had all the scratch memory it asked for.
    Ran {
        choice: C,
        searched: bool,
        full_scratch: bool,
    },
    /// It did not run; burn's kernel runs instead.
    Failed(Failure),
}

/// The state a waited call leaves behind, from the state it found and how it ended, and
/// whether its choice is to be kept on disk for later processes.
pub(crate) fn settle<C: Copy>(
    before: Option<State<C>>,
    outcome: &CallOutcome<C>,
) -> (State<C>, bool) {
    let failures_so_far = match before {
        Some(State::Backoff { failures, .. }) | Some(State::Provisional { failures, .. }) => {
            failures + 1
        }
        _ => 0,
    };
    match *outcome {
        CallOutcome::Ran {
            choice,
            searched,
            full_scratch,
        } => {
            if searched && !full_scratch {
                let failures = failures_so_far;
                let calls = calls_before_retry(failures);
                let state = State::Provisional {
                    choice,
                    calls,
                    failures,
                };
                (state, false)
            } else {
                (State::Verified(choice), searched)
            }
        }
        CallOutcome::Failed(Failure {
            cause: Cause::Unsupported,
            ..
        }) => (State::Unsupported, false),
        CallOutcome::Failed(Failure {
            cause: Cause::Transient,
            ..
        }) => {
            let failures = failures_so_far;
            let calls = calls_before_retry(failures);
            (State::Backoff { calls, failures }, false)
        }
    }
}

/// The state after a call launched without waiting failed on the library thread (its output is
/// lost: the failure is also reported on the stream, as a failed kernel launch is).
pub(crate) fn after_launch_failure<C>(failure: &Failure) -> State<C> {
    match failure.cause {
        Cause::Unsupported => State::Unsupported,
        Cause::Transient => State::Backoff {
            calls: calls_before_retry(0),
            failures: 0,
        },
    }
}

/// Lines already logged, so that each distinct failure (its cause and shape) is logged once.
#[derive(Debug, Default)]
pub(crate) struct Logged(HashSet<String>);

impl Logged {
    /// Whether `line` is new (and now remembered).
    pub(crate) fn first(&mut self, line: &str) -> bool {
        self.0.insert(line.to_owned())
    }
}

/// The state of every key met in this process: read by the threads that route calls, written by
/// them and by the library threads that report a failed launch. The lock is held only to read
/// or write a state, never across a library call.
#[derive(Debug)]
pub(crate) struct Keys<K, C> {
    states: Mutex<HashMap<K, State<C>>>,
    logged: Mutex<Logged>,
}

impl<K, C> Default for Keys<K, C> {
    fn default() -> Self {
        Self {
            states: Mutex::new(HashMap::new()),
            logged: Mutex::new(Logged::default()),
        }
    }
}

impl<K: Eq + Hash + Clone, C: Copy> Keys<K, C> {
    fn states(&self) -> std::sync::MutexGuard<'_, HashMap<K, State<C>>> {
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The route of one call of `key`.
    pub(crate) fn route(&self, key: &K) -> Route<C> {
        let mut states = self.states();
        let (route, next) = route(states.get(key).copied());
        if let Some(next) = next {
            states.insert(key.clone(), next);
        }
        route
    }

    /// Records how a waited call of `key` ended; whether its choice is to be kept on disk.
    pub(crate) fn settle(&self, key: &K, outcome: &CallOutcome<C>) -> bool {
        let mut states = self.states();
        let (next, keep) = settle(states.get(key).copied(), outcome);
        states.insert(key.clone(), next);
        keep
    }

    /// Records that a call of `key` launched without waiting failed.
    pub(crate) fn launch_failed(&self, key: &K, failure: &Failure) {
        self.states()
            .insert(key.clone(), after_launch_failure(failure));
    }

    /// Whether `key` has a state.
    pub(crate) fn knows(&self, key: &K) -> bool {
        self.states().contains_key(key)
    }

    /// Adds a choice read from kiln's cache for a key not met yet.
    pub(crate) fn add_kept(&self, key: K, choice: C) {
        self.states().entry(key).or_insert(State::Kept(choice));
    }

    /// Whether `line` is logged for the first time.
    pub(crate) fn first_report(&self, line: &str) -> bool {
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        logged.first(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type S = State<u8>;

    /// Runs `calls` calls from `state`, settling each waited call with `outcome`; the routes taken.
    fn calls(
        mut state: Option<S>,
        calls: usize,
        outcome: impl Fn() -> CallOutcome<u8>,
    ) -> (Vec<Route<u8>>, Option<S>) {
        let mut routes = Vec::new();
        for _ in 0..calls {
            let (route, next) = route(state);
            state = next;
            if let Route::Wait { .. } = route {
                state = Some(settle(state, &outcome()).0);
            }
            routes.push(route);
        }
        (routes, state)
    }

    fn ran(choice: u8, searched: bool, full_scratch: bool) -> CallOutcome<u8> {
        CallOutcome::Ran {
            choice,
            searched,
            full_scratch,
        }
    }

    #[test]
    fn only_the_first_call_of_a_key_waits() {
        let (routes, state) = calls(None, 4, || ran(3, true, true));
        assert_eq!(routes[0], Route::Wait { kept: None });
        assert!(
            routes[1..].iter().all(|r| *r == Route::Launch(3)),
            "{routes:?}"
        );
        assert_eq!(state, Some(State::Verified(3)));
        assert_eq!(
            settle(None, &ran(3, true, true)),
            (State::Verified(3), true)
        );
    }

    #[test]
    fn a_kept_choice_waits_once_and_is_not_written_again() {
        let kept = Some(State::Kept(5));
        assert_eq!(route(kept).0, Route::Wait { kept: Some(5) });
        assert_eq!(
            settle(kept, &ran(5, false, true)),
            (State::Verified(5), false)
        );
        // Failed and searched again: the new choice is written.
        assert_eq!(
            settle(kept, &ran(2, true, true)),
            (State::Verified(2), true)
        );
    }

    #[test]
    fn an_unsupported_key_runs_burns_kernel_for_good() {
        let failed = || CallOutcome::Failed(Failure::unsupported("NOT_SUPPORTED"));
        let (routes, state) = calls(None, 50, failed);
        assert_eq!(routes[0], Route::Wait { kept: None });
        assert!(routes[1..].iter().all(|r| *r == Route::Burn));
        assert_eq!(state, Some(State::Unsupported));
    }

    #[test]
    fn a_transient_failure_is_tried_again_later_and_less_often() {
        let failed = || CallOutcome::Failed(Failure::transient("ALLOC_FAILED"));
        let (routes, _) = calls(None, 200, failed);
        let waits: Vec<usize> = routes
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Route::Wait { .. }))
            .map(|(i, _)| i)
            .collect();
        // Tried at once, then after 8 calls of burn's kernel, then 16, then 32, ...
        assert_eq!(waits, vec![0, 9, 26, 59, 124]);
        assert!(routes.iter().all(|r| !matches!(r, Route::Launch(_))));
        assert_eq!(calls_before_retry(40), 1024, "the wait stops growing");
    }

    #[test]
    fn a_try_that_passes_after_failures_is_launched_from_then_on() {
        let mut failures = 2;
        let outcome = move || {
            failures -= 1;
            if failures >= 0 {
                CallOutcome::Failed(Failure::transient("a failed sync"))
            } else {
                ran(7, true, true)
            }
        };
        let mut outcome = outcome;
        let mut state = None;
        let mut launched = 0;
        for _ in 0..60 {
            let (r, next) = route(state);
            state = next;
            match r {
                Route::Wait { .. } => state = Some(settle(state, &outcome()).0),
                Route::Launch(7) => launched += 1,
                _ => {}
            }
        }
        assert_eq!(state, Some(State::Verified(7)));
        assert!(launched > 30, "{launched}");
    }

    #[test]
    fn a_choice_searched_without_its_scratch_is_used_but_not_kept() {
        let (state, keep) = settle(None, &ran(4, true, false));
        assert!(!keep, "never written to the file");
        assert_eq!(
            state,
            State::Provisional {
                choice: 4,
                calls: 8,
                failures: 0
            }
        );
        // Launched while it lasts, then searched again; with its scratch this time, it is kept.
        let mut now = Some(state);
        let mut routes = Vec::new();
        for _ in 0..9 {
            let (taken, next) = route(now);
            routes.push(taken);
            now = next;
        }
        assert!(routes[..8].iter().all(|r| *r == Route::Launch(4)));
        assert_eq!(routes[8], Route::Wait { kept: None });
        let (state, keep) = settle(
            Some(State::Provisional {
                choice: 4,
                calls: 0,
                failures: 0,
            }),
            &ran(1, true, true),
        );
        assert_eq!((state, keep), (State::Verified(1), true));
        // Still short of memory: provisional again, for longer.
        let again = settle(
            Some(State::Provisional {
                choice: 4,
                calls: 0,
                failures: 0,
            }),
            &ran(4, true, false),
        );
        assert_eq!(
            again,
            (
                State::Provisional {
                    choice: 4,
                    calls: 16,
                    failures: 1
                },
                false
            )
        );
    }

    #[test]
    fn a_failed_launch_stops_launching() {
        let unsupported = after_launch_failure::<u8>(&Failure::unsupported("x"));
        assert_eq!(unsupported, State::Unsupported);
        let transient = after_launch_failure::<u8>(&Failure::transient("x"));
        assert_eq!(route(Some(transient)).0, Route::Burn);
    }

    #[test]
    fn cudnn_9_statuses_by_cause() {
        // cuDNN 9's values (cudnn_graph.h): grouped by thousands.
        for unsupported in [1001, 1008, 2000, 2002, 2003, 3000, 3002, 3010] {
            assert_eq!(
                cudnn_cause(unsupported),
                Cause::Unsupported,
                "{unsupported}"
            );
        }
        for transient in [4000, 4001, 4003, 4004, 5000, 5001, 6000, 9999] {
            assert_eq!(cudnn_cause(transient), Cause::Transient, "{transient}");
        }
    }

    #[test]
    fn each_distinct_failure_is_logged_once() {
        let mut logged = Logged::default();
        assert!(logged.first("forward [8, 64, 32, 32]: ALLOC_FAILED"));
        assert!(!logged.first("forward [8, 64, 32, 32]: ALLOC_FAILED"));
        assert!(logged.first("forward [8, 64, 16, 16]: ALLOC_FAILED"));
        assert!(logged.first("forward [8, 64, 32, 32]: NOT_SUPPORTED"));
    }

    #[test]
    fn keys_route_each_key_on_its_own() {
        let keys = Keys::<&str, u8>::default();
        assert_eq!(keys.route(&"a"), Route::Wait { kept: None });
        assert!(
            keys.settle(&"a", &ran(1, true, true)),
            "a measured choice is kept"
        );
        assert_eq!(keys.route(&"a"), Route::Launch(1));
        keys.add_kept("b", 2);
        keys.add_kept("a", 9);
        assert_eq!(
            keys.route(&"a"),
            Route::Launch(1),
            "a kept choice never replaces one met"
        );
        assert_eq!(keys.route(&"b"), Route::Wait { kept: Some(2) });
        assert!(!keys.settle(&"b", &ran(2, false, true)));
        assert_eq!(keys.route(&"b"), Route::Launch(2));
        keys.launch_failed(&"b", &Failure::transient("ALLOC_FAILED"));
        assert_eq!(keys.route(&"b"), Route::Burn);
        assert!(!keys.knows(&"c"));
        assert!(keys.first_report("x") && !keys.first_report("x"));
    }
}
