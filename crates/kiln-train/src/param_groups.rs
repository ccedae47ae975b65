//! Which parameters train, and how, by their torchvision names: `model.freeze` (no gradient, no
//! optimizer state, batch norm in eval mode, until `unfreeze_at_epoch`),
//! `[[optimizer.groups]]` (a learning-rate factor and a weight decay of their own) and
//! `optimizer.no_weight_decay`, as PyTorch's parameter groups.
//!
//! A name is selected by a torchvision name or module prefix (`"layer4"`, `"fc.bias"`,
//! `"layer1.0.conv1"`), or by `"bn"` (every batch norm's weight and bias) or `"bias"` (every
//! bias): with `no_weight_decay = ["bn", "bias"]`, timm's filter (no decay on 1-d parameters).

use std::collections::{HashMap, HashSet};

use burn::module::ParamId;

use kiln_config::config::{ModelConfig, OptimizerConfig};

/// A group's learning-rate factor and weight decay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupSettings {
    pub lr_scale: f64,
    pub weight_decay: f64,
}

/// Every parameter's group (by torchvision name), and which of them are frozen until
/// `unfreeze_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroups {
    pub settings: Vec<GroupSettings>,
    /// Each parameter's group and whether `model.freeze` selects it.
    members: HashMap<String, (usize, bool)>,
    freeze: Vec<String>,
    /// The first epoch (counted from 0) in which the frozen parameters train.
    unfreeze_at: Option<usize>,
    /// `model.freeze_batch_norm`: every batch norm in eval mode, always.
    all_batch_norm: bool,
    /// The model's batch norms (see [`batch_norms`]), which `"bn"` selects.
    batch_norms: HashSet<String>,
}

/// Whether `selector` (a name, a module prefix, `"bn"` or `"bias"`) selects `name`, a
/// torchvision name.
pub fn selects(selector: &str, name: &str) -> bool {
    selects_among(selector, name, is_batch_norm)
}

/// [`selects`] with `batch_norm` telling which modules are batch norms.
fn selects_among(selector: &str, name: &str, batch_norm: impl Fn(&str) -> bool) -> bool {
    match selector {
        "bias" => name.ends_with(".bias"),
        "bn" => name
            .rsplit_once('.')
            .is_some_and(|(module, _)| batch_norm(module)),
        _ => name
            .strip_prefix(selector)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.')),
    }
}

/// The batch norms among a model's parameter `names`: in torchvision's and timm's ResNets the
/// convolutions have no bias, so every module with a bias but the classifier is one (timm's
/// ResNet-D names them `conv1.1` and `downsample.2`, and its `downsample.1` is a convolution).
fn batch_norms(names: &[String]) -> HashSet<String> {
    names
        .iter()
        .filter_map(|name| name.strip_suffix(".bias"))
        .filter(|module| *module != "fc")
        .map(String::from)
        .collect()
}

/// torchvision's batch norms: `bn1`, `layer1.0.bn2`, `layer2.0.downsample.1`.
fn is_batch_norm(module: &str) -> bool {
    let last = module.rsplit('.').next().unwrap_or(module);
    last.starts_with("bn") || module.ends_with("downsample.1")
}

impl ParamGroups {
    /// The groups of `names` (a model's trainable parameters, torchvision's names) that the
    /// config's sections describe; an error names a selector that selects nothing.
    pub fn new(
        names: &[String],
        model: &ModelConfig,
        optimizer: &OptimizerConfig,
    ) -> Result<Self, String> {
        let norms = batch_norms(names);
        let selects = |selector: &str, name: &str| {
            selects_among(selector, name, |module| norms.contains(module))
        };
        let lists = [
            ("model.freeze", &model.freeze),
            ("optimizer.no_weight_decay", &optimizer.no_weight_decay),
        ];
        let groups = optimizer
            .groups
            .iter()
            .map(|g| ("optimizer.groups params", &g.params));
        for (key, selectors) in lists.into_iter().chain(groups) {
            for selector in selectors {
                if !names.iter().any(|name| selects(selector, name)) {
                    return Err(format!(
                        "{key}: \"{selector}\" names no parameter of {} (use torchvision's names or \
                         prefixes, such as conv1, bn1, layer1, layer4.1.conv2, fc, or \"bn\" or \"bias\")",
                        model.name
                    ));
                }
            }
        }
        let base_decay = optimizer.weight_decay();
        let mut settings: Vec<GroupSettings> = Vec::new();
        let mut members = HashMap::new();
        for name in names {
            // The first group that names it, as PyTorch takes each parameter once.
            let group = optimizer
                .groups
                .iter()
                .find(|g| g.params.iter().any(|s| selects(s, name)));
            let decays = !optimizer.no_weight_decay.iter().any(|s| selects(s, name));
            let wanted = GroupSettings {
                lr_scale: group.map_or(1.0, |g| g.lr_scale),
                weight_decay: match decays {
                    true => group.and_then(|g| g.weight_decay).unwrap_or(base_decay),
                    false => 0.0,
                },
            };
            let index = match settings.iter().position(|s| *s == wanted) {
                Some(index) => index,
                None => {
                    settings.push(wanted);
                    settings.len() - 1
                }
            };
            let frozen = model.freeze.iter().any(|s| selects(s, name));
            members.insert(name.clone(), (index, frozen));
        }
        if settings.is_empty() {
            settings.push(GroupSettings {
                lr_scale: 1.0,
                weight_decay: base_decay,
            });
        }
        Ok(Self {
            settings,
            members,
            freeze: model.freeze.clone(),
            unfreeze_at: model.unfreeze_at_epoch.map(|e| e - 1),
            all_batch_norm: model.freeze_batch_norm,
            batch_norms: norms,
        })
    }

    /// Whether the config asks for nothing but one group of everything: PyTorch's default.
    pub fn is_plain(&self) -> bool {
        self.settings.len() == 1 && self.freeze.is_empty()
    }

    /// Whether `model.freeze` holds in `epoch` (counted from 0).
    pub fn frozen_in(&self, epoch: usize) -> bool {
        !self.freeze.is_empty() && self.unfreeze_at.is_none_or(|at| epoch < at)
    }

    /// The group of parameter `name` while `frozen` holds (`None`: it gets no update).
    pub fn group_of(&self, name: &str, frozen: bool) -> Option<usize> {
        let &(group, is_frozen) = self.members.get(name)?;
        (!(frozen && is_frozen)).then_some(group)
    }

    /// Whether the batch norm `module` (a torchvision name) runs in eval mode while `frozen`
    /// holds: when its weight is frozen (or `freeze_batch_norm` freezes them all).
    pub fn freezes_batch_norm(&self, module: &str, frozen: bool) -> bool {
        let weight = format!("{module}.weight");
        let selected = |s: &String| selects_among(s, &weight, |m| self.batch_norms.contains(m));
        self.all_batch_norm || (frozen && self.freeze.iter().any(selected))
    }

    /// Each parameter's group by id, for a model whose parameters are `params`.
    pub fn by_id(&self, params: &[(String, ParamId)], frozen: bool) -> HashMap<ParamId, usize> {
        params
            .iter()
            .filter_map(|(name, id)| Some((*id, self.group_of(name, frozen)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_config::config::GroupConfig;

    fn names() -> Vec<String> {
        [
            "conv1.weight",
            "bn1.weight",
            "bn1.bias",
            "layer1.0.conv1.weight",
            "layer1.0.bn1.weight",
            "layer1.0.bn1.bias",
            "layer2.0.downsample.0.weight",
            "layer2.0.downsample.1.weight",
            "layer2.0.downsample.1.bias",
            "fc.weight",
            "fc.bias",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn selectors_follow_torchvision_names() {
        assert!(selects("layer1", "layer1.0.conv1.weight"));
        assert!(!selects("layer1", "layer10.0.conv1.weight"));
        assert!(selects("fc.bias", "fc.bias"));
        assert!(selects("bn1", "bn1.weight") && !selects("bn1", "layer1.0.bn1.weight"));
        assert!(selects("bn", "layer1.0.bn1.weight") && selects("bn", "bn1.bias"));
        assert!(selects("bn", "layer2.0.downsample.1.bias"));
        assert!(!selects("bn", "layer2.0.downsample.0.weight") && !selects("bn", "fc.weight"));
        assert!(selects("bias", "fc.bias") && !selects("bias", "fc.weight"));
    }

    /// timm's ResNet-D: `"bn"` selects its deep stem's batch norms (`conv1.1`) and its
    /// shortcuts' (`downsample.2`), not the shortcut's convolution (`downsample.1`).
    #[test]
    fn bn_selects_resnet_ds_batch_norms() {
        let names: Vec<String> = [
            "conv1.0.weight",
            "conv1.1.weight",
            "conv1.1.bias",
            "conv1.6.weight",
            "bn1.weight",
            "bn1.bias",
            "layer2.0.downsample.1.weight",
            "layer2.0.downsample.2.weight",
            "layer2.0.downsample.2.bias",
            "fc.weight",
            "fc.bias",
        ]
        .map(String::from)
        .to_vec();
        let model = ModelConfig {
            name: "resnet50d".into(),
            freeze: vec!["bn".into()],
            ..ModelConfig::default()
        };
        let mut optimizer = OptimizerConfig::sgd(0.1);
        optimizer.weight_decay = Some(5e-4);
        optimizer.no_weight_decay = vec!["bn".into()];
        let groups = ParamGroups::new(&names, &model, &optimizer).unwrap();
        let decay =
            |name: &str| groups.settings[groups.group_of(name, false).unwrap()].weight_decay;
        assert_eq!(decay("conv1.1.weight"), 0.0);
        assert_eq!(decay("layer2.0.downsample.2.bias"), 0.0);
        assert_eq!(decay("layer2.0.downsample.1.weight"), 5e-4);
        assert_eq!(decay("fc.bias"), 5e-4);
        assert!(groups.freezes_batch_norm("conv1.1", true));
        assert!(groups.freezes_batch_norm("layer2.0.downsample.2", true));
        assert!(
            groups
                .group_of("layer2.0.downsample.1.weight", true)
                .is_some()
        );
    }

    #[test]
    fn groups_are_pytorchs_parameter_groups() {
        let model = ModelConfig {
            freeze: vec!["conv1".into(), "bn1".into()],
            unfreeze_at_epoch: Some(3),
            ..ModelConfig::default()
        };
        let mut optimizer = OptimizerConfig::sgd(0.1);
        optimizer.weight_decay = Some(5e-4);
        optimizer.no_weight_decay = vec!["bn".into(), "bias".into()];
        optimizer.groups = vec![GroupConfig {
            params: vec!["fc".into()],
            lr_scale: 10.0,
            weight_decay: Some(1e-3),
        }];
        let groups = ParamGroups::new(&names(), &model, &optimizer).unwrap();
        let settings = |name: &str| groups.settings[groups.group_of(name, false).unwrap()];
        let decayed = GroupSettings {
            lr_scale: 1.0,
            weight_decay: 5e-4,
        };
        assert_eq!(settings("conv1.weight"), decayed);
        assert_eq!(settings("layer2.0.downsample.0.weight"), decayed);
        assert_eq!(settings("layer2.0.downsample.1.weight").weight_decay, 0.0);
        assert_eq!(settings("fc.weight").weight_decay, 1e-3);
        assert_eq!(settings("fc.bias").weight_decay, 0.0);
        assert_eq!(settings("fc.bias").lr_scale, 10.0);
        assert_eq!(groups.settings.len(), 4);
        // Frozen in epochs 0 and 1 (unfreeze_at_epoch counts from 1, as the console does).
        assert!(groups.frozen_in(1) && !groups.frozen_in(2));
        assert_eq!(groups.group_of("bn1.bias", true), None);
        assert!(groups.group_of("layer1.0.bn1.bias", true).is_some());
        assert!(groups.freezes_batch_norm("bn1", true));
        assert!(!groups.freezes_batch_norm("bn1", false));
        assert!(!groups.freezes_batch_norm("layer1.0.bn1", true));

        let wrong = ModelConfig {
            freeze: vec!["layer9".into()],
            ..ModelConfig::default()
        };
        let err = ParamGroups::new(&names(), &wrong, &optimizer).unwrap_err();
        assert!(
            err.contains("model.freeze") && err.contains("layer9"),
            "{err}"
        );
        let plain = ParamGroups::new(
            &names(),
            &ModelConfig::default(),
            &OptimizerConfig::sgd(0.1),
        );
        assert!(plain.unwrap().is_plain());
    }
}
