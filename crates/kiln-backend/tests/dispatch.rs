//! One process dispatching to the same wgpu device twice, as `kiln compare --trajectories`
//! does (the comparison, then PyTorch's training runs): the second dispatch must reuse the
//! device, where cubecl panicked on a second setup ("Service already initialized"). Skips
//! without a Vulkan adapter unless `KILN_REQUIRE_WGPU` is set (CI sets it).

#![cfg(feature = "vulkan")]

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use kiln_backend::{Backend, BackendChoice, BackendTask, DeviceSelection, probe, resolve, run_on};

/// Sums a few numbers on the first device.
struct Sum;

impl BackendTask for Sum {
    type Output = f32;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> f32 {
        let x = Tensor::<B, 1>::from_floats([1.0, 2.0, 3.5], &devices[0]);
        x.sum().into_scalar().elem()
    }
}

#[test]
fn a_vulkan_device_dispatched_twice_is_set_up_once() {
    let probe = probe();
    let resolved = match resolve(
        BackendChoice::Explicit(Backend::Vulkan),
        &DeviceSelection::default(),
        &probe,
    ) {
        Ok(resolved) => resolved,
        Err(why) if std::env::var_os("KILN_REQUIRE_WGPU").is_some() => {
            panic!("KILN_REQUIRE_WGPU is set but Vulkan is unusable: {why}")
        }
        Err(why) => {
            eprintln!("skipping: {why}");
            return;
        }
    };
    assert_eq!(run_on(&resolved, Sum).unwrap(), 6.5);
    assert_eq!(run_on(&resolved, Sum).unwrap(), 6.5);
}

/// `cargo test` prints no "error: XDG_RUNTIME_DIR is invalid or not set" for each Vulkan instance
/// (Mesa's device-selection layer asking Wayland for the default GPU, which `.cargo/config.toml`
/// switches off with `NODEVICE_SELECT` as the binary does for itself): the test above, run again
/// without a display session, prints nothing of it.
#[test]
fn vulkan_tests_print_nothing_about_a_missing_display_session() {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_vulkan_device_dispatched_twice_is_set_up_once",
            "--nocapture",
        ])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{errors}");
    assert!(!errors.contains("XDG_RUNTIME_DIR"), "{errors}");
}
