//! What a cuDNN convolution call is made of, as pure functions of burn's shapes and options:
//! descriptor dims and strides, the output shape, data, compute and math types, and the key under
//! which the chosen algorithm is remembered. Nothing here touches cuDNN, so it is tested on any
//! machine (also without the `cuda` feature).

use burn::tensor::DType;
use burn::tensor::ops::ConvOptions;
use serde::{Deserialize, Serialize};

/// The three convolutions of a training step. cuDNN names them forward, backward data and
/// backward filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ConvPass {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx` from `w` and `dy`.
    BackwardData,
    /// `dw` from `x` and `dy`.
    BackwardFilter,
}

/// The element types kiln convolves in, with cuDNN's `cudnnDataType_t` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DataType {
    F32,
    F16,
    Bf16,
}

impl DataType {
    /// `None` for a dtype cuDNN's path does not take (burn's convolution runs instead).
    pub(crate) fn from_dtype(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(DataType::F32),
            DType::F16 => Some(DataType::F16),
            DType::BF16 => Some(DataType::Bf16),
            _ => None,
        }
    }

    /// `CUDNN_DATA_FLOAT` (0), `CUDNN_DATA_HALF` (2), `CUDNN_DATA_BFLOAT16` (9), as in cuDNN 9's
    /// `cudnn_graph.h`.
    pub(crate) fn cudnn_code(self) -> u32 {
        match self {
            DataType::F32 => 0,
            DataType::F16 => 2,
            DataType::Bf16 => 9,
        }
    }

    /// The convolution descriptor's compute type: f32 for every data type, so that 16-bit
    /// convolutions accumulate in f32 as PyTorch's do (`CUDNN_DATA_FLOAT`).
    pub(crate) fn compute_code(self) -> u32 {
        0
    }
}

/// cuDNN's `cudnnMathType_t`, with its codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MathType {
    /// `CUDNN_DEFAULT_MATH`: from cuDNN 8 on Ampere and later, TF32 tensor cores for f32.
    Default,
    /// `CUDNN_TENSOR_OP_MATH`.
    TensorOp,
    /// `CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION`: may round f32 operands to f16.
    TensorOpAllowConversion,
    /// `CUDNN_FMA_MATH`: no tensor cores, full f32 products.
    Fma,
}

impl MathType {
    /// The C enum's value (`cudnn_graph.h`).
    pub(crate) fn cudnn_code(self) -> u32 {
        match self {
            MathType::Default => 0,
            MathType::TensorOp => 1,
            MathType::TensorOpAllowConversion => 2,
            MathType::Fma => 3,
        }
    }

    pub(crate) fn from_cudnn_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(MathType::Default),
            1 => Some(MathType::TensorOp),
            2 => Some(MathType::TensorOpAllowConversion),
            3 => Some(MathType::Fma),
            _ => None,
        }
    }

    /// The math type set on the descriptor before the algorithm search, as PyTorch does:
    /// tensor cores for 16-bit data, TF32 (`Default`) or plain f32 products (`Fma`) for f32.
    pub(crate) fn for_search(data: DataType, tf32: bool) -> Self {
        match data {
            DataType::F16 | DataType::Bf16 => MathType::TensorOp,
            DataType::F32 if tf32 => MathType::Default,
            DataType::F32 => MathType::Fma,
        }
    }

    /// Whether a search result computed with `math` may be used. f32 never takes the f16
    /// conversion, and without TF32 only full f32 products.
    pub(crate) fn allowed(data: DataType, tf32: bool, math: MathType) -> bool {
        match data {
            DataType::F16 | DataType::Bf16 => true,
            DataType::F32 if tf32 => math != MathType::TensorOpAllowConversion,
            DataType::F32 => math == MathType::Fma,
        }
    }

    /// The math type applied for the run: the one the search measured the algorithm with, except
    /// that f32 without TF32 is always held to `Fma`.
    pub(crate) fn for_run(data: DataType, tf32: bool, found: MathType) -> Self {
        match data {
            DataType::F32 if !tf32 => MathType::Fma,
            _ => found,
        }
    }
}

/// A 2-D convolution in NCHW: input `x [N, C, H, W]`, weight `w [K, C / groups, R, S]`, output
/// `y [N, K, P, Q]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct ConvDims {
    pub x: [usize; 4],
    pub w: [usize; 4],
    pub y: [usize; 4],
    pub padding: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Channel groups (`cudnnSetConvolutionGroupCount`); choices kept before groups were
    /// taken have none written, and were all of one group.
    #[serde(default = "one_group")]
    pub groups: usize,
}

fn one_group() -> usize {
    1
}

impl ConvDims {
    /// The geometry of `conv2d(x, w, options)`, or why cuDNN's path does not take it.
    pub(crate) fn new(
        x: [usize; 4],
        w: [usize; 4],
        options: &ConvOptions<2>,
    ) -> Result<Self, String> {
        let groups = options.groups;
        if groups == 0 || !w[0].is_multiple_of(groups) || x[1] != w[1] * groups {
            return Err(format!(
                "input channels {}, weight {w:?} and {groups} groups do not fit",
                x[1]
            ));
        }
        if options.stride.contains(&0) || options.dilation.contains(&0) {
            return Err("a zero stride or dilation".into());
        }
        let size = |axis: usize| {
            output_size(
                x[2 + axis],
                w[2 + axis],
                options.padding[axis],
                options.stride[axis],
                options.dilation[axis],
            )
        };
        let (Some(p), Some(q)) = (size(0), size(1)) else {
            return Err(format!("kernel {w:?} larger than the padded input {x:?}"));
        };
        let geometry = ConvDims {
            x,
            w,
            y: [x[0], w[0], p, q],
            padding: options.padding,
            stride: options.stride,
            dilation: options.dilation,
            groups,
        };
        geometry.check_limits()?;
        Ok(geometry)
    }

    /// cuDNN's legacy API takes `int` dims, strides and parameters, and tensors of fewer than
    /// 2^31 elements; and nothing empty.
    fn check_limits(&self) -> Result<(), String> {
        let limit = i32::MAX as usize;
        for dims in [self.x, self.w, self.y] {
            let count = dims
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .unwrap_or(usize::MAX);
            if count == 0 {
                return Err(format!("empty tensor {dims:?}"));
            }
            if count > limit {
                return Err(format!("tensor {dims:?} past cuDNN's 2^31 elements"));
            }
        }
        let params = self
            .padding
            .iter()
            .chain(&self.stride)
            .chain(&self.dilation)
            .chain([&self.groups]);
        if params.into_iter().any(|&v| v > limit) {
            return Err("padding, stride, dilation or groups past i32".into());
        }
        Ok(())
    }

    /// The shape of the tensor `pass` writes.
    pub(crate) fn output(&self, pass: ConvPass) -> [usize; 4] {
        match pass {
            ConvPass::Forward => self.y,
            ConvPass::BackwardData => self.x,
            ConvPass::BackwardFilter => self.w,
        }
    }

    /// `cudnnSetConvolution2dDescriptor`'s `pad_h, pad_w, u, v, dilation_h, dilation_w`.
    pub(crate) fn conv_params(&self) -> [i32; 6] {
        [
            self.padding[0] as i32,
            self.padding[1] as i32,
            self.stride[0] as i32,
            self.stride[1] as i32,
            self.dilation[0] as i32,
            self.dilation[1] as i32,
        ]
    }
}

/// One spatial output size, `None` where the dilated kernel does not fit the padded input.
pub(crate) fn output_size(
    size: usize,
    kernel: usize,
    padding: usize,
    stride: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation.checked_mul(kernel.checked_sub(1)?)? + 1;
    let padded = size.checked_add(padding.checked_mul(2)?)?;
    Some(padded.checked_sub(span)? / stride + 1)
}

/// A packed NCHW tensor descriptor: `(dims, strides)` as cuDNN's `int` arrays.
pub(crate) fn nchw_descriptor(dims: [usize; 4]) -> ([i32; 4], [i32; 4]) {
    let strides = packed_strides(dims);
    (dims.map(|d| d as i32), strides.map(|s| s as i32))
}

/// Row-major strides of a packed tensor.
pub(crate) fn packed_strides(dims: [usize; 4]) -> [usize; 4] {
    let mut strides = [1; 4];
    for i in (0..3).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

/// The key of one algorithm choice: everything the choice depends on. The device, because
/// GPUs of a process may differ; TF32, because it changes the candidates; alignment, because
/// some algorithms need 16-byte aligned buffers and the choice is measured on one set of them.
/// On disk (`store`) the device is left out: the file is the GPU model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct AlgoKey {
    #[serde(skip)]
    pub device: usize,
    pub pass: ConvPass,
    pub data: DataType,
    pub geometry: ConvDims,
    pub tf32: bool,
    pub aligned: bool,
}

/// Whether every address is a multiple of 16 bytes.
pub(crate) fn aligned_16(addresses: &[u64]) -> bool {
    addresses.iter().all(|a| a % 16 == 0)
}

/// cuDNN's `cudnnGetVersion()` as `major.minor.patch`: `major * 10000 + minor * 100 + patch`
/// from cuDNN 9, `major * 1000 + minor * 100 + patch` before.
pub(crate) fn version_name(version: usize) -> String {
    if version >= 90000 {
        format!(
            "{}.{}.{}",
            version / 10000,
            version % 10000 / 100,
            version % 100
        )
    } else {
        format!(
            "{}.{}.{}",
            version / 1000,
            version % 1000 / 100,
            version % 100
        )
    }
}

/// Whether kiln can use a cuDNN of `version` (`cudnnGetVersion()`): 9 only, the API whose calls
/// and status codes kiln is written against (cuDNN 8 numbers its statuses 1 to 14, cuDNN 9 in
/// thousands).
pub(crate) fn require_9(version: usize) -> Result<(), String> {
    match version {
        90000..100000 => Ok(()),
        _ => Err(format!(
            "cuDNN {} was found where cuDNN 9 was asked for (libcudnn.so.9); kiln runs cuDNN 9 only: install it with `pip install nvidia-cudnn-cu12` (or -cu13), or put cuDNN 9's libcudnn.so.9 on LD_LIBRARY_PATH",
            version_name(version)
        )),
    }
}

/// Where the scratch memory of an algorithm search stops: the largest workspace any candidate
/// asks for, but no more than `cap` (candidates that need more are not measured).
pub(crate) fn search_workspace(sizes: impl IntoIterator<Item = usize>, cap: usize) -> usize {
    sizes.into_iter().max().unwrap_or(0).min(cap)
}

/// The algorithm to run among a search's successful results `(algorithm, math type, workspace)`,
/// fastest first (as cuDNN returns them): the fastest whose math type is allowed; none where no
/// result is (an algorithm measured with one math type is not run with another: burn's kernel
/// runs instead).
pub(crate) fn choose<A: Copy>(
    found: &[(A, MathType, usize)],
    data: DataType,
    tf32: bool,
) -> Option<(A, MathType, usize)> {
    found
        .iter()
        .copied()
        .find(|&(_, math, _)| MathType::allowed(data, tf32, math))
}

/// The number of algorithms of each pass in cuDNN 9 (`CUDNN_CONVOLUTION_*_ALGO_COUNT`): an
/// algorithm is the value of its pass's enum, below this.
pub(crate) fn algo_count(pass: ConvPass) -> u32 {
    match pass {
        ConvPass::Forward => 8,
        ConvPass::BackwardData => 6,
        ConvPass::BackwardFilter => 7,
    }
}

/// What runs a key's convolution: the algorithm (the value of its pass's cuDNN enum), the math
/// type to run it with and the workspace it asks for. Kept in kiln's cache as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Choice {
    pub algo: u32,
    pub math: MathType,
    pub workspace: usize,
}

impl Choice {
    /// The choice read back from kiln's cache for `key`, held to what the key's settings allow
    /// as a searched choice is ([`MathType::for_run`]: a "default" entry for f32 without TF32
    /// runs plain f32 products); `None` where this cuDNN has no such algorithm or the math type
    /// is not allowed (then the key is searched again).
    pub(crate) fn kept_for(self, key: &AlgoKey) -> Option<Self> {
        let math = MathType::for_run(key.data, key.tf32, self.math);
        (self.algo < algo_count(key.pass) && MathType::allowed(key.data, key.tf32, math))
            .then_some(Choice { math, ..self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(stride: usize, padding: usize, dilation: usize) -> ConvOptions<2> {
        ConvOptions::new([stride; 2], [padding; 2], [dilation; 2], 1)
    }

    #[test]
    fn output_sizes_match_pytorch() {
        // torch.nn.functional.conv2d: floor((H + 2p - d(k - 1) - 1) / s) + 1.
        assert_eq!(output_size(32, 3, 1, 1, 1), Some(32));
        assert_eq!(output_size(32, 3, 1, 2, 1), Some(16));
        assert_eq!(output_size(33, 3, 1, 2, 1), Some(17));
        assert_eq!(output_size(224, 7, 3, 2, 1), Some(112));
        assert_eq!(output_size(7, 1, 0, 2, 1), Some(4));
        assert_eq!(output_size(9, 3, 0, 1, 2), Some(5));
        assert_eq!(output_size(1, 3, 1, 1, 1), Some(1));
        assert_eq!(output_size(2, 3, 0, 1, 1), None);
        assert_eq!(output_size(4, 3, 0, 1, 2), None);
        assert_eq!(output_size(4, 0, 0, 1, 1), None);
    }

    #[test]
    fn geometry_of_resnet_convolutions() {
        let stem = ConvDims::new([2, 3, 224, 224], [64, 3, 7, 7], &options(2, 3, 1)).unwrap();
        assert_eq!(stem.y, [2, 64, 112, 112]);
        assert_eq!(stem.conv_params(), [3, 3, 2, 2, 1, 1]);
        let down = ConvDims::new([1, 64, 15, 15], [128, 64, 1, 1], &options(2, 0, 1)).unwrap();
        assert_eq!(down.y, [1, 128, 8, 8]);
        assert_eq!(down.output(ConvPass::Forward), [1, 128, 8, 8]);
        assert_eq!(down.output(ConvPass::BackwardData), [1, 64, 15, 15]);
        assert_eq!(down.output(ConvPass::BackwardFilter), [128, 64, 1, 1]);
        let asymmetric = ConvOptions::new([1, 2], [1, 0], [1, 1], 1);
        let g = ConvDims::new([3, 5, 17, 23], [6, 5, 3, 3], &asymmetric).unwrap();
        assert_eq!(g.y, [3, 6, 17, 11]);
        assert_eq!(g.conv_params(), [1, 0, 1, 2, 1, 1]);
    }

    #[test]
    fn grouped_geometry_carries_its_groups() {
        // ResNeXt-50's first grouped 3x3: 128 channels in 32 groups of 4.
        let grouped = ConvOptions::new([1, 1], [1, 1], [1, 1], 32);
        let g = ConvDims::new([2, 128, 56, 56], [128, 4, 3, 3], &grouped).unwrap();
        assert_eq!((g.groups, g.y), (32, [2, 128, 56, 56]));
        assert_eq!(g.output(ConvPass::BackwardFilter), [128, 4, 3, 3]);
        // Choices kept before groups existed read back as one group.
        let mut json = serde_json::to_value(g).unwrap();
        json.as_object_mut().unwrap().remove("groups");
        let old: ConvDims = serde_json::from_value(json).unwrap();
        assert_eq!(old.groups, 1);
    }

    #[test]
    fn geometry_refuses_what_cudnn_path_does_not_take() {
        let grouped = ConvOptions::new([1, 1], [1, 1], [1, 1], 2);
        assert!(ConvDims::new([1, 4, 8, 8], [4, 4, 3, 3], &grouped).is_err());
        assert!(ConvDims::new([1, 4, 8, 8], [3, 2, 3, 3], &grouped).is_err());
        assert!(ConvDims::new([1, 4, 8, 8], [4, 2, 3, 3], &grouped).is_ok());
        assert!(ConvDims::new([1, 4, 8, 8], [4, 3, 3, 3], &options(1, 1, 1)).is_err());
        assert!(ConvDims::new([1, 4, 2, 2], [4, 4, 3, 3], &options(1, 0, 1)).is_err());
        assert!(ConvDims::new([0, 4, 8, 8], [4, 4, 3, 3], &options(1, 1, 1)).is_err());
        // `ConvOptions::new` refuses a zero stride; the fields are public.
        let zero_stride = ConvOptions {
            stride: [0, 1],
            ..options(1, 1, 1)
        };
        assert!(ConvDims::new([1, 4, 8, 8], [4, 4, 3, 3], &zero_stride).is_err());
        let huge = ConvDims::new([1 << 12, 64, 128, 128], [64, 64, 3, 3], &options(1, 1, 1));
        assert!(huge.is_err(), "2^32 elements pass cuDNN's int limit");
    }

    #[test]
    fn descriptors_are_packed_nchw() {
        assert_eq!(packed_strides([2, 3, 4, 5]), [60, 20, 5, 1]);
        assert_eq!(packed_strides([1, 1, 1, 1]), [1, 1, 1, 1]);
        assert_eq!(
            nchw_descriptor([8, 64, 7, 9]),
            ([8, 64, 7, 9], [64 * 63, 63, 9, 1])
        );
    }

    #[test]
    fn data_types_and_compute_type() {
        assert_eq!(DataType::from_dtype(DType::F32), Some(DataType::F32));
        assert_eq!(DataType::from_dtype(DType::F16), Some(DataType::F16));
        assert_eq!(DataType::from_dtype(DType::BF16), Some(DataType::Bf16));
        assert_eq!(DataType::from_dtype(DType::F64), None);
        assert_eq!(DataType::from_dtype(DType::I32), None);
        let codes = [DataType::F32, DataType::F16, DataType::Bf16].map(DataType::cudnn_code);
        assert_eq!(codes, [0, 2, 9]);
        for data in [DataType::F32, DataType::F16, DataType::Bf16] {
            assert_eq!(data.compute_code(), 0, "accumulate in f32");
        }
    }

    #[test]
    fn math_types_follow_tf32_switch() {
        use MathType::*;
        assert_eq!(MathType::for_search(DataType::F32, true), Default);
        assert_eq!(MathType::for_search(DataType::F32, false), Fma);
        assert_eq!(MathType::for_search(DataType::Bf16, false), TensorOp);
        assert_eq!(MathType::for_search(DataType::F16, true), TensorOp);

        assert!(MathType::allowed(DataType::F32, true, Default));
        assert!(MathType::allowed(DataType::F32, true, TensorOp));
        assert!(MathType::allowed(DataType::F32, true, Fma));
        assert!(!MathType::allowed(
            DataType::F32,
            true,
            TensorOpAllowConversion
        ));
        assert!(MathType::allowed(DataType::F32, false, Fma));
        assert!(!MathType::allowed(DataType::F32, false, Default));
        assert!(!MathType::allowed(DataType::F32, false, TensorOp));
        assert!(MathType::allowed(
            DataType::F16,
            false,
            TensorOpAllowConversion
        ));

        assert_eq!(MathType::for_run(DataType::F32, false, Default), Fma);
        assert_eq!(MathType::for_run(DataType::F32, true, TensorOp), TensorOp);
        assert_eq!(MathType::for_run(DataType::Bf16, false, TensorOp), TensorOp);

        for m in [Default, TensorOp, TensorOpAllowConversion, Fma] {
            assert_eq!(MathType::from_cudnn_code(m.cudnn_code()), Some(m));
        }
        assert_eq!(MathType::from_cudnn_code(7), None);
    }

    #[test]
    fn algorithm_keys_tell_apart_what_changes_the_choice() {
        let g = ConvDims::new([8, 64, 32, 32], [64, 64, 3, 3], &options(1, 1, 1)).unwrap();
        let key = AlgoKey {
            device: 0,
            pass: ConvPass::Forward,
            data: DataType::F32,
            geometry: g,
            tf32: true,
            aligned: true,
        };
        let mut set = std::collections::HashSet::new();
        set.insert(key);
        assert!(set.contains(&key.clone()));
        let others = [
            AlgoKey { device: 1, ..key },
            AlgoKey {
                pass: ConvPass::BackwardData,
                ..key
            },
            AlgoKey {
                data: DataType::Bf16,
                ..key
            },
            AlgoKey { tf32: false, ..key },
            AlgoKey {
                aligned: false,
                ..key
            },
            AlgoKey {
                geometry: ConvDims::new([8, 64, 32, 32], [64, 64, 3, 3], &options(2, 1, 1))
                    .unwrap(),
                ..key
            },
            AlgoKey {
                geometry: ConvDims::new(
                    [8, 64, 32, 32],
                    [64, 2, 3, 3],
                    &ConvOptions::new([1, 1], [1, 1], [1, 1], 32),
                )
                .unwrap(),
                ..key
            },
        ];
        for other in others {
            assert!(!set.contains(&other), "{other:?}");
        }
    }

    #[test]
    fn choice_takes_fastest_allowed_result() {
        use MathType::*;
        let found = [
            ("tf32", Default, 0),
            ("conv", TensorOpAllowConversion, 8),
            ("fma", Fma, 4),
        ];
        assert_eq!(
            choose(&found, DataType::F32, true),
            Some(("tf32", Default, 0))
        );
        assert_eq!(choose(&found, DataType::F32, false), Some(("fma", Fma, 4)));
        // Nothing measured with plain f32 products: nothing is run with another math type.
        assert_eq!(choose(&found[..2], DataType::F32, false), None);
        assert_eq!(
            choose(&found[1..], DataType::Bf16, false),
            Some(("conv", TensorOpAllowConversion, 8))
        );
        assert_eq!(choose::<u8>(&[], DataType::F32, true), None);
    }

    #[test]
    fn alignment_versions_and_search_workspace() {
        assert!(aligned_16(&[0, 512, 1024 + 16]));
        assert!(!aligned_16(&[512, 514]));
        assert_eq!(version_name(91900), "9.19.0");
        assert_eq!(version_name(90102), "9.1.2");
        assert_eq!(version_name(8907), "8.9.7");
        assert!(require_9(91900).is_ok());
        assert!(require_9(90000).is_ok());
        let old = require_9(8907).unwrap_err();
        assert!(
            old.contains("cuDNN 8.9.7") && old.contains("cuDNN 9 only"),
            "{old}"
        );
        assert!(require_9(100100).is_err(), "cuDNN 10's API is not 9's");
        assert_eq!(search_workspace([10, 300, 20], 256), 256);
        assert_eq!(search_workspace([10, 30], 256), 30);
        assert_eq!(search_workspace([], 256), 0);
    }

    #[test]
    fn a_kept_choice_is_held_to_the_keys_settings() {
        let g = ConvDims::new([8, 64, 32, 32], [64, 64, 3, 3], &options(1, 1, 1)).unwrap();
        let key = |pass, data, tf32| AlgoKey {
            device: 0,
            pass,
            data,
            geometry: g,
            tf32,
            aligned: true,
        };
        let choice = |algo, math| Choice {
            algo,
            math,
            workspace: 1024,
        };
        // A file entry saying "default" math for f32 without TF32 runs plain f32 products.
        let f32_exact = key(ConvPass::Forward, DataType::F32, false);
        assert_eq!(
            choice(1, MathType::Default).kept_for(&f32_exact),
            Some(choice(1, MathType::Fma))
        );
        let f32_tf32 = key(ConvPass::Forward, DataType::F32, true);
        assert_eq!(
            choice(1, MathType::Default).kept_for(&f32_tf32),
            Some(choice(1, MathType::Default))
        );
        // f32 never runs with conversion to f16, whatever the file says.
        assert_eq!(
            choice(1, MathType::TensorOpAllowConversion).kept_for(&f32_tf32),
            None
        );
        // An algorithm this cuDNN does not have is searched again.
        assert_eq!(choice(8, MathType::Default).kept_for(&f32_tf32), None);
        let filter = key(ConvPass::BackwardFilter, DataType::Bf16, false);
        assert_eq!(
            choice(6, MathType::TensorOp).kept_for(&filter),
            Some(choice(6, MathType::TensorOp))
        );
        assert_eq!(choice(7, MathType::TensorOp).kept_for(&filter), None);
    }
}
