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
