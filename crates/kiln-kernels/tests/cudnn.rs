//! kiln's cuDNN convolution on the CUDA backend against burn's convolution on the CPU (flex, in
//! f32): forward, input gradient and weight gradient, for the shapes ResNets use and a few odd
//! ones, in f32 (TF32 off and on), bf16 and f16; and burn's own CUDA convolution against the
//! same reference (its autotuned gradients were seen wrong on an H200). Skipped (with a line
//! saying so) where there is no CUDA device or no cuDNN, unless `KILN_REQUIRE_CUDA=1` (then they
//! fail, naming what is missing).
//!
//! And cuDNN's batch norm in training against the textbook formula on the CPU; the classifier's
//! product through cuBLAS against burn's on the CPU; cuDNN's algorithm choices kept in kiln's
//! cache for the next process.
//!
//!     cargo test --release -p kiln-kernels --features cuda --test cudnn -- --nocapture

#![cfg(feature = "cuda")]

use burn::backend::{Autodiff, Cuda, Flex};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, FloatDType, Tensor, TensorData, Tolerance, module};

type Train = Autodiff<Cuda>;
/// The reference: burn's convolution on the CPU, in f32.
type Reference = Autodiff<Flex>;

/// Whether kiln can train on CUDA here, set up as the `kiln` binary sets it up (kiln-backend's
/// probe: the driver, NVRTC and CUDA's headers found in a toolkit or NVIDIA's pip wheels, and
/// cuDNN 9 opened by path). Where it cannot, the test is skipped with a line saying why; or,
/// where `KILN_REQUIRE_CUDA` is set (the GPU check sets it), it fails, naming what is missing.
fn gpu() -> bool {
    let probe = kiln_backend::probe();
    match probe.report(kiln_backend::Backend::Cuda).devices() {
        Ok(devices) => {
            println!("CUDA: {}", devices[0].name);
            true
        }
        Err(why) => skip_or_fail(&format!("no CUDA device kiln can use: {why}")),
    }
}

/// Whether there is a CUDA device and kiln's convolutions go through cuDNN; says why not.
fn gpu_with_cudnn() -> bool {
    if !gpu() {
        return false;
    }
    match kiln_kernels::cudnn_status() {
        Ok(version) => {
            println!("cuDNN {version}");
            true
        }
        Err(why) => skip_or_fail(&format!("cuDNN not used: {why}")),
    }
}

/// `false` (skip, with a line saying why), or a failure where `KILN_REQUIRE_CUDA` is set.
fn skip_or_fail(why: &str) -> bool {
    if std::env::var_os("KILN_REQUIRE_CUDA").is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("KILN_REQUIRE_CUDA is set, but {why}");
    }
    println!("skipped: {why}");
    false
}

/// Values spread over `low..1` from a fixed hash of their index and `salt`.
fn fixed<B: AutodiffBackend>(shape: [usize; 4], salt: u64, low: f32) -> Tensor<B, 4> {
    let values: Vec<f32> = (0..shape.iter().product::<usize>() as u64)
        .map(|i| {
            let mut z = (i ^ (salt << 40)).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            low + (1.0 - low) * (z >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// (input, weight, stride, padding)
const CASES: [([usize; 4], [usize; 4], usize, usize); 11] = [
    // A width-16 ResNet-18's layer 4 on 32x32 images: burn's CUDA gradients were 0.34 off here.
    ([8, 128, 4, 4], [128, 128, 3, 3], 1, 1),
    ([2, 3, 9, 9], [4, 3, 3, 3], 1, 1),
    ([3, 5, 17, 23], [6, 5, 3, 3], 1, 1),
    ([3, 4, 8, 8], [5, 4, 3, 3], 2, 1),
    ([2, 6, 8, 8], [3, 6, 1, 1], 2, 0),
    ([1, 9, 14, 14], [19, 9, 1, 1], 1, 0),
    ([2, 3, 33, 31], [8, 3, 7, 7], 2, 3),
    ([1, 5, 1, 1], [3, 5, 3, 3], 1, 1),
    ([1, 17, 7, 5], [19, 17, 3, 3], 1, 0),
    ([4, 64, 16, 16], [64, 64, 3, 3], 1, 1),
    // Its layer 2's first convolution: 32 output channels fill cubek's stages, 16 * 3 * 3 = 144
    // kernel columns do not (patches/cubek-convolution).
    ([8, 16, 32, 32], [32, 16, 3, 3], 2, 1),
];

/// Forward, input gradient and weight gradient through kiln (`ours`) or burn, in `dtype`,
/// returned in f32. `weighted` weighs every output differently in the loss (so a misplaced
/// gradient shows); otherwise the loss is a plain sum, whose gradient reaches the convolution
/// as a broadcast (zero-stride) tensor.
fn run<B: AutodiffBackend>(
    ours: bool,
    (x_shape, w_shape, stride, padding): ([usize; 4], [usize; 4], usize, usize),
    dtype: DType,
    weighted: bool,
) -> [TensorData; 3] {
    let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
    let (x, w) = (fixed::<B>(x_shape, 1, -1.0), fixed::<B>(w_shape, 2, -1.0));
    let (x, w) = (x.require_grad(), w.require_grad());
    // Work queued in the fusion stream before the convolution, so that it reads fused output.
    let x_in = (x.clone() * 0.5 + 0.25).cast(FloatDType::from(dtype));
    let w_in = w.clone().cast(FloatDType::from(dtype));
    let y = if ours {
        kiln_kernels::conv2d(x_in, w_in, options.clone())
    } else {
        module::conv2d(x_in, w_in, None, options.clone())
    };
    let y = y.cast(FloatDType::F32);
    let loss = if weighted {
        (y.clone() * fixed::<B>(y.dims(), 3, 0.0)).sum()
    } else {
        y.clone().sum()
    };
    let grads = loss.backward();
    [
        y.inner().into_data(),
        x.grad(&grads).unwrap().into_data(),
        w.grad(&grads).unwrap().into_data(),
    ]
}

/// The reference's result (burn on flex, f32) for `case`.
fn reference(case: ([usize; 4], [usize; 4], usize, usize), weighted: bool) -> [TensorData; 3] {
    run::<Reference>(false, case, DType::F32, weighted)
}

fn compare(label: &str, case_index: usize, ours: [TensorData; 3], burn: [TensorData; 3], tol: f32) {
    for (name, (a, b)) in ["y", "dx", "dw"].iter().zip(ours.into_iter().zip(burn)) {
        println!("{label} case {case_index} {name}");
        a.assert_approx_eq::<f32>(&b, Tolerance::rel_abs(tol, tol));
    }
}

#[test]
fn cudnn_matches_burn_on_the_cpu() {
    if !gpu_with_cudnn() {
        return;
    }
    let started = std::time::Instant::now();
    // f32 with plain f32 products: as close as two summation orders.
    kiln_kernels::set_tf32(false);
    for (i, case) in CASES.into_iter().enumerate() {
        let ours = run::<Train>(true, case, DType::F32, true);
        compare("f32", i, ours, reference(case, true), 1e-3);
    }
    // The broadcast gradient of a plain sum.
    for (i, case) in CASES.into_iter().enumerate().take(4) {
        let ours = run::<Train>(true, case, DType::F32, false);
        compare("f32 sum", i, ours, reference(case, false), 1e-3);
    }
    // Inference (plain `Cuda`, no autodiff).
    for (i, (x_shape, w_shape, stride, padding)) in CASES.into_iter().enumerate() {
        let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
        let ours = kiln_kernels::conv2d(
            fixed::<Train>(x_shape, 1, -1.0).inner(),
            fixed::<Train>(w_shape, 2, -1.0).inner(),
            options.clone(),
        );
        let burn = module::conv2d(
            fixed::<Reference>(x_shape, 1, -1.0).inner(),
            fixed::<Reference>(w_shape, 2, -1.0).inner(),
            None,
            options,
        );
        println!("inference case {i}");
        ours.into_data()
            .assert_approx_eq::<f32>(&burn.into_data(), Tolerance::rel_abs(1e-3, 1e-3));
    }
    // TF32 (10-bit mantissa products) and 16-bit data: looser.
    kiln_kernels::set_tf32(true);
    for (i, case) in CASES.into_iter().enumerate() {
        let ours = run::<Train>(true, case, DType::F32, true);
        compare("tf32", i, ours, reference(case, true), 3e-2);
    }
    for dtype in [DType::BF16, DType::F16] {
        let tol = if dtype == DType::BF16 { 8e-2 } else { 2e-2 };
        for (i, case) in CASES.into_iter().enumerate() {
            let ours = run::<Train>(true, case, dtype, true);
            compare(&format!("{dtype:?}"), i, ours, reference(case, true), tol);
        }
    }
    // What the GPU check's time limit for this test is set from.
    println!(
        "{} cuDNN algorithm searches in {:.1} s",
        kiln_kernels::cudnn_searches(),
        started.elapsed().as_secs_f64()
    );
}

/// Batch norm's shapes: a ResNet-18 CIFAR stem's and layer 4's, odd sizes, one value per
/// image, and a ResNet's 16x16 maps.
const NORM_CASES: [[usize; 4]; 5] = [
    [8, 16, 32, 32],
    [8, 128, 4, 4],
    [2, 3, 5, 7],
    [3, 8, 1, 1],
    [4, 64, 16, 16],
];

/// Batch norm in training as the textbook writes it, in burn's operations.
fn textbook_batch_norm<B: AutodiffBackend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 1>,
    bias: Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>) {
    let [n, c, h, w] = x.dims();
    let rows = x.swap_dims(0, 1).reshape([c, n * h * w]);
    let (mean, var) = (rows.clone().mean_dim(1), rows.clone().var_bias(1));
    let y = (rows - mean.clone()) / (var.clone() + eps).sqrt() * weight.reshape([c, 1])
        + bias.reshape([c, 1]);
    let y = y.reshape([c, n, h, w]).swap_dims(0, 1);
    (y, mean.reshape([c]).detach(), var.reshape([c]).detach())
}

/// Output, batch mean, batch variance and the gradients of input, weight and bias, through
/// kiln (`ours`) or the textbook composition.
fn run_batch_norm<B: AutodiffBackend>(
    ours: bool,
    shape: [usize; 4],
    weighted: bool,
) -> [TensorData; 6] {
    let c = shape[1];
    let x = fixed::<B>(shape, 4, -1.0).require_grad();
    let weight = fixed::<B>([1, 1, 1, c], 5, 0.5).reshape([c]).require_grad();
    let bias = fixed::<B>([1, 1, 1, c], 6, -1.0)
        .reshape([c])
        .require_grad();
    // Work queued in the fusion stream before it, so that it reads fused output.
    let x_in = x.clone() * 2.0 + 0.5;
    let (y, mean, var) = if ours {
        kiln_kernels::batch_norm_train(&x_in, &weight, &bias, 1e-5)
            .expect("kiln's batch norm runs on CUDA under autodiff")
    } else {
        textbook_batch_norm(x_in, weight.clone(), bias.clone(), 1e-5)
    };
    let loss = if weighted {
        (y.clone() * fixed::<B>(shape, 7, -1.0)).sum()
    } else {
        y.clone().sum()
    };
    let grads = loss.backward();
    [
        y.inner().into_data(),
        mean.inner().into_data(),
        var.inner().into_data(),
        x.grad(&grads).unwrap().into_data(),
        weight.grad(&grads).unwrap().into_data(),
        bias.grad(&grads).unwrap().into_data(),
    ]
}

/// cuDNN's batch norm (`cudnnBatchNormalizationForwardTraining` and `Backward`) against the
/// textbook formula on the CPU: the output, the statistics handed on for the running ones, and
/// the three gradients, with a weighted loss and with a plain sum (a broadcast gradient).
#[test]
fn cudnn_matches_the_textbook_batch_norm_on_the_cpu() {
    if !gpu_with_cudnn() {
        return;
    }
    let names = ["y", "mean", "var", "dx", "dweight", "dbias"];
    for weighted in [true, false] {
        for (i, shape) in NORM_CASES.into_iter().enumerate() {
            let ours = run_batch_norm::<Train>(true, shape, weighted);
            let theirs = run_batch_norm::<Reference>(false, shape, weighted);
            for (name, (a, b)) in names.iter().zip(ours.into_iter().zip(theirs)) {
                println!("batch norm case {i} {shape:?} weighted {weighted}: {name}");
                a.assert_approx_eq::<f32>(&b, Tolerance::rel_abs(1e-3, 1e-4));
            }
        }
    }
}

/// A `[rows, cols]` matrix of [`fixed`] values.
fn fixed_matrix<B: AutodiffBackend>(dims: [usize; 2], salt: u64, low: f32) -> Tensor<B, 2> {
    fixed::<B>([1, 1, dims[0], dims[1]], salt, low).reshape(dims)
}

/// The classifier's `x weight + bias` through kiln (`ours`: cuBLAS on CUDA) or burn's matmul,
/// in `dtype`: output and the gradients of input, weight and bias, in f32.
fn run_linear<B: AutodiffBackend>(
    ours: bool,
    (batch, inputs, outputs): (usize, usize, usize),
    dtype: DType,
) -> [TensorData; 4] {
    let x = fixed_matrix::<B>([batch, inputs], 8, -1.0).require_grad();
    let w = fixed_matrix::<B>([inputs, outputs], 9, -1.0).require_grad();
    let b = fixed_matrix::<B>([1, outputs], 10, -1.0)
        .reshape([outputs])
        .require_grad();
    let cast = FloatDType::from(dtype);
    // Work queued in the fusion stream before it, so that it reads fused output.
    let x_in = (x.clone() * 0.5 + 0.25).cast(cast);
    let (w_in, b_in) = (w.clone().cast(cast), b.clone().cast(cast));
    let y = if ours {
        kiln_kernels::linear(&x_in, &w_in, Some(&b_in)).expect("cuBLAS runs on CUDA")
    } else {
        x_in.matmul(w_in) + b_in.unsqueeze()
    };
    let y = y.cast(FloatDType::F32);
    let loss = (y.clone() * fixed_matrix::<B>(y.dims(), 11, 0.0)).sum();
    let grads = loss.backward();
    [
        y.inner().into_data(),
        x.grad(&grads).unwrap().into_data(),
        w.grad(&grads).unwrap().into_data(),
        b.grad(&grads).unwrap().into_data(),
    ]
}

/// The classifier's product through cuBLAS (forward, and the input's and weight's gradients as
/// two more products) against burn's on the CPU: f32 without TF32 (as PyTorch's matmuls), and
/// bf16; with autodiff and without. (batch, in, out): the quickstart's and ResNet-50's
/// classifiers and odd sizes.
#[test]
fn cublas_matches_burn_on_the_cpu() {
    if !gpu() {
        return;
    }
    let probe = fixed_matrix::<Train>([2, 3], 1, -1.0);
    if kiln_kernels::linear(&probe, &probe.clone().transpose(), None).is_none() {
        skip_or_fail("cuBLAS not used (not on the library path, or KILN_KERNELS)");
        return;
    }
    for case in [(64, 128, 10), (3, 2048, 1000), (1, 5, 7), (17, 33, 1)] {
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 3e-2)] {
            let ours = run_linear::<Train>(true, case, dtype);
            let theirs = run_linear::<Reference>(false, case, DType::F32);
            for (name, (a, b)) in ["y", "dx", "dw", "db"]
                .iter()
                .zip(ours.into_iter().zip(theirs))
            {
                println!("cuBLAS {case:?} {dtype:?}: {name}");
                a.assert_approx_eq::<f32>(&b, Tolerance::rel_abs(tol, tol));
            }
        }
        // Inference (plain `Cuda`, no autodiff).
        let (batch, inputs, outputs) = case;
        let x = fixed_matrix::<Train>([batch, inputs], 8, -1.0).inner();
        let w = fixed_matrix::<Train>([inputs, outputs], 9, -1.0).inner();
        let ours = kiln_kernels::linear(&x, &w, None).expect("cuBLAS runs without autodiff");
        let x = fixed_matrix::<Reference>([batch, inputs], 8, -1.0).inner();
        let w = fixed_matrix::<Reference>([inputs, outputs], 9, -1.0).inner();
        println!("cuBLAS {case:?} inference");
        ours.into_data()
            .assert_approx_eq::<f32>(&x.matmul(w).into_data(), Tolerance::rel_abs(1e-4, 1e-4));
    }
}

/// burn's own CUDA convolution (autotuned cubecl kernels, what runs without cuDNN) against the
/// same reference, TF32 allowed as burn's matmuls may use it. On an H200 at 3dff4fb its
/// gradients were 0.34 off on layer 4's shape (`kiln compare --backends flex,cuda`); this names
/// the pass and shape that is wrong.
#[test]
fn burns_cuda_convolution_matches_burn_on_the_cpu() {
    if !gpu() {
        return;
    }
    for (i, case) in CASES.into_iter().enumerate() {
        let burn = run::<Train>(false, case, DType::F32, true);
        compare("burn's CUDA kernel", i, burn, reference(case, true), 3e-2);
    }
}

/// burn's implicit-GEMM weight gradient (`ConvStrategy::ImplicitGemm`: cubek's synchronous cmma
/// kernel, one of the candidates autotune may keep) launched directly, against the CPU: before
/// patches/cubek-convolution its output checked rows and columns with each other's flags, and
/// where the output channels fill the stages and the kernel columns do not (the last case) it
/// wrote zeros over `dW[:, :, 0, 0]`. TF32 products, so the tolerance of burn's CUDA kernels.
#[test]
fn burns_implicit_gemm_weight_gradient_matches_burn_on_the_cpu() {
    use burn::tensor::{Shape, TensorPrimitive};
    use burn_cubecl::kernel::conv::{ConvStrategy, conv_weight_backward};
    use cubecl_cuda::CudaRuntime;
    type Cube = burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>;

    if !gpu() {
        return;
    }
    let on_gpu = |t: Tensor<Reference, 4>| {
        Tensor::<Cube, 4>::from_data(t.inner().into_data(), &Default::default())
            .into_primitive()
            .tensor()
    };
    for (i, case) in CASES.into_iter().enumerate() {
        let (x_shape, w_shape, stride, padding) = case;
        let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
        let size = |d: usize| (x_shape[d] + 2 * padding - w_shape[d]) / stride + 1;
        let y_shape = [x_shape[0], w_shape[0], size(2), size(3)];
        // The inputs and output gradient of `run`'s weighted loss.
        let x = on_gpu(fixed::<Reference>(x_shape, 1, -1.0) * 0.5 + 0.25);
        let dy = on_gpu(fixed::<Reference>(y_shape, 3, 0.0));
        let shape = Shape::from(w_shape.to_vec());
        match conv_weight_backward::<CudaRuntime, 2>(
            x,
            dy,
            shape,
            options,
            ConvStrategy::ImplicitGemm,
        ) {
            Ok(dw) => {
                let dw = Tensor::<Cube, 4>::from_primitive(TensorPrimitive::Float(dw));
                let [_, _, expected] = reference(case, true);
                println!("burn's implicit-GEMM weight gradient, case {i}");
                dw.into_data()
                    .assert_approx_eq::<f32>(&expected, Tolerance::rel_abs(3e-2, 3e-2));
            }
            Err(why) => println!("case {i}: the implicit GEMM does not take it: {why:?}"),
        }
    }
}

/// ResNeXt's grouped convolutions: (input, weight, stride, groups), 3x3 with padding 1.
const GROUPED: [([usize; 4], [usize; 4], usize, usize); 4] = [
    // resnext50_32x4d's layer 1 and layer 2's first block, batch 2, at 32x32.
    ([2, 128, 8, 8], [128, 4, 3, 3], 1, 32),
    ([2, 256, 8, 8], [256, 8, 3, 3], 2, 32),
    ([3, 6, 5, 5], [6, 1, 3, 3], 1, 6),
    ([2, 16, 11, 13], [24, 8, 3, 3], 1, 2),
];

/// Forward and both gradients of a grouped convolution, through kiln (cuDNN with
/// `cudnnSetConvolutionGroupCount`) or burn, in f32.
fn run_grouped<B: AutodiffBackend>(
    ours: bool,
    (x_shape, w_shape, stride, groups): ([usize; 4], [usize; 4], usize, usize),
) -> [TensorData; 3] {
    let options = ConvOptions::new([stride; 2], [1, 1], [1, 1], groups);
    let (x, w) = (fixed::<B>(x_shape, 1, -1.0), fixed::<B>(w_shape, 2, -1.0));
    let (x, w) = (x.require_grad(), w.require_grad());
    let y = if ours {
        kiln_kernels::conv2d(x.clone(), w.clone(), options)
    } else {
        module::conv2d(x.clone(), w.clone(), None, options)
    };
    let grads = (y.clone() * fixed::<B>(y.dims(), 3, 0.0)).sum().backward();
    [
        y.inner().into_data(),
        x.grad(&grads).unwrap().into_data(),
        w.grad(&grads).unwrap().into_data(),
    ]
}

/// Grouped convolutions through cuDNN against burn's on the CPU (flex's grouped convolution and
/// its gradients are checked against one convolution per group in kiln-kernels' unit tests).
#[test]
fn cudnn_grouped_matches_burn_on_the_cpu() {
    if !gpu_with_cudnn() {
        return;
    }
    kiln_kernels::set_tf32(false);
    for (i, case) in GROUPED.into_iter().enumerate() {
        let ours = run_grouped::<Train>(true, case);
        compare(
            "grouped f32",
            i,
            ours,
            run_grouped::<Reference>(false, case),
            1e-3,
        );
    }
    kiln_kernels::set_tf32(true);
}

/// Set in the child process of [`choices_are_kept_in_kilns_cache`].
const CHILD: &str = "KILN_TEST_CUDNN_KEPT_CHILD";

/// cuDNN's algorithm choices are kept in kiln's cache and read back by a later process: where
/// the file holds a choice, it runs without a search (its entry stays as written), and a kept
/// choice that cannot run is measured again and replaced, the result still right. In a child
/// process with a cache folder of its own (a process reads its choices once).
#[test]
fn choices_are_kept_in_kilns_cache() {
    if std::env::var_os(CHILD).is_some() {
        return kept_choices_child();
    }
    if !gpu_with_cudnn() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "choices_are_kept_in_kilns_cache", "--nocapture"])
        .env(CHILD, "1")
        .env("KILN_CACHE_DIR", cache.path())
        .status()
        .unwrap();
    assert!(status.success(), "the child process failed: {status}");
}

fn kept_choices_child() {
    use serde_json::{Value, json};
    let cache = std::path::PathBuf::from(std::env::var_os("KILN_CACHE_DIR").unwrap());
    assert!(gpu_with_cudnn());
    let gpu = cudarc::driver::result::device::get(0)
        .and_then(cudarc::driver::result::device::get_name)
        .unwrap();
    let version = kiln_kernels::cudnn_status().unwrap();
    let file =
        kiln_download::kernel_folder(&cache, "cuda", &gpu).join(format!("cudnn-{version}.json"));
    // Case `plain` kept for every pass as algorithm 0 (implicit GEMM, any shape) with a
    // workspace no search reports for it; case `strided`'s forward kept as FFT, which cuDNN
    // refuses at stride 2.
    let (plain, strided) = (CASES[1], CASES[3]);
    let key = |pass: &str,
               (x, w, stride, padding): ([usize; 4], [usize; 4], usize, usize),
               aligned: bool| {
        let size = |i: usize| (x[i] + 2 * padding - w[i]) / stride + 1;
        json!({
            "pass": pass, "data": "f32", "tf32": false, "aligned": aligned,
            "geometry": {
                "x": x, "w": w, "y": [x[0], w[0], size(2), size(3)],
                "padding": [padding, padding], "stride": [stride, stride], "dilation": [1, 1],
            },
        })
    };
    let mut choices = Vec::new();
    for aligned in [true, false] {
        for pass in ["forward", "backward_data", "backward_filter"] {
            let choice = json!({"algo": 0, "math": "fma", "workspace": 4096});
            choices.push(json!({"key": key(pass, plain, aligned), "choice": choice}));
        }
        let fft = json!({"algo": 4, "math": "fma", "workspace": 0});
        choices.push(json!({"key": key("forward", strided, aligned), "choice": fft}));
    }
    let written = json!({"format": 1, "gpu": gpu, "cudnn": version, "choices": choices});
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, serde_json::to_string_pretty(&written).unwrap()).unwrap();

    kiln_kernels::set_tf32(false);
    for (i, case) in [plain, strided].into_iter().enumerate() {
        let ours = run::<Train>(true, case, DType::F32, true);
        compare("kept", i, ours, reference(case, true), 1e-3);
    }

    let after: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let after = after["choices"].as_array().unwrap();
    let find = |key: &Value| {
        after
            .iter()
            .filter(|e| &e["key"] == key)
            .map(|e| &e["choice"])
            .collect::<Vec<_>>()
    };
    for aligned in [true, false] {
        for pass in ["forward", "backward_data", "backward_filter"] {
            let kept = find(&key(pass, plain, aligned));
            assert_eq!(kept.len(), 1, "{pass}: {kept:?}");
            assert_eq!(
                kept[0]["workspace"], 4096,
                "{pass} was searched again: {kept:?}"
            );
        }
    }
    let forward: Vec<_> = [true, false]
        .iter()
        .flat_map(|&a| find(&key("forward", strided, a)))
        .collect();
    assert_eq!(forward.len(), 2, "{forward:?}");
    assert!(
        forward.iter().any(|c| c["algo"] != 4),
        "the failing FFT choice was not replaced: {forward:?}"
    );
    let gradients: Vec<_> = [true, false]
        .iter()
        .flat_map(|&a| ["backward_data", "backward_filter"].map(|p| find(&key(p, strided, a))))
        .flatten()
        .collect();
    assert!(
        gradients.len() >= 2,
        "the strided gradients' choices were not kept: {after:?}"
    );
}
