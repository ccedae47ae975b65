//! A training step reads nothing back from the device: its loss and correct count stay there
//! until the loop asks for them, in one read for any number of steps. Counted on flex behind
//! burn's router, through which every read of every tensor passes (`read_tensor_async`).

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::ir::{BackendIr, OperationIr, TensorHandle, TensorId, TensorIr};
use burn::backend::router::{
    BackendRouter, MultiBackendBridge, RouterTensor, Runner, RunnerChannel, RunnerClient,
};
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::{DTypeUsageSet, ExecutionError};
use burn::tensor::{DType, Shape, TensorData};
use kiln_config::config::OptimizerConfig;
use kiln_data::HostBatch;
use kiln_models::{ResNetConfig, Stem};
use kiln_train::batch::to_device;
use kiln_train::optim::AnyOptimizer;
use kiln_train::step::{Replica, StepPlan};

/// Reads from the device of every tensor, since the process started.
static READS: AtomicUsize = AtomicUsize::new(0);

/// burn's own runner for `B`, with every read counted.
#[derive(Clone)]
struct CountingClient<B: BackendIr>(Runner<B>);

type Future<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<B: BackendIr> RunnerClient for CountingClient<B> {
    type Device = B::Device;

    fn register_op(&self, op: OperationIr) {
        self.0.register_op(op)
    }

    fn read_tensor_async(&self, tensor: TensorIr) -> Future<Result<TensorData, ExecutionError>> {
        READS.fetch_add(1, Ordering::SeqCst);
        self.0.read_tensor_async(tensor)
    }

    fn sync(&self) -> Result<(), ExecutionError> {
        self.0.sync()
    }

    fn create_empty_handle(&self) -> TensorId {
        self.0.create_empty_handle()
    }

    fn register_tensor_data(&self, data: TensorData) -> RouterTensor<Self> {
        let ir = self.0.register_tensor_data_desc(data);
        RouterTensor::new(ir.id, ir.shape, ir.dtype, self.clone())
    }

    fn device(&self) -> B::Device {
        self.0.device()
    }

    fn seed(&self, seed: u64) {
        self.0.seed(seed)
    }

    fn dtype_usage(&self, dtype: DType) -> DTypeUsageSet {
        self.0.dtype_usage(dtype)
    }
}

/// Tensors never change backend here (one device); the bridge only has to exist.
struct SameBackend<B>(std::marker::PhantomData<B>);

impl<B: BackendIr> MultiBackendBridge for SameBackend<B> {
    type TensorHandle = B::Handle;
    type Device = B::Device;

    fn change_backend_float(handle: B::Handle, shape: Shape, device: &B::Device) -> B::Handle {
        let tensor = B::float_tensor(TensorHandle { handle, shape });
        B::float_tensor_handle(B::float_to_device(tensor, device))
    }

    fn change_backend_int(handle: B::Handle, shape: Shape, device: &B::Device) -> B::Handle {
        let tensor = B::int_tensor(TensorHandle { handle, shape });
        B::int_tensor_handle(B::int_to_device(tensor, device))
    }

    fn change_backend_bool(handle: B::Handle, shape: Shape, device: &B::Device) -> B::Handle {
        let tensor = B::bool_tensor(TensorHandle { handle, shape });
        B::bool_tensor_handle(B::bool_to_device(tensor, device))
    }
}

struct CountingChannel<B>(std::marker::PhantomData<B>);

impl<B> Clone for CountingChannel<B> {
    fn clone(&self) -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<B: BackendIr> RunnerChannel for CountingChannel<B> {
    type Device = B::Device;
    type Bridge = SameBackend<B>;
    type Client = CountingClient<B>;
    type FloatElem = B::FloatElem;
    type IntElem = B::IntElem;
    type BoolElem = B::BoolElem;

    fn name(device: &B::Device) -> String {
        format!("counting<{}>", B::name(device))
    }

    fn init_client(device: &B::Device) -> CountingClient<B> {
        CountingClient(Runner::new(device.clone()))
    }

    fn get_tensor_handle(tensor: &TensorIr, client: &CountingClient<B>) -> B::Handle {
        client.0.get_tensor_handle(tensor)
    }

    fn register_tensor(
        client: &CountingClient<B>,
        handle: B::Handle,
        shape: Shape,
        dtype: DType,
    ) -> RouterTensor<CountingClient<B>> {
        client
            .0
            .register_tensor(handle, shape, dtype, client.clone())
    }
}

type Counted = Autodiff<BackendRouter<CountingChannel<Flex>>>;

fn reads() -> usize {
    READS.load(Ordering::SeqCst)
}

#[test]
fn a_training_step_reads_nothing_and_its_figures_come_back_in_one_read() {
    // Initialising the model draws from flex's process-wide generator, as the engine's runs do.
    let _turn = crate::common::take_turn();
    let device = Default::default();
    let model = ResNetConfig::new(18)
        .with_width(4)
        .with_stem(Stem::Cifar)
        .with_num_classes(3)
        .init::<Counted>(&device)
        .unwrap();
    let mut sgd = OptimizerConfig::sgd(0.1);
    sgd.momentum = 0.9;
    let loss = CrossEntropyLossConfig::new().init(&device);
    let mut replica = Replica::new(model, AnyOptimizer::new(&sgd), loss, device);
    let batch = |seed: usize| HostBatch {
        images: (0..4 * 3 * 8 * 8)
            .map(|i| ((i * 31 + seed * 7) % 17) as f32 / 8.0 - 1.0)
            .collect(),
        shape: [4, 3, 8, 8],
        labels: vec![0, 1, 2, 1],
        indices: vec![0, 1, 2, 3],
        targets: None,
        skipped: Vec::new(),
    };

    // The counter sees a read.
    let before = reads();
    let _ = to_device::<Counted>(batch(0), &device).images.into_data();
    assert_eq!(reads(), before + 1);

    // Three steps (upload, forward, loss, backward, SGD): not one read.
    let before = reads();
    for step in 0..3 {
        let batch = to_device::<Counted>(batch(step), &device);
        replica.step(vec![batch], &StepPlan::alone(4), 0.1).unwrap();
    }
    assert_eq!(reads(), before, "a training step read from the device");

    // Their losses and correct counts: one read for all three.
    let stats = replica.take_stats();
    assert_eq!(reads(), before + 1);
    assert_eq!(stats.len(), 3);
    for step in &stats {
        assert_eq!(step.images, 4);
        let loss = step.loss_sum / 4.0;
        assert!(loss.is_finite() && loss > 0.0, "{stats:?}");
        assert!(step.correct <= 4);
    }
    // Steps were taken: the loss of a repeated batch moves.
    assert_ne!(stats[0].loss_sum, stats[2].loss_sum);
}
