//! kiln's optimizers against PyTorch's update rule, step by step, on a small tensor with given
//! gradients and learning rates (`fixtures/make_optimizer_steps.py` wrote the reference in
//! float64; kiln computes in float32, hence the 1e-5 tolerance). Gradient clipping too, over
//! two parameters, as `torch.nn.utils.clip_grad_norm_` and `clip_grad_value_` do it, and the
//! weights' moving average against torchvision's (`AveragedModel` with an EMA update), and the
//! class-weighted, label-smoothed loss against `CrossEntropyLoss(weight=..., label_smoothing=...)`,
//! and parameter groups with frozen parameters against PyTorch's parameter groups.

use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param, ParamId, RunningState};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use kiln_config::config::{
    ClassWeights, GroupConfig, ModelConfig, OptimizerConfig, OptimizerName, TrainConfig,
};
use kiln_train::clip::clip_gradients;
use kiln_train::ema::Ema;
use kiln_train::optim::AnyOptimizer;
use kiln_train::param_groups::ParamGroups;

#[derive(Module, Debug)]
struct Weights<B: burn::tensor::backend::Backend> {
    w: Param<Tensor<B, 1>>,
}

/// A parameter and a buffer, as batch norm has.
#[derive(Module, Debug)]
struct WithBuffer<B: burn::tensor::backend::Backend> {
    w: Param<Tensor<B, 1>>,
    running: RunningState<Tensor<B, 1>>,
}

#[derive(Module, Debug)]
struct Two<B: burn::tensor::backend::Backend> {
    w: Param<Tensor<B, 1>>,
    v: Param<Tensor<B, 2>>,
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
        clip_grad_norm: None,
        clip_grad_value: None,
        groups: Vec::new(),
        no_weight_decay: Vec::new(),
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

/// `[[a, b, c], [d, e, f]]` as a 2x3 tensor.
fn matrix<B: AutodiffBackend>(value: &serde_json::Value, device: &B::Device) -> Tensor<B, 2> {
    let rows: Vec<f32> = value.as_array().unwrap().iter().flat_map(floats).collect();
    Tensor::from_data(TensorData::new(rows, [2, 3]), device)
}

/// Runs the clipping case `name` and returns the largest difference from PyTorch's parameters
/// and from its norms before clipping.
fn run_clipped<B: AutodiffBackend>(config: &OptimizerConfig, name: &str) -> (f32, f64) {
    let device = B::Device::default();
    let data = reference()["clipping"].clone();
    let mut model = Two::<B> {
        w: Param::from_tensor(Tensor::from_data(
            TensorData::new(floats(&data["start"]["w"]), [5]),
            &device,
        )),
        v: Param::from_tensor(matrix(&data["start"]["v"], &device)),
    };
    let mut optimizer = AnyOptimizer::<Two<B>, B>::new(config);
    let (mut worst, mut worst_norm) = (0f32, 0f64);
    let steps = data["grads"].as_array().unwrap();
    for (grad, expected) in steps.iter().zip(data["runs"][name].as_array().unwrap()) {
        let gw = Tensor::<B, 1>::from_data(TensorData::new(floats(&grad["w"]), [5]), &device);
        let gv = matrix::<B>(&grad["v"], &device);
        let loss = (model.w.val() * gw).sum() + (model.v.val() * gv).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let (grads, norm) = clip_gradients(&model, grads, optimizer.clipping);
        let norm: f64 = norm.unwrap().into_scalar().elem();
        worst_norm = worst_norm.max((norm - expected["norm"].as_f64().unwrap()).abs());
        model = optimizer.step(config.lr, model, grads);
        let w: Vec<f32> = model.w.val().into_data().to_vec().unwrap();
        let v: Vec<f32> = model.v.val().into_data().to_vec().unwrap();
        let want_v: Vec<f32> = expected["v"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(floats)
            .collect();
        for (a, b) in w
            .iter()
            .chain(&v)
            .zip(floats(&expected["w"]).iter().chain(&want_v))
        {
            worst = worst.max((a - b).abs());
        }
    }
    (worst, worst_norm)
}

#[test]
fn clipping_follows_pytorchs_clip_grad_norm_and_clip_grad_value() {
    let cases = [
        (
            "sgd_momentum_norm",
            config(OptimizerName::Sgd, |c| {
                c.momentum = 0.9;
                c.weight_decay = Some(5e-4);
                c.clip_grad_norm = Some(0.8);
            }),
        ),
        (
            "adamw_value",
            config(OptimizerName::Adamw, |c| {
                c.lr = 0.05;
                c.weight_decay = Some(0.01);
                c.clip_grad_value = Some(0.35);
            }),
        ),
    ];
    for (name, config) in cases {
        let (worst, worst_norm) = run_clipped::<Autodiff<Flex>>(&config, name);
        println!("{name}: largest difference from PyTorch {worst:.2e}, norms {worst_norm:.2e}");
        assert!(worst < 1e-5, "{name} differs from PyTorch by {worst}");
        assert!(worst_norm < 1e-5, "{name}'s norm differs by {worst_norm}");
    }
    // Unclipped, the same gradients take PyTorch's clipped path elsewhere: the check can fail.
    let unclipped = config(OptimizerName::Sgd, |c| {
        c.momentum = 0.9;
        c.weight_decay = Some(5e-4);
    });
    let (worst, _) = run_clipped::<Autodiff<Flex>>(&unclipped, "sgd_momentum_norm");
    assert!(worst > 1e-2, "clipping changed nothing: {worst}");
}

#[test]
fn ema_follows_torchvisions_averaged_model_with_buffers_copied() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    let data = reference()["ema"].clone();
    let at = |step: usize| {
        let model = &data["models"][step];
        let vector = |key: &str| {
            let values = floats(&model[key]);
            let n = values.len();
            Tensor::<B, 1>::from_data(TensorData::new(values, [n]), &device)
        };
        WithBuffer {
            w: Param::from_tensor(vector("w")),
            running: RunningState::new(vector("running")),
        }
    };
    let (decay, every) = (
        data["decay"].as_f64().unwrap(),
        data["every"].as_u64().unwrap(),
    );
    let warmup = data["warmup_steps"].as_u64().unwrap();
    let mut ema = Ema::<B, WithBuffer<B>>::new(&at(0));
    let mut expected = data["updates"].as_array().unwrap().iter();
    let mut worst = 0f32;
    for step in 1..data["models"].as_array().unwrap().len() {
        if !(step as u64).is_multiple_of(every) {
            continue;
        }
        ema.update(&at(step), decay);
        if step as u64 <= warmup {
            ema.reset();
        }
        let want = expected.next().unwrap();
        let w: Vec<f32> = ema.model.w.val().into_data().to_vec().unwrap();
        let running: Vec<f32> = ema.model.running.value().into_data().to_vec().unwrap();
        let pairs = w.iter().zip(floats(&want["w"]));
        for (a, b) in pairs.chain(running.iter().zip(floats(&want["running"]))) {
            worst = worst.max((a - b).abs());
        }
    }
    assert!(expected.next().is_none(), "every update was checked");
    println!("EMA: largest difference from torchvision's {worst:.2e}");
    assert!(
        worst < 1e-5,
        "the EMA differs from torchvision's by {worst}"
    );
}

#[test]
fn class_weights_follow_pytorchs_weighted_mean_with_label_smoothing() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    let data = reference()["class_weights"].clone();
    let rows: Vec<f32> = data["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(floats)
        .collect();
    let n = rows.len() / 3;
    let targets: Vec<i64> = data["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    let list: Vec<f64> = data["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_f64().unwrap())
        .collect();
    let weights = ClassWeights::List(list).resolve(&[1, 1, 1]).unwrap();
    let text = r#"
epochs = 1
batch_size = 4
[data]
source = { kind = "synthetic", train_size = 4, image_size = 8, num_classes = 3 }
[optimizer]
name = "sgd"
lr = 0.1
"#;
    for case in data["cases"].as_array().unwrap() {
        let smoothing = case["smoothing"].as_f64().unwrap();
        let set = [format!("loss.label_smoothing = {smoothing}")];
        let config = TrainConfig::parse(text, std::path::Path::new("t.toml"), &set).unwrap();
        let loss_fn = kiln_train::step::loss_function::<B>(&config, Some(&weights), &device);
        let logits = Tensor::<B, 2>::from_data(TensorData::new(rows.clone(), [n, 3]), &device);
        let labels = Tensor::from_data(TensorData::new(targets.clone(), [n]), &device);
        let got: f64 = loss_fn.forward(logits, labels).into_scalar().elem();
        let want = case["loss"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-6,
            "smoothing {smoothing}: {got} against {want}"
        );
    }
    // scikit-learn's "balanced": n_images / (n_classes * images_of_class).
    let balanced = ClassWeights::Named("balanced".into())
        .resolve(&[3, 1, 0])
        .unwrap();
    for (got, want) in balanced.iter().zip([4.0 / 9.0, 4.0 / 3.0, 4.0 / 3.0]) {
        assert!((got - want).abs() < 1e-6, "{balanced:?}");
    }
    assert!(ClassWeights::List(vec![1.0]).resolve(&[2, 2]).is_err());
}

/// Parameters as a ResNet names them, each a flat tensor.
#[derive(Module, Debug)]
struct Flat<B: burn::tensor::backend::Backend> {
    params: Vec<Param<Tensor<B, 1>>>,
}

/// Runs the parameter-group steps of `name` (frozen parameters until the fixture's step,
/// state saved and loaded into a fresh optimizer half-way) and returns the largest difference.
fn run_groups<B: AutodiffBackend>(name: &str, optimizer: OptimizerConfig) -> f32 {
    let data = reference()["parameter_groups"].clone();
    let start = data["start"].as_object().unwrap();
    let names: Vec<String> = start.keys().cloned().collect();
    let device = B::Device::default();
    let tensor = |values: &serde_json::Value| {
        let values = floats(values);
        let len = values.len();
        Tensor::<B, 1>::from_data(TensorData::new(values, [len]), &device)
    };
    let mut model = Flat::<B> {
        params: names
            .iter()
            .map(|n| Param::from_tensor(tensor(&start[n])))
            .collect(),
    };
    let ids: Vec<(String, ParamId)> = names
        .iter()
        .cloned()
        .zip(model.params.iter().map(|p| p.id))
        .collect();
    let frozen: Vec<String> = serde_json::from_value(data["frozen"].clone()).unwrap();
    let section = ModelConfig {
        freeze: frozen,
        ..ModelConfig::default()
    };
    let groups = Arc::new(ParamGroups::new(&names, &section, &optimizer).unwrap());
    let mut adam = AnyOptimizer::<Flat<B>, B>::with_groups(&optimizer, groups.clone());
    let unfreeze = data["unfreeze"].as_u64().unwrap() as usize;
    let expected = &data["runs"][name]["steps"];
    let saved = tempfile::tempdir().unwrap();
    let mut worst = 0f32;
    let lrs = data["lrs"].as_array().unwrap();
    for (step, (grads, lr)) in data["grads"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lrs)
        .enumerate()
    {
        if step == unfreeze + 1 {
            // Every group has state by now: a checkpoint's round trip keeps each in its group.
            adam.save(&saved.path().join("optimizer")).unwrap();
            adam = AnyOptimizer::with_groups(&optimizer, groups.clone());
            adam.resolve(&ids, false);
            adam = adam.load(&saved.path().join("optimizer"), &device).unwrap();
        }
        adam.resolve(&ids, step < unfreeze);
        // d/dp sum(p * g) = g, for every parameter.
        let loss = (names.iter().zip(&model.params))
            .map(|(n, p)| (p.val() * tensor(&grads[n])).sum())
            .reduce(|a, b| a + b)
            .unwrap();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = adam.trainable(&model, grads);
        model = adam.step(lr.as_f64().unwrap(), model, grads);
        for (n, p) in names.iter().zip(&model.params) {
            let got: Vec<f32> = p.val().into_data().to_vec().unwrap();
            for (a, b) in got.iter().zip(floats(&expected[step][n])) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    worst
}

#[test]
fn parameter_groups_and_freezing_follow_pytorchs_parameter_groups() {
    let data = reference()["parameter_groups"].clone();
    let fc = GroupConfig {
        params: vec!["fc".into()],
        lr_scale: data["fc_lr_scale"].as_f64().unwrap(),
        weight_decay: data["fc_weight_decay"].as_f64(),
    };
    for (name, optimizer) in [("sgd", OptimizerName::Sgd), ("adamw", OptimizerName::Adamw)] {
        let config = config(optimizer, |c| {
            if name == "sgd" {
                c.momentum = 0.9;
                c.nesterov = true;
            }
            c.weight_decay = data["runs"][name]["weight_decay"].as_f64();
            c.no_weight_decay = vec!["bn".into(), "bias".into()];
            c.groups = vec![fc.clone()];
        });
        let worst = run_groups::<Autodiff<Flex>>(name, config);
        println!("{name} with groups: largest difference from PyTorch {worst:.2e}");
        assert!(
            worst < 1e-5,
            "{name} with groups differs from PyTorch by {worst}"
        );
    }
}
