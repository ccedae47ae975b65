//! The `kiln` binary as a user runs it: exit codes and the one line an error gets.

mod common;

use std::path::Path;
use std::process::Output;

use common::{errors, kiln};

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn devices_lists_the_cpu_backend_and_the_choice_of_auto() {
    let output = kiln(&["devices"]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let text = stdout(&output);
    assert!(text.contains("flex:0  CPU"), "{text}");
    assert!(text.contains("--backend auto --devices 0 uses:"), "{text}");
    // `auto` never picks a software adapter.
    let chosen = text.lines().last().unwrap();
    assert!(!chosen.contains("llvmpipe"), "{chosen}");
}

/// On a machine without a display session, Mesa's Vulkan device-selection layer made libwayland
/// print "error: XDG_RUNTIME_DIR is invalid or not set" for every probe, before anything else.
#[test]
fn probing_devices_on_a_headless_machine_prints_nothing_on_stderr() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["devices"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .env_remove("MESA_VK_DEVICE_SELECT")
        .env_remove("DRI_PRIME")
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(errors(&output), Vec::<String>::new());
}

#[test]
fn a_backend_that_is_not_there_is_one_line_and_a_failure() {
    let cases: &[&[&str]] = &[
        &["devices", "--backend", "cuda"],
        &["devices", "--backend", "metal"],
        &["devices", "--backend", "flex", "--devices", "3"],
    ];
    for args in cases {
        let output = kiln(args);
        assert!(!output.status.success(), "{args:?}");
        let lines = errors(&output);
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        assert!(lines[0].starts_with("error: "), "{lines:?}");
        assert!(!lines[0].contains("panicked"), "{lines:?}");
    }
    let cuda = errors(&kiln(&["devices", "--backend", "cuda"])).remove(0);
    if cfg!(feature = "cuda") {
        assert!(cuda.contains("cuda"), "{cuda}");
    } else {
        assert!(cuda.contains("--features cuda"), "{cuda}");
    }
}

/// `kiln summary`'s totals are torchvision's parameter count and published multiply-adds;
/// a bad argument is one line.
#[test]
fn summary_counts_a_resnet_stage_by_stage() {
    let output = kiln(&["summary", "--model", "resnet50", "--json"]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(summary["parameters"], 25_557_032);
    let giga = summary["mult_adds"].as_f64().unwrap() / 1e9;
    assert!((giga - 4.09).abs() < 0.005, "{giga}");
    assert_eq!(summary["stages"].as_array().unwrap().len(), 6);

    let output = kiln(&[
        "summary",
        "--model",
        "resnet18",
        "--stem",
        "cifar",
        "--image-size",
        "32",
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let text = stdout(&output);
    assert!(
        text.contains("layer4") && text.contains("11,681,832"),
        "{text}"
    );

    for bad in [
        ["--model", "resnet19"],
        ["--image-size", "0"],
        ["--stem", "tiny"],
    ] {
        let mut args = vec!["summary"];
        args.extend(bad);
        let output = kiln(&args);
        assert!(!output.status.success(), "{bad:?}");
        let lines: Vec<String> = errors(&output)
            .into_iter()
            .filter(|l| !l.is_empty())
            .collect();
        assert!(
            lines.iter().filter(|l| l.contains("error")).count() == 1,
            "{bad:?}: {lines:?}"
        );
    }
}

/// `kiln stats` on the shipped digits: the normalize line, ten classes, one stored size.
#[test]
fn stats_describes_the_training_set() {
    let output = kiln(&["stats", "--config", "configs/quickstart.toml", "--json"]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let stats: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let classes = stats["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 10);
    let counted: u64 = classes.iter().map(|c| c[1].as_u64().unwrap()).sum();
    assert_eq!(counted, stats["images"].as_u64().unwrap());
    for c in 0..3 {
        let (mean, std) = (
            stats["mean"][c].as_f64().unwrap(),
            stats["std"][c].as_f64().unwrap(),
        );
        assert!(
            mean > 0.0 && mean < 1.0 && std > 0.0 && std < 0.5,
            "{stats}"
        );
    }
    assert_eq!(stats["unreadable"].as_array().unwrap().len(), 0);

    let output = kiln(&["stats", "--config", "configs/quickstart.toml"]);
    assert!(output.status.success(), "{:?}", errors(&output));
    assert!(
        stdout(&output).contains("{ op = \"normalize\", mean = ["),
        "{}",
        stdout(&output)
    );

    let output = kiln(&["stats", "--config", "configs/no-such-config.toml"]);
    assert!(!output.status.success());
    assert_eq!(errors(&output).len(), 1, "{:?}", errors(&output));
}

#[test]
fn predict_prints_the_top_classes_of_each_image() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("stripes.png");
    image::RgbImage::from_fn(80, 60, |x, y| {
        image::Rgb([(x * 3) as u8, (y * 4) as u8, 128])
    })
    .save(&image)
    .unwrap();
    let names = dir.path().join("names.txt");
    let classes: Vec<String> = (0..10).map(|i| format!("digit {i}")).collect();
    std::fs::write(&names, classes.join("\n")).unwrap();
    let image = image.to_string_lossy().into_owned();
    let names = names.to_string_lossy().into_owned();
    let weights = fixture("resnet18_w4.pth");
    let common = [
        "--model",
        "resnet18",
        "--width",
        "4",
        "--num-classes",
        "10",
        "--resize",
        "36",
        "--crop",
        "32",
        "--backend",
        "flex",
    ];

    let mut args = vec![
        "predict",
        image.as_str(),
        "--pretrained",
        weights.as_str(),
        "--classes",
        names.as_str(),
    ];
    args.extend(common);
    let output = kiln(&args);
    assert!(output.status.success(), "{:?}", errors(&output));
    let text = stdout(&output);
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 5, "{text}");
    let probabilities: Vec<f32> = rows
        .iter()
        .map(|r| r.trim().split('%').next().unwrap().trim().parse().unwrap())
        .collect();
    assert!(probabilities.windows(2).all(|w| w[0] >= w[1]), "{text}");
    assert!(probabilities.iter().sum::<f32>() <= 100.01, "{text}");
    assert!(rows.iter().all(|r| r.contains("digit ")), "{text}");

    // A corrupt image, and weights for another class count, each get one line naming the cause.
    let broken = dir.path().join("broken.jpg");
    std::fs::write(&broken, b"not an image").unwrap();
    let broken = broken.to_string_lossy().into_owned();
    let mut args = vec!["predict", broken.as_str(), "--pretrained", weights.as_str()];
    args.extend(common);
    let lines = errors(&kiln(&args));
    assert!(
        lines.len() == 1 && lines[0].contains("broken.jpg"),
        "{lines:?}"
    );

    let mut args = vec!["predict", image.as_str(), "--pretrained", weights.as_str()];
    args.extend(common);
    let pos = args.iter().position(|a| *a == "10").unwrap();
    args[pos] = "7";
    let lines = errors(&kiln(&args));
    assert!(
        lines.len() == 1 && lines[0].contains("--num-classes"),
        "{lines:?}"
    );
}

/// `name`'s PyTorch input batch and float64 eval logits, from its `_expected.safetensors`.
fn pytorch_eval(name: &str) -> (Vec<usize>, Vec<f32>, Vec<f32>) {
    let bytes = std::fs::read(fixture(&format!("{name}_expected.safetensors"))).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let floats = |key: &str| -> (Vec<usize>, Vec<f32>) {
        let view = file.tensor(key).unwrap();
        let values = (view.data().chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (view.shape().to_vec(), values)
    };
    let (shape, input) = floats("input");
    (shape, input, floats("eval_logits").1)
}

#[test]
fn export_writes_onnx_that_computes_pytorchs_logits() {
    use tract_onnx::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    for (name, model) in [("resnet18_w4", "resnet18"), ("resnet50_w4", "resnet50")] {
        let out = dir.path().join(format!("{name}.onnx"));
        let (weights, out_arg) = (fixture(&format!("{name}.pth")), out.to_string_lossy());
        let output = kiln(&[
            "export",
            "--weights",
            &weights,
            "--model",
            model,
            "--width",
            "4",
            "--num-classes",
            "10",
            "--image-size",
            "64",
            "--out",
            &out_arg,
        ]);
        assert!(output.status.success(), "{:?}", errors(&output));
        // PyTorch's float64 eval logits of the same torchvision weights on the same batch.
        let (shape, input, expected) = pytorch_eval(name);
        let plan = (tract_onnx::onnx().model_for_path(&out).unwrap())
            .into_optimized()
            .unwrap()
            .into_runnable()
            .unwrap();
        let input = tract_ndarray::ArrayD::from_shape_vec(shape, input).unwrap();
        let actual = plan.run(tvec!(Tensor::from(input).into())).unwrap();
        let actual = actual[0].to_plain_array_view::<f32>().unwrap();
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in expected.iter().zip(actual.iter()) {
            assert!(
                (a - b).abs() <= 1e-4 * scale,
                "{name}: PyTorch {a}, ONNX {b}"
            );
        }
    }

    // Bad arguments: one line each, naming what to change.
    let weights = fixture("resnet18_w4.pth");
    let out = dir.path().join("x.onnx").to_string_lossy().into_owned();
    let base = [
        "export",
        "--weights",
        &weights,
        "--model",
        "resnet18",
        "--width",
        "4",
    ];
    let cases: [(&[&str], &str); 3] = [
        (
            &["--num-classes", "10", "--opset", "3", "--out", &out],
            "opset 3",
        ),
        (&["--num-classes", "7", "--out", &out], "--num-classes"),
        (
            &["--num-classes", "10", "--out", "/no/such/dir/x.onnx"],
            "/no/such/dir",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = base.to_vec();
        args.extend(extra);
        let output = kiln(&args);
        assert!(!output.status.success());
        let lines = errors(&output);
        assert!(lines.len() == 1 && lines[0].contains(needle), "{lines:?}");
    }
    let lines = errors(&kiln(&["export", "--run", "/no/such/run"]));
    assert!(
        lines.len() == 1 && lines[0].contains("/no/such/run"),
        "{lines:?}"
    );
}

/// README's two commands, `cargo run --release` (the kiln binary) and `cargo test --release
/// --workspace`, must compile the binary's crates once: every unit of the first in the second,
/// with the same features and dependencies. A dev-dependency that asks a shared crate for another
/// feature breaks that silently (the test command then rebuilds burn and kiln, 14 minutes on two
/// cores); the cure is to ask for the same feature in the root Cargo.toml.
#[test]
fn readmes_test_command_reuses_every_crate_its_main_command_builds() {
    let main = unit_graph(&["build", "--release", "--bin", "kiln"]);
    let tests = unit_graph(&["test", "--release", "--workspace", "--no-run"]);
    let shared: std::collections::HashSet<u64> = unit_keys(&tests).into_iter().collect();
    let keys = unit_keys(&main);
    let units = main["units"].as_array().unwrap();
    let apart = |i: &usize| !shared.contains(&keys[*i]);
    // The causes: units built apart although all their dependencies are shared. Everything that
    // depends on them is built apart too.
    let mut causes: Vec<String> = (0..units.len())
        .filter(apart)
        .filter(|&i| {
            let deps = units[i]["dependencies"].as_array().unwrap();
            !deps
                .iter()
                .any(|d| apart(&(d["index"].as_u64().unwrap() as usize)))
        })
        .map(|i| describe(&units[i]))
        .collect();
    causes.sort();
    causes.dedup();
    assert!(
        causes.is_empty(),
        "the test command builds {} of the main command's {} units apart, because of these; ask \
         for the test command's features of them in the root Cargo.toml:\n{}",
        (0..units.len()).filter(apart).count(),
        units.len(),
        causes.join("\n")
    );
}

/// After README's two commands, `cargo xtask compare` (xtask alone, then the kiln binary with
/// the compared backends' features) builds nothing again: building xtask alone resolved
/// kiln-data's, image's and twenty other crates' features apart from the workspace's, and
/// xtask's own binary is built by the test command for xtask's tests.
#[test]
fn xtask_compare_reuses_every_crate_readmes_commands_build() {
    let built: std::collections::HashSet<u64> = [
        unit_graph(&["build", "--release", "--bin", "kiln"]),
        unit_graph(&["test", "--release", "--workspace", "--no-run"]),
    ]
    .iter()
    .flat_map(unit_keys)
    .collect();
    let xtask = unit_graph(&["build", "--release", "--package", "xtask"]);
    let compare = unit_graph(&[
        "build",
        "--release",
        "--package",
        "kiln",
        "--bin",
        "kiln",
        "--features",
        "ndarray",
    ]);
    let mut apart = Vec::new();
    for graph in [xtask, compare] {
        let keys = unit_keys(&graph);
        let units = graph["units"].as_array().unwrap();
        for (unit, key) in units.iter().zip(keys) {
            if !built.contains(&key) {
                apart.push(describe(unit));
            }
        }
    }
    apart.sort();
    apart.dedup();
    assert!(
        apart.is_empty(),
        "cargo xtask compare builds these again:\n{}",
        apart.join("\n")
    );
}

/// `name version (target, mode) features [...]`, for a unit of `cargo --unit-graph`.
fn describe(unit: &serde_json::Value) -> String {
    // "registry+...#name@1.2.3", or "path+file:///.../name#1.2.3" for a path package.
    let id = unit["pkg_id"].as_str().unwrap();
    let (source, version) = id.rsplit_once('#').unwrap();
    let package = match version.split_once('@') {
        Some((name, version)) => format!("{name} {version}"),
        None => format!("{} {version}", source.rsplit('/').next().unwrap()),
    };
    format!(
        "{package} ({}, {}) features {}",
        unit["target"]["name"].as_str().unwrap(),
        unit["mode"].as_str().unwrap(),
        unit["features"]
    )
}

/// Cargo's plan of a command without building it (`--unit-graph`, unstable: allowed here by
/// `RUSTC_BOOTSTRAP`), in a target folder of its own so that it never waits on this test's.
fn unit_graph(command: &[&str]) -> serde_json::Value {
    let target = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(command)
        .args(["--locked", "--unit-graph", "-Z", "unstable-options"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", target.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo {command:?}: {:?}",
        errors(&output)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// One key per unit that is equal exactly when two units would compile to the same artifact:
/// package, target, profile, mode and features, and the same of all its dependencies.
fn unit_keys(graph: &serde_json::Value) -> Vec<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    fn key(units: &[serde_json::Value], i: usize, keys: &mut Vec<Option<u64>>) -> u64 {
        if let Some(k) = keys[i] {
            return k;
        }
        let unit = &units[i];
        let mut deps: Vec<u64> = unit["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| key(units, d["index"].as_u64().unwrap() as usize, keys))
            .collect();
        deps.sort_unstable();
        let mut hasher = DefaultHasher::new();
        for field in [
            "pkg_id", "target", "profile", "mode", "features", "platform",
        ] {
            unit[field].to_string().hash(&mut hasher);
        }
        deps.hash(&mut hasher);
        let k = hasher.finish();
        keys[i] = Some(k);
        k
    }
    let units = graph["units"].as_array().unwrap();
    let mut keys = vec![None; units.len()];
    (0..units.len()).map(|i| key(units, i, &mut keys)).collect()
}
