//! `cargo xtask` as a user meets it. (Also makes README's test command build xtask's binary, so
//! that `cargo xtask ...` afterwards compiles nothing: `tests/cli.rs` at the root checks.)

use std::process::{Command, Output};

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn without_a_chore_it_fails_with_the_list_of_chores() {
    for args in [&[][..], &["polish"]] {
        let output = xtask(args);
        assert!(!output.status.success());
        let errors = String::from_utf8_lossy(&output.stderr);
        for chore in ["lint", "fixtures", "compare", "bench", "gpu-check"] {
            assert!(errors.contains(chore), "{args:?}: {errors}");
        }
    }
}

#[test]
fn compare_with_a_missing_binary_says_to_build_it() {
    let output = xtask(&["compare", "--kiln", "/nonexistent/kiln"]);
    assert!(!output.status.success());
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains("/nonexistent/kiln: no such file; build it first"),
        "{errors}"
    );
}
