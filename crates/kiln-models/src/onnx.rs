//! ONNX export for inference: the ResNet as an ONNX graph (standard operators only, so every
//! runtime runs it), batch norm folded into the convolutions unless asked to keep it, a dynamic
//! batch dimension, and what a user of the file needs in its metadata (the input's
//! preprocessing, the class names).
//!
//! The messages are the fields of ONNX's `onnx.proto` that kiln writes, encoded by prost (as
//! for TensorBoard's records); the field numbers are those of `onnx.proto`.

use std::path::Path;

use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2d;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use prost::Message;

use crate::batch_norm::BatchNorm2d;
use crate::resnet::{Block, Downsample, ResNet};
use crate::weights::{WeightsError, write_whole};

/// The opset kiln writes unless asked for another.
pub const DEFAULT_OPSET: i64 = 17;

/// The opsets whose definitions of kiln's operators (Conv, BatchNormalization, Relu, MaxPool,
/// Add, GlobalAveragePool, Flatten, Gemm) are the ones kiln writes: from 9 (BatchNormalization
/// without `spatial`) to 21; ResNet-D's AveragePool (with `ceil_mode`) from 10.
pub const OPSETS: std::ops::RangeInclusive<i64> = 9..=21;

/// How to export.
#[derive(Debug, Clone)]
pub struct OnnxOptions {
    pub opset: i64,
    /// Fold each batch norm into the convolution before it (the inference graph runtimes and
    /// PyTorch's `torch.onnx.export(..., do_constant_folding=True)` end with); `false` keeps
    /// them as `BatchNormalization` nodes.
    pub fold_batch_norm: bool,
    /// The input's height and width, or `None` for any size (the network pools globally).
    pub image_size: Option<[usize; 2]>,
    /// `metadata_props` of the model: the preprocessing, the class names, where it came from.
    pub metadata: Vec<(String, String)>,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        Self {
            opset: DEFAULT_OPSET,
            fold_batch_norm: true,
            image_size: None,
            metadata: Vec::new(),
        }
    }
}

/// The model's input and output names in the graph.
pub const INPUT: &str = "images";
pub const OUTPUT: &str = "logits";

/// Writes `model` to `path` as an ONNX model (through a temporary file and a rename).
pub fn save_onnx<B: Backend>(
    model: &ResNet<B>,
    path: &Path,
    options: &OnnxOptions,
) -> Result<(), WeightsError> {
    let bytes = to_onnx(model, options).map_err(|reason| WeightsError::Write {
        path: path.to_path_buf(),
        reason,
    })?;
    write_whole(path, &bytes)
}

/// The ONNX model of `model`, encoded. An opset outside [`OPSETS`] is an error.
pub fn to_onnx<B: Backend>(model: &ResNet<B>, options: &OnnxOptions) -> Result<Vec<u8>, String> {
    if !OPSETS.contains(&options.opset) {
        return Err(format!(
            "opset {} is not one kiln writes: choose {} to {} (default {DEFAULT_OPSET})",
            options.opset,
            OPSETS.start(),
            OPSETS.end()
        ));
    }
    if model.avg_down() && options.opset < 10 {
        return Err(format!(
            "a ResNet-D's shortcuts average-pool rounding up (AveragePool's ceil_mode), which opset {} lacks: choose opset 10 or later",
            options.opset
        ));
    }
    let mut graph = Graph {
        fold: options.fold_batch_norm,
        ..Graph::default()
    };
    let logits = graph.resnet(model);
    let (height, width) = match options.image_size {
        Some([h, w]) => (Dim::Fixed(h), Dim::Fixed(w)),
        None => (Dim::Named("height"), Dim::Named("width")),
    };
    let input = value_info(INPUT, &[Dim::Named("batch"), Dim::Fixed(3), height, width]);
    let output = value_info(
        &logits,
        &[Dim::Named("batch"), Dim::Fixed(model.num_classes())],
    );
    let model = ModelProto {
        ir_version: ir_version(options.opset),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: options.opset,
        }],
        producer_name: "kiln".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: "A ResNet image classifier trained with kiln: images [batch, 3, height, width], normalized as the metadata's `normalize` says, to logits [batch, classes].".into(),
        graph: Some(GraphProto {
            node: graph.nodes,
            name: "resnet".into(),
            initializer: graph.initializers,
            input: vec![input],
            output: vec![output],
        }),
        metadata_props: (options.metadata.iter())
            .map(|(key, value)| StringStringEntryProto {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    };
    Ok(model.encode_to_vec())
}

/// The newest IR version each opset's ONNX release wrote (onnx's `helper.VERSION_TABLE`):
/// runtimes refuse a model whose IR version is newer than its opset's.
fn ir_version(opset: i64) -> i64 {
    match opset {
        ..=9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        _ => 10,
    }
}

/// The graph being built: nodes in order, and the weights as initializers.
#[derive(Default)]
struct Graph {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    fold: bool,
}

impl Graph {
    /// The ResNet's forward pass, as `ResNet::forward` runs it; returns the output's name.
    fn resnet<B: Backend>(&mut self, model: &ResNet<B>) -> String {
        let mut x: String = INPUT.into();
        let mut conv1 = "conv1";
        if let Some(stem) = &model.deep_stem {
            // timm's names: conv1 is an nn.Sequential of convolutions, batch norms and ReLUs.
            x = self.conv_bn(x, &stem.conv1, None, &stem.bn1, "conv1.0", "conv1.1");
            x = self.relu(x, "conv1.2");
            x = self.conv_bn(x, &stem.conv2, None, &stem.bn2, "conv1.3", "conv1.4");
            x = self.relu(x, "conv1.5");
            conv1 = "conv1.6";
        }
        let x = self.conv_bn(x, &model.conv1, None, &model.bn1, conv1, "bn1");
        let mut x = self.relu(x, "relu");
        if let Some(pool) = &model.maxpool {
            let attributes = vec![
                ints("kernel_shape", &pool.kernel_size),
                ints("strides", &pool.stride),
                ints("pads", &pads(&pool.padding)),
            ];
            x = self.node("MaxPool", vec![x], "maxpool", attributes);
        }
        let stages = [&model.layer1, &model.layer2, &model.layer3, &model.layer4];
        for (stage, blocks) in stages.into_iter().enumerate() {
            for (index, block) in blocks.iter().enumerate() {
                x = self.block(x, block, &format!("layer{}.{index}", stage + 1));
            }
        }
        let pooled = self.node("GlobalAveragePool", vec![x], "avgpool", vec![]);
        let flat = self.node("Flatten", vec![pooled], "flatten", vec![int("axis", 1)]);
        let weight = self.constant("fc.weight", model.fc.weight.val());
        let bias = match &model.fc.bias {
            Some(bias) => self.constant("fc.bias", bias.val()),
            None => {
                let classes = model.num_classes();
                self.initializer("fc.bias", &[classes], vec![0.0; classes])
            }
        };
        // burn's Linear keeps its weight as [in, out]: A x B, no transpose.
        self.node("Gemm", vec![flat, weight, bias], OUTPUT, vec![])
    }

    /// A residual block, as `BasicBlock::forward` and `Bottleneck::forward`.
    fn block<B: Backend>(&mut self, x: String, block: &Block<B>, name: &str) -> String {
        let at = |part: &str| format!("{name}.{part}");
        let (out, downsample) = match block {
            Block::Basic(b) => {
                let out = self.conv_bn(x.clone(), &b.conv1, None, &b.bn1, &at("conv1"), &at("bn1"));
                let out = self.relu(out, &at("relu1"));
                let out = self.conv_bn(out, &b.conv2, None, &b.bn2, &at("conv2"), &at("bn2"));
                (out, b.downsample.as_ref())
            }
            Block::Bottleneck(b) => {
                let out = self.conv_bn(x.clone(), &b.conv1, None, &b.bn1, &at("conv1"), &at("bn1"));
                let out = self.relu(out, &at("relu1"));
                let out = self.conv_bn(out, &b.conv2, None, &b.bn2, &at("conv2"), &at("bn2"));
                let out = self.relu(out, &at("relu2"));
                let out = self.conv_bn(out, &b.conv3, None, &b.bn3, &at("conv3"), &at("bn3"));
                (out, b.downsample.as_ref())
            }
        };
        let identity = match downsample {
            Some(Downsample {
                conv,
                bn,
                stride,
                avg_pool: true,
            }) => {
                // timm's AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False).
                let attributes = vec![
                    ints("kernel_shape", &[2, 2]),
                    ints("strides", &[*stride, *stride]),
                    int("ceil_mode", 1),
                    int("count_include_pad", 0),
                ];
                let pooled = match *stride {
                    1 => x,
                    _ => self.node("AveragePool", vec![x], &at("downsample.0"), attributes),
                };
                let (conv_name, bn_name) = (at("downsample.1"), at("downsample.2"));
                self.conv_bn(pooled, conv, Some(1), bn, &conv_name, &bn_name)
            }
            Some(Downsample {
                conv, bn, stride, ..
            }) => {
                let (conv_name, bn_name) = (at("downsample.0"), at("downsample.1"));
                self.conv_bn(x, conv, Some(*stride), bn, &conv_name, &bn_name)
            }
            None => x,
        };
        let sum = self.node("Add", vec![out, identity], &at("add"), vec![]);
        self.relu(sum, &at("relu"))
    }

    /// A bias-free convolution and the batch norm after it: one `Conv` with the batch norm
    /// folded into its weights and bias, or `Conv` and `BatchNormalization`. `stride` replaces
    /// the convolution's own (a downsample strides by slicing its input; see `Downsample`).
    fn conv_bn<B: Backend>(
        &mut self,
        x: String,
        conv: &Conv2d<B>,
        stride: Option<usize>,
        bn: &BatchNorm2d<B>,
        conv_name: &str,
        bn_name: &str,
    ) -> String {
        let weight = conv.weight.val();
        let [out_channels, _, _, _] = weight.dims();
        let stride = stride.map_or(conv.stride, |s| [s, s]);
        let attributes = vec![
            ints("kernel_shape", &conv.kernel_size),
            ints("strides", &stride),
            ints("pads", &pads(&conv.padding)),
            ints("dilations", &conv.dilation),
            int("group", conv.groups as i64),
        ];
        let values = |t: Tensor<B, 1>| -> Vec<f64> {
            t.into_data()
                .convert::<f64>()
                .to_vec()
                .expect("a float tensor reads as f64")
        };
        let gamma = values(bn.weight.val());
        let beta = values(bn.bias.val());
        let mean = values(bn.running_mean.value());
        let var = values(bn.running_var.value());
        if !self.fold {
            let w = self.constant(&format!("{conv_name}.weight"), weight);
            let y = self.node("Conv", vec![x, w], conv_name, attributes);
            let mut inputs = vec![y];
            for (part, values) in [
                ("weight", gamma),
                ("bias", beta),
                ("running_mean", mean),
                ("running_var", var),
            ] {
                let values = values.into_iter().map(|v| v as f32).collect();
                inputs.push(self.initializer(
                    &format!("{bn_name}.{part}"),
                    &[out_channels],
                    values,
                ));
            }
            let epsilon = AttributeProto {
                name: "epsilon".into(),
                r#type: ATTRIBUTE_FLOAT,
                f: bn.eps as f32,
                ..AttributeProto::default()
            };
            return self.node("BatchNormalization", inputs, bn_name, vec![epsilon]);
        }
        // y = gamma (conv(x) - mean) / sqrt(var + eps) + beta = conv'(x) + b', with each output
        // channel's weights scaled by gamma / sqrt(var + eps). Computed in f64.
        let scale: Vec<f64> = (0..out_channels)
            .map(|c| gamma[c] / (var[c] + bn.eps).sqrt())
            .collect();
        let dims = weight.dims();
        let w: Vec<f64> = weight
            .into_data()
            .convert::<f64>()
            .to_vec()
            .expect("a float tensor reads as f64");
        let per_channel = w.len() / out_channels;
        let folded = w
            .chunks(per_channel)
            .zip(&scale)
            .flat_map(|(channel, s)| channel.iter().map(move |v| (v * s) as f32))
            .collect();
        let bias = (0..out_channels)
            .map(|c| (beta[c] - mean[c] * scale[c]) as f32)
            .collect();
        let w = self.initializer(&format!("{conv_name}.weight"), &dims, folded);
        let b = self.initializer(&format!("{conv_name}.bias"), &[out_channels], bias);
        self.node("Conv", vec![x, w, b], conv_name, attributes)
    }

    fn relu(&mut self, x: String, name: &str) -> String {
        self.node("Relu", vec![x], name, vec![])
    }

    /// Adds a node whose one output is named `name`; returns that name.
    fn node(
        &mut self,
        op_type: &str,
        input: Vec<String>,
        name: &str,
        attribute: Vec<AttributeProto>,
    ) -> String {
        self.nodes.push(NodeProto {
            input,
            output: vec![name.into()],
            name: name.into(),
            op_type: op_type.into(),
            attribute,
        });
        name.into()
    }

    /// A weight tensor as an initializer named `name`.
    fn constant<const D: usize, B: Backend>(&mut self, name: &str, tensor: Tensor<B, D>) -> String {
        let dims = tensor.dims();
        let values = tensor
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("a float tensor reads as f32");
        self.initializer(name, &dims, values)
    }

    fn initializer(&mut self, name: &str, dims: &[usize], values: Vec<f32>) -> String {
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: FLOAT,
            name: name.into(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        name.into()
    }
}

/// ONNX's `pads`: the beginnings of height and width, then their ends.
fn pads(padding: &PaddingConfig2d) -> [usize; 4] {
    match *padding {
        PaddingConfig2d::Explicit(top, left, bottom, right) => [top, left, bottom, right],
        PaddingConfig2d::Valid => [0; 4],
        // kiln's ResNets pad explicitly; `Same` appears in none of them.
        PaddingConfig2d::Same => unreachable!("kiln's ResNets pad explicitly"),
    }
}

fn ints(name: &str, values: &[usize]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: ATTRIBUTE_INTS,
        ints: values.iter().map(|&v| v as i64).collect(),
        ..AttributeProto::default()
    }
}

fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: ATTRIBUTE_INT,
        i: value,
        ..AttributeProto::default()
    }
}

/// A dimension of an input or output: a number, or a name that stands for any size.
enum Dim {
    Fixed(usize),
    Named(&'static str),
}

fn value_info(name: &str, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => dimension::Value::DimValue(*n as i64),
                Dim::Named(s) => dimension::Value::DimParam(s.to_string()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorType {
                elem_type: FLOAT,
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
    }
}

/// `TensorProto.DataType.FLOAT`.
const FLOAT: i32 = 1;
/// `AttributeProto.AttributeType`'s FLOAT, INT and INTS.
const ATTRIBUTE_FLOAT: i32 = 1;
const ATTRIBUTE_INT: i32 = 2;
const ATTRIBUTE_INTS: i32 = 7;

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(int64, tag = "1")]
    ir_version: i64,
    #[prost(string, tag = "2")]
    producer_name: String,
    #[prost(string, tag = "3")]
    producer_version: String,
    #[prost(string, tag = "6")]
    doc_string: String,
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    opset_import: Vec<OperatorSetIdProto>,
    #[prost(message, repeated, tag = "14")]
    metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, Message)]
struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(int64, tag = "2")]
    version: i64,
}

#[derive(Clone, PartialEq, Message)]
struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    output: Vec<String>,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    op_type: String,
    #[prost(message, repeated, tag = "5")]
    attribute: Vec<AttributeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct AttributeProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(float, tag = "2")]
    f: f32,
    #[prost(int64, tag = "3")]
    i: i64,
    #[prost(int64, repeated, tag = "8")]
    ints: Vec<i64>,
    #[prost(int32, tag = "20")]
    r#type: i32,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(string, tag = "8")]
    name: String,
    /// Little-endian values, as ONNX requires.
    #[prost(bytes = "vec", tag = "9")]
    raw_data: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct ValueInfoProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    r#type: Option<TypeProto>,
}

/// `TypeProto`, whose one case kiln writes is a tensor (`oneof value`, field 1).
#[derive(Clone, PartialEq, Message)]
struct TypeProto {
    #[prost(message, optional, tag = "1")]
    tensor_type: Option<TensorType>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorType {
    #[prost(int32, tag = "1")]
    elem_type: i32,
    #[prost(message, optional, tag = "2")]
    shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
struct Dimension {
    #[prost(oneof = "dimension::Value", tags = "1, 2")]
    value: Option<dimension::Value>,
}

mod dimension {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(int64, tag = "1")]
        DimValue(i64),
        #[prost(string, tag = "2")]
        DimParam(String),
    }
}
