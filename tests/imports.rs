//! The house's rule that data flows one way, inside each crate too: no module of kiln's crates
//! reaches, through `crate::` paths, back to a module that reaches it (docs/architecture.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`huggingface::read`) -> the source with its tests and comments cut.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let name = relative
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .filter(|p| p != "mod" && p != "lib")
                .collect::<Vec<_>>()
                .join("::");
            let text = std::fs::read_to_string(&path).unwrap();
            // What `#[cfg(test)]` guards may import anything; comments only name modules.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let code: String = code
                .lines()
                .map(|line| line.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            found.insert(name, code);
        }
    }
    found
}

/// The modules `code` names through `crate::a::b` (the longest prefix that is a module).
fn imports(code: &str, own: &str, modules: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let path: String = code[at + "crate::".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        for k in (1..=segments.len()).rev() {
            let candidate = segments[..k].join("::");
            let nested = own.starts_with(&format!("{candidate}::"))
                || candidate.starts_with(&format!("{own}::"));
            if candidate != own && !nested && modules.contains_key(&candidate) {
                out.insert(candidate);
                break;
            }
        }
    }
    out
}

/// Whether `from` reaches `to` through `graph`.
fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(at) = stack.pop() {
        for next in &graph[&at] {
            if next == to {
                return true;
            }
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    false
}

#[test]
fn no_module_of_a_kiln_crate_imports_one_that_imports_it() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut circles = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let modules = modules(&src);
        let graph: BTreeMap<String, BTreeSet<String>> = modules
            .iter()
            .map(|(name, code)| (name.clone(), imports(code, name, &modules)))
            .collect();
        for (name, uses) in &graph {
            for used in uses {
                if name < used && reaches(&graph, used, name) {
                    circles.push(format!("{}: {name} <-> {used}", src.display()));
                }
            }
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

/// The type names (`struct`, `enum`, `trait`, `type`, public to the crate or beyond) that each of
/// kiln's source files defines, outside its tests.
fn type_names(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in code.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words
            .iter()
            .position(|w| *w == "pub" || w.starts_with("pub("))
        else {
            continue;
        };
        if let [kind, name, ..] = &words[at + 1..]
            && ["struct", "enum", "trait", "type"].contains(kind)
        {
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            names.insert(name);
        }
    }
    names
}

#[test]
fn no_type_name_is_defined_in_two_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        sources.push(entry.unwrap().path().join("src"));
    }
    let mut homes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for src in sources.iter().filter(|s| s.is_dir()) {
        for (module, code) in modules(src) {
            for name in type_names(&code) {
                let krate = src.parent().unwrap().file_name().unwrap().to_string_lossy();
                homes
                    .entry(name)
                    .or_default()
                    .push(format!("{krate}::{module}"));
            }
        }
    }
    homes.retain(|_, files| files.len() > 1);
    assert!(homes.is_empty(), "names defined in two files: {homes:#?}");
}
