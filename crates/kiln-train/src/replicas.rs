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

use std::any::TypeId;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::collective::{self, CollectiveConfig, PeerId};
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::backend::AutodiffBackend;
use kiln_data::HostBatch;
use kiln_models::ResNet;

use crate::batch::{DeviceBatch, to_device};
use crate::cluster::{Cluster, heartbeat};
use crate::collective::sum_values;
use crate::error::{ParallelError, TrainError};
use crate::optim::AnyOptimizer;
use crate::panics::REPLICA_THREAD;
use crate::scaler::LossScaler;
use crate::step::{Replica, StepPlan, StepStats};

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

/// A replica at work: the replica, the batches uploaded for its next step and its peer.
pub struct Worker<B: AutodiffBackend> {
    pub replica: Replica<B>,
    /// The next step's batches, on the device, with this replica's share of the counts.
    loaded: Option<(Vec<DeviceBatch<B>>, StepPlan)>,
    peer: Option<PeerId>,
    /// A failure to report instead of the next step (tests of what a failing replica does).
    fail: Option<String>,
}

/// Work for a replica's thread.
type Job<B> = Box<dyn FnOnce(&mut Worker<B>) + Send>;

/// Where the replicas live: one on the calling thread, or each on a thread of its own for the
/// whole run (cubecl gives every thread its own stream and memory pool, so a replica keeps
/// one thread).
enum Workers<B: AutodiffBackend> {
    Here(Box<Worker<B>>),
    Threads(Vec<mpsc::Sender<Job<B>>>),
}

/// The model replicas of this machine, each with its device and optimizer state.
pub struct Replicas<B: AutodiffBackend> {
    workers: Workers<B>,
    /// True when there is more than one replica in the whole run.
    collective: bool,
    /// True when the run spans several machines.
    machines: bool,
    /// Batch norm over all replicas' images (`sync_bn`), where there are several.
    sync_bn: bool,
    /// Replicas on this machine.
    count: usize,
    /// The loss's class weights, by which a step's losses are shared out (see `StepPlan`).
    class_weights: Option<Vec<f32>>,
    /// Whether `model.freeze` holds in the current epoch.
    frozen: bool,
}

/// How long to wait for the replicas before saying what is being waited for.
const PATIENCE: Duration = Duration::from_secs(60);

/// How often a wait for the replicas looks whether another machine was lost.
const POLL: Duration = Duration::from_millis(250);

/// How long a wait goes on after another machine was lost: a machine that leaves as the run
/// ends may have completed the wait's all-reduce already.
const GRACE: Duration = Duration::from_secs(2);

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
    ) -> Result<Self, TrainError> {
        let sync_bn = sync_bn && placement.peers() > 1;
        if sync_bn && TypeId::of::<B>() != TypeId::of::<Autodiff<B::InnerBackend>>() {
            return Err(ParallelError::SyncBatchNorm.into());
        }
        let collective = placement.peers() > 1;
        let first = placement.first_peer();
        let mut workers: Vec<Worker<B>> = placement
            .devices
            .iter()
            .enumerate()
            .map(|(i, device)| Worker {
                replica: Replica::new(
                    replica_of(&model, device),
                    make_optimizer(),
                    make_loss(device),
                    device.clone(),
                ),
                loaded: None,
                fail: None,
                peer: collective.then(|| PeerId::from(first + i)),
            })
            .collect();
        // On several machines the replica runs on a thread of its own even when it is the only
        // one, so that this thread can notice a lost machine while the replica waits for it.
        let workers = match workers.len() == 1 && placement.cluster.is_none() {
            true => Workers::Here(Box::new(workers.remove(0))),
            false => Workers::Threads(
                workers
                    .into_iter()
                    .enumerate()
                    .map(|(i, worker)| spawn_worker(i, worker))
                    .collect::<Result<_, _>>()?,
            ),
        };
        let mut replicas = Self {
            workers,
            collective,
            machines: placement.cluster.is_some(),
            sync_bn,
            count: placement.devices.len(),
            class_weights: None,
            frozen: false,
        };
        if collective {
            if replicas.machines {
                crate::panics::joined_cluster();
            }
            replicas.join(placement)?;
        }
        Ok(replicas)
    }

    fn join(&mut self, placement: &Placement<B::Device>) -> Result<(), TrainError> {
        let mut config = CollectiveConfig::default().with_num_devices(self.count);
        if let Some(cluster) = &placement.cluster {
            config = cluster.join(config)?;
        }
        collective::reset_collective::<B::InnerBackend>();
        self.on_each(|_| {
            let config = config.clone();
            move |worker: &mut Worker<B>| {
                collective::register::<B::InnerBackend>(
                    worker
                        .peer
                        .expect("a collective run gives every replica a peer"),
                    worker.replica.device.clone(),
                    config,
                )
                .map_err(|e| ParallelError::from(e).into())
            }
        })?;
        Ok(())
    }

    /// Replica 0's model (a handle to it, not a copy of the weights): the one evaluated,
    /// checkpointed and exported.
    pub fn model(&mut self) -> Result<ResNet<B>, TrainError> {
        self.with_first(|replica| Ok(replica.model().clone()))
    }

    /// Shares each step's loss out by these class weights (the loss function's), so that the
    /// step's gradient is that of its weighted mean loss over all replicas' images.
    pub fn with_class_weights(mut self, weights: Option<Vec<f32>>) -> Self {
        self.class_weights = weights;
        self
    }

    /// Runs `f` on replica 0, on its thread.
    pub fn with_first<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Replica<B>) -> Result<T, TrainError> + Send + 'static,
    ) -> Result<T, TrainError> {
        let mut f = Some(f);
        let mut results = self.on_each(|i| {
            let f = if i == 0 { f.take() } else { None };
            move |worker: &mut Worker<B>| f.map(|f| f(&mut worker.replica)).transpose()
        })?;
        Ok(results.swap_remove(0).expect("replica 0 ran it"))
    }

    /// f16 training's loss scaling (the same on every replica); `None` in other precisions.
    pub fn loss_scaler(&mut self) -> Result<Option<LossScaler>, TrainError> {
        self.with_first(|replica| Ok(replica.scaler.clone()))
    }

    /// Replaces every replica's model and optimizer state (a resumed checkpoint), and its loss
    /// scaling where it scales its loss.
    pub fn restore(
        &mut self,
        load: impl Fn(
            ResNet<B>,
            AnyOptimizer<ResNet<B>, B>,
            &B::Device,
        ) -> Result<(ResNet<B>, AnyOptimizer<ResNet<B>, B>), TrainError>
        + Clone
        + Send
        + 'static,
        make_optimizer: impl Fn() -> AnyOptimizer<ResNet<B>, B> + Clone + Send + 'static,
        scaler: Option<LossScaler>,
    ) -> Result<(), TrainError> {
        self.on_each(|_| {
            let (load, make_optimizer, saved) =
                (load.clone(), make_optimizer.clone(), scaler.clone());
            move |worker: &mut Worker<B>| {
                let replica = &mut worker.replica;
                let (model, optimizer) = replica.take(make_optimizer());
                let (model, optimizer) = load(model, optimizer, &replica.device)?;
                replica.replace(model, optimizer);
                if let (Some(scaler), Some(saved)) = (&mut replica.scaler, saved) {
                    *scaler = saved;
                }
                Ok(())
            }
        })?;
        Ok(())
    }

    /// Holds `model.freeze` (or lifts it) from the next step on.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    /// Uploads the next step's `batches` (one loader batch, or `accumulate` of them), each
    /// split between this machine's replicas; each replica uploads its part on its own thread.
    pub fn load(&mut self, batches: Vec<HostBatch>) -> Result<(), TrainError> {
        let count = self.count;
        let mut parts: Vec<Vec<HostBatch>> = (0..count).map(|_| Vec::new()).collect();
        for batch in batches {
            for (i, part) in split(batch, count).into_iter().enumerate() {
                parts[i].push(part);
            }
        }
        let plans = self.plans(&parts);
        let mut work = parts.into_iter().zip(plans).map(Some).collect::<Vec<_>>();
        self.on_each(|i| {
            let (part, plan) = work[i].take().expect("one part per replica");
            move |worker: &mut Worker<B>| {
                let device = worker.replica.device.clone();
                let batches = part.into_iter().map(|b| to_device(b, &device)).collect();
                worker.loaded = Some((batches, plan));
                Ok(())
            }
        })?;
        Ok(())
    }

    /// Each replica's share of a step's counts. On one machine they are known here; on
    /// several, each replica knows its own and [`Replicas::step`] sums them over the machines.
    fn plans(&self, parts: &[Vec<HostBatch>]) -> Vec<StepPlan> {
        let images = |part: &[HostBatch]| part.iter().map(|b| b.labels.len()).sum::<usize>();
        let total: usize = parts.iter().map(|p| images(p)).sum();
        // With class weights, each batch's weight is the sum of its labels' weights.
        let batch_weights = |part: &[HostBatch]| match &self.class_weights {
            None => Vec::new(),
            Some(w) => part
                .iter()
                .map(|b| b.labels.iter().map(|&y| f64::from(w[y as usize])).sum())
                .collect(),
        };
        let weight = |part: &[HostBatch]| match &self.class_weights {
            None => images(part) as f64,
            Some(_) => batch_weights(part).iter().sum(),
        };
        let total_weight: f64 = parts.iter().map(|p| weight(p)).sum();
        let batches = parts.first().map_or(0, Vec::len);
        let sync_bn: Vec<Option<usize>> = match self.sync_bn {
            false => Vec::new(),
            true => (0..batches)
                .map(|b| {
                    let sizes = parts.iter().map(|p| p[b].labels.len());
                    let all_have = sizes.clone().all(|n| n > 0);
                    all_have.then(|| sizes.sum())
                })
                .collect(),
        };
        parts
            .iter()
            .map(|part| StepPlan {
                images: if self.machines { images(part) } else { total },
                weight: if self.machines {
                    weight(part)
                } else {
                    total_weight
                },
                batch_weights: batch_weights(part),
                peer: None,
                frozen: self.frozen,
                sync_bn: match self.machines && self.sync_bn {
                    // Per batch, this replica's images; summed over the machines in `step`.
                    true => part.iter().map(|b| Some(b.labels.len())).collect(),
                    false => sync_bn.clone(),
                },
            })
            .collect()
    }

    /// One optimizer step on the loaded batches, on every replica at once. Returns as soon as
    /// the work is queued on the devices (nothing is read back; see [`Replicas::take_stats`]),
    /// with what this machine `asks` of the run after the step, agreed by all machines: on
    /// several, the step's count of images carries it, so that all stop or checkpoint at the
    /// same step whichever machine asked.
    pub fn step(&mut self, lr: f64, asks: StepRequests) -> Result<StepRequests, TrainError> {
        let machines = self.machines;
        let mut agreed = self.on_each(|i| {
            move |worker: &mut Worker<B>| {
                if let Some(message) = worker.fail.take() {
                    return Err(failed(i, &message));
                }
                let (batches, mut plan) = worker
                    .loaded
                    .take()
                    .expect("a step's batches are loaded first");
                plan.peer = worker.peer;
                let mut agreed = asks;
                if machines {
                    (plan, agreed) = over_machines(plan, &batches, worker, asks)?;
                }
                worker.replica.step(batches, &plan, lr)?;
                Ok(agreed)
            }
        })?;
        Ok(agreed.swap_remove(0))
    }

    /// Makes replica `index` fail its next step with `message` instead of stepping, while the
    /// others step (and wait for it in their all-reduce): how a device that fails mid-run
    /// looks to the rest of the run. For tests.
    #[doc(hidden)]
    pub fn inject_failure(&mut self, index: usize, message: &str) -> Result<(), TrainError> {
        let message = message.to_string();
        let mut message = Some(message);
        self.on_each(|i| {
            let message = if i == index { message.take() } else { None };
            move |worker: &mut Worker<B>| {
                worker.fail = message.or(worker.fail.take());
                Ok(())
            }
        })?;
        Ok(())
    }

    /// Every step's images, loss sum and correct predictions since the last call, over all
    /// replicas and machines: one read from each device (and one all-reduce of the figures
    /// when there are several replicas).
    pub fn take_stats(&mut self) -> Result<Vec<StepStats>, TrainError> {
        let collective = self.collective;
        let mut all = self.on_each(|_| {
            move |worker: &mut Worker<B>| {
                let stats = worker.replica.take_stats();
                if !collective {
                    return Ok(stats);
                }
                let values: Vec<f64> = stats
                    .iter()
                    .flat_map(|s| [s.loss_sum, s.correct as f64])
                    .collect();
                let peer = worker
                    .peer
                    .expect("a collective run gives every replica a peer");
                let sums = sum_values::<B::InnerBackend>(&values, peer, &worker.replica.device)?;
                Ok(stats
                    .iter()
                    .zip(sums.chunks(2))
                    .map(|(s, sum)| StepStats {
                        loss_sum: sum[0],
                        correct: sum[1].round() as usize,
                        // The same on every replica: computed from all-reduced gradients.
                        ..*s
                    })
                    .collect())
            }
        })?;
        Ok(all.swap_remove(0))
    }

    /// Leaves the collective, so that a later run in this process can join a new one.
    ///
    /// On several machines, waits for all of them and stays registered instead: machine 0's
    /// process hosts the coordinator, and a machine still asking it to unregister when machine 0
    /// exits would wait for its answer forever. The process ends right after.
    pub fn finish(mut self) -> Result<(), TrainError> {
        if !self.collective {
            return Ok(());
        }
        let machines = self.machines;
        self.on_each(|_| {
            move |worker: &mut Worker<B>| {
                let peer = worker
                    .peer
                    .expect("a collective run gives every replica a peer");
                if machines {
                    sum_values::<B::InnerBackend>(&[0.0], peer, &worker.replica.device)?;
                } else {
                    collective::finish_collective::<B::InnerBackend>(peer)
                        .map_err(ParallelError::from)?;
                }
                Ok(())
            }
        })?;
        if machines {
            heartbeat::leave();
        }
        Ok(())
    }

    /// Runs the job that `job(i)` makes on replica `i`, all at once, and gathers the results.
    /// The first replica that fails (an error or a panic) ends the wait with its error at
    /// once: the others may be blocked in an all-reduce that will never complete, and are
    /// left behind. So does a lost machine (see [`heartbeat`]). A wait longer than a minute is
    /// reported, with what it waits for.
    fn on_each<T, J>(&mut self, mut job: impl FnMut(usize) -> J) -> Result<Vec<T>, TrainError>
    where
        T: Send + 'static,
        J: FnOnce(&mut Worker<B>) -> Result<T, TrainError> + Send + 'static,
    {
        let senders = match &mut self.workers {
            Workers::Here(worker) => return job(0)(&mut **worker).map(|value| vec![value]),
            Workers::Threads(senders) => senders,
        };
        let (reply, replies) = mpsc::channel();
        for (i, sender) in senders.iter().enumerate() {
            let (work, reply) = (job(i), reply.clone());
            let task: Job<B> = Box::new(move |worker| {
                let _ = reply.send((i, catch_unwind(AssertUnwindSafe(|| work(worker)))));
            });
            sender
                .send(task)
                .map_err(|_| failed(i, "its thread has ended"))?;
        }
        drop(reply);
        let mut results: Vec<Option<T>> = senders.iter().map(|_| None).collect();
        let start = Instant::now();
        let collective = self.collective;
        // The others may wait for the failed one in an all-reduce: dropping the collective's
        // pending operation releases them with an error.
        let stop_the_others = || {
            if collective {
                // Quietly: once a machine is lost, the collective's own threads may be gone.
                let _ = crate::panics::quietly(collective::reset_collective::<B::InnerBackend>);
            }
        };
        // A replica that failed because another machine left the run says so.
        let machines = self.machines;
        // A failed all-reduce may be the first sign: then the heartbeat, which names the
        // machine, gets a moment (its connection's end arrives within milliseconds of a death).
        let lost = move |wait: Duration| {
            if !machines {
                return None;
            }
            let deadline = Instant::now() + wait;
            while heartbeat::lost().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let why = heartbeat::lost().or_else(crate::panics::network_failure);
            why.map(ParallelError::MachineLost)
        };
        let (mut lost_since, mut next_warning) = (None, PATIENCE);
        while let Some(waiting) = results.iter().position(Option::is_none) {
            match replies.recv_timeout(POLL) {
                Ok((i, Ok(Ok(value)))) => results[i] = Some(value),
                Ok((_, Ok(Err(error)))) => {
                    stop_the_others();
                    return Err(lost(GRACE).map_or(error, Into::into));
                }
                Ok((i, Err(panic))) => {
                    stop_the_others();
                    let message = crate::panics::message(panic.as_ref()).unwrap_or_default();
                    if crate::panics::is_out_of_memory(&message) {
                        resume_unwind(panic);
                    }
                    let error = failed(i, message.lines().next().unwrap_or("a panic"));
                    return Err(lost(GRACE).map_or(error, Into::into));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(error) = lost(Duration::ZERO) {
                        let since = *lost_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= GRACE {
                            stop_the_others();
                            return Err(error.into());
                        }
                    }
                    if start.elapsed() >= next_warning {
                        next_warning += PATIENCE;
                        log::warn!(
                            "replica {waiting} has not answered for {} s (compiling GPU kernels, or waiting for another replica or machine in an all-reduce)",
                            start.elapsed().as_secs()
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(failed(waiting, "its thread has ended"));
                }
            }
        }
        Ok(results.into_iter().flatten().collect())
    }
}

fn failed(replica: usize, message: &str) -> TrainError {
    ParallelError::ReplicaFailed {
        replica,
        message: message.to_string(),
    }
    .into()
}

/// Starts the long-lived thread of replica `index`.
fn spawn_worker<B: AutodiffBackend>(
    index: usize,
    mut worker: Worker<B>,
) -> Result<mpsc::Sender<Job<B>>, TrainError> {
    let (sender, jobs) = mpsc::channel::<Job<B>>();
    std::thread::Builder::new()
        .name(format!("{REPLICA_THREAD}{index}"))
        .spawn(move || {
            while let Ok(job) = jobs.recv() {
                job(&mut worker);
            }
        })
        .map_err(|e| failed(index, &format!("cannot start its thread: {e}")))?;
    Ok(sender)
}

/// What a machine asks of the whole run at a step (see [`Replicas::step`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepRequests {
    /// Stop after this step with a checkpoint (Ctrl-C).
    pub stop: bool,
    /// Write a checkpoint after this step (`checkpoints.every_minutes`, which each machine's
    /// own clock decides).
    pub checkpoint: bool,
}

/// A replica's step plan with the counts summed over every peer of a multi-machine run (each
/// machine loads only its shard of a batch, so only together do they know the step's images),
/// and what any machine asks of the run.
fn over_machines<B: AutodiffBackend>(
    plan: StepPlan,
    batches: &[DeviceBatch<B>],
    worker: &Worker<B>,
    asks: StepRequests,
) -> Result<(StepPlan, StepRequests), TrainError> {
    let peer = worker
        .peer
        .expect("a multi-machine run gives every replica a peer");
    let flag = |on: bool| f64::from(u8::from(on));
    // Per batch: whether this replica has none of its images (batch norm syncs only over
    // batches every replica runs), and how many images it has.
    let mut counts = vec![
        plan.images as f64,
        plan.weight,
        flag(asks.stop),
        flag(asks.checkpoint),
    ];
    if !plan.sync_bn.is_empty() {
        counts.extend(batches.iter().flat_map(|b| {
            let images = b.len();
            [f64::from(u8::from(images == 0)), images as f64]
        }));
    }
    let counts = sum_values::<B::InnerBackend>(&counts, peer, &worker.replica.device)?;
    let sync_bn = match plan.sync_bn.is_empty() {
        true => Vec::new(),
        false => counts[4..]
            .chunks(2)
            .map(|c| (c[0] == 0.0).then_some(c[1] as usize))
            .collect(),
    };
    let agreed = StepRequests {
        stop: counts[2] > 0.0,
        checkpoint: counts[3] > 0.0,
    };
    let plan = StepPlan {
        images: counts[0] as usize,
        weight: counts[1],
        peer: Some(peer),
        sync_bn,
        ..plan
    };
    Ok((plan, agreed))
}

/// A copy of `model` on `device` with state of its own: `clone` and `fork` alone would leave
/// the replicas one batch-norm running state, which burn shares between clones.
fn replica_of<B: AutodiffBackend>(model: &ResNet<B>, device: &B::Device) -> ResNet<B> {
    ResNet::from_inner(model.valid()).fork(device)
}

/// Splits a host batch into `parts` consecutive parts, as even as can be.
pub fn split(batch: HostBatch, parts: usize) -> Vec<HostBatch> {
    if parts == 1 {
        return vec![batch];
    }
    let [n, c, h, w] = batch.shape;
    let per_image = c * h * w;
    let classes = batch.targets.as_ref().map_or(0, |t| t.len() / n.max(1));
    let mut skipped = Some(batch.skipped);
    (0..parts)
        .map(|i| {
            let range = kiln_data::BatchShare {
                index: i,
                count: parts,
            }
            .range(n);
            HostBatch {
                images: batch.images[range.start * per_image..range.end * per_image].to_vec(),
                shape: [range.len(), c, h, w],
                labels: batch.labels[range.clone()].to_vec(),
                indices: batch.indices[range.clone()].to_vec(),
                targets: (batch.targets.as_ref())
                    .map(|t| t[range.start * classes..range.end * classes].to_vec()),
                skipped: skipped.take().unwrap_or_default(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> HostBatch {
        HostBatch {
            images: (0..n * 3).map(|i| i as f32).collect(),
            shape: [n, 3, 1, 1],
            labels: (0..n as i64).collect(),
            indices: (0..n).collect(),
            targets: Some((0..n * 2).map(|i| i as f32).collect()),
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
        let targets = parts.iter().flat_map(|p| p.targets.clone().unwrap());
        assert_eq!(targets.collect::<Vec<_>>(), batch(7).targets.unwrap());
        assert!(parts.iter().all(|p| p.shape[0] == p.labels.len()));
    }

    #[test]
    fn a_batch_smaller_than_the_replicas_leaves_some_empty() {
        let sizes: Vec<usize> = split(batch(1), 2).iter().map(|p| p.labels.len()).collect();
        assert_eq!(sizes, [1, 0]);
    }
}
