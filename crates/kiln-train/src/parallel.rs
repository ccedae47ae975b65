//! Data parallel training, as PyTorch's DistributedDataParallel does it: one model replica per
//! device (on every machine of the run), each step's images split evenly between the replicas,
//! the gradients summed through burn-collective's all-reduce, and the same optimizer step taken
//! by every replica, so that they stay identical without ever sending weights.
//!
//! The loss of each replica is weighted by its share of the step's images, so the summed
//! gradient is exactly the gradient of the mean loss over the whole step (uneven splits and
//! skipped images included). With `accumulate = k` a step is k loader batches, run one after
//! another through the same replicas before the one all-reduce.
//!
//! Batch norm normalizes with each replica's own images (PyTorch DDP's default), or with
//! `sync_bn` with all replicas' images together (PyTorch's `SyncBatchNorm`: per layer, sums over
//! the replicas through an all-reduce that autodiff goes through); its running statistics are
//! those of replica 0, which is the one checkpointed and exported.

use std::net::{ToSocketAddrs, UdpSocket};

use burn::collective::{
    self, AllReduceStrategy, CollectiveConfig, CollectiveError, PeerId, ReduceOperation, all_reduce,
};
use std::any::{Any, TypeId};

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData, TensorPrimitive};
use kiln_data::HostBatch;
use kiln_models::{Precision, ResNet};

use crate::batch::to_device;
use crate::optim::AnyOptimizer;
use crate::scaler::LossScaler;

/// The machines of a multi-machine run and this machine's place among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub nodes: usize,
    /// This machine's number, 0 to `nodes - 1`. Machine 0 runs the coordinator.
    pub rank: usize,
    /// `host:port` of the coordinator (burn-collective's global orchestrator).
    pub coordinator: String,
    /// `host:port` where this machine serves its tensors to the others. Default: the address
    /// this machine reaches the coordinator from, port = coordinator's + 1 + rank.
    pub node_address: Option<String>,
}

impl Cluster {
    fn coordinator_port(&self) -> Result<u16, ParallelError> {
        self.coordinator
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .ok_or_else(|| ParallelError::Address(self.coordinator.clone()))
    }

    /// Where this node's data service listens, as `(host:port, port)`.
    fn node_address(&self) -> Result<(String, u16), ParallelError> {
        let address = match &self.node_address {
            Some(address) => address.clone(),
            None => {
                let port = self.coordinator_port()? as usize + 1 + self.rank;
                format!("{}:{port}", self.local_host()?)
            }
        };
        let port = address
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .ok_or_else(|| ParallelError::Address(address.clone()))?;
        Ok((address, port))
    }

    /// The local IP address on the route to the coordinator (a UDP `connect` sends nothing).
    fn local_host(&self) -> Result<String, ParallelError> {
        let unreachable = |_| ParallelError::Address(self.coordinator.clone());
        let target = self
            .coordinator
            .to_socket_addrs()
            .map_err(unreachable)?
            .next()
            .ok_or_else(|| ParallelError::Address(self.coordinator.clone()))?;
        let socket = UdpSocket::bind(("0.0.0.0", 0)).map_err(unreachable)?;
        socket.connect(target).map_err(unreachable)?;
        Ok(socket.local_addr().map_err(unreachable)?.ip().to_string())
    }
}

/// Where a run trains: its devices on this machine and, for a multi-machine run, the cluster.
#[derive(Debug, Clone)]
pub struct Placement<D> {
    pub devices: Vec<D>,
    pub cluster: Option<Cluster>,
}

impl<D> Placement<D> {
    /// One device, one machine.
    pub fn single(device: D) -> Self {
        Self {
            devices: vec![device],
            cluster: None,
        }
    }

    /// Replicas on all machines together.
    pub fn peers(&self) -> usize {
        self.devices.len() * self.cluster.as_ref().map_or(1, |c| c.nodes)
    }

    fn first_peer(&self) -> usize {
        self.devices.len() * self.cluster.as_ref().map_or(0, |c| c.rank)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ParallelError {
    #[error(
        "{0} is not a usable host:port for the coordinator or a node (for example 10.0.0.1:29500)"
    )]
    Address(String),
    #[error(
        "the data-parallel all-reduce failed: {0}. On a multi-machine run, check that every machine started with the same --nodes and --coordinator, and that the coordinator's and each node's port are open"
    )]
    Collective(String),
    #[error(
        "cannot start the coordinator on port {0}: {1}. Choose a free port in --coordinator on every machine"
    )]
    CoordinatorPort(u16, String),
    #[error(
        "sync_bn needs burn's Autodiff backend without gradient checkpointing, which this build does not train on; set sync_bn = false"
    )]
    SyncBatchNorm,
}

impl From<CollectiveError> for ParallelError {
    fn from(error: CollectiveError) -> Self {
        ParallelError::Collective(format!("{error:?}"))
    }
}

/// What one optimizer step saw, over every replica on every machine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    pub images: usize,
    /// Mean loss over the step's images.
    pub loss: f64,
    pub correct: usize,
}

/// The model replicas of this machine, each with its device and optimizer state.
pub struct Replicas<B: AutodiffBackend> {
    replicas: Vec<Replica<B>>,
    /// True when there is more than one replica in the whole run.
    collective: bool,
    /// True when the run spans several machines.
    machines: bool,
    /// Batch norm over all replicas' images (`sync_bn`), where there are several.
    sync_bn: bool,
}

struct Replica<B: AutodiffBackend> {
    model: Option<ResNet<B>>,
    optimizer: AnyOptimizer<ResNet<B>, B>,
    /// f16 training's loss scaling; every replica makes the same decisions, from the same
    /// all-reduced gradients.
    scaler: Option<LossScaler>,
    loss_fn: CrossEntropyLoss<B>,
    device: B::Device,
    peer: PeerId,
}

impl<B: AutodiffBackend> Replicas<B> {
    /// One replica per device of `placement`, all starting from `model`, `optimizer` and the
    /// loss function that `make_loss` builds for a device. Joins the collective (and, on
    /// machine 0 of a multi-machine run, starts the coordinator first).
    pub fn new(
        model: ResNet<B>,
        make_optimizer: impl Fn() -> AnyOptimizer<ResNet<B>, B>,
        make_loss: impl Fn(&B::Device) -> CrossEntropyLoss<B>,
        placement: &Placement<B::Device>,
        sync_bn: bool,
    ) -> Result<Self, ParallelError> {
        let sync_bn = sync_bn && placement.peers() > 1;
        if sync_bn && TypeId::of::<B>() != TypeId::of::<Autodiff<B::InnerBackend>>() {
            return Err(ParallelError::SyncBatchNorm);
        }
        let first = placement.first_peer();
        let replicas = placement
            .devices
            .iter()
            .enumerate()
            .map(|(i, device)| Replica {
                model: Some(replica_of(&model, device)),
                optimizer: make_optimizer(),
                scaler: (model.precision == Precision::F16).then(LossScaler::default),
                loss_fn: make_loss(device),
                device: device.clone(),
                peer: PeerId::from(first + i),
            })
            .collect();
        let mut replicas = Self {
            replicas,
            collective: placement.peers() > 1,
            machines: placement.cluster.is_some(),
            sync_bn,
        };
        if replicas.collective {
            replicas.join(placement)?;
        }
        Ok(replicas)
    }

    fn join(&mut self, placement: &Placement<B::Device>) -> Result<(), ParallelError> {
        let mut config = CollectiveConfig::default().with_num_devices(self.replicas.len());
        if let Some(cluster) = &placement.cluster {
            let port = cluster.coordinator_port()?;
            if cluster.rank == 0 {
                start_coordinator(port)?;
            }
            let (node_address, data_port) = cluster.node_address()?;
            let websocket = |host_port: &str| {
                format!("ws://{host_port}")
                    .parse()
                    .expect("any string parses as an address")
            };
            config = config
                .with_num_nodes(cluster.nodes as u32)
                .with_global_address(websocket(&cluster.coordinator))
                .with_node_address(websocket(&node_address))
                .with_data_service_port(data_port)
                // burn-collective's global ring refuses tensors with fewer rows than machines
                // (a one-element count, a small bias) instead of falling back.
                .with_global_all_reduce_strategy(AllReduceStrategy::Tree(2));
        }
        collective::reset_collective::<B::InnerBackend>();
        self.on_each(|replica| {
            collective::register::<B::InnerBackend>(
                replica.peer,
                replica.device.clone(),
                config.clone(),
            )
            .map_err(ParallelError::from)
        })
        .into_iter()
        .collect()
    }

    /// Replica 0's model: the one evaluated, checkpointed and exported.
    pub fn model(&self) -> &ResNet<B> {
        self.replicas[0]
            .model
            .as_ref()
            .expect("a replica holds its model between steps")
    }

    pub fn optimizer(&self) -> &AnyOptimizer<ResNet<B>, B> {
        &self.replicas[0].optimizer
    }

    /// f16 training's loss scaling (the same on every replica); `None` in other precisions.
    pub fn loss_scaler(&self) -> Option<LossScaler> {
        self.replicas[0].scaler.clone()
    }

    /// Restores a checkpoint's loss scaling on every replica that scales its loss.
    pub fn restore_loss_scaler(&mut self, saved: Option<LossScaler>) {
        for replica in &mut self.replicas {
            if let (Some(scaler), Some(saved)) = (&mut replica.scaler, &saved) {
                *scaler = saved.clone();
            }
        }
    }

    /// Replaces every replica's model and optimizer state (a resumed checkpoint).
    pub fn restore<E>(
        &mut self,
        mut load: impl FnMut(
            ResNet<B>,
            AnyOptimizer<ResNet<B>, B>,
            &B::Device,
        ) -> Result<(ResNet<B>, AnyOptimizer<ResNet<B>, B>), E>,
        make_optimizer: impl Fn() -> AnyOptimizer<ResNet<B>, B>,
    ) -> Result<(), E> {
        for replica in &mut self.replicas {
            let model = replica.model.take().expect("a replica holds its model");
            let optimizer = std::mem::replace(&mut replica.optimizer, make_optimizer());
            let (model, optimizer) = load(model, optimizer, &replica.device)?;
            replica.model = Some(model);
            replica.optimizer = optimizer;
        }
        Ok(())
    }

    /// One optimizer step over `batches` (one loader batch, or `accumulate` of them): each is
    /// split between this machine's replicas, which train on their parts in parallel.
    pub fn step(&mut self, batches: Vec<HostBatch>, lr: f64) -> Result<StepStats, ParallelError> {
        let count = self.replicas.len();
        let mut parts: Vec<Vec<HostBatch>> = (0..count).map(|_| Vec::new()).collect();
        for batch in batches {
            for (i, part) in split(batch, count).into_iter().enumerate() {
                parts[i].push(part);
            }
        }
        let (collective, sync_bn) = (self.collective, self.sync_bn);
        let work: Vec<_> = self.replicas.iter_mut().zip(parts).collect();
        let results = run_each(work, |(replica, batches)| {
            replica.step(batches, lr, collective, sync_bn)
        });
        let mut stats = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(stats.swap_remove(0))
    }

    /// Leaves the collective, so that a later run in this process can join a new one.
    ///
    /// On several machines, waits for all of them and stays registered instead: machine 0's
    /// process hosts the coordinator, and a machine still asking it to unregister when machine 0
    /// exits would wait for its answer forever. The process ends right after.
    pub fn finish(mut self) -> Result<(), ParallelError> {
        if !self.collective {
            return Ok(());
        }
        if self.machines {
            return self
                .on_each(|replica| replica.sum(&[0.0]).map(drop))
                .into_iter()
                .collect();
        }
        self.on_each(|replica| {
            collective::finish_collective::<B::InnerBackend>(replica.peer)
                .map_err(ParallelError::from)
        })
        .into_iter()
        .collect()
    }

    fn on_each<T: Send>(&mut self, f: impl Fn(&mut Replica<B>) -> T + Sync) -> Vec<T> {
        run_each(self.replicas.iter_mut().collect(), f)
    }
}

/// A copy of `model` on `device` with state of its own: `clone` and `fork` alone would leave
/// the replicas one batch-norm running state, which burn shares between clones.
fn replica_of<B: AutodiffBackend>(model: &ResNet<B>, device: &B::Device) -> ResNet<B> {
    ResNet::from_inner(model.valid()).fork(device)
}

/// Runs `f` on every item, each on its own thread when there are several (the collective's
/// calls block until every peer has made them), inline when there is one.
fn run_each<I: Send, T: Send>(items: Vec<I>, f: impl Fn(I) -> T + Sync) -> Vec<T> {
    if items.len() == 1 {
        return items.into_iter().map(f).collect();
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

impl<B: AutodiffBackend> Replica<B> {
    /// Forward and backward over each of `batches`, gradients summed (each loss weighted by
    /// its share of the step's images on all replicas), all-reduced, then the optimizer step.
    fn step(
        &mut self,
        batches: Vec<HostBatch>,
        lr: f64,
        collective: bool,
        sync_bn: bool,
    ) -> Result<StepStats, ParallelError> {
        let model = self
            .model
            .take()
            .expect("a replica holds its model between steps");
        let local: usize = batches.iter().map(|b| b.labels.len()).sum();
        // With sync_bn, also per batch how many replicas got none of its images (batch norm
        // syncs only over batches that every replica runs, since each sum waits for all of
        // them) and how many images it has on all replicas (batch norm's count).
        let mut counts = vec![local as f64];
        if sync_bn {
            counts.extend(batches.iter().flat_map(|b| {
                let images = b.labels.len();
                [f64::from(u8::from(images == 0)), images as f64]
            }));
        }
        if collective {
            counts = self.sum(&counts)?;
        }
        let total = counts[0] as usize;
        let mut accumulator = GradientsAccumulator::new();
        let (mut loss_sum, mut correct) = (0.0, 0);
        for (index, batch) in batches.into_iter().enumerate() {
            if batch.labels.is_empty() {
                continue;
            }
            let batch = to_device::<B>(batch, &self.device);
            let n = batch.len();
            let logits = if sync_bn && counts[1 + 2 * index] == 0.0 {
                let peer = self.peer;
                kiln_models::synchronized(
                    move |x: Tensor<B, 2>| sum_over_peers(x, peer),
                    counts[2 + 2 * index] as usize,
                    || model.forward(batch.images),
                )
            } else {
                model.forward(batch.images)
            };
            correct += crate::engine::count_correct(logits.clone().detach(), batch.labels.clone());
            let loss = self.loss_fn.forward(logits, batch.labels);
            let value: f64 = loss.clone().into_scalar().elem();
            loss_sum += value * n as f64;
            let share = n as f64 / total as f64;
            let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale);
            let grads = GradientsParams::from_grads((loss * (share * scale)).backward(), &model);
            accumulator.accumulate(&model, grads);
        }
        let mut grads = Some(accumulator.grads());
        if collective {
            grads = grads
                .map(|g| all_reduce_gradients(&model, g, self.peer))
                .transpose()?;
        }
        if let Some(scaler) = &mut self.scaler {
            grads = grads.and_then(|g| scaler.unscale(&model, g));
        }
        self.model = Some(match grads {
            Some(grads) if total > 0 => self.optimizer.step(lr, model, grads),
            // No images this step, or f16 gradients that overflowed: no update.
            _ => model,
        });
        if collective {
            let sums = self.sum(&[loss_sum, correct as f64])?;
            (loss_sum, correct) = (sums[0], sums[1].round() as usize);
        }
        Ok(StepStats {
            images: total,
            loss: loss_sum / total.max(1) as f64,
            correct,
        })
    }

    /// The sum of `values` over every peer of the run.
    fn sum(&self, values: &[f64]) -> Result<Vec<f64>, ParallelError> {
        let data = TensorData::new(values.iter().map(|&v| v as f32).collect(), [values.len()]);
        let tensor = Tensor::<B::InnerBackend, 1>::from_data(data, &self.device);
        let primitive = tensor.into_primitive().tensor();
        let summed = all_reduce::<B::InnerBackend>(self.peer, primitive, ReduceOperation::Sum)?;
        let summed = Tensor::<B::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(summed));
        Ok(summed
            .into_data()
            .convert::<f64>()
            .to_vec()
            .expect("an f64 vector"))
    }
}

/// `x` summed over every peer of the run, in a way autodiff goes through: each peer's input
/// receives the sum of all peers' output gradients (an all-reduce's adjoint is an all-reduce).
/// Without it, a replica's images would miss their effect, through shared batch statistics, on
/// the other replicas' losses. Panics if the all-reduce fails, as the forward pass that calls it
/// cannot return an error.
fn sum_over_peers<B: AutodiffBackend>(x: Tensor<B, 2>, peer: PeerId) -> Tensor<B, 2> {
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
fn same<T: 'static, U: 'static>(value: T) -> Option<U> {
    let mut slot = Some(value);
    (&mut slot as &mut dyn Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
}

/// Sums every trainable parameter's gradient over all peers, in the order the model lists its
/// parameters. (burn's `GradientsParams::all_reduce` goes by sorted `ParamId`s, which are random
/// per process, so two machines would pair different tensors.) A replica that had no images
/// this step sends zeros, so that every peer makes the same calls.
fn all_reduce_gradients<B: AutodiffBackend>(
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

/// Splits a host batch into `parts` consecutive parts, as even as can be.
pub fn split(batch: HostBatch, parts: usize) -> Vec<HostBatch> {
    if parts == 1 {
        return vec![batch];
    }
    let [n, c, h, w] = batch.shape;
    let per_image = c * h * w;
    let mut skipped = Some(batch.skipped);
    (0..parts)
        .map(|i| {
            let range = kiln_data::Shard {
                index: i,
                count: parts,
            }
            .range(n);
            HostBatch {
                images: batch.images[range.start * per_image..range.end * per_image].to_vec(),
                shape: [range.len(), c, h, w],
                labels: batch.labels[range].to_vec(),
                skipped: skipped.take().unwrap_or_default(),
            }
        })
        .collect()
}

/// Starts burn-collective's global orchestrator on `port`, in the background for the life of
/// the process. A port already taken is an error here, rather than the orchestrator's log line
/// while every machine waits for it.
fn start_coordinator(port: u16) -> Result<(), ParallelError> {
    std::net::TcpListener::bind(("0.0.0.0", port))
        .map_err(|error| ParallelError::CoordinatorPort(port, error.to_string()))?;
    std::thread::spawn(move || {
        match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(collective::start_global_orchestrator(port)),
            Err(error) => eprintln!("error: cannot start the coordinator on port {port}: {error}"),
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> HostBatch {
        HostBatch {
            images: (0..n * 3).map(|i| i as f32).collect(),
            shape: [n, 3, 1, 1],
            labels: (0..n as i64).collect(),
            skipped: Vec::new(),
        }
    }

    #[test]
    fn split_keeps_every_image_once_in_order_and_evenly() {
        let parts = split(batch(7), 3);
        let sizes: Vec<usize> = parts.iter().map(|p| p.labels.len()).collect();
        assert_eq!(sizes, [3, 2, 2]);
        let labels: Vec<i64> = parts.iter().flat_map(|p| p.labels.clone()).collect();
        assert_eq!(labels, (0..7).collect::<Vec<_>>());
        let images: Vec<f32> = parts.iter().flat_map(|p| p.images.clone()).collect();
        assert_eq!(images, batch(7).images);
        assert!(parts.iter().all(|p| p.shape[0] == p.labels.len()));
    }

    #[test]
    fn a_batch_smaller_than_the_replicas_leaves_some_empty() {
        let sizes: Vec<usize> = split(batch(1), 2).iter().map(|p| p.labels.len()).collect();
        assert_eq!(sizes, [1, 0]);
    }

    #[test]
    fn default_node_address_is_on_the_route_to_the_coordinator() {
        let cluster = Cluster {
            nodes: 2,
            rank: 1,
            coordinator: "127.0.0.1:29500".into(),
            node_address: None,
        };
        assert_eq!(
            cluster.node_address().unwrap(),
            ("127.0.0.1:29502".to_string(), 29502)
        );
        let bad = Cluster {
            coordinator: "no-port".into(),
            ..cluster
        };
        assert!(matches!(bad.node_address(), Err(ParallelError::Address(_))));
    }
}
