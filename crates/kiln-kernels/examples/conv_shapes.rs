//! Every convolution shape of ResNet-18 with the CIFAR stem, timed on flex through burn's
//! convolution and through kiln's: forward alone (plain flex) and forward plus both gradients
//! (`Autodiff<Flex>`), in milliseconds, median of 7 after one warm-up.
//!
//!     cargo run --release -p kiln-kernels --features flex --example conv_shapes [-- BATCH]

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Distribution, Tensor, module};

type Train = Autodiff<Flex>;

/// (input channels, output channels, input size, stride, kernel, how many ResNet-18 has)
const SHAPES: [(usize, usize, usize, usize, usize, usize); 11] = [
    (3, 64, 32, 1, 3, 1),
    (64, 64, 32, 1, 3, 4),
    (64, 128, 32, 2, 3, 1),
    (64, 128, 32, 2, 1, 1),
    (128, 128, 16, 1, 3, 3),
    (128, 256, 16, 2, 3, 1),
    (128, 256, 16, 2, 1, 1),
    (256, 256, 8, 1, 3, 3),
    (256, 512, 8, 2, 3, 1),
    (256, 512, 8, 2, 1, 1),
    (512, 512, 4, 1, 3, 3),
];

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let batch: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(32);
    let device = Default::default();
    println!(
        "batch {batch}, times in ms; \"x N\" is how often ResNet-18 (CIFAR stem) has the shape"
    );
    println!(
        "| convolution | x N | GFLOP | forward burn | forward kiln | fwd+bwd burn | fwd+bwd kiln | kiln GFLOP/s (fwd+bwd) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let (mut total_burn, mut total_kiln) = (0.0, 0.0);
    for (c_in, c_out, size, stride, kernel, count) in SHAPES {
        let padding = kernel / 2;
        let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<Train, 4>::random([batch, c_in, size, size], normal, &device);
        let w = Tensor::<Train, 4>::random([c_out, c_in, kernel, kernel], normal, &device);
        // The stem's input is the images, which need no gradient.
        let x = if c_in == 3 { x } else { x.require_grad() };
        let w = w.require_grad();
        let (xi, wi) = (x.clone().inner(), w.clone().inner());

        let forward_burn = median_ms(|| {
            let _ = module::conv2d(xi.clone(), wi.clone(), None, options.clone()).into_primitive();
        });
        let forward_kiln = median_ms(|| {
            let _ = kiln_kernels::conv2d(xi.clone(), wi.clone(), options.clone()).into_primitive();
        });
        let both = |kiln: bool| {
            median_ms(|| {
                let y = if kiln {
                    kiln_kernels::conv2d(x.clone(), w.clone(), options.clone())
                } else {
                    module::conv2d(x.clone(), w.clone(), None, options.clone())
                };
                let grads = y.sum().backward();
                let _ = w.grad(&grads);
            })
        };
        let (both_burn, both_kiln) = (both(false), both(true));
        total_burn += both_burn * count as f64;
        total_kiln += both_kiln * count as f64;

        let out = size / stride;
        let gflop = 2.0 * (batch * c_out * c_in * kernel * kernel * out * out) as f64 / 1e9;
        let passes = if c_in == 3 { 2.0 } else { 3.0 };
        println!(
            "| {c_in}->{c_out} {kernel}x{kernel}/{stride} at {size}x{size} | {count} | {gflop:.2} | {forward_burn:.1} | {forward_kiln:.1} | {both_burn:.1} | {both_kiln:.1} | {:.0} |",
            passes * gflop / both_kiln * 1000.0
        );
    }
    println!(
        "all of ResNet-18's convolutions, forward and backward: burn {total_burn:.0} ms, kiln {total_kiln:.0} ms ({:.2}x)",
        total_burn / total_kiln
    );
}
