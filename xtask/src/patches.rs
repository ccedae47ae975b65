//! `cargo xtask patches [--write] [--dir DIR]`: every crate under `patches/` is the published
//! crate plus the diff its `KILN.md` shows, and nothing else.
//!
//! For each folder with a `Cargo.toml`, the published crate of the same name and version is
//! taken from cargo's registry cache (cargo downloads it there the first time, through a small
//! package in `target/xtask-patches/` that depends on all of them), the diff between the two
//! trees is made again, and each file's part is compared with the `## The diff` section of the
//! folder's `KILN.md`. Any difference is a failure naming the file. `--write` writes the diffs
//! made instead, for a change that is meant. A new patched crate is covered by adding its folder
//! and running `--write` once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The heading under which `KILN.md` holds the diff; the tool owns it to the end of the file.
const HEADING: &str = "## The diff";

/// Cargo's marker of a finished extraction, in the registry's copy (and in one vendored copy):
/// not part of a crate.
const CARGO_OK: &str = ".cargo-ok";

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut write = false;
    let mut dir = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--write" => write = true,
            "--dir" => dir = Some(PathBuf::from(args.next().context("--dir needs a folder")?)),
            other => bail!("patches: unknown option {other}; usage: patches [--write] [--dir DIR]"),
        }
    }
    let dir = dir.unwrap_or_else(|| root.join("patches"));
    let crates = vendored_crates(&dir)?;
    if dir == root.join("patches") {
        check_patch_table(root, &crates)?;
    }
    let published = published_sources(
        &root.join("target/xtask-patches"),
        &root.join("Cargo.lock"),
        &crates,
    )?;
    let mut failures = 0;
    for krate in &crates {
        let shown = krate.dir.strip_prefix(root).unwrap_or(&krate.dir).display();
        let source = &published[&(krate.name.clone(), krate.version.clone())];
        let kiln_md = krate.dir.join("KILN.md");
        if write {
            let diff = render(&tree_diff(source, &krate.dir)?);
            let text = std::fs::read_to_string(&kiln_md).unwrap_or_default();
            let updated = with_diff(&text, &diff);
            // Unchanged files keep their time: cargo rebuilds a patched crate (and everything
            // above it) when any file in its folder is newer than its last build.
            if updated == text {
                eprintln!("patches: {shown}/KILN.md already holds its diff");
                continue;
            }
            std::fs::write(&kiln_md, updated)
                .with_context(|| format!("cannot write {}", kiln_md.display()))?;
            eprintln!("patches: wrote {shown}/KILN.md");
            continue;
        }
        let problems = check_crate(source, &krate.dir)?;
        for problem in &problems {
            eprintln!("{shown}: {problem}");
        }
        if problems.is_empty() {
            eprintln!(
                "patches: {shown} is {} {} and its KILN.md's diff",
                krate.name, krate.version
            );
        }
        failures += problems.len();
    }
    if failures > 0 {
        bail!(
            "{failures} difference(s) between the vendored crates and their KILN.md diffs. If a \
             change is meant, run `cargo xtask patches --write` to record it and say why in the \
             crate's KILN.md"
        );
    }
    Ok(())
}

/// A patched copy of a published crate: its folder and the name and version it replaces.
#[derive(Debug, Clone)]
pub struct Vendored {
    pub dir: PathBuf,
    pub name: String,
    pub version: String,
}

/// Every folder under `dir` with a `Cargo.toml`, in name order.
fn vendored_crates(dir: &Path) -> anyhow::Result<Vec<Vendored>> {
    let mut crates = Vec::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        let manifest = path.join("Cargo.toml");
        if !manifest.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&manifest)
            .with_context(|| format!("cannot read {}", manifest.display()))?;
        let toml: toml::Table = text
            .parse()
            .with_context(|| format!("{} is not TOML", manifest.display()))?;
        let field = |key: &str| {
            toml.get("package")
                .and_then(|p| p.get(key))
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .with_context(|| format!("{} has no package.{key}", manifest.display()))
        };
        crates.push(Vendored {
            name: field("name")?,
            version: field("version")?,
            dir: path,
        });
    }
    crates.sort_by(|a, b| a.dir.cmp(&b.dir));
    Ok(crates)
}

/// Each folder in `patches/` is a `[patch.crates-io]` entry of the workspace, and each entry a
/// folder there, so that no copy lies unused and none is used unchecked.
fn check_patch_table(root: &Path, crates: &[Vendored]) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let manifest: toml::Table = text.parse().context("the workspace's Cargo.toml")?;
    let table = manifest
        .get("patch")
        .and_then(|p| p.get("crates-io"))
        .and_then(|t| t.as_table())
        .cloned()
        .unwrap_or_default();
    let patched: BTreeSet<PathBuf> = table
        .values()
        .filter_map(|entry| entry.get("path")?.as_str().map(|p| root.join(p)))
        .collect();
    let vendored: BTreeSet<PathBuf> = crates.iter().map(|c| c.dir.clone()).collect();
    if let Some(unused) = vendored.difference(&patched).next() {
        bail!(
            "{} is not in the workspace's [patch.crates-io]: add it there, or delete the folder",
            unused.display()
        );
    }
    if let Some(missing) = patched.difference(&vendored).next() {
        bail!(
            "[patch.crates-io] names {}, which has no Cargo.toml",
            missing.display()
        );
    }
    Ok(())
}

/// The published source folder of each crate, from cargo's registry cache. `work` gets a package
/// that depends on each published version (and a copy of `lock`, so that their dependencies
/// resolve to the versions kiln already has); `cargo metadata` downloads what the cache lacks
/// and says where each one lies.
pub fn published_sources(
    work: &Path,
    lock: &Path,
    crates: &[Vendored],
) -> anyhow::Result<BTreeMap<(String, String), PathBuf>> {
    std::fs::create_dir_all(work.join("src"))?;
    let mut manifest = String::from(
        "# Written by `cargo xtask patches`: the published crates that patches/ replaces.\n\
         [package]\nname = \"kiln-published-crates\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[lib]\npath = \"src/lib.rs\"\n\n[workspace]\n\n[dependencies]\n",
    );
    for krate in crates {
        writeln!(manifest, "{} = \"={}\"", krate.name, krate.version)?;
    }
    std::fs::write(work.join("Cargo.toml"), manifest)?;
    std::fs::write(work.join("src/lib.rs"), "")?;
    if !work.join("Cargo.lock").exists() && lock.exists() {
        std::fs::copy(lock, work.join("Cargo.lock"))?;
    }
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--filter-platform"])
        .arg(host_triple()?)
        .arg("--manifest-path")
        .arg(work.join("Cargo.toml"))
        .output()
        .context("cannot run cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata could not find the published crates (it downloads them into cargo's \
             registry cache the first time: is crates.io reachable?):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let mut found = BTreeMap::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let source = package["source"].as_str().unwrap_or_default();
        if !source.starts_with("registry+") {
            continue;
        }
        let key = (
            package["name"].as_str().unwrap_or_default().to_string(),
            package["version"].as_str().unwrap_or_default().to_string(),
        );
        if crates
            .iter()
            .any(|c| (c.name.clone(), c.version.clone()) == key)
        {
            let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap_or_default());
            found.insert(key, manifest.parent().unwrap().to_path_buf());
        }
    }
    for krate in crates {
        if !found.contains_key(&(krate.name.clone(), krate.version.clone())) {
            bail!(
                "cargo did not fetch {} {}: is it on crates.io?",
                krate.name,
                krate.version
            );
        }
    }
    Ok(found)
}

/// The host's target triple, so that `cargo metadata` downloads no other platform's crates.
fn host_triple() -> anyhow::Result<String> {
    let output = Command::new("rustc").arg("-vV").output()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV names no host")
}

/// What is wrong with `vendored` against `published` and its `KILN.md` (nothing: empty).
pub fn check_crate(published: &Path, vendored: &Path) -> anyhow::Result<Vec<String>> {
    let actual = tree_diff(published, vendored)?;
    let text = std::fs::read_to_string(vendored.join("KILN.md")).unwrap_or_default();
    let Some(recorded) = recorded_diff(&text) else {
        return Ok(vec![format!(
            "KILN.md has no `{HEADING}` section with a ```diff block: run `cargo xtask patches \
             --write`"
        )]);
    };
    let recorded = parse(recorded).context("KILN.md's diff")?;
    Ok(mismatches(&recorded, &actual))
}

/// One file's part of a diff: a unified diff of it, or `Only in a: PATH` for a file or folder
/// that the copy leaves out. Keyed by the file's path, with `/` between folders.
type Sections = BTreeMap<String, String>;

/// The diff from `published` (a) to `vendored` (b): changed and added files as unified diffs,
/// left-out ones as `Only in a:` (a left-out folder as one line), in path order.
fn tree_diff(published: &Path, vendored: &Path) -> anyhow::Result<Sections> {
    let a = files(published, &[CARGO_OK])?;
    let b = files(vendored, &[CARGO_OK, "KILN.md"])?;
    let mut sections = Sections::new();
    for path in a.union(&b) {
        match (a.contains(path), b.contains(path)) {
            (true, false) => {
                let gone = outermost_missing(vendored, path);
                sections.insert(gone.clone(), format!("Only in a: {gone}\n"));
            }
            (in_a, _) => {
                let old = if in_a {
                    read_text(&published.join(path))?
                } else {
                    String::new()
                };
                let new = read_text(&vendored.join(path))?;
                if old != new {
                    let from = if in_a {
                        format!("a/{path}")
                    } else {
                        "/dev/null".into()
                    };
                    let diff = similar::TextDiff::from_lines(&old, &new)
                        .unified_diff()
                        .context_radius(3)
                        .header(&from, &format!("b/{path}"))
                        .to_string();
                    sections.insert(path.clone(), diff);
                }
            }
        }
    }
    Ok(sections)
}

/// Every file under `root`, relative, with `/` between folders, less the top-level `skip`s.
fn files(root: &Path, skip: &[&str]) -> anyhow::Result<BTreeSet<String>> {
    let mut files = BTreeSet::new();
    for entry in walkdir::WalkDir::new(root).min_depth(1) {
        let entry = entry?;
        if entry.file_type().is_dir() {
            continue;
        }
        let relative = entry.path().strip_prefix(root)?;
        let path = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        if !skip.contains(&path.as_str()) {
            files.insert(path);
        }
    }
    Ok(files)
}

/// The shortest leading part of `path` that `root` lacks: a whole folder the copy leaves out
/// is one line, as `diff -r` says it.
fn outermost_missing(root: &Path, path: &str) -> String {
    let mut prefix = PathBuf::new();
    let mut parts = Vec::new();
    for part in path.split('/') {
        prefix.push(part);
        parts.push(part);
        if !root.join(&prefix).exists() {
            break;
        }
    }
    parts.join("/")
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| {
        anyhow::anyhow!(
            "{} is not UTF-8 text: kiln's patches change text files only",
            path.display()
        )
    })
}

fn render(sections: &Sections) -> String {
    sections.values().map(String::as_str).collect()
}

/// The text of the ```diff block under `## The diff`, if there is one.
fn recorded_diff(kiln_md: &str) -> Option<&str> {
    let start = section_start(kiln_md)?;
    let rest = &kiln_md[start..];
    let open = rest.find("\n```diff\n")? + "\n```diff\n".len();
    let body = &rest[open..];
    let close = if body.starts_with("```\n") || body == "```" {
        0
    } else {
        body.find("\n```")? + 1
    };
    Some(&body[..close])
}

/// Where `## The diff` begins, at the start of a line.
fn section_start(kiln_md: &str) -> Option<usize> {
    if kiln_md.starts_with(&format!("{HEADING}\n")) {
        return Some(0);
    }
    kiln_md.find(&format!("\n{HEADING}\n")).map(|i| i + 1)
}

/// `kiln_md` with its `## The diff` section (to the end of the file) replaced by `diff`.
fn with_diff(kiln_md: &str, diff: &str) -> String {
    let kept = match section_start(kiln_md) {
        Some(start) => &kiln_md[..start],
        None => kiln_md,
    };
    let mut text = kept.trim_end().to_string();
    if !text.is_empty() {
        text.push_str("\n\n");
    }
    text.push_str(HEADING);
    text.push_str(
        "\n\nThe whole difference from the published crate (a) to this copy (b), as `cargo xtask \
         patches --write`\nwrites it; `cargo xtask patches`, which CI runs, fails when the \
         sources differ from the published\ncrate in any other way. `Only in a:` is what the \
         copy leaves out.\n\n```diff\n",
    );
    text.push_str(diff);
    text.push_str("```\n");
    text
}

/// A diff as [`tree_diff`] writes it, split back into its files' parts. Hunks are read by the
/// line counts in their headers, so a changed line that itself starts with `---` stays inside.
fn parse(diff: &str) -> anyhow::Result<Sections> {
    let lines: Vec<&str> = diff.split_inclusive('\n').collect();
    let mut sections = Sections::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(path) = line.strip_prefix("Only in a: ") {
            sections.insert(path.trim_end().to_string(), line.to_string());
            i += 1;
            continue;
        }
        let (Some(_), Some(to)) = (
            line.strip_prefix("--- "),
            lines.get(i + 1).and_then(|l| l.strip_prefix("+++ ")),
        ) else {
            bail!(
                "line {}: expected `--- a/PATH` or `Only in a: PATH`: {line:?}",
                i + 1
            );
        };
        let path = to.trim_end().strip_prefix("b/").unwrap_or(to.trim_end());
        let start = i;
        i += 2;
        while let Some(header) = lines.get(i).filter(|l| l.starts_with("@@ ")) {
            let (mut old, mut new) = hunk_counts(header)
                .with_context(|| format!("line {}: a bad hunk header {header:?}", i + 1))?;
            i += 1;
            while old > 0 || new > 0 || lines.get(i).is_some_and(|l| l.starts_with('\\')) {
                let Some(body) = lines.get(i) else {
                    bail!("the hunk for {path} ends early");
                };
                match body.as_bytes().first() {
                    Some(b' ') => (old, new) = (old.saturating_sub(1), new.saturating_sub(1)),
                    Some(b'-') => old = old.saturating_sub(1),
                    Some(b'+') => new = new.saturating_sub(1),
                    Some(b'\\') => {}
                    _ => bail!("line {}: not a line of a hunk: {body:?}", i + 1),
                }
                i += 1;
            }
        }
        sections.insert(path.to_string(), lines[start..i].concat());
    }
    Ok(sections)
}

/// The old and new line counts of `@@ -l[,s] +l[,s] @@`.
fn hunk_counts(header: &str) -> Option<(usize, usize)> {
    let mut ranges = header.strip_prefix("@@ ")?.split(' ');
    let count = |range: &str| -> Option<usize> {
        match range.split_once(',') {
            Some((_, count)) => count.parse().ok(),
            None => Some(1),
        }
    };
    let old = count(ranges.next()?.strip_prefix('-')?)?;
    let new = count(ranges.next()?.strip_prefix('+')?)?;
    Some((old, new))
}

/// One line per file whose part differs between the recorded diff and the one made now.
fn mismatches(recorded: &Sections, actual: &Sections) -> Vec<String> {
    let mut problems = Vec::new();
    let paths: BTreeSet<&String> = recorded.keys().chain(actual.keys()).collect();
    for path in paths {
        let problem = match (recorded.get(path), actual.get(path)) {
            (None, Some(now)) if now.starts_with("Only in a: ") => {
                format!("{path} is left out of the copy, and KILN.md's diff does not say so")
            }
            (None, Some(now)) => format!(
                "{path} differs from the published crate, and KILN.md's diff does not say so:\n{}",
                excerpt(now)
            ),
            (Some(_), None) => format!(
                "KILN.md's diff changes {path}, but the copy's {path} is now the published one"
            ),
            (Some(then), Some(now)) if then != now => format!(
                "{path} differs from the published crate otherwise than KILN.md's diff says; \
                 the difference now:\n{}",
                excerpt(now)
            ),
            _ => continue,
        };
        problems.push(problem);
    }
    problems
}

/// The first lines of a file's diff, for a message.
fn excerpt(section: &str) -> String {
    const LINES: usize = 40;
    let mut text: String = section.split_inclusive('\n').take(LINES).collect();
    if section.lines().count() > LINES {
        text.push_str("...\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    const LIB: &str = "fn a() {}\nfn b() {}\nfn c() {}\nfn d() {}\nfn e() {}\nfn f() {}\n\
                       fn g() {}\nfn h() {}\nfn i() {}\n";

    /// A published crate and a copy with one line changed, a file added and a folder and a
    /// file left out, with the copy's KILN.md written by `--write`.
    fn published_and_copy() -> (tempfile::TempDir, tempfile::TempDir) {
        let published = tree(&[
            ("Cargo.toml", "[package]\nname = \"x\"\n"),
            ("Cargo.lock", "# lock\n"),
            (".cargo-ok", "{\"v\":1}"),
            ("src/lib.rs", LIB),
            ("tests/a.rs", "#[test]\nfn t() {}\n"),
            ("tests/b.rs", "#[test]\nfn u() {}\n"),
        ]);
        let copy = tree(&[
            ("Cargo.toml", "[package]\nname = \"x\"\n"),
            ("src/lib.rs", &LIB.replace("fn e() {}", "fn e() { kiln() }")),
            ("src/kiln.rs", "pub fn kiln() {}\n"),
            ("KILN.md", "# x, patched\n\nWhy.\n"),
        ]);
        let diff = render(&tree_diff(published.path(), copy.path()).unwrap());
        let kiln_md = copy.path().join("KILN.md");
        let text = std::fs::read_to_string(&kiln_md).unwrap();
        std::fs::write(&kiln_md, with_diff(&text, &diff)).unwrap();
        (published, copy)
    }

    #[test]
    fn the_diff_names_changes_additions_and_what_is_left_out() {
        let (published, copy) = published_and_copy();
        let diff = render(&tree_diff(published.path(), copy.path()).unwrap());
        let expected = "\
Only in a: Cargo.lock
--- /dev/null
+++ b/src/kiln.rs
@@ -0,0 +1 @@
+pub fn kiln() {}
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -2,7 +2,7 @@
 fn b() {}
 fn c() {}
 fn d() {}
-fn e() {}
+fn e() { kiln() }
 fn f() {}
 fn g() {}
 fn h() {}
Only in a: tests
";
        assert_eq!(diff, expected);
        assert_eq!(
            parse(&diff).unwrap(),
            tree_diff(published.path(), copy.path()).unwrap()
        );
        assert!(
            check_crate(published.path(), copy.path())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_one_line_change_outside_the_diff_fails_naming_the_file() {
        let (published, copy) = published_and_copy();
        std::fs::write(copy.path().join("Cargo.toml"), "[package]\nname = \"y\"\n").unwrap();
        let problems = check_crate(published.path(), copy.path()).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("Cargo.toml differs from the published crate, and KILN.md"),
            "{}",
            problems[0]
        );
        assert!(problems[0].contains("+name = \"y\""), "{}", problems[0]);
    }

    #[test]
    fn a_change_inside_a_patched_file_fails_and_write_records_it() {
        let (published, copy) = published_and_copy();
        let lib = copy.path().join("src/lib.rs");
        let text = std::fs::read_to_string(&lib).unwrap();
        std::fs::write(&lib, text.replace("fn h() {}", "fn h() { 1; }")).unwrap();
        let problems = check_crate(published.path(), copy.path()).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("src/lib.rs differs from the published crate otherwise"),
            "{}",
            problems[0]
        );
        // What `--write` does, then the check passes, and the KILN.md above the diff is kept.
        let kiln_md = copy.path().join("KILN.md");
        let diff = render(&tree_diff(published.path(), copy.path()).unwrap());
        let md = std::fs::read_to_string(&kiln_md).unwrap();
        std::fs::write(&kiln_md, with_diff(&md, &diff)).unwrap();
        assert!(
            check_crate(published.path(), copy.path())
                .unwrap()
                .is_empty()
        );
        let md = std::fs::read_to_string(&kiln_md).unwrap();
        assert!(
            md.starts_with("# x, patched\n\nWhy.\n\n## The diff\n"),
            "{md}"
        );
        assert_eq!(md.matches(HEADING).count(), 1);
    }

    #[test]
    fn undoing_a_change_or_restoring_a_left_out_file_fails_too() {
        let (published, copy) = published_and_copy();
        std::fs::write(copy.path().join("src/lib.rs"), LIB).unwrap();
        std::fs::write(copy.path().join("Cargo.lock"), "# lock\n").unwrap();
        let problems = check_crate(published.path(), copy.path()).unwrap();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("KILN.md's diff changes Cargo.lock"));
        assert!(problems[1].starts_with("KILN.md's diff changes src/lib.rs"));
    }

    #[test]
    fn a_kiln_md_without_its_diff_fails() {
        let (published, copy) = published_and_copy();
        std::fs::write(copy.path().join("KILN.md"), "# x, patched\n").unwrap();
        let problems = check_crate(published.path(), copy.path()).unwrap();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("no `## The diff` section"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn hunks_are_read_by_their_counts_not_their_first_characters() {
        // A removed line `-- x` is `--- x` in the diff; it stays in its file's part.
        let published = tree(&[("a.sql", "-- x\nselect 1;\n")]);
        let copy = tree(&[("a.sql", "select 1;\n")]);
        let sections = tree_diff(published.path(), copy.path()).unwrap();
        assert!(sections["a.sql"].contains("\n--- x\n"));
        assert_eq!(parse(&render(&sections)).unwrap(), sections);
    }
}
