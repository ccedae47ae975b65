//! What the engine's CPU tests share: taking turns, test configs, runs on flex.

#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard};

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use kiln_backend::MemoryMeter;
use kiln_config::{DeviceFacts, SettleFor, TrainConfig, settle};
use kiln_models::{ResNet, weights};
use kiln_records::RunDir;
use kiln_train::replicas::Placement;
use kiln_train::{Observer, RunEnd, TrainError, train};

pub type B = Autodiff<Flex>;

/// burn seeds a backend's random generator process-wide, and burn-collective's server is
/// process-wide too, so runs in parallel tests would disturb each other; they take turns.
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn take_turn() -> MutexGuard<'static, ()> {
    ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Parses `text` with `overrides`, writing runs under `runs`.
pub fn parse(text: &str, runs: &Path, overrides: &[&str]) -> TrainConfig {
    let mut overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    overrides.push(format!("logging.runs_dir = '{}'", runs.display()));
    TrainConfig::parse(text, Path::new("test.toml"), &overrides).unwrap()
}

/// Trains on `replicas` copies of the CPU device.
pub fn train_on_cpu(
    config: &TrainConfig,
    run: &RunDir,
    resume: bool,
    replicas: usize,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<RunEnd, TrainError> {
    let placement = Placement {
        devices: vec![Default::default(); replicas],
        cluster: None,
    };
    let facts = DeviceFacts {
        compiles_kernels: false,
        available_bytes: None,
        replicas: placement.peers(),
    };
    let settled = settle(config, &facts, SettleFor::Training)?;
    train::<B>(
        &settled,
        run,
        resume,
        placement,
        &mut MemoryMeter::none(),
        observer,
        stop,
    )
}

/// Every value of the model's state dict (torchvision's names, in name order), flattened.
pub fn flat_parameters<Bk: Backend>(model: &ResNet<Bk>) -> Vec<f32> {
    weights::torch_state_dict(model)
        .into_values()
        .flat_map(|data| data.convert::<f32>().to_vec::<f32>().unwrap())
        .collect()
}

/// A headless Chromium, where one is installed (CI installs `chromium`); tests that render pages
/// say so and skip their browser checks without one.
pub fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Runs `browser` headless with `args` and then `file://page`, ended if it takes over a minute;
/// its standard output.
pub fn run_browser(browser: &str, args: &[String], page: &Path) -> String {
    let mut child = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
        text
    });
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!(
                "{browser} did not render {} within a minute",
                page.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    reader.join().unwrap()
}

/// `page`'s document as a browser has rendered it, with one line of script added that counts
/// the images it decoded (`data-images="loaded/all"` on `<body>`); `None` without Chromium.
pub fn rendered_dom(page: &Path) -> Option<String> {
    let browser = chromium()?;
    let html = std::fs::read_to_string(page).unwrap();
    let counter = "<script>window.addEventListener('load', () => { const all = [...document.images]; \
        const loaded = all.filter(i => i.complete && i.naturalWidth > 0).length; \
        document.body.setAttribute('data-images', loaded + '/' + all.length); });</script>";
    let probe = page.with_extension("probe.html");
    std::fs::write(
        &probe,
        html.replace("</body>", &format!("{counter}</body>")),
    )
    .unwrap();
    Some(run_browser(browser, &["--dump-dom".to_string()], &probe))
}
