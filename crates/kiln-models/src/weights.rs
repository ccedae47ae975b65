//! torchvision and timm weight files in and out, keyed exactly as their `state_dict`s.
//!
//! kiln's module paths are torchvision's names except in a few places, mapped by [`Names`]: a
//! block's shortcut is `downsample.conv` / `downsample.bn` in kiln and `downsample.0` /
//! `downsample.1` in torchvision (`downsample.1` / `downsample.2` in timm's ResNet-D, whose
//! `downsample.0` is the average pool); timm's deep stem is `conv1.0` to `conv1.6`; and burn
//! stores a linear layer's weight as `[in, out]` where PyTorch stores `[out, in]`. Batch norm's
//! `num_batches_tracked` is an int64 scalar in PyTorch. timm's ResNets, ResNeXts and Wide
//! ResNets have torchvision's names, so one model is written in the names of either library.
//!
//! Reading never executes code from the file: `.pth` files go through burn-store's restricted
//! pickle reader, `.safetensors` files hold no code.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use burn_store::{ModuleSnapshot, ModuleStore, PytorchStore, SafetensorsStore, TensorSnapshot};

use crate::ResNet;

/// Prefixes under which training scripts commonly nest a state dict: a checkpoint dict
/// (`{"state_dict": ...}`, `{"model": ...}`) and `DataParallel`'s `module.`.
const STATE_DICT_PREFIXES: [&str; 6] = [
    "",
    "module.",
    "state_dict.",
    "state_dict.module.",
    "model.",
    "model.module.",
];

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("cannot read weights from {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("cannot write weights to {path}: {reason}")]
    Write { path: PathBuf, reason: String },
    #[error(
        "{path} holds no ResNet state dict (no `bn1.weight` key, also under `state_dict.`, `model.` or `module.`)"
    )]
    NotAResNet { path: PathBuf },
    #[error(
        "{path} holds NaN or infinite values in {tensors}: the file is damaged or comes from a run that diverged"
    )]
    NotFinite { path: PathBuf, tensors: String },
    #[error(
        "{path} does not fit this {model}:{details}; choose the network and class count the weights were saved for (`--model`, `--num-classes`, or `model.name` and `model.num_classes` in a config)"
    )]
    Mismatch {
        path: PathBuf,
        model: String,
        details: String,
    },
}

/// What a load did beyond the obvious.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoadReport {
    /// torchvision keys left at their initial values: the classifier when `num_classes`
    /// differs from the file's (fine-tuning).
    pub left_out: Vec<String>,
    /// Keys the file lacked but that are safe to miss (`num_batches_tracked` in old files).
    pub defaulted: Vec<String>,
}

/// Loads a torchvision `state_dict` (`.pth`, `.pt`, `.bin` or `.safetensors`) into `model`.
///
/// Every key must match by name and shape, with one exception: when only the classifier's
/// class count differs, `fc.*` is left out and reported, for fine-tuning.
pub fn load<B: Backend>(
    mut model: ResNet<B>,
    path: &Path,
) -> Result<(ResNet<B>, LoadReport), WeightsError> {
    let file = read_state_dict(path)?;
    let names = Names::of(&model);
    let expected = torch_shapes(&model);
    let mut report = LoadReport::default();
    let mut missing = Vec::new();
    let mut wrong_shape = Vec::new();
    for (name, shape) in &expected {
        match file.get(name) {
            Some(data) if data.shape.as_slice() == shape.as_slice() => {}
            Some(data) if is_classifier_resize(name, &data.shape, shape) => {
                report.left_out.push(name.clone())
            }
            Some(data) => wrong_shape.push(format!(
                "{name} is {:?} in the file, {:?} in the model",
                data.shape.as_slice(),
                shape
            )),
            None if name.ends_with(".num_batches_tracked") => report.defaulted.push(name.clone()),
            None => missing.push(name.clone()),
        }
    }
    let unexpected: Vec<String> = file
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .cloned()
        .collect();
    if !(missing.is_empty() && unexpected.is_empty() && wrong_shape.is_empty()) {
        let mut details = String::new();
        list(&mut details, "missing keys", &missing);
        list(&mut details, "unexpected keys", &unexpected);
        list(&mut details, "wrong shapes", &wrong_shape);
        return Err(WeightsError::Mismatch {
            path: path.to_path_buf(),
            model: describe(&model),
            details,
        });
    }

    let damaged: Vec<String> = file
        .iter()
        .filter(|(name, _)| !report.left_out.contains(name))
        .filter(|(_, data)| data.dtype.is_float())
        .filter_map(|(name, data)| {
            let bad = data.iter::<f64>().filter(|v| !v.is_finite()).count();
            (bad > 0).then(|| format!("{name} ({bad} of {})", data.num_elements()))
        })
        .collect();
    if !damaged.is_empty() {
        return Err(WeightsError::NotFinite {
            path: path.to_path_buf(),
            tensors: damaged.join(", "),
        });
    }
    let snapshots = file
        .into_iter()
        .filter(|(name, _)| !report.left_out.contains(name))
        .map(|(name, data)| {
            let path_stack = names
                .kiln_path(&name)
                .split('.')
                .map(String::from)
                .collect();
            TensorSnapshot::from_data(
                to_kiln_layout(&name, data),
                path_stack,
                vec![],
                ParamId::new(),
            )
        })
        .collect();
    let result = model.apply(snapshots, None, None, true);
    if !result.errors.is_empty() || !result.unused.is_empty() {
        return Err(WeightsError::Mismatch {
            path: path.to_path_buf(),
            model: describe(&model),
            details: format!(" {result}"),
        });
    }
    Ok((model, report))
}

/// The model's state as torchvision names and lays it out, ready to save or compare.
pub fn torch_state_dict<B: Backend>(model: &ResNet<B>) -> BTreeMap<String, TensorData> {
    let names = Names::of(model);
    model
        .collect(None, None, true)
        .into_iter()
        .map(|snapshot| {
            let name = names.torch_name(&snapshot.full_path());
            let data = snapshot
                .to_data()
                .expect("a live module's tensors can always be read");
            let data = to_torch_layout(&name, data);
            (name, data)
        })
        .collect()
}

/// Writes the model as `.safetensors` with torchvision's names, so that
/// `torchvision.models.resnetNN().load_state_dict(safetensors.torch.load_file(p), strict=True)`
/// takes it. Written to a temporary file and renamed, so a crash never leaves half a file.
pub fn save_safetensors<B: Backend>(model: &ResNet<B>, path: &Path) -> Result<(), WeightsError> {
    write_safetensors(&torch_state_dict(model), path)
}

/// Writes named tensors as `.safetensors` through a temporary file and a rename.
pub fn write_safetensors(
    state: &BTreeMap<String, TensorData>,
    path: &Path,
) -> Result<(), WeightsError> {
    let write_err = |reason: String| WeightsError::Write {
        path: path.to_path_buf(),
        reason,
    };
    let views = state
        .iter()
        .map(|(name, data)| {
            let dtype = match data.dtype {
                DType::I64 => safetensors::Dtype::I64,
                DType::F32 => safetensors::Dtype::F32,
                other => return Err(write_err(format!("{name} has unsupported dtype {other:?}"))),
            };
            safetensors::tensor::TensorView::new(dtype, data.shape.to_vec(), &data.bytes)
                .map(|view| (name.clone(), view))
                .map_err(|e| write_err(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = safetensors::serialize(views, None).map_err(|e| write_err(e.to_string()))?;
    write_whole(path, &bytes)
}

/// Writes `bytes` to `path` through a temporary file and a rename, so that a crash never leaves
/// half a file.
pub(crate) fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), WeightsError> {
    let write_err = |reason: String| WeightsError::Write {
        path: path.to_path_buf(),
        reason,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            write_err(e.to_string())
        })
}

/// How far a compressed entry of a `.pth` may expand. `torch.save` stores its entries
/// uncompressed; a recompressed weight file shrinks by a few percent, a zip bomb a thousandfold.
const MAX_EXPANSION: u64 = 100;

/// Refuses a `.pth` (a zip archive, as `torch.save` writes) with an entry that would expand
/// beyond [`MAX_EXPANSION`] times its compressed size or beyond the size it declares, before
/// burn-store reads its entries whole into memory. Each compressed entry is decompressed once
/// into nothing to count its bytes. A file that is no zip archive (an old `.pth`) is left to
/// burn-store.
fn check_expansion(path: &Path) -> Result<(), String> {
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(());
    };
    let Ok(mut archive) = zip::ZipArchive::new(std::io::BufReader::new(file)) else {
        return Ok(());
    };
    for index in 0..archive.len() {
        let entry = archive.by_index(index).map_err(|e| e.to_string())?;
        if entry.compression() == zip::CompressionMethod::Stored {
            continue;
        }
        let (name, declared) = (entry.name().to_string(), entry.size());
        let limit = entry
            .compressed_size()
            .saturating_mul(MAX_EXPANSION)
            .max(1 << 20);
        if declared > limit {
            return Err(format!(
                "its entry {name} would expand from {} to {declared} bytes (a zip bomb?); torch.save writes entries uncompressed",
                entry.compressed_size()
            ));
        }
        let mut bounded = std::io::Read::take(entry, declared + 1);
        let written = std::io::copy(&mut bounded, &mut std::io::sink())
            .map_err(|e| format!("its entry {name} cannot be decompressed: {e}"))?;
        if written > declared {
            return Err(format!(
                "its entry {name} expands beyond the {declared} bytes it declares (a zip bomb?)"
            ));
        }
    }
    Ok(())
}

/// `path`'s entries written again into a new zip `into`, every one compressed (deflate, level
/// 1), plus `extra`: a recompressed weight file, or with a large `extra` of zeros a zip bomb.
/// Test support, shared by this module's tests and the binary's hostile-input tests so that
/// both build the archive [`check_expansion`] judges the same way; not kiln's API.
#[doc(hidden)]
pub fn recompressed(
    path: &Path,
    into: &Path,
    extra: Option<(&str, &[u8])>,
) -> zip::result::ZipResult<()> {
    use std::io::{Read, Write};
    let mut from = zip::ZipArchive::new(std::fs::File::open(path)?)?;
    let mut to = zip::ZipWriter::new(std::fs::File::create(into)?);
    let deflated = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(1));
    for index in 0..from.len() {
        let mut entry = from.by_index(index)?;
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        to.start_file(entry.name(), deflated)?;
        to.write_all(&bytes)?;
    }
    if let Some((name, bytes)) = extra {
        to.start_file(name, deflated)?;
        to.write_all(bytes)?;
    }
    to.finish()?;
    Ok(())
}

/// Reads every tensor of a weight file, keyed by torchvision name, with any checkpoint or
/// `DataParallel` prefix removed.
fn read_state_dict(path: &Path) -> Result<BTreeMap<String, TensorData>, WeightsError> {
    let read_err = |reason: String| WeightsError::Read {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_file() {
        return Err(read_err("no such file".to_string()));
    }
    let is_safetensors = path.extension().is_some_and(|e| e == "safetensors");
    let snapshots = if is_safetensors {
        all_snapshots(SafetensorsStore::from_file(path)).map_err(read_err)?
    } else {
        check_expansion(path).map_err(read_err)?;
        // Keys as the file has them: burn-store renumbers gaps in indices by default, which
        // would turn timm's `conv1.3` (after a ReLU at `conv1.2`) into `conv1.2`.
        let store = PytorchStore::from_file(path).map_indices_contiguous(false);
        all_snapshots(store).map_err(read_err)?
    };
    let prefix = STATE_DICT_PREFIXES
        .into_iter()
        .find(|p| snapshots.contains_key(&format!("{p}bn1.weight")))
        .ok_or_else(|| WeightsError::NotAResNet {
            path: path.to_path_buf(),
        })?;
    snapshots
        .into_iter()
        .filter_map(|(key, snapshot)| {
            let name = key.strip_prefix(prefix)?.to_string();
            Some(
                snapshot
                    .to_data()
                    .map(|data| (name, data))
                    .map_err(|e| read_err(e.to_string())),
            )
        })
        .collect()
}

fn all_snapshots<S: ModuleStore>(mut store: S) -> Result<BTreeMap<String, TensorSnapshot>, String>
where
    S::Error: std::fmt::Display,
{
    store
        .get_all_snapshots()
        .map(|snapshots| {
            snapshots
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .map_err(|e| e.to_string())
}

/// How a model's kiln module paths map to the names of its weight files: torchvision's, and
/// timm's for ResNet-D (its deep stem's `conv1.0` to `conv1.6`, and `downsample.1` /
/// `downsample.2` after the average pool). The two libraries name every other tensor alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Names {
    deep_stem: bool,
    avg_down: bool,
}

/// timm's deep stem: kiln's module path prefix and timm's.
const DEEP_STEM: [(&str, &str); 5] = [
    ("deep_stem.conv1.", "conv1.0."),
    ("deep_stem.bn1.", "conv1.1."),
    ("deep_stem.conv2.", "conv1.3."),
    ("deep_stem.bn2.", "conv1.4."),
    ("conv1.", "conv1.6."),
];

impl Names {
    pub fn of<B: Backend>(model: &ResNet<B>) -> Self {
        Self {
            deep_stem: model.deep_stem.is_some(),
            avg_down: model.avg_down(),
        }
    }

    /// The shortcut's convolution and batch norm in the files: `downsample.0` and `.1`, or
    /// after timm's average pool `.1` and `.2`.
    fn shortcut(&self) -> [(&'static str, &'static str); 2] {
        if self.avg_down {
            [
                (".downsample.conv.", ".downsample.1."),
                (".downsample.bn.", ".downsample.2."),
            ]
        } else {
            [
                (".downsample.conv.", ".downsample.0."),
                (".downsample.bn.", ".downsample.1."),
            ]
        }
    }

    /// The file's name for a kiln tensor path (`layer2.0.downsample.conv.weight`).
    pub fn torch_name(&self, kiln_path: &str) -> String {
        self.map(kiln_path, false)
    }

    /// kiln's module path for a file's tensor name.
    pub fn kiln_path(&self, torch_name: &str) -> String {
        self.map(torch_name, true)
    }

    /// The file's name for a kiln module path (`layer2.0.downsample.bn`, `deep_stem.bn1`).
    pub fn torch_module(&self, kiln_module: &str) -> String {
        let name = self.torch_name(&format!("{kiln_module}."));
        name.trim_end_matches('.').to_string()
    }

    /// One name in the other naming: kiln's to the files' (`back`: the files' to kiln's).
    fn map(&self, name: &str, back: bool) -> String {
        let pick = |(kiln, torch): (&'static str, &'static str)| {
            if back { (torch, kiln) } else { (kiln, torch) }
        };
        if self.deep_stem {
            for (from, to) in DEEP_STEM.map(pick) {
                if let Some(rest) = name.strip_prefix(from) {
                    return format!("{to}{rest}");
                }
            }
        }
        for (from, to) in self.shortcut().map(pick) {
            if name.contains(from) {
                return name.replacen(from, to, 1);
            }
        }
        name.to_string()
    }
}

/// Every torchvision key the model has, with the shape PyTorch gives it.
fn torch_shapes<B: Backend>(model: &ResNet<B>) -> BTreeMap<String, Vec<usize>> {
    let names = Names::of(model);
    model
        .collect(None, None, true)
        .into_iter()
        .map(|snapshot| {
            let name = names.torch_name(&snapshot.full_path());
            let mut shape = snapshot.shape.to_vec();
            if is_linear_weight(&name) {
                shape.reverse();
            }
            if name.ends_with(".num_batches_tracked") {
                shape.clear();
            }
            (name, shape)
        })
        .collect()
}

/// The classifier of another class count: same input features, other outputs.
fn is_classifier_resize(name: &str, file: &[usize], model: &[usize]) -> bool {
    match name {
        "fc.weight" => file.len() == 2 && model.len() == 2 && file[1] == model[1],
        "fc.bias" => file.len() == 1 && model.len() == 1,
        _ => false,
    }
}

fn is_linear_weight(name: &str) -> bool {
    name == "fc.weight"
}

/// PyTorch's layout and dtype to kiln's: f32 floats, `[in, out]` linear weights, and the
/// batch counter as a float of one element.
fn to_kiln_layout(name: &str, data: TensorData) -> TensorData {
    if name.ends_with(".num_batches_tracked") {
        let count = data.convert::<i64>().to_vec::<i64>().unwrap_or_default();
        return TensorData::new(vec![count.first().copied().unwrap_or(0) as f32], [1]);
    }
    let data = data.convert_dtype(DType::F32);
    if is_linear_weight(name) {
        transpose(data)
    } else {
        data
    }
}

/// The inverse of [`to_kiln_layout`].
fn to_torch_layout(name: &str, data: TensorData) -> TensorData {
    if name.ends_with(".num_batches_tracked") {
        let count = data.to_vec::<f32>().unwrap_or_default();
        let count = count.first().copied().unwrap_or(0.0).round() as i64;
        return TensorData::new(vec![count], Vec::<usize>::new());
    }
    let data = data.convert_dtype(DType::F32);
    if is_linear_weight(name) {
        transpose(data)
    } else {
        data
    }
}

fn transpose(data: TensorData) -> TensorData {
    let [rows, cols] = data.shape.dims::<2>();
    let values = data.to_vec::<f32>().expect("converted to f32 above");
    let transposed: Vec<f32> = (0..cols)
        .flat_map(|c| (0..rows).map(move |r| (r, c)))
        .map(|(r, c)| values[r * cols + c])
        .collect();
    TensorData::new(transposed, [cols, rows])
}

fn describe<B: Backend>(model: &ResNet<B>) -> String {
    let width = model.conv1.weight.dims()[0];
    let kind = if model.deep_stem.is_some() {
        "ResNet-D"
    } else {
        "resnet"
    };
    format!("{kind} (width {width}, {} classes)", model.num_classes())
}

/// Appends ` <label> (<count>): a, b, c, and N more` when `items` is not empty.
fn list(out: &mut String, label: &str, items: &[String]) {
    const SHOWN: usize = 8;
    if items.is_empty() {
        return;
    }
    let _ = write!(
        out,
        " {label} ({}): {}",
        items.len(),
        items[..items.len().min(SHOWN)].join(", ")
    );
    if items.len() > SHOWN {
        let _ = write!(out, ", and {} more", items.len() - SHOWN);
    }
    out.push(';');
}

/// The model's trainable parameters: torchvision's name and burn's id of each, in the order
/// of the state dict (buffers left out).
pub fn torch_parameters<B: Backend>(model: &ResNet<B>) -> Vec<(String, ParamId)> {
    let buffers = [".running_mean", ".running_var", ".num_batches_tracked"];
    let names = Names::of(model);
    model
        .collect(None, None, true)
        .into_iter()
        .filter_map(|snapshot| {
            let name = names.torch_name(&snapshot.full_path());
            let buffer = buffers.iter().any(|b| name.ends_with(b));
            Some((name, snapshot.tensor_id?)).filter(|_| !buffer)
        })
        .collect()
}

/// Every parameter's gradient, keyed and laid out as PyTorch's `param.grad` after
/// `loss.backward()`. Parameters that took no part in the loss are absent.
pub fn torch_gradients<B: AutodiffBackend>(
    model: &ResNet<B>,
    grads: &B::Gradients,
) -> BTreeMap<String, TensorData> {
    let mut collector = GradientCollector::<B> {
        grads,
        found: HashMap::new(),
    };
    model.visit(&mut collector);
    let names = Names::of(model);
    model
        .collect(None, None, true)
        .into_iter()
        .filter_map(|snapshot| {
            let data = collector.found.remove(&snapshot.tensor_id?)?;
            let name = names.torch_name(&snapshot.full_path());
            let data = to_torch_layout(&name, data);
            Some((name, data))
        })
        .collect()
}

struct GradientCollector<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    found: HashMap<ParamId, TensorData>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradientCollector<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = param.val().grad(self.grads) {
            self.found.insert(param.id, grad.into_data());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResNetConfig;
    use burn::backend::Flex;

    type B = Flex;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(name)
    }

    fn tiny(depth: usize, num_classes: usize, width: usize) -> ResNet<B> {
        ResNetConfig::new(depth)
            .with_num_classes(num_classes)
            .with_width(width)
            .init(&Default::default())
            .unwrap()
    }

    fn assert_same_state(a: &BTreeMap<String, TensorData>, b: &BTreeMap<String, TensorData>) {
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (name, data) in a {
            assert_eq!(data, &b[name], "{name}");
        }
    }

    #[test]
    fn full_size_models_have_torchvisions_keys() {
        let device = Default::default();
        for (depth, keys, params) in [(18, 122, 11_689_512), (50, 320, 25_557_032)] {
            let model = ResNetConfig::new(depth).init::<B>(&device).unwrap();
            let shapes = torch_shapes(&model);
            assert_eq!(shapes.len(), keys, "resnet{depth}");
            let learnable: usize = shapes
                .iter()
                .filter(|(k, _)| !k.contains("running_") && !k.ends_with("num_batches_tracked"))
                .map(|(_, s)| s.iter().product::<usize>())
                .sum();
            assert_eq!(learnable, params, "resnet{depth} parameters");
            assert_eq!(
                shapes["fc.weight"],
                vec![1000, 512 * (1 + 3 * (depth == 50) as usize)]
            );
            assert_eq!(shapes["layer2.0.downsample.1.running_var"].len(), 1);
            assert!(shapes["bn1.num_batches_tracked"].is_empty());
        }
    }

    /// torchvision's keys for ResNeXt and Wide ResNet (counted with torchvision 0.29), timm's
    /// for ResNet-D (timm 1.0.31): its deep stem as `conv1.0` to `conv1.6`, its shortcuts'
    /// convolution and batch norm as `downsample.1` and `downsample.2`.
    #[test]
    fn the_family_has_torchvisions_and_timms_keys() {
        let device = Default::default();
        for (name, keys, width, shapes) in [
            (
                "resnext50_32x4d",
                320,
                64,
                &[("layer1.0.conv2.weight", &[128, 4, 3, 3][..])][..],
            ),
            (
                "wide_resnet50_2",
                320,
                64,
                &[("layer4.2.conv2.weight", &[1024, 1024, 3, 3][..])],
            ),
            (
                "resnet50d",
                332,
                64,
                &[
                    ("conv1.0.weight", &[32, 3, 3, 3][..]),
                    ("conv1.1.running_mean", &[32]),
                    ("conv1.3.weight", &[32, 32, 3, 3]),
                    ("conv1.4.bias", &[32]),
                    ("conv1.6.weight", &[64, 32, 3, 3]),
                    ("bn1.weight", &[64]),
                    ("layer1.0.downsample.1.weight", &[256, 64, 1, 1]),
                    ("layer2.0.downsample.1.weight", &[512, 256, 1, 1]),
                    ("layer2.0.downsample.2.running_var", &[512]),
                ],
            ),
            (
                "resnet18d",
                134,
                8,
                &[("layer2.0.downsample.2.weight", &[16][..])],
            ),
        ] {
            let model = ResNetConfig::from_name(name)
                .unwrap()
                .with_width(width)
                .init::<B>(&device)
                .unwrap();
            let found = torch_shapes(&model);
            assert_eq!(found.len(), keys, "{name}");
            for (key, shape) in shapes {
                assert_eq!(
                    found.get(*key).map(Vec::as_slice),
                    Some(*shape),
                    "{name} {key}"
                );
            }
            assert!(
                !found
                    .keys()
                    .any(|k| k.starts_with("deep_stem") || k.contains("downsample.conv"))
            );
        }
    }

    #[test]
    fn names_map_both_ways() {
        let device = Default::default();
        let d = Names::of(
            &ResNetConfig::from_name("resnet50d")
                .unwrap()
                .with_width(8)
                .init::<B>(&device)
                .unwrap(),
        );
        let plain = Names::of(&tiny(50, 10, 4));
        for (names, kiln, torch) in [
            (d, "deep_stem.conv1.weight", "conv1.0.weight"),
            (d, "deep_stem.bn2.running_mean", "conv1.4.running_mean"),
            (d, "conv1.weight", "conv1.6.weight"),
            (d, "layer1.0.conv1.weight", "layer1.0.conv1.weight"),
            (
                d,
                "layer3.0.downsample.conv.weight",
                "layer3.0.downsample.1.weight",
            ),
            (
                d,
                "layer3.0.downsample.bn.bias",
                "layer3.0.downsample.2.bias",
            ),
            (plain, "conv1.weight", "conv1.weight"),
            (
                plain,
                "layer3.0.downsample.conv.weight",
                "layer3.0.downsample.0.weight",
            ),
            (
                plain,
                "layer3.0.downsample.bn.bias",
                "layer3.0.downsample.1.bias",
            ),
        ] {
            assert_eq!(names.torch_name(kiln), torch);
            assert_eq!(names.kiln_path(torch), kiln);
        }
        assert_eq!(d.torch_module("deep_stem.bn1"), "conv1.1");
        assert_eq!(
            d.torch_module("layer2.0.downsample.bn"),
            "layer2.0.downsample.2"
        );
        assert_eq!(
            plain.torch_module("layer2.0.downsample.bn"),
            "layer2.0.downsample.1"
        );
    }

    /// A ResNet-D and a ResNeXt written and read back; a torchvision file does not fit a
    /// ResNet-D, and the error lists what differs.
    #[test]
    fn the_family_round_trips_and_mismatches_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let device = Default::default();
        for name in ["resnet50d", "resnext50_32x4d"] {
            let config = ResNetConfig::from_name(name)
                .unwrap()
                .with_width(8)
                .with_num_classes(10);
            let model = config.init::<B>(&device).unwrap();
            let path = dir.path().join(format!("{name}.safetensors"));
            save_safetensors(&model, &path).unwrap();
            let (loaded, report) = load(config.init::<B>(&device).unwrap(), &path).unwrap();
            assert_eq!(report, LoadReport::default());
            assert_same_state(&torch_state_dict(&loaded), &torch_state_dict(&model));
        }
        let d = ResNetConfig::from_name("resnet50d")
            .unwrap()
            .with_width(4)
            .with_num_classes(10);
        let err = load(d.init::<B>(&device).unwrap(), &fixture("resnet50_w4.pth"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ResNet-D")
                && err.contains("conv1.0.weight")
                && err.contains("unexpected keys"),
            "{err}"
        );
    }

    #[test]
    fn pth_safetensors_and_wrapped_checkpoints_load_the_same_weights() {
        let reference = read_state_dict(&fixture("resnet18_w4.safetensors")).unwrap();
        for file in [
            "resnet18_w4.pth",
            "resnet18_w4.safetensors",
            "resnet18_w4_checkpoint.pth",
        ] {
            let (model, report) = load(tiny(18, 10, 4), &fixture(file)).unwrap();
            assert_eq!(report, LoadReport::default(), "{file}");
            assert_same_state(&torch_state_dict(&model), &reference);
        }
    }

    #[test]
    fn another_class_count_leaves_the_classifier_out() {
        let (model, report) = load(tiny(50, 3, 4), &fixture("resnet50_w4.pth")).unwrap();
        assert_eq!(report.left_out, vec!["fc.bias", "fc.weight"]);
        assert_eq!(model.num_classes(), 3);
        let file = read_state_dict(&fixture("resnet50_w4.pth")).unwrap();
        let loaded = torch_state_dict(&model);
        assert_eq!(
            loaded["layer4.2.conv3.weight"],
            file["layer4.2.conv3.weight"]
        );
    }

    #[test]
    fn mismatched_files_list_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = read_state_dict(&fixture("resnet18_w4.pth")).unwrap();
        state.remove("layer3.1.bn2.running_mean");
        state.insert("head.weight".into(), TensorData::new(vec![0f32; 4], [2, 2]));
        let broken = dir.path().join("broken.safetensors");
        write_safetensors(&state, &broken).unwrap();
        let err = load(tiny(18, 10, 4), &broken).unwrap_err().to_string();
        assert!(
            err.contains("missing keys (1): layer3.1.bn2.running_mean"),
            "{err}"
        );
        assert!(err.contains("unexpected keys (1): head.weight"), "{err}");

        let err = load(tiny(18, 10, 8), &fixture("resnet18_w4.pth"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("wrong shapes")
                && err.contains(
                    "conv1.weight is [4, 3, 7, 7] in the file, [8, 3, 7, 7] in the model"
                ),
            "{err}"
        );

        let err = load(tiny(50, 10, 4), &fixture("resnet18_w4.pth"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing keys") && err.contains("conv3.weight"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = std::fs::read(fixture("resnet18_w4.pth")).unwrap();
        let truncated = dir.path().join("truncated.pth");
        std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
        let garbage = dir.path().join("garbage.safetensors");
        std::fs::write(&garbage, b"not a weight file").unwrap();
        for path in [truncated, garbage, dir.path().join("absent.pth")] {
            let err = load(tiny(18, 10, 4), &path).unwrap_err();
            assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
        }
    }

    /// A `.pth` whose entry would expand a thousandfold (a zip bomb) is refused before
    /// anything reads it into memory; a recompressed weight file still loads.
    #[test]
    fn a_zip_bomb_pth_is_refused_and_a_recompressed_one_loads() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = fixture("resnet18_w4.pth");
        let plain = dir.path().join("recompressed.pth");
        recompressed(&fixture, &plain, None).unwrap();
        let (model, _) = load(tiny(18, 10, 4), &plain).unwrap();
        let (expected, _) = load(tiny(18, 10, 4), &fixture).unwrap();
        assert_same_state(&torch_state_dict(&model), &torch_state_dict(&expected));

        let bomb = dir.path().join("bomb.pth");
        let zeros = vec![0u8; 64 << 20];
        let name = "resnet18_w4/data/999";
        recompressed(&fixture, &bomb, Some((name, &zeros))).unwrap();
        let err = load(tiny(18, 10, 4), &bomb).unwrap_err().to_string();
        assert!(err.contains("zip bomb") && err.contains(name), "{err}");
        assert!(err.contains(&*bomb.to_string_lossy()), "{err}");
    }

    /// A weights file with NaN or infinity in it would load and predict garbage: it is refused,
    /// naming the tensor.
    #[test]
    fn weights_with_nan_or_infinity_are_refused_naming_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        for (name, poison) in [("nan", f32::NAN), ("inf", f32::INFINITY)] {
            let mut model = tiny(18, 10, 4);
            model.fc.weight = model.fc.weight.map(|w| w.add_scalar(poison));
            let path = dir.path().join(format!("{name}.safetensors"));
            save_safetensors(&model, &path).unwrap();
            let err = load(tiny(18, 10, 4), &path).unwrap_err().to_string();
            assert!(
                err.contains("fc.weight") && err.contains("NaN or infinite"),
                "{err}"
            );
            assert!(!err.contains("conv1.weight"), "{err}");
        }
    }

    #[test]
    fn exported_safetensors_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let model = tiny(50, 10, 4);
        save_safetensors(&model, &path).unwrap();
        let (loaded, _) = load(tiny(50, 10, 4), &path).unwrap();
        assert_same_state(&torch_state_dict(&loaded), &torch_state_dict(&model));
        let fixture_keys = read_state_dict(&fixture("resnet50_w4.safetensors")).unwrap();
        let exported = read_state_dict(&path).unwrap();
        assert_eq!(
            exported.keys().collect::<Vec<_>>(),
            fixture_keys.keys().collect::<Vec<_>>()
        );
        assert_eq!(exported["bn1.num_batches_tracked"].dtype, DType::I64);
        assert_eq!(exported["fc.weight"].shape.to_vec(), vec![10, 128]);
    }
}
