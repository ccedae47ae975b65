//! The fixes that kiln's patched copies of burn's crates carry (`patches/*/KILN.md`), each
//! checked on the backend that runs it: these fail with the published crates.
//!
//! - cubek-matmul: the double-buffered matmuls on a real wgpu device, where `k` is a multiple of
//!   one stage but not of two: 0.2.0 read a whole stage past `k` there and added what lay beyond
//!   the operands into the result. burn's autotune picks these kernels when they time fastest, so
//!   a wrong one made training depend on timing; ResNet-50's 1x1 convolutions with 8 or 24 input
//!   channels hit it. Skips without a wgpu adapter unless `KILN_REQUIRE_WGPU` is set (CI sets it).
//! - burn-ndarray: the reciprocal, which burn's autodiff takes for the gradient of every division
//!   and every log (batch norm's scale, the loss's log-sum-exp): 0.21 returned the processor's
//!   estimate, up to 5e-5 off on AVX-512 and 4e-4 on AVX2.

#[cfg(feature = "wgpu")]
mod cubek_matmul {
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
            let strategy =
                Strategy::DoubleUnit(BlueprintStrategy::Inferred(DoubleUnitSelectionArgs {
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
}

#[cfg(feature = "ndarray")]
mod burn_ndarray {
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::{Tensor, TensorData};

    /// As many values as take ndarray's vectorized path, spread over 0.1..10.
    fn values() -> Vec<f32> {
        (0..4096)
            .map(|i| 0.1 + (i as f32 * 0.618_034).fract() * 9.9)
            .collect()
    }

    /// The largest error of `got` against `1 / x` worked out in f64, relative to it.
    fn worst_against_reciprocal(got: Tensor<NdArray, 1>, x: &[f32]) -> f64 {
        let got = got.into_data().to_vec::<f32>().unwrap();
        (got.iter().zip(x))
            .map(|(&g, &x)| (g as f64 * x as f64 - 1.0).abs())
            .fold(0.0, f64::max)
    }

    /// `recip`, and the gradients of `a / x` (for `a`) and of `log(x)`, within one float32
    /// rounding of `1 / x`.
    #[test]
    fn reciprocals_and_the_gradients_that_take_them_are_exact() {
        let device = Default::default();
        let x = values();
        let tensor =
            || Tensor::<NdArray, 1>::from_data(TensorData::new(x.clone(), [x.len()]), &device);
        let recip = worst_against_reciprocal(tensor().recip(), &x);
        assert!(recip <= 1.2e-7, "recip: {recip:.1e} off");

        let a = Tensor::<Autodiff<NdArray>, 1>::ones([x.len()], &device).require_grad();
        let grads = (a.clone() / Tensor::from_inner(tensor())).sum().backward();
        let division = worst_against_reciprocal(a.grad(&grads).unwrap(), &x);
        assert!(division <= 1.2e-7, "a / x's gradient: {division:.1e} off");

        let xt = Tensor::<Autodiff<NdArray>, 1>::from_inner(tensor()).require_grad();
        let grads = xt.clone().log().sum().backward();
        let log = worst_against_reciprocal(xt.grad(&grads).unwrap(), &x);
        assert!(log <= 1.2e-7, "log's gradient: {log:.1e} off");
    }
}
