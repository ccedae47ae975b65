//! ResNeXt-50 32x4d's grouped 3x3 convolutions (32 groups) at 224x224 inputs, timed on flex
//! through burn's convolution and through kiln's: forward alone (plain flex) and forward plus
//! both gradients (`Autodiff<Flex>`), in milliseconds, median of 5 after one warm-up.
//!
//!     cargo run --release -p kiln-kernels --features flex --example grouped_shapes [-- BATCH]

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Distribution, Tensor, module};

type Train = Autodiff<Flex>;

/// (channels, input size, stride, how many ResNeXt-50 has)
const SHAPES: [(usize, usize, usize, usize); 7] = [
    (128, 56, 1, 3),
    (256, 56, 2, 1),
    (256, 28, 1, 3),
    (512, 28, 2, 1),
    (512, 14, 1, 5),
    (1024, 14, 2, 1),
    (1024, 7, 1, 2),
];

const GROUPS: usize = 32;

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..5)
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
        .unwrap_or(8);
    let device = Default::default();
    println!(
        "batch {batch}, {GROUPS} groups, times in ms; \"x N\" is how often ResNeXt-50 has the shape"
    );
    println!("| convolution | x N | forward burn | forward kiln | fwd+bwd burn | fwd+bwd kiln |");
    println!("|---|---:|---:|---:|---:|---:|");
    let (mut total_burn, mut total_kiln) = (0.0, 0.0);
    for (channels, size, stride, count) in SHAPES {
        let options = ConvOptions::new([stride; 2], [1, 1], [1, 1], GROUPS);
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<Train, 4>::random([batch, channels, size, size], normal, &device);
        let shape = [channels, channels / GROUPS, 3, 3];
        let w = Tensor::<Train, 4>::random(shape, normal, &device);
        let (x, w) = (x.require_grad(), w.require_grad());
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
                let _ = (x.grad(&grads), w.grad(&grads));
            })
        };
        let (both_burn, both_kiln) = (both(false), both(true));
        total_burn += both_burn * count as f64;
        total_kiln += both_kiln * count as f64;
        println!(
            "| {channels} 3x3/{stride} at {size}x{size} | {count} | {forward_burn:.1} | {forward_kiln:.1} | {both_burn:.1} | {both_kiln:.1} |"
        );
    }
    println!(
        "all of ResNeXt-50's grouped convolutions, forward and backward: burn {total_burn:.0} ms, kiln {total_kiln:.0} ms ({:.2}x)",
        total_burn / total_kiln
    );
}
