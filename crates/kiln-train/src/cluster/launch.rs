//! Where a cluster's job launcher put this process. SLURM's `srun` and torchrun-style launchers
//! (torchrun, Kubeflow's PyTorchJob, Accelerate) start the same command on every machine and
//! hand each process its rank in environment variables, as PyTorch Lightning reads them: with
//! them, `kiln train --config F` joins the run without `--nodes/--node-rank/--coordinator`.
//!
//! kiln's machines are processes: one per machine (training on all of its GPUs), or one per GPU
//! where the launcher starts several on a machine (each then on its local device).

use thiserror::Error;

/// A run's shape and this process's place in it, as a launcher gave them.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub launcher: Launcher,
    /// Processes in the run (kiln's `--nodes`).
    pub processes: usize,
    /// This process's number, 0 to `processes - 1` (kiln's `--node-rank`).
    pub rank: usize,
    /// `host:port` of the coordinator, which process 0 runs.
    pub coordinator: String,
    /// The one device this process trains on, where the launcher starts several processes on
    /// a machine; `None`: the config's devices.
    pub local_device: Option<usize>,
    /// What was taken from where, for the line a run prints.
    pub sources: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Slurm,
    Torchrun,
}

#[derive(Debug, Error, PartialEq)]
pub enum LaunchError {
    #[error(
        "{variable}={value:?} from the job launcher is not {expected}; fix the job script, or give --nodes, --node-rank and --coordinator yourself"
    )]
    Malformed {
        variable: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "the job launcher set {present} but not {missing}; set it, or give --nodes, --node-rank and --coordinator yourself"
    )]
    Missing {
        present: &'static str,
        missing: &'static str,
    },
}

/// The port SLURM runs use when `MASTER_PORT` is not set: 15000 plus the job id's last four
/// digits, as Lightning chooses it, so that two jobs sharing a machine rarely collide.
pub fn slurm_port(job_id: u64) -> u16 {
    15000 + (job_id % 10000) as u16
}

impl Launch {
    /// The launch described by the environment (`get` reads a variable), `None` where no
    /// launcher started a run of several processes: torchrun's variables first (`RANK`,
    /// `WORLD_SIZE`), then SLURM's inside `srun` (`SLURM_STEP_ID`).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, LaunchError> {
        let get = |key: &str| get(key).filter(|v| !v.trim().is_empty());
        // A world of one process is a plain run, whatever else is set or missing.
        let alone = |key: &str| get(key).is_some_and(|v| v.trim() == "1");
        let launch = if get("WORLD_SIZE").is_some() || get("RANK").is_some() {
            if alone("WORLD_SIZE") {
                return Ok(None);
            }
            torchrun(&get)?
        } else if get("SLURM_STEP_ID").is_some() && get("SLURM_PROCID").is_some() {
            if alone("SLURM_STEP_NUM_TASKS") || alone("SLURM_NTASKS") {
                return Ok(None);
            }
            slurm(&get)?
        } else {
            return Ok(None);
        };
        Ok((launch.processes > 1).then_some(launch))
    }

    /// One line: the launcher and what kiln took from it.
    pub fn describe(&self) -> String {
        let launcher = match self.launcher {
            Launcher::Slurm => "SLURM",
            Launcher::Torchrun => "a torchrun-style launcher",
        };
        format!("started by {launcher}: {}", self.sources.join(", "))
    }
}

fn torchrun(get: &impl Fn(&str) -> Option<String>) -> Result<Launch, LaunchError> {
    let processes = number(get, "WORLD_SIZE", "RANK")?;
    let rank = rank(get, "RANK", "WORLD_SIZE", processes)?;
    let host = required(get, "MASTER_ADDR", "WORLD_SIZE")?;
    let master_port = port(get, "MASTER_PORT")?.ok_or(LaunchError::Missing {
        present: "WORLD_SIZE",
        missing: "MASTER_PORT",
    })?;
    // torchrun's own agent serves its rendezvous store on MASTER_PORT: kiln's coordinator
    // takes the next port there.
    let agent_store = get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v == "True");
    let (coordinator_port, port_source) = match agent_store {
        true => (
            master_port.checked_add(1).ok_or(LaunchError::Malformed {
                variable: "MASTER_PORT",
                value: master_port.to_string(),
                expected: "below 65535 under torchrun, whose store holds it (kiln takes the next)",
            })?,
            "MASTER_PORT + 1, torchrun's store being on MASTER_PORT",
        ),
        false => (master_port, "MASTER_PORT"),
    };
    let per_machine = get("LOCAL_WORLD_SIZE")
        .map(|_| number(get, "LOCAL_WORLD_SIZE", "LOCAL_RANK"))
        .transpose()?;
    let local = local_device(get, "LOCAL_RANK", per_machine)?;
    let mut sources = vec![
        format!("machine {rank} of {processes} (RANK, WORLD_SIZE)"),
        format!("coordinator {host}:{coordinator_port} (MASTER_ADDR, {port_source})"),
    ];
    sources.extend(local.map(|d| format!("device {d} (LOCAL_RANK)")));
    Ok(Launch {
        launcher: Launcher::Torchrun,
        processes,
        rank,
        coordinator: format!("{host}:{coordinator_port}"),
        local_device: local,
        sources,
    })
}

fn slurm(get: &impl Fn(&str) -> Option<String>) -> Result<Launch, LaunchError> {
    let tasks_key = match get("SLURM_STEP_NUM_TASKS") {
        Some(_) => "SLURM_STEP_NUM_TASKS",
        None => "SLURM_NTASKS",
    };
    let processes = number(get, tasks_key, "SLURM_PROCID")?;
    let rank = rank(get, "SLURM_PROCID", tasks_key, processes)?;
    let (host, host_source) = match get("MASTER_ADDR") {
        Some(host) => (host, "MASTER_ADDR".to_string()),
        None => {
            let key = match get("SLURM_STEP_NODELIST") {
                Some(_) => "SLURM_STEP_NODELIST",
                None => "SLURM_JOB_NODELIST",
            };
            (first_host(get, key)?, format!("the first host of {key}"))
        }
    };
    let (port, port_source) = match port(get, "MASTER_PORT")? {
        Some(port) => (port, "MASTER_PORT"),
        None => {
            let job = number(get, "SLURM_JOB_ID", "SLURM_PROCID")?;
            (
                slurm_port(job as u64),
                "15000 + SLURM_JOB_ID's last 4 digits",
            )
        }
    };
    let nodes_key = match get("SLURM_STEP_NUM_NODES") {
        Some(_) => "SLURM_STEP_NUM_NODES",
        None => "SLURM_NNODES",
    };
    let machines = get(nodes_key)
        .map(|_| number(get, nodes_key, tasks_key))
        .transpose()?;
    let local = local_device(get, "SLURM_LOCALID", machines.map(|m| processes / m.max(1)))?;
    let mut sources = vec![
        format!("machine {rank} of {processes} (SLURM_PROCID, {tasks_key})"),
        format!("coordinator {host}:{port} ({host_source}, {port_source})"),
    ];
    sources.extend(local.map(|d| format!("device {d} (SLURM_LOCALID)")));
    Ok(Launch {
        launcher: Launcher::Slurm,
        processes,
        rank,
        coordinator: format!("{host}:{port}"),
        local_device: local,
        sources,
    })
}

/// This process's device on its machine, where there are `per_machine` processes on each: its
/// local rank (`local_key`), or 0 where the launcher left it one GPU (`CUDA_VISIBLE_DEVICES`
/// naming a single device, as `srun --gpus-per-task=1` does).
fn local_device(
    get: &impl Fn(&str) -> Option<String>,
    local_key: &'static str,
    per_machine: Option<usize>,
) -> Result<Option<usize>, LaunchError> {
    if per_machine.is_none_or(|n| n <= 1) || get(local_key).is_none() {
        return Ok(None);
    }
    let one_visible = get("CUDA_VISIBLE_DEVICES").is_some_and(|v| !v.contains(','));
    match one_visible {
        true => Ok(Some(0)),
        false => Ok(Some(number(get, local_key, local_key)?)),
    }
}

fn required(
    get: &impl Fn(&str) -> Option<String>,
    key: &'static str,
    because: &'static str,
) -> Result<String, LaunchError> {
    get(key).ok_or(LaunchError::Missing {
        present: because,
        missing: key,
    })
}

fn number(
    get: &impl Fn(&str) -> Option<String>,
    key: &'static str,
    because: &'static str,
) -> Result<usize, LaunchError> {
    let value = required(get, key, because)?;
    value.trim().parse().map_err(|_| LaunchError::Malformed {
        variable: key,
        value,
        expected: "a whole number",
    })
}

fn rank(
    get: &impl Fn(&str) -> Option<String>,
    key: &'static str,
    because: &'static str,
    processes: usize,
) -> Result<usize, LaunchError> {
    let rank = number(get, key, because)?;
    if rank >= processes {
        return Err(LaunchError::Malformed {
            variable: key,
            value: rank.to_string(),
            expected: "below the number of processes",
        });
    }
    Ok(rank)
}

fn port(
    get: &impl Fn(&str) -> Option<String>,
    key: &'static str,
) -> Result<Option<u16>, LaunchError> {
    get(key)
        .map(|value| match value.trim().parse::<u16>() {
            Ok(port) if port > 0 => Ok(port),
            _ => Err(LaunchError::Malformed {
                variable: key,
                value,
                expected: "a port number (1 to 65535)",
            }),
        })
        .transpose()
}

/// The first host of a SLURM host list (`gpu[01-04,07]` is gpu01, gpu02, gpu03, gpu04, gpu07).
fn first_host(
    get: &impl Fn(&str) -> Option<String>,
    key: &'static str,
) -> Result<String, LaunchError> {
    let list = required(get, key, "SLURM_PROCID")?;
    let hosts = hostlist_parser::parse(&list).map_err(|_| LaunchError::Malformed {
        variable: key,
        value: list.clone(),
        expected: "a SLURM host list (such as gpu[01-04,07])",
    })?;
    hosts.into_iter().next().ok_or(LaunchError::Malformed {
        variable: key,
        value: list,
        expected: "a SLURM host list with a host",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    const SRUN: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "1234567"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "2"),
        ("SLURM_STEP_NUM_TASKS", "4"),
        ("SLURM_STEP_NUM_NODES", "4"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_NODELIST", "gpu[07-09,11]"),
        ("SLURM_JOB_NODELIST", "gpu[01-12]"),
    ];

    #[test]
    fn srun_one_task_per_machine() {
        let launch = Launch::from_env(env(SRUN)).unwrap().unwrap();
        assert_eq!(launch.launcher, Launcher::Slurm);
        assert_eq!((launch.processes, launch.rank), (4, 2));
        assert_eq!(launch.coordinator, "gpu07:19567");
        assert_eq!(launch.local_device, None);
        let line = launch.describe();
        assert!(line.contains("SLURM_STEP_NODELIST"), "{line}");
        assert!(line.contains("SLURM_JOB_ID"), "{line}");
    }

    #[test]
    fn srun_one_task_per_gpu_takes_the_local_device() {
        let mut vars = SRUN.to_vec();
        vars.retain(|(k, _)| *k != "SLURM_STEP_NUM_NODES" && *k != "SLURM_LOCALID");
        vars.extend([
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_LOCALID", "1"),
            ("MASTER_PORT", "29400"),
        ]);
        let launch = Launch::from_env(env(&vars)).unwrap().unwrap();
        assert_eq!(launch.local_device, Some(1));
        assert_eq!(launch.coordinator, "gpu07:29400");
        // --gpus-per-task leaves each task one visible GPU, its device 0.
        vars.push(("CUDA_VISIBLE_DEVICES", "3"));
        let launch = Launch::from_env(env(&vars)).unwrap().unwrap();
        assert_eq!(launch.local_device, Some(0));
    }

    #[test]
    fn torchrun_variables() {
        let vars = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ];
        let launch = Launch::from_env(env(&vars)).unwrap().unwrap();
        assert_eq!(launch.launcher, Launcher::Torchrun);
        assert_eq!((launch.processes, launch.rank), (2, 1));
        assert_eq!(launch.coordinator, "10.1.2.3:29500");
        assert_eq!(launch.local_device, Some(1));
        // torchrun itself serves its store on MASTER_PORT.
        let mut with_agent = vars.to_vec();
        with_agent.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        let launch = Launch::from_env(env(&with_agent)).unwrap().unwrap();
        assert_eq!(launch.coordinator, "10.1.2.3:29501");
    }

    #[test]
    fn no_launcher_or_a_single_process_is_a_plain_run() {
        assert_eq!(Launch::from_env(env(&[])).unwrap(), None);
        // sbatch's script (no srun step) is not a run of several processes.
        let batch = [
            ("SLURM_JOB_ID", "7"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
        ];
        assert_eq!(Launch::from_env(env(&batch)).unwrap(), None);
        let single = [
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
        ];
        assert_eq!(Launch::from_env(env(&single)).unwrap(), None);
        // Nothing else is needed of a world of one.
        let bare = [("RANK", "0"), ("WORLD_SIZE", "1")];
        assert_eq!(Launch::from_env(env(&bare)).unwrap(), None);
    }

    #[test]
    fn a_malformed_variable_is_named() {
        let bad = [("RANK", "one"), ("WORLD_SIZE", "2")];
        let error = Launch::from_env(env(&bad)).unwrap_err();
        assert!(error.to_string().starts_with("RANK=\"one\""), "{error}");
        let out_of_range = [
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ];
        assert!(matches!(
            Launch::from_env(env(&out_of_range)),
            Err(LaunchError::Malformed {
                variable: "RANK",
                ..
            })
        ));
        let no_port = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
        assert_eq!(
            Launch::from_env(env(&no_port)).unwrap_err(),
            LaunchError::Missing {
                present: "WORLD_SIZE",
                missing: "MASTER_PORT"
            }
        );
        let mut bad_list = SRUN.to_vec();
        bad_list.retain(|(k, _)| *k != "SLURM_STEP_NODELIST");
        bad_list.push(("SLURM_STEP_NODELIST", "gpu[01-"));
        let error = Launch::from_env(env(&bad_list)).unwrap_err();
        assert!(error.to_string().contains("SLURM_STEP_NODELIST"), "{error}");
    }

    #[test]
    fn job_ids_give_ports_in_range() {
        assert_eq!(slurm_port(4242), 19242);
        assert_eq!(slurm_port(1_239_999), 24999);
    }
}
