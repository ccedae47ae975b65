//! `cargo xtask` as a user meets it. (Also makes README's test command build xtask's binary, so
//! that `cargo xtask ...` afterwards compiles nothing: `tests/cli.rs` at the root checks.)

use std::path::Path;
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
        for chore in [
            "lint",
            "fixtures",
            "compare",
            "bench",
            "gpu-check",
            "patches",
        ] {
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

/// `cargo xtask patches` on a copy of one vendored crate (burn-optim, against the published
/// burn-optim in cargo's registry cache): it passes as committed, and fails on a one-line change
/// to a file that KILN.md's diff does not touch, and on one to a file that it does.
#[test]
fn patches_fails_on_a_one_line_change_to_a_vendored_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("burn-optim");
    copy_tree(&root.join("patches/burn-optim"), &copy);
    let folder = dir.path().to_str().unwrap();
    let output = xtask(&["patches", "--dir", folder]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (file, from, to) in [
        ("src/optim/sgd.rs", "use super::", "use  super::"),
        (
            "src/optim/adam.rs",
            "fn bias_correction",
            "fn bias_correction_",
        ),
    ] {
        let path = copy.join(file);
        let original = std::fs::read_to_string(&path).unwrap();
        assert!(original.contains(from), "{file} has no {from:?}");
        std::fs::write(&path, original.replacen(from, to, 1)).unwrap();
        let output = xtask(&["patches", "--dir", folder]);
        let errors = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{file}: {errors}");
        assert!(
            errors.contains(&format!("{file} differs from the published crate")),
            "{file}: {errors}"
        );
        assert!(errors.contains("cargo xtask patches --write"), "{errors}");
        std::fs::write(&path, original).unwrap();
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.unwrap();
        let target = to.join(entry.path().strip_prefix(from).unwrap());
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(target).unwrap();
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
