//! A batch norm layer's buffers (running mean, running variance, batches tracked): tensors that
//! a training forward pass replaces, visited, mapped, saved and loaded as burn's `RunningState`
//! (the same record, `Param<Tensor>`, so checkpoints and weight files are unchanged).
//!
//! Not burn's `RunningState`: it keeps each thread's update apart and folds them into their
//! average on the next read, which launches a division for every buffer of every layer at every
//! step, by one where one thread updates it (57 of a ResNet-18 step's 390 kernels on wgpu).
//! kiln gives every replica a model of its own (kiln-train's `replica_of`), so a buffer has one
//! writer, and an update is its new value.

use std::sync::{Arc, Mutex, PoisonError};

use burn::module::{
    AutodiffModule, Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper,
    ModuleVisitor, Param, ParamId,
};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

/// A tensor that is not trained but replaced (`torch.nn.Module.register_buffer`). Clones share
/// the value, as `RunningState`'s do.
#[derive(Clone, Debug)]
pub struct Buffer<B: Backend> {
    id: ParamId,
    value: Arc<Mutex<Tensor<B, 1>>>,
}

impl<B: Backend> Buffer<B> {
    pub fn new(value: Tensor<B, 1>) -> Self {
        Self::with_id(ParamId::new(), value)
    }

    fn with_id(id: ParamId, value: Tensor<B, 1>) -> Self {
        Self {
            id,
            value: Arc::new(Mutex::new(value)),
        }
    }

    /// The current value.
    pub fn value(&self) -> Tensor<B, 1> {
        self.lock().clone()
    }

    /// Replaces the value: no kernel runs.
    pub fn update(&self, value: Tensor<B, 1>) {
        *self.lock() = value;
    }

    /// The value, also after a thread that held it panicked (it is always a whole tensor).
    fn lock(&self) -> std::sync::MutexGuard<'_, Tensor<B, 1>> {
        self.value.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn as_param(&self) -> Param<Tensor<B, 1>> {
        Param::initialized(self.id, self.value())
    }
}

impl<B: Backend> Module<B> for Buffer<B> {
    type Record = Param<Tensor<B, 1>>;

    fn collect_devices(&self, mut devices: Devices<B>) -> Devices<B> {
        let device = self.lock().device();
        if !devices.contains(&device) {
            devices.push(device);
        }
        devices
    }

    fn fork(self, device: &B::Device) -> Self {
        self.to_device(device)
    }

    fn to_device(self, device: &B::Device) -> Self {
        let moved = self.value().to_device(device);
        self.update(moved);
        self
    }

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        visitor.visit_float(&self.as_param());
    }

    fn map<M: ModuleMapper<B>>(self, mapper: &mut M) -> Self {
        let (_, mapped, _) = mapper.map_float(self.as_param()).consume();
        self.update(mapped);
        self
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        let device = self.lock().device();
        self.id = record.id;
        self.update(record.val().to_device(&device));
        self
    }

    fn into_record(self) -> Self::Record {
        self.as_param()
    }
}

impl<B: AutodiffBackend> AutodiffModule<B> for Buffer<B> {
    type InnerModule = Buffer<B::InnerBackend>;

    fn valid(&self) -> Self::InnerModule {
        Buffer::with_id(self.id, self.value().inner())
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        Buffer::with_id(module.id, Tensor::from_inner(module.value()))
    }
}

impl<B: Backend> ModuleDisplayDefault for Buffer<B> {
    fn content(&self, content: Content) -> Option<Content> {
        content.add_formatted(&"Buffer".to_string()).optional()
    }
}

impl<B: Backend> ModuleDisplay for Buffer<B> {}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::module::ModuleMapper;

    type B = Flex;

    #[test]
    fn an_update_is_the_new_value_and_clones_share_it() {
        let device = Default::default();
        let buffer = Buffer::<B>::new(Tensor::from_floats([1.0, 2.0], &device));
        let clone = buffer.clone();
        buffer.update(Tensor::from_floats([3.0, 5.0], &device));
        let values = |b: &Buffer<B>| b.value().into_data().to_vec::<f32>().unwrap();
        assert_eq!(values(&buffer), [3.0, 5.0]);
        assert_eq!(values(&clone), [3.0, 5.0]);
    }

    #[test]
    fn records_keep_the_id_and_value_and_mappers_replace_it() {
        let device = Default::default();
        let buffer = Buffer::<B>::new(Tensor::from_floats([1.0, 2.0], &device));
        let record = buffer.clone().into_record();
        assert_eq!(record.id, buffer.id);
        let other = Buffer::<B>::new(Tensor::zeros([2], &device)).load_record(record);
        assert_eq!(other.id, buffer.id);
        assert_eq!(
            other.value().into_data().to_vec::<f32>().unwrap(),
            [1.0, 2.0]
        );

        struct Double;
        impl ModuleMapper<B> for Double {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                let (id, value, mapper) = param.consume();
                Param::from_mapped_value(id, value * 2.0, mapper)
            }
        }
        let doubled = other.map(&mut Double);
        assert_eq!(
            doubled.value().into_data().to_vec::<f32>().unwrap(),
            [2.0, 4.0]
        );
    }

    #[test]
    fn valid_and_back_keep_the_value_apart_from_the_original() {
        let device = Default::default();
        let buffer = Buffer::<Autodiff<B>>::new(Tensor::from_floats([1.0], &device));
        let inner = buffer.valid();
        let back = Buffer::<Autodiff<B>>::from_inner(inner);
        back.update(Tensor::from_floats([7.0], &device));
        // A replica made this way has a state of its own (kiln-train's `replica_of`).
        assert_eq!(buffer.value().into_data().to_vec::<f32>().unwrap(), [1.0]);
        assert_eq!(back.id, buffer.id);
    }
}
