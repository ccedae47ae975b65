//! cubek's double-buffered matmuls on a real wgpu device, where `k` is a multiple of one stage
//! but not of two: 0.2.0 read a whole stage past `k` there and added what lay beyond the
//! operands into the result (kiln patches it: `patches/cubek-matmul/KILN.md`). burn's autotune
//! picks these kernels when they time fastest, so a wrong one made training depend on timing;
//! ResNet-50's 1x1 convolutions with 8 or 24 input channels hit it.
//!
//! Skips without a wgpu adapter unless `KILN_REQUIRE_WGPU` is set (CI sets it).
#![cfg(feature = "wgpu")]

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::tensor::{DType, Distribution, Tensor, TensorPrimitive};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{Strategy, launch_ref};
use cubek::matmul::routines::{
    BlueprintStrategy, TileSizeSelection, double_unit::DoubleUnitSelectionArgs,
};
use cubek::std::InputBinding;
use kiln_backend::{Backend, probe};

/// burn's wgpu backend without fusion, so that its tensors are cubecl's.
type B = CubeBackend<WgpuRuntime, f32, i32, u32>;

fn wgpu_present() -> bool {
    match probe().report(Backend::Wgpu).devices() {
        Ok(devices) if !devices.is_empty() => true,
        outcome if std::env::var_os("KILN_REQUIRE_WGPU").is_some() => {
            panic!("KILN_REQUIRE_WGPU is set but wgpu is unusable: {outcome:?}")
        }
        _ => {
            eprintln!("skipping: no wgpu adapter");
            false
        }
    }
}

/// `a [m, k] @ w [n, k]^T` through `strategy` (the weight transposed as a view, as burn's 1x1
/// convolution passes it), and the worst error against the same sums in f64 on the host.
fn worst_error(strategy: &Strategy, [m, n, k]: [usize; 3], device: &WgpuDevice) -> f64 {
    let a = Tensor::<B, 2>::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let w = Tensor::<B, 2>::random([n, k], Distribution::Normal(0.0, 1.0), device);
    let host = |t: &Tensor<B, 2>| t.clone().into_data().to_vec::<f32>().unwrap();
    let (a_host, w_host) = (host(&a), host(&w));
    let float = |t: Tensor<B, 2>| match t.into_primitive() {
        TensorPrimitive::Float(t) => t,
        TensorPrimitive::QFloat(_) => unreachable!("not quantized"),
    };
    let out = float(Tensor::<B, 2>::zeros([m, n], device));
    let (a, w) = (float(a), float(w.transpose()));
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: a.dtype.into(),
        rhs: w.dtype.into(),
        out: out.dtype.into(),
    });
    let client = out.client.clone();
    launch_ref(
        strategy,
        &client,
        InputBinding::new(a.binding(), DType::F32.into()),
        InputBinding::new(w.binding(), DType::F32.into()),
        out.clone().binding(),
        &mut dtypes,
    )
    .unwrap_or_else(|e| panic!("{strategy} cannot launch on {m}x{n}x{k}: {e:?}"));
    let got = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out))
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let exact: f64 = (0..k)
                .map(|l| a_host[i * k + l] as f64 * w_host[j * k + l] as f64)
                .sum();
            worst = worst.max((got[i * n + j] as f64 - exact).abs());
        }
    }
    worst
}

#[test]
fn double_buffered_unit_matmuls_stop_at_k() {
    if !wgpu_present() {
        return;
    }
    let device = WgpuDevice::default();
    for tile_size in [
        TileSizeSelection::MaxTileSize,
        TileSizeSelection::MinTileSize,
    ] {
        let strategy = Strategy::DoubleUnit(BlueprintStrategy::Inferred(DoubleUnitSelectionArgs {
            tile_size,
        }));
        // ResNet-50 (width 4, 16x16 images, batch 8): layer2's last 1x1 convolution, 8 -> 32
        // channels on 8 images of 8x8; then k of three stages, and of two (always right).
        for shape in [[512, 32, 8], [64, 16, 24], [64, 16, 32]] {
            let error = worst_error(&strategy, shape, &device);
            // f32 sums of 8 to 32 products of unit normals: a few 1e-6; a stage read past k
            // adds whole products of the next row (errors of order 10).
            assert!(
                error < 1e-4,
                "{strategy} on m, n, k = {shape:?}: off by {error}"
            );
        }
    }
}
