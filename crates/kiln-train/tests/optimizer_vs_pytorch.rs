//! kiln's optimizers against PyTorch's update rule, step by step, on a small tensor with given
//! gradients and learning rates (`fixtures/make_optimizer_steps.py` wrote the reference in
//! float64; kiln computes in float32, hence the 1e-5 tolerance).

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use kiln_train::config::{OptimizerConfig, OptimizerName};
use kiln_train::optim::AnyOptimizer;

#[derive(Module, Debug)]
struct Weights<B: burn::tensor::backend::Backend> {
    w: Param<Tensor<B, 1>>,
}

fn reference() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/optimizer_steps.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

/// Runs the steps and returns the largest difference from PyTorch's parameters.
fn run<B: AutodiffBackend>(config: &OptimizerConfig, expected: &serde_json::Value) -> f32 {
    let device = B::Device::default();
    let data = reference();
    let start = floats(&data["start"]);
    let mut model = Weights::<B> {
        w: Param::from_tensor(Tensor::from_data(TensorData::new(start, [5]), &device)),
    };
    let mut optimizer = AnyOptimizer::<Weights<B>, B>::new(config);
    let mut worst = 0f32;
    let steps = data["grads"]
        .as_array()
        .unwrap()
        .iter()
        .zip(data["lrs"].as_array().unwrap());
    for (step, (grad, lr)) in steps.enumerate() {
        // d/dw sum(w * g) = g: the gradient of this step.
        let g = Tensor::<B, 1>::from_data(TensorData::new(floats(grad), [5]), &device);
        let loss = (model.w.val() * g).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(lr.as_f64().unwrap(), model, grads);
        let got: Vec<f32> = model.w.val().into_data().to_vec().unwrap();
        for (a, b) in got.iter().zip(floats(&expected[step])) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

fn config(name: OptimizerName, edit: impl FnOnce(&mut OptimizerConfig)) -> OptimizerConfig {
    let mut config = OptimizerConfig {
        name,
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: None,
        betas: [0.9, 0.999],
        eps: 1e-8,
    };
    edit(&mut config);
    config
}

#[test]
fn every_optimizer_follows_pytorchs_update_rule() {
    let runs = reference()["runs"].clone();
    let cases = [
        ("sgd_plain", config(OptimizerName::Sgd, |_| {})),
        (
            "sgd_momentum_wd",
            config(OptimizerName::Sgd, |c| {
                c.momentum = 0.9;
                c.weight_decay = Some(5e-4);
            }),
        ),
        (
            "sgd_nesterov",
            config(OptimizerName::Sgd, |c| {
                c.momentum = 0.9;
                c.nesterov = true;
                c.weight_decay = Some(5e-4);
            }),
        ),
        (
            "sgd_dampening",
            config(OptimizerName::Sgd, |c| {
                c.momentum = 0.8;
                c.dampening = 0.3;
            }),
        ),
        ("adam", config(OptimizerName::Adam, |_| {})),
        (
            "adam_wd",
            config(OptimizerName::Adam, |c| {
                c.betas = [0.8, 0.99];
                c.weight_decay = Some(0.1);
            }),
        ),
        ("adamw", config(OptimizerName::Adamw, |_| {})),
        (
            "adamw_wd",
            config(OptimizerName::Adamw, |c| {
                c.weight_decay = Some(0.3);
                c.eps = 1e-6;
            }),
        ),
    ];
    for (name, config) in cases {
        let worst = run::<Autodiff<Flex>>(&config, &runs[name]);
        println!("{name}: largest difference from PyTorch {worst:.2e}");
        assert!(worst < 1e-5, "{name} differs from PyTorch by {worst}");
    }
}
