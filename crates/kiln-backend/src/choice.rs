//! What a user can ask for: `--backend` and `--devices`.

use std::fmt;
use std::str::FromStr;

use crate::backend::Backend;
use crate::error::BackendError;
use crate::probe::DeviceInfo;

/// `--backend`: `auto` or one backend by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    #[default]
    Auto,
    Explicit(Backend),
}

impl FromStr for BackendChoice {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        if s == "auto" {
            return Ok(BackendChoice::Auto);
        }
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .map(BackendChoice::Explicit)
            .ok_or(BackendError::UnknownBackend(s))
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendChoice::Auto => f.write_str("auto"),
            BackendChoice::Explicit(b) => b.fmt(f),
        }
    }
}

/// `--devices`: one index, a comma-separated list, or `all`. Indices count the devices that
/// `kiln devices` lists for the backend, from 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    Indices(Vec<usize>),
    All,
}

impl Default for DeviceSelection {
    fn default() -> Self {
        DeviceSelection::Indices(vec![0])
    }
}

impl DeviceSelection {
    /// Chooses devices from the usable ones that the backend has.
    pub(crate) fn pick<'a>(
        &self,
        backend: Backend,
        available: &[&'a DeviceInfo],
    ) -> Result<Vec<&'a DeviceInfo>, BackendError> {
        if available.is_empty() {
            return Err(BackendError::NoDevice { backend });
        }
        match self {
            DeviceSelection::All => Ok(available.to_vec()),
            DeviceSelection::Indices(indices) => indices
                .iter()
                .map(|&index| {
                    available
                        .get(index)
                        .copied()
                        .ok_or(BackendError::NoSuchDevice {
                            backend,
                            index,
                            count: available.len(),
                        })
                })
                .collect(),
        }
    }
}

impl FromStr for DeviceSelection {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(DeviceSelection::All);
        }
        let mut indices = Vec::new();
        for part in s.split(',') {
            let index = part
                .trim()
                .parse::<usize>()
                .map_err(|_| BackendError::BadDeviceList(s.to_string()))?;
            // A repeated index is one more replica on that device (`0,0`: two on the CPU).
            indices.push(index);
        }
        Ok(DeviceSelection::Indices(indices))
    }
}

impl fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelection::All => f.write_str("all"),
            DeviceSelection::Indices(indices) => {
                let list: Vec<String> = indices.iter().map(usize::to_string).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backend_names_and_refuses_others() {
        assert_eq!(
            "auto".parse::<BackendChoice>().unwrap(),
            BackendChoice::Auto
        );
        assert_eq!(
            "CUDA".parse::<BackendChoice>().unwrap(),
            BackendChoice::Explicit(Backend::Cuda)
        );
        assert_eq!(
            "ndarray".parse::<BackendChoice>().unwrap(),
            BackendChoice::Explicit(Backend::NdArray)
        );
        let err = "tpu".parse::<BackendChoice>().unwrap_err().to_string();
        assert!(err.contains("tpu") && err.contains("flex"), "{err}");
    }

    #[test]
    fn parses_device_lists() {
        assert_eq!(
            "all".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::All
        );
        assert_eq!(
            "2".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::Indices(vec![2])
        );
        assert_eq!(
            "0, 1,3".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::Indices(vec![0, 1, 3])
        );
        assert_eq!(
            "0,0".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::Indices(vec![0, 0])
        );
        assert!("one".parse::<DeviceSelection>().is_err());
        assert!("".parse::<DeviceSelection>().is_err());
    }
}
