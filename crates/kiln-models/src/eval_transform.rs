//! The evaluation transform a set of published weights expects (torchvision's
//! `ImageClassification`, timm's `pretrained_cfg`), which `pretrained` and `hub` hand to
//! `kiln predict`.

/// ImageNet's per-channel mean and standard deviation, as torchvision's weights expect.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// How an image is resampled when it is resized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalInterpolation {
    /// torchvision's default (`InterpolationMode.BILINEAR`), antialiased as Pillow's.
    Bilinear,
    /// Pillow's bicubic, timm's usual choice.
    Bicubic,
}

/// The evaluation transform a set of weights was published with: resize the shorter side to
/// `resize`, center-crop `crop`, normalize with `mean` and `std` (pixels / 255).
#[derive(Debug, Clone, PartialEq)]
pub struct EvalSpec {
    pub resize: u32,
    pub crop: u32,
    pub interpolation: EvalInterpolation,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl EvalSpec {
    /// torchvision's `ImageClassification(crop_size=224, resize_size=resize)`.
    pub(crate) fn torchvision(resize: u32) -> Self {
        Self {
            resize,
            crop: 224,
            interpolation: EvalInterpolation::Bilinear,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }
}
