//! Running the `kiln` binary as a user does, for the end-to-end tests.

use std::process::{Command, Output};

/// Runs `kiln` with `args` from the project root.
pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the kiln binary runs")
}

/// The lines on standard error.
pub fn errors(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(String::from)
        .collect()
}
