//! The ONNX export, run by another runtime: tract (a pure-Rust ONNX runtime) computes the same
//! logits as kiln from the exported file, for ResNet-18 and ResNet-50 with both stems, ResNeXt
//! (grouped convolutions) and ResNet-D (the deep stem, average-pool shortcuts on odd maps),
//! batch norm folded and kept, at two batch sizes from one file.

use std::collections::BTreeMap;

use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor, TensorData};
use kiln_models::onnx::{OnnxOptions, save_onnx};
use kiln_models::{ResNet, ResNetConfig, Stem, weights};
use tract_onnx::prelude::*;

type B = Flex;

/// A small ResNet of `name` whose batch norms hold statistics and affine parameters far from
/// their initial values (or folding them would change nothing).
fn model(name: &str, stem: Stem, dir: &std::path::Path) -> ResNet<B> {
    let device = Default::default();
    let config = ResNetConfig::from_name(name)
        .unwrap()
        .with_num_classes(7)
        .with_input_stem(stem)
        .with_width(8);
    let model = config.init::<B>(&device).unwrap();
    let mut state: BTreeMap<String, TensorData> = weights::torch_state_dict(&model);
    for (name, data) in state.iter_mut() {
        let shape = data.shape.to_vec();
        let random = |low: f64, high: f64| {
            Tensor::<B, 1>::random([shape[0]], Distribution::Uniform(low, high), &device)
                .into_data()
        };
        *data = match name.rsplit('.').next().unwrap() {
            "running_mean" => random(-0.5, 0.5),
            "running_var" => random(0.5, 2.0),
            "bias" if !name.starts_with("fc") => random(-0.3, 0.3),
            "weight" if shape.len() == 1 => random(0.5, 1.5),
            _ => continue,
        };
    }
    let path = dir.join(format!("{name}.safetensors"));
    weights::write_safetensors(&state, &path).unwrap();
    weights::load(model, &path).unwrap().0
}

/// `[n, 3, size, size]` images, standard normal.
fn images(n: usize, size: usize) -> Tensor<B, 4> {
    Tensor::random(
        [n, 3, size, size],
        Distribution::Normal(0.0, 1.0),
        &Default::default(),
    )
}

/// Runs the ONNX file at `path` on `images` with tract.
fn run_onnx(path: &std::path::Path, images: &Tensor<B, 4>) -> Vec<f32> {
    let plan = tract_onnx::onnx()
        .model_for_path(path)
        .unwrap()
        .into_optimized()
        .unwrap()
        .into_runnable()
        .unwrap();
    let shape = images.dims();
    let values = images.to_data().to_vec::<f32>().unwrap();
    let input = tract_ndarray::Array4::from_shape_vec(shape, values).unwrap();
    let outputs = plan
        .run(tvec!(tract_onnx::prelude::Tensor::from(input).into()))
        .unwrap();
    outputs[0]
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect()
}

/// Compares kiln's logits with tract's on the export of `name` with `stem`.
fn check(name: &str, stem: Stem, size: usize, fold: bool) {
    let dir = tempfile::tempdir().unwrap();
    let model = model(name, stem, dir.path());
    let path = dir.path().join("model.onnx");
    let options = OnnxOptions {
        fold_batch_norm: fold,
        image_size: Some([size, size]),
        ..OnnxOptions::default()
    };
    save_onnx(&model, &path, &options).unwrap();
    // Two batch sizes from the one file: the batch dimension is dynamic.
    for n in [1, 7] {
        let x = images(n, size);
        let expected = model
            .forward(x.clone())
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let actual = run_onnx(&path, &x);
        assert_eq!(
            actual.len(),
            expected.len(),
            "{name} {stem:?}: logits' shape"
        );
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = expected
            .iter()
            .zip(&actual)
            .map(|(a, b)| (a - b).abs() / scale)
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-4,
            "{name} {stem:?} (fold {fold}), batch {n}: logits differ by {worst:e} of their largest ({scale})"
        );
    }
}

#[test]
fn resnet18_runs_the_same_in_onnx_with_both_stems() {
    check("resnet18", Stem::Imagenet, 64, true);
    check("resnet18", Stem::Cifar, 16, true);
}

#[test]
fn resnet50_runs_the_same_in_onnx_with_both_stems() {
    check("resnet50", Stem::Imagenet, 64, true);
    check("resnet50", Stem::Cifar, 16, true);
}

#[test]
fn unfolded_batch_norm_runs_the_same() {
    check("resnet18", Stem::Imagenet, 32, false);
    check("resnet50", Stem::Cifar, 16, false);
}

/// Width 8: 4 groups in the 3x3 convolutions, 4 channels each in layer 1.
#[test]
fn resnext_runs_the_same_in_onnx_with_its_groups() {
    check("resnext50_32x4d", Stem::Imagenet, 64, true);
    check("resnext50_32x4d", Stem::Cifar, 16, false);
    let dir = tempfile::tempdir().unwrap();
    let model = model("resnext50_32x4d", Stem::Imagenet, dir.path());
    let path = dir.path().join("model.onnx");
    save_onnx(&model, &path, &OnnxOptions::default()).unwrap();
    let graph = tract_onnx::onnx()
        .proto_model_for_path(&path)
        .unwrap()
        .graph
        .unwrap();
    let group = |name: &str| {
        let node = graph.node.iter().find(|n| n.name == name).unwrap();
        node.attribute.iter().find(|a| a.name == "group").unwrap().i
    };
    assert_eq!(group("layer1.0.conv2"), 4);
    assert_eq!(group("layer1.0.conv1"), 1);
}

/// 72x72 inputs: layer 3's shortcut pools a 9x9 map to 5x5, rounding up; timm's node names.
#[test]
fn resnet_d_runs_the_same_in_onnx() {
    check("resnet50d", Stem::Imagenet, 72, true);
    check("resnet18d", Stem::Imagenet, 72, false);
    let dir = tempfile::tempdir().unwrap();
    let model = model("resnet50d", Stem::Imagenet, dir.path());
    let path = dir.path().join("model.onnx");
    save_onnx(&model, &path, &OnnxOptions::default()).unwrap();
    let graph = tract_onnx::onnx()
        .proto_model_for_path(&path)
        .unwrap()
        .graph
        .unwrap();
    let names: Vec<&str> = graph.node.iter().map(|n| n.name.as_str()).collect();
    for name in [
        "conv1.0",
        "conv1.3",
        "conv1.6",
        "layer2.0.downsample.0",
        "layer2.0.downsample.1",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let error = save_onnx(
        &model,
        &path,
        &OnnxOptions {
            opset: 9,
            ..OnnxOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("opset 10"), "{error}");
}

#[test]
fn the_file_declares_a_dynamic_batch_opset_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let model = model("resnet18", Stem::Cifar, dir.path());
    let path = dir.path().join("model.onnx");
    let options = OnnxOptions {
        opset: 13,
        metadata: vec![("classes".into(), "[\"cat\",\"dog\"]".into())],
        ..OnnxOptions::default()
    };
    save_onnx(&model, &path, &options).unwrap();
    let proto = tract_onnx::onnx().proto_model_for_path(&path).unwrap();
    assert_eq!(proto.opset_import[0].version, 13);
    assert_eq!(proto.ir_version, 7);
    assert_eq!(proto.metadata_props[0].key, "classes");
    assert_eq!(proto.metadata_props[0].value, "[\"cat\",\"dog\"]");
    let graph = proto.graph.unwrap();
    let input = &graph.input[0];
    let shape = match &input.r#type.as_ref().unwrap().value {
        Some(tract_onnx::pb::type_proto::Value::TensorType(t)) => t.shape.clone().unwrap(),
        other => panic!("input type {other:?}"),
    };
    use tract_onnx::pb::tensor_shape_proto::dimension::Value;
    let dims: Vec<_> = shape.dim.iter().map(|d| d.value.clone().unwrap()).collect();
    assert_eq!(dims[0], Value::DimParam("batch".into()));
    assert_eq!(dims[1], Value::DimValue(3));
    assert_eq!(dims[2], Value::DimParam("height".into()));
    // Folded: no batch norm left, one bias per convolution.
    assert!(graph.node.iter().all(|n| n.op_type != "BatchNormalization"));
    assert!(
        graph
            .node
            .iter()
            .filter(|n| n.op_type == "Conv")
            .all(|n| n.input.len() == 3)
    );
    // An opset kiln does not write is refused with the ones it does.
    let error = save_onnx(
        &model,
        &path,
        &OnnxOptions {
            opset: 7,
            ..OnnxOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("opset 7") && error.contains("9 to 21"),
        "{error}"
    );
}
