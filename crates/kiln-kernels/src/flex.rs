//! kiln's convolution on flex: a custom autodiff operation on `Autodiff<Flex>` whose forward and
//! backward are the matrix products of `gemm_conv`, and the same forward on plain `Flex`.

use std::any::Any;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{DType, Tensor, TensorData, TensorMetadata, TensorPrimitive, backend::Backend};

use crate::gemm_conv::{self, Geometry};

/// The training backend this path serves: flex under burn's default (no checkpointing) autodiff.
pub(crate) type Train = Autodiff<Flex>;

/// kiln's convolution when `B` is flex (with or without autodiff) and the call is f32 without
/// groups; `None` otherwise, for burn's.
pub(crate) fn conv2d<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 4>,
    options: &ConvOptions<2>,
) -> Option<Tensor<B, 4>> {
    if options.groups != 1 || x.dtype() != DType::F32 || weight.dtype() != DType::F32 {
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
        );
        return same(Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(y)));
    }
    let x = same::<_, Tensor<Train, 4>>(x.clone())?;
    let weight = same::<_, Tensor<Train, 4>>(weight.clone())?;
    same(train_conv2d(x, weight, options.clone()))
}

/// `value` as a `U` when `T` and `U` are the same type (how a generic caller reaches a
/// backend-specific path without a trait bound that every model would have to carry).
pub(crate) fn same<T: 'static, U: 'static>(value: T) -> Option<U> {
    let mut slot = Some(value);
    (&mut slot as &mut dyn Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
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
            prep.finish(state, forward(x.primitive, weight.primitive, &options))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, weight.primitive, &options)),
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
) -> FloatTensor<Flex> {
    let [n, _, h, w] = dims(&x);
    let [c_out, _, kh, kw] = dims(&weight);
    let out = |size: usize, k: usize, axis: usize| {
        (size + 2 * options.padding[axis] - options.dilation[axis] * (k - 1) - 1)
            / options.stride[axis]
            + 1
    };
    let y_shape = [n, c_out, out(h, kh, 0), out(w, kw, 1)];
    let geometry = Geometry::new(dims(&x), dims(&weight), y_shape, options);
    let y = gemm_conv::forward(&values(&x), &values(&weight), &geometry);
    primitive(y, y_shape)
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
    /// 3x3 with padding at strides 1 and 2 on small maps (im2col) and large ones (shifted
    /// views; blocks that split an image, a row longer than a block), 1x1 downsampling, the 7x7
    /// stem, and a batch that takes several groups of images.
    #[test]
    fn gradients_match_burns_convolution() {
        let cases = [
            ([2, 3, 9, 9], [4, 3, 3, 3], [1, 1], [1, 1], 1e-4),
            ([3, 5, 17, 23], [6, 5, 3, 3], [1, 1], [1, 1], 1e-4),
            ([1, 2, 3, 1100], [3, 2, 3, 3], [1, 1], [1, 1], 1e-4),
            ([2, 3, 32, 32], [8, 3, 3, 3], [1, 1], [1, 1], 1e-4),
            ([3, 4, 8, 8], [5, 4, 3, 3], [2, 2], [1, 1], 1e-4),
            ([2, 6, 8, 8], [3, 6, 1, 1], [2, 2], [0, 0], 1e-4),
            ([1, 3, 15, 15], [4, 3, 7, 7], [2, 2], [3, 3], 1e-4),
            // 37 MB of im2col matrix per image: one image per group, so the groups' sums count.
            // Each weight gradient sums 32,768 products, which burn's f32 reference adds in
            // another order.
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
        assert!(conv2d(&x, &w1, &grouped).is_none());
    }
}
