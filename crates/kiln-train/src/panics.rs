//! Panics from burn's runtimes as errors. The GPU runtimes panic when an allocation fails; the
//! engine runs its work under [`catch_out_of_memory`], which turns such a panic into a value
//! that can be explained with a batch size that fits, and lets every other panic go on. A
//! capability probe runs under [`quietly`], which catches every panic.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How many [`catch_out_of_memory`]s are running, on any thread: while there is one, a panic
/// hook can leave out-of-memory panics to it (see [`will_be_caught`]).
static CATCHING: AtomicUsize = AtomicUsize::new(0);

/// How many [`quietly`]s are running: while there is one, every panic is caught.
static QUIET: AtomicUsize = AtomicUsize::new(0);

/// The last out-of-memory panic seen on a GPU runtime's thread while a
/// [`catch_out_of_memory`] was running.
static RUNTIME_OUT_OF_MEMORY: Mutex<Option<String>> = Mutex::new(None);

/// Set once this process is one machine of a multi-machine run.
static IN_CLUSTER: AtomicBool = AtomicBool::new(false);

/// The first panic on the multi-machine network's threads: how burn-collective shows a
/// machine that left the run (its connection reset, `PeerLost`).
static NETWORK_FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// The prefix of the threads kiln runs model replicas on.
pub const REPLICA_THREAD: &str = "kiln-replica-";

/// Whether kiln itself turns a panic on this thread into an error.
pub fn is_handled_thread(name: &str) -> bool {
    name.starts_with(REPLICA_THREAD)
}

/// Whether this is one of cubecl's device threads, which swallow panics.
pub fn is_runtime_thread(name: &str) -> bool {
    name.starts_with("DSU-") || name.starts_with("DSD-")
}

/// Marks this process as one machine of a multi-machine run (see [`is_network_thread`]).
pub fn joined_cluster() {
    IN_CLUSTER.store(true, Ordering::SeqCst);
}

/// Whether a panic on thread `name` is the multi-machine network's: burn-collective's tokio
/// threads panic when a peer's connection breaks, and kiln reports that as the all-reduce's
/// error instead (see [`network_failure`]).
pub fn is_network_thread(name: &str) -> bool {
    IN_CLUSTER.load(Ordering::SeqCst) && name.starts_with("tokio-")
}

/// Remembers the first panic's first line on the network's threads.
pub fn record_network_panic(first_line: &str) {
    let mut failure = NETWORK_FAILURE.lock().unwrap_or_else(|e| e.into_inner());
    failure.get_or_insert_with(|| first_line.to_string());
}

/// Why the network of a multi-machine run failed, if it did.
pub fn network_failure() -> Option<String> {
    NETWORK_FAILURE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Remembers a caught panic's first line if it is an out-of-memory one (see the module doc).
pub fn record_runtime_panic(first_line: &str) {
    if CATCHING.load(Ordering::SeqCst) > 0 && is_out_of_memory(first_line) {
        *RUNTIME_OUT_OF_MEMORY
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(first_line.to_string());
    }
}

/// An allocation that failed on the device, with the runtime's words.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemory {
    pub message: String,
}

/// Runs `work`; an out-of-memory panic inside it becomes `Err`, any other panic unwinds on.
pub fn catch_out_of_memory<T>(work: impl FnOnce() -> T) -> Result<T, OutOfMemory> {
    CATCHING.fetch_add(1, Ordering::SeqCst);
    let result = catch_unwind(AssertUnwindSafe(work));
    CATCHING.fetch_sub(1, Ordering::SeqCst);
    match result {
        Ok(value) => Ok(value),
        Err(payload) => {
            let recorded = RUNTIME_OUT_OF_MEMORY
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            match message(payload.as_ref()) {
                Some(text) if is_out_of_memory(&text) => Err(OutOfMemory {
                    message: text.lines().next().unwrap_or_default().to_string(),
                }),
                _ => match recorded {
                    Some(message) => Err(OutOfMemory { message }),
                    None => resume_unwind(payload),
                },
            }
        }
    }
}

/// Runs `probe`; any panic inside becomes `Err` with its first line, unreported by the hook.
pub fn quietly<T>(probe: impl FnOnce() -> T) -> Result<T, String> {
    QUIET.fetch_add(1, Ordering::SeqCst);
    let result = catch_unwind(AssertUnwindSafe(probe));
    QUIET.fetch_sub(1, Ordering::SeqCst);
    result.map_err(|payload| {
        let text = message(payload.as_ref()).unwrap_or_else(|| "no message".into());
        text.lines().next().unwrap_or_default().to_string()
    })
}

/// Whether a panic with this payload will be turned into an error by a running
/// [`catch_out_of_memory`] or [`quietly`], so that a panic hook need not report it.
pub fn will_be_caught(payload: &(dyn Any + Send)) -> bool {
    QUIET.load(Ordering::SeqCst) > 0
        || CATCHING.load(Ordering::SeqCst) > 0
            && message(payload).is_some_and(|m| is_out_of_memory(&m))
}

/// The panic hook of kiln's programs: the binary installs it first thing, and an example or a
/// test that trains may too, to report as the binary does. A panic that kiln turns into an
/// error (a device out of memory, a capability probe, a replica's thread, a machine that left
/// the run) is recorded for that error instead of printed. Any other prints one line naming
/// its thread (`RUST_BACKTRACE` set: the default report instead); one on a GPU runtime's
/// thread ends the process, since cubecl only logs it there and whoever waits for that thread's
/// answer would wait forever.
pub fn install_hook() {
    let backtrace = std::env::var_os("RUST_BACKTRACE").is_some();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let first_line = first_line(info.payload());
        if will_be_caught(info.payload()) || is_handled_thread(name) {
            record_runtime_panic(&first_line);
            return;
        }
        if is_network_thread(name) {
            record_network_panic(&first_line);
            return;
        }
        let runtime = is_runtime_thread(name);
        if backtrace {
            default(info);
        } else if runtime {
            eprintln!(
                "error: the GPU runtime failed in thread '{name}': {first_line}; kiln cannot go on and ends the run here (RUST_LOG=debug shows more)"
            );
        } else {
            eprintln!(
                "error: kiln stopped unexpectedly in thread '{name}': {first_line}; this is a bug, please report it (RUST_BACKTRACE=1 shows where)"
            );
        }
        if runtime {
            std::process::exit(1);
        }
    }));
}

/// The first non-empty line of a panic's message (cubecl's begin with a newline).
pub fn first_line(payload: &(dyn Any + Send)) -> String {
    let message = message(payload).unwrap_or_else(|| "unknown cause".to_string());
    message
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("no message")
        .to_string()
}

/// The text of a panic.
pub(crate) fn message(payload: &(dyn Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}

/// How cubecl (CUDA, wgpu), the CUDA driver and wgpu word a failed allocation.
pub(crate) fn is_out_of_memory(text: &str) -> bool {
    let text = text.to_lowercase();
    [
        "out of memory",
        "out-of-memory",
        "outofmemory",
        "out_of_memory",
    ]
    .iter()
    .any(|words| text.contains(words))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_memory_panic_becomes_an_error() {
        let caught = catch_out_of_memory(|| -> u32 {
            panic!(
                "An out-of-memory error happened during launch\nCaused by:\n  cannot allocate 4 GiB"
            )
        });
        assert_eq!(
            caught,
            Err(OutOfMemory {
                message: "An out-of-memory error happened during launch".into()
            })
        );
        assert_eq!(catch_out_of_memory(|| 7), Ok(7));
        assert_eq!(
            quietly(|| -> u32 { panic!("no bf16\nhere") }),
            Err("no bf16".into())
        );
    }

    #[test]
    fn other_panics_go_on() {
        let outer =
            std::panic::catch_unwind(|| catch_out_of_memory(|| panic!("index out of bounds")));
        assert!(outer.is_err());
    }
}
