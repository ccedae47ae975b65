//! What replicas exchange through burn-collective's all-reduce: gradients (in model order),
//! batch norm's statistics under `sync_bn` (an all-reduce autodiff goes through), and small
//! vectors of counts.

use std::any::Any;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::collective::{CollectiveError, PeerId, ReduceOperation, all_reduce};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use kiln_models::ResNet;

use crate::error::ParallelError;

/// The sum of `values` over every peer of the run (read back to the host).
pub fn sum_values<B: Backend>(
    values: &[f64],
    peer: PeerId,
    device: &B::Device,
) -> Result<Vec<f64>, ParallelError> {
    let data = TensorData::new(values.iter().map(|&v| v as f32).collect(), [values.len()]);
    let tensor = Tensor::<B, 1>::from_data(data, device);
    let summed = all_reduce::<B>(peer, tensor.into_primitive().tensor(), ReduceOperation::Sum)?;
    let summed = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(summed));
    Ok(summed
        .into_data()
        .convert::<f64>()
        .to_vec()
        .expect("an f64 vector"))
}

/// `x` summed over every peer of the run, in a way autodiff goes through: each peer's input
/// receives the sum of all peers' output gradients (an all-reduce's adjoint is an all-reduce).
/// Without it, a replica's images would miss their effect, through shared batch statistics, on
/// the other replicas' losses. Panics if the all-reduce fails, as the forward pass that calls it
/// cannot return an error.
pub fn sum_over_peers<B: AutodiffBackend>(x: Tensor<B, 2>, peer: PeerId) -> Tensor<B, 2> {
    type Tracked<B> = Tensor<Autodiff<<B as AutodiffBackend>::InnerBackend>, 2>;
    let x = same::<_, Tracked<B>>(x)
        .expect("Replicas::new checked that B is Autodiff")
        .into_primitive()
        .tensor();
    let sum = all_reduce::<B::InnerBackend>(peer, x.primitive.clone(), ReduceOperation::Sum)
        .unwrap_or_else(|error| panic!("{}", ParallelError::from(error)));
    let sum = match SumOverPeers
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(peer, sum),
        OpsKind::UnTracked(prep) => prep.finish(sum),
    };
    same(Tracked::<B>::from_primitive(TensorPrimitive::Float(sum)))
        .expect("Replicas::new checked that B is Autodiff")
}

#[derive(Debug)]
struct SumOverPeers;

impl<I: Backend> Backward<I, 1> for SumOverPeers {
    type State = PeerId;

    fn backward(self, ops: Ops<PeerId, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<I>(&ops.node);
        if let Some(parent) = parent {
            let sum = all_reduce::<I>(ops.state, grad, ReduceOperation::Sum)
                .unwrap_or_else(|error| panic!("{}", ParallelError::from(error)));
            grads.register::<I>(parent.id, sum);
        }
    }
}

/// `value` as a `U` when `T` and `U` are the same type.
pub fn same<T: 'static, U: 'static>(value: T) -> Option<U> {
    let mut slot = Some(value);
    (&mut slot as &mut dyn Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
}

/// Sums every trainable parameter's gradient over all peers, in the order the model lists its
/// parameters. (burn's `GradientsParams::all_reduce` goes by sorted `ParamId`s, which are random
/// per process, so two machines would pair different tensors.) A replica that had no images
/// this step sends zeros, so that every peer makes the same calls.
pub fn all_reduce_gradients<B: AutodiffBackend>(
    model: &ResNet<B>,
    grads: GradientsParams,
    peer: PeerId,
) -> Result<GradientsParams, ParallelError> {
    struct Reduce<B> {
        grads: GradientsParams,
        peer: PeerId,
        error: Option<CollectiveError>,
        _backend: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Reduce<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            // Batch-norm running statistics come through here too; they take no gradient.
            let value = param.val();
            if self.error.is_some() || !value.is_require_grad() {
                return;
            }
            let grad = self
                .grads
                .remove::<B::InnerBackend, D>(param.id)
                .unwrap_or_else(|| value.inner().zeros_like());
            let primitive = grad.into_primitive().tensor();
            match all_reduce::<B::InnerBackend>(self.peer, primitive, ReduceOperation::Sum) {
                Ok(sum) => self.grads.register::<B::InnerBackend, D>(
                    param.id,
                    Tensor::from_primitive(TensorPrimitive::Float(sum)),
                ),
                Err(error) => self.error = Some(error),
            }
        }
    }
    let mut reduce = Reduce::<B> {
        grads,
        peer,
        error: None,
        _backend: std::marker::PhantomData,
    };
    model.visit(&mut reduce);
    match reduce.error {
        Some(error) => Err(error.into()),
        None => Ok(reduce.grads),
    }
}
