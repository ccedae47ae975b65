//! kiln's convolution on flex: a custom autodiff operation on `Autodiff<Flex>` whose forward and
//! backward are the matrix products of `gemm_conv`, and the same forward on plain `Flex`.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{DType, Tensor, TensorData, TensorMetadata, TensorPrimitive, backend::Backend};

use crate::epilogue::PlaneEpilogue;
use crate::gemm_conv::{self, Geometry};
use crate::winograd::ForwardKind;

/// The training backend this path serves: flex under burn's default (no checkpointing) autodiff.
pub(crate) type Train = Autodiff<Flex>;

/// kiln's convolution when `B` is flex (with or without autodiff) and the call is f32 with
/// channel groups that divide both channel counts; `None` otherwise, for burn's.
pub(crate) fn conv2d<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 4>,
    options: &ConvOptions<2>,
) -> Option<Tensor<B, 4>> {
    if !groups_fit(x.dims(), weight.dims(), options)
        || x.dtype() != DType::F32
        || weight.dtype() != DType::F32
    {
        return None;
    }
    if let (Some(x), Some(weight)) = (
        same::<_, Tensor<Flex, 4>>(x.clone()),
        same::<_, Tensor<Flex, 4>>(weight.clone()),
    ) {
        let y = forward(
            x.into_primitive().tensor(),
            weight.into_primitive().tensor(),
            options,
            None,
            ForwardKind::Inference,
        );
        return same(Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(y)));
    }
    let x = same::<_, Tensor<Train, 4>>(x.clone())?;
    let weight = same::<_, Tensor<Train, 4>>(weight.clone())?;
    same(train_conv2d(x, weight, options.clone()))
}

pub(crate) use crate::same;

/// Whether `options.groups` splits the input `[n, c_in, h, w]` and the weight `[c_out, c_in /
/// groups, kh, kw]` evenly (a call that does not is left to burn, which names the mismatch).
fn groups_fit(x: [usize; 4], weight: [usize; 4], options: &ConvOptions<2>) -> bool {
    let groups = options.groups;
    groups > 0
        && x[1].is_multiple_of(groups)
        && weight[0].is_multiple_of(groups)
        && x[1] / groups == weight[1]
}

fn train_conv2d(
    x: Tensor<Train, 4>,
    weight: Tensor<Train, 4>,
    options: ConvOptions<2>,
) -> Tensor<Train, 4> {
    let x = x.into_primitive().tensor();
    let weight = weight.into_primitive().tensor();
    let y = match Conv2dBackward
        .prepare::<NoCheckpointing>([x.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let x_state = prep.checkpoint(&x);
            let weight_state = prep.checkpoint(&weight);
            let state = (x_state, weight_state, options.clone());
            prep.finish(
                state,
                forward(
                    x.primitive,
                    weight.primitive,
                    &options,
                    None,
                    ForwardKind::Training,
                ),
            )
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(
            x.primitive,
            weight.primitive,
            &options,
            None,
            ForwardKind::Training,
        )),
    };
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

#[derive(Debug)]
struct Conv2dBackward;

impl Backward<Flex, 2> for Conv2dBackward {
    type State = (NodeId, NodeId, ConvOptions<2>);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [x_node, weight_node] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x_state, weight_state, options) = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<Flex>>(x_state);
        let weight = checkpointer.retrieve_node_output::<FloatTensor<Flex>>(weight_state);

        let geometry = Geometry::new(dims(&x), dims(&weight), dims(&grad), &options);
        let grad = grad.to_contiguous();
        let wanted = [x_node.is_some(), weight_node.is_some()];
        let (dx, dw) = gemm_conv::gradients(
            &values(&x),
            &values(&weight),
            grad.storage(),
            &geometry,
            wanted,
        );
        if let (Some(node), Some(dx)) = (x_node, dx) {
            grads.register::<Flex>(node.id, primitive(dx, dims(&x)));
        }
        if let (Some(node), Some(dw)) = (weight_node, dw) {
            grads.register::<Flex>(node.id, primitive(dw, dims(&weight)));
        }
    }
}

fn forward(
    x: FloatTensor<Flex>,
    weight: FloatTensor<Flex>,
    options: &ConvOptions<2>,
    epilogue: Option<&PlaneEpilogue>,
    kind: ForwardKind,
) -> FloatTensor<Flex> {
    let y_shape = output_shape(&x, &weight, options);
    let geometry = Geometry::new(dims(&x), dims(&weight), y_shape, options);
    let y = gemm_conv::forward(&values(&x), &values(&weight), &geometry, epilogue, kind);
    primitive(y, y_shape)
}

/// kiln's convolution and its epilogue in one pass where `B` is flex without autodiff (nothing
/// to differentiate: inference) and every tensor is f32, the residual of the output's shape.
pub(crate) fn conv2d_epilogue<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 4>,
    options: &ConvOptions<2>,
    epilogue: &crate::Epilogue<B>,
) -> Option<Tensor<B, 4>> {
    let residual = epilogue.residual.as_ref();
    let dtypes = [
        x.dtype(),
        weight.dtype(),
        epilogue.scale.dtype(),
        epilogue.shift.dtype(),
    ];
    if !groups_fit(x.dims(), weight.dims(), options)
        || dtypes != [DType::F32; 4]
        || residual.is_some_and(|r| r.dtype() != DType::F32)
    {
        return None;
    }
    let flat = |t: &Tensor<B, 1>| {
        same::<_, Tensor<Flex, 1>>(t.clone()).map(|t| t.into_primitive().tensor())
    };
    let four = |t: &Tensor<B, 4>| {
        same::<_, Tensor<Flex, 4>>(t.clone()).map(|t| t.into_primitive().tensor())
    };
    let (x, weight) = (four(x)?, four(weight)?);
    let (scale, shift) = (flat(&epilogue.scale)?, flat(&epilogue.shift)?);
    let residual = match residual {
        Some(r) => Some(four(r)?),
        None => None,
    };
    let c_out = dims(&weight)[0];
    let y_shape = output_shape(&x, &weight, options);
    if scale.shape().num_elements() != c_out
        || shift.shape().num_elements() != c_out
        || residual.as_ref().is_some_and(|r| dims(r) != y_shape)
    {
        return None;
    }
    let (scale, shift) = (values(&scale), values(&shift));
    let residual = residual.as_ref().map(values);
    let finish = PlaneEpilogue {
        scale: &scale,
        shift: &shift,
        residual: residual.as_deref(),
        relu: epilogue.relu,
    };
    let y = forward(x, weight, options, Some(&finish), ForwardKind::Inference);
    same(Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(y)))
}

/// `[N, C_out, H_out, W_out]`.
fn output_shape(
    x: &FloatTensor<Flex>,
    weight: &FloatTensor<Flex>,
    options: &ConvOptions<2>,
) -> [usize; 4] {
    let [n, _, h, w] = dims(x);
    let [c_out, _, kh, kw] = dims(weight);
    let out = |size: usize, k: usize, axis: usize| {
        (size + 2 * options.padding[axis] - options.dilation[axis] * (k - 1) - 1)
            / options.stride[axis]
            + 1
    };
    [n, c_out, out(h, kh, 0), out(w, kw, 1)]
}

pub(crate) fn dims(tensor: &FloatTensor<Flex>) -> [usize; 4] {
    tensor.shape().dims()
}

/// The tensor's values in row-major order, without a copy where it is laid out so already.
pub(crate) fn values(tensor: &FloatTensor<Flex>) -> std::borrow::Cow<'_, [f32]> {
    let contiguous = tensor.to_contiguous();
    if std::ptr::eq(contiguous.storage::<f32>(), tensor.storage::<f32>()) {
        std::borrow::Cow::Borrowed(tensor.storage())
    } else {
        std::borrow::Cow::Owned(contiguous.storage().to_vec())
    }
}

pub(crate) fn primitive(values: Vec<f32>, shape: [usize; 4]) -> FloatTensor<Flex> {
    Tensor::<Flex, 4>::from_data(TensorData::new(values, shape), &Default::default())
        .into_primitive()
        .tensor()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Tolerance, module};

    /// Gradients of kiln's convolution against burn's own, for the shapes ResNets use:
    /// 3x3 with padding at stride 1 (Winograd's tiles on odd maps, 4x4 and a row of 1,100; the
    /// weight gradient through shifted views from 16x16; im2col below 4x4) and at stride 2
    /// (im2col), 1x1 downsampling and 1x1 in place, the 7x7 stem, and a batch that takes
    /// several groups of images.
    #[test]
    fn gradients_match_burns_convolution() {
        let cases = [
            ([2, 3, 9, 9], [4, 3, 3, 3], [1, 1], [1, 1], 1e-4),
            ([3, 5, 17, 23], [6, 5, 3, 3], [1, 1], [1, 1], 1e-4),
            ([1, 2, 3, 1100], [3, 2, 3, 3], [1, 1], [1, 1], 1e-4),
            ([2, 3, 32, 32], [8, 3, 3, 3], [1, 1], [1, 1], 1e-4),
            ([3, 4, 8, 8], [5, 4, 3, 3], [2, 2], [1, 1], 1e-4),
            ([2, 6, 8, 8], [3, 6, 1, 1], [2, 2], [0, 0], 1e-4),
            // The 1x1 map (im2col in training), Winograd's tiles on odd maps and on 4x4, one
            // image, channels no multiple of the vector width.
            ([1, 5, 1, 1], [3, 5, 3, 3], [1, 1], [1, 1], 1e-4),
            ([1, 17, 3, 5], [19, 17, 3, 3], [1, 1], [1, 1], 1e-4),
            ([3, 33, 4, 4], [20, 33, 3, 3], [1, 1], [1, 1], 1e-4),
            // Winograd channels-last (maps of 64 to 256 positions): an odd map, channels past
            // blocks of 16 both ways; one image.
            ([2, 37, 9, 11], [21, 37, 3, 3], [1, 1], [1, 1], 1e-4),
            ([1, 20, 8, 8], [17, 20, 3, 3], [1, 1], [1, 1], 1e-4),
            // 1x1 with stride 1 on a 16x16 map: multiplied in place, image by image.
            ([2, 6, 16, 16], [3, 6, 1, 1], [1, 1], [0, 0], 1e-4),
            ([1, 3, 15, 15], [4, 3, 7, 7], [2, 2], [3, 3], 1e-4),
            // 19 MB of transformed tiles per image: one image per group. Each weight gradient
            // sums 32,768 products, which burn's f32 reference adds in another order.
            ([2, 64, 128, 128], [8, 64, 3, 3], [1, 1], [1, 1], 1e-3),
        ];
        for (x_shape, w_shape, stride, padding, tolerance) in cases {
            let options = ConvOptions::new(stride, padding, [1, 1], 1);
            let x = fixed(x_shape, 1, -1.0);
            let w = fixed(w_shape, 2, -1.0);
            // A loss that weighs every output differently, so that a misplaced gradient shows.
            let y_dims = module::conv2d(x.clone(), w.clone(), None, options.clone()).dims();
            let weights = fixed(y_dims, 3, 0.0);
            let gradients = |ours: bool| {
                let (x, w) = (x.clone().require_grad(), w.clone().require_grad());
                let y = if ours {
                    crate::conv2d(x.clone(), w.clone(), options.clone())
                } else {
                    module::conv2d(x.clone(), w.clone(), None, options.clone())
                };
                let grads = (y.clone() * weights.clone()).sum().backward();
                (y.inner(), x.grad(&grads).unwrap(), w.grad(&grads).unwrap())
            };
            let (y, dx, dw) = gradients(true);
            let (y_ref, dx_ref, dw_ref) = gradients(false);
            let tolerance = Tolerance::<f32>::rel_abs(tolerance, tolerance);
            y.into_data()
                .assert_approx_eq(&y_ref.into_data(), tolerance);
            dx.into_data()
                .assert_approx_eq(&dx_ref.into_data(), tolerance);
            dw.into_data()
                .assert_approx_eq(&dw_ref.into_data(), tolerance);
        }
    }

    /// Values spread over `low..1` from a fixed hash of their index and `salt`: the same in every
    /// run. (burn's generator is shared with the tests running alongside, and the last case's
    /// weight gradients, sums of 32,768 products rounded in two orders, came out 1.08e-3 apart
    /// at a value near zero in 1 run of 40, past its 1e-3.)
    fn fixed(shape: [usize; 4], salt: u64, low: f32) -> Tensor<Train, 4> {
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

    /// The fused inference path against burn's operations composed (convolution, scale and shift
    /// per channel, residual, ReLU) on every route the forward takes: Winograd (3x3 at stride
    /// 1: F(4x4, 3x3) on 8x8 maps of 32 channels, F(2x2, 3x3) on 16x16, 5x7 and the 1x1 map),
    /// im2col (stride 2), 1x1 convolutions multiplied in place (one image, where the product
    /// runs in parallel, and several), with channel counts that are no multiple of the vector
    /// width.
    #[test]
    fn epilogue_matches_burns_operations() {
        let cases = [
            ([3, 32, 8, 8], [17, 32, 3, 3], 1, 1),
            ([2, 5, 16, 16], [17, 5, 3, 3], 1, 1),
            ([3, 4, 5, 7], [6, 4, 3, 3], 1, 1),
            ([2, 6, 9, 9], [3, 6, 3, 3], 2, 1),
            ([1, 7, 1, 1], [5, 7, 3, 3], 1, 1),
            ([1, 9, 14, 14], [19, 9, 1, 1], 1, 0),
            ([3, 8, 15, 16], [4, 8, 1, 1], 1, 0),
            ([2, 8, 3, 3], [4, 8, 1, 1], 1, 0),
        ];
        for (x_shape, w_shape, stride, padding) in cases {
            let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
            let x = fixed(x_shape, 1, -1.0).inner();
            let w = fixed(w_shape, 2, -1.0).inner();
            let c_out = w_shape[0];
            let scale = fixed([1, 1, 1, c_out], 3, -1.0).inner().reshape([c_out]);
            let shift = fixed([1, 1, 1, c_out], 4, -1.0).inner().reshape([c_out]);
            let y = module::conv2d(x.clone(), w.clone(), None, options.clone());
            let residual = fixed(y.dims(), 5, -1.0).inner();
            for (with_residual, relu) in [(false, false), (false, true), (true, true)] {
                let per_channel = |t: &Tensor<Flex, 1>| t.clone().reshape([1, c_out, 1, 1]);
                let mut expected = y.clone() * per_channel(&scale) + per_channel(&shift);
                if with_residual {
                    expected = expected + residual.clone();
                }
                if relu {
                    expected = burn::tensor::activation::relu(expected);
                }
                let epilogue = crate::Epilogue {
                    scale: scale.clone(),
                    shift: shift.clone(),
                    residual: with_residual.then(|| residual.clone()),
                    relu,
                };
                let fused = crate::conv2d_epilogue(&x, &w, &options, &epilogue)
                    .expect("flex in f32 takes kiln's path");
                fused
                    .into_data()
                    .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::rel_abs(1e-4, 1e-4));
            }
        }
        // Under autodiff (training) the composed operations run, which differentiate.
        let x = Tensor::<Train, 4>::zeros([1, 2, 4, 4], &Default::default());
        let w = Tensor::<Train, 4>::zeros([2, 2, 3, 3], &Default::default());
        let ones = Tensor::<Train, 1>::ones([2], &Default::default());
        let epilogue = crate::Epilogue {
            scale: ones.clone(),
            shift: ones,
            residual: None,
            relu: true,
        };
        let options = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        assert!(crate::conv2d_epilogue(&x, &w, &options, &epilogue).is_none());
    }

    #[test]
    fn other_backends_and_types_take_burns_path() {
        let device = Default::default();
        let options = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        let x = Tensor::<Flex, 4>::zeros([1, 2, 4, 4], &device);
        let w = Tensor::<Flex, 4>::zeros([2, 2, 3, 3], &device);
        assert!(conv2d(&x, &w, &options).is_some());
        let x16 = x.clone().cast(burn::tensor::FloatDType::F16);
        assert!(
            conv2d(&x16, &w, &options).is_none(),
            "16-bit convolutions are flex's"
        );
        let x = Tensor::<Train, 4>::zeros([1, 2, 4, 4], &device);
        let w = Tensor::<Train, 4>::zeros([2, 2, 3, 3], &device);
        assert!(conv2d(&x, &w, &options).is_some());
        let grouped = ConvOptions::new([1, 1], [1, 1], [1, 1], 2);
        let w1 = Tensor::<Train, 4>::zeros([2, 1, 3, 3], &device);
        assert!(conv2d(&x, &w1, &grouped).is_some());
        // Groups that do not split the channels are burn's to refuse.
        let three = ConvOptions::new([1, 1], [1, 1], [1, 1], 3);
        assert!(conv2d(&x, &w1, &three).is_none());
        assert!(conv2d(&x, &w, &grouped).is_none());
    }

    /// `conv2d(x, w, groups)` computed as PyTorch defines it: each group's input channels
    /// convolved with its block of filters by an ungrouped convolution, the outputs concatenated.
    /// Independent of any backend's grouped kernels, and differentiable.
    fn per_group(
        x: Tensor<Train, 4>,
        w: Tensor<Train, 4>,
        options: &ConvOptions<2>,
    ) -> Tensor<Train, 4> {
        let groups = options.groups;
        let (c_in, c_out) = (x.dims()[1] / groups, w.dims()[0] / groups);
        let ungrouped = ConvOptions::new(options.stride, options.padding, options.dilation, 1);
        let outputs = (0..groups)
            .map(|i| {
                let x = x.clone().narrow(1, i * c_in, c_in);
                let w = w.clone().narrow(0, i * c_out, c_out);
                module::conv2d(x, w, None, ungrouped.clone())
            })
            .collect();
        Tensor::cat(outputs, 1)
    }

    /// ResNeXt's grouped 3x3 convolutions (stride 1 and 2, 32 groups of 4 channels, depthwise
    /// groups of one, groups of 8 on odd maps) and a grouped 1x1, forward and both gradients,
    /// against the per-group definition; and in inference with the fused epilogue.
    #[test]
    fn grouped_convolutions_match_one_convolution_per_group() {
        let cases = [
            ([2, 128, 8, 8], [128, 4, 3, 3], 32, 1, 1),
            ([3, 64, 9, 7], [64, 4, 3, 3], 16, 2, 1),
            ([2, 6, 5, 5], [6, 1, 3, 3], 6, 1, 1),
            ([2, 16, 11, 13], [24, 8, 3, 3], 2, 1, 1),
            ([1, 12, 6, 6], [8, 3, 1, 1], 4, 2, 0),
        ];
        for (x_shape, w_shape, groups, stride, padding) in cases {
            let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], groups);
            let x = fixed(x_shape, 1, -1.0);
            let w = fixed(w_shape, 2, -1.0);
            let y_dims = per_group(x.clone(), w.clone(), &options).dims();
            let weights = fixed(y_dims, 3, 0.0);
            // kiln's, burn's own grouped convolution, and the definition.
            let gradients = |which: usize| {
                let (x, w) = (x.clone().require_grad(), w.clone().require_grad());
                let y = match which {
                    0 => crate::conv2d(x.clone(), w.clone(), options.clone()),
                    1 => module::conv2d(x.clone(), w.clone(), None, options.clone()),
                    _ => per_group(x.clone(), w.clone(), &options),
                };
                let grads = (y.clone() * weights.clone()).sum().backward();
                [y.inner(), x.grad(&grads).unwrap(), w.grad(&grads).unwrap()]
            };
            let reference = gradients(2);
            let tolerance = Tolerance::<f32>::rel_abs(1e-4, 1e-4);
            for (who, which) in [("kiln", 0), ("burn", 1)] {
                for ((name, ours), expected) in ["y", "dx", "dw"]
                    .into_iter()
                    .zip(gradients(which))
                    .zip(&reference)
                {
                    let case = format!("{who} {name} {x_shape:?} {w_shape:?} groups {groups}");
                    assert_eq!(ours.dims(), expected.dims(), "{case}");
                    println!("{case}");
                    ours.into_data()
                        .assert_approx_eq(&expected.clone().into_data(), tolerance);
                }
            }

            // Inference, with batch norm's scale and shift and ReLU after the convolution.
            let (xi, wi) = (x.clone().inner(), w.clone().inner());
            let c_out = w_shape[0];
            let scale = fixed([1, 1, 1, c_out], 4, -1.0).inner().reshape([c_out]);
            let shift = fixed([1, 1, 1, c_out], 5, -1.0).inner().reshape([c_out]);
            let epilogue = crate::Epilogue {
                scale: scale.clone(),
                shift: shift.clone(),
                residual: None,
                relu: true,
            };
            let fused = crate::conv2d_epilogue(&xi, &wi, &options, &epilogue)
                .expect("flex in f32 takes kiln's path");
            let per_channel = |t: Tensor<Flex, 1>| t.reshape([1, c_out, 1, 1]);
            let expected = burn::tensor::activation::relu(
                per_group(x.clone(), w.clone(), &options).inner() * per_channel(scale)
                    + per_channel(shift),
            );
            fused
                .into_data()
                .assert_approx_eq::<f32>(&expected.into_data(), tolerance);
        }
    }
}
