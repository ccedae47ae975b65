//! The machines of a multi-machine run: where they meet (burn-collective's coordinator, which
//! machine 0 starts, and each machine's own address for the others), kiln's own line between
//! them (`heartbeat`), and what a job launcher says of them (`launch`: SLURM, torchrun). The
//! replicas on each machine (`crate::replicas`) join through [`Cluster::join`].

pub mod heartbeat;
pub mod launch;

use std::net::{ToSocketAddrs, UdpSocket};

use burn::collective::{self, AllReduceStrategy, CollectiveConfig};

use crate::error::ParallelError;

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

impl Cluster {
    /// Starts this machine's part of the run (the coordinator on machine 0, the heartbeat) and
    /// returns `config` set to join the others.
    pub(crate) fn join(&self, config: CollectiveConfig) -> Result<CollectiveConfig, ParallelError> {
        let port = self.coordinator_port()?;
        if self.rank == 0 {
            start_coordinator(port)?;
        }
        let host = self
            .coordinator
            .rsplit_once(':')
            .map_or("", |(host, _)| host);
        heartbeat::start(self.rank, host, heartbeat::port(port, self.nodes))?;
        let (node_address, data_port) = self.node_address()?;
        let websocket = |host_port: &str| {
            format!("ws://{host_port}")
                .parse()
                .expect("any string parses as an address")
        };
        Ok(config
            .with_num_nodes(self.nodes as u32)
            .with_global_address(websocket(&self.coordinator))
            .with_node_address(websocket(&node_address))
            .with_data_service_port(data_port)
            // burn-collective's global ring refuses tensors with fewer rows than machines
            // (a one-element count, a small bias) instead of falling back.
            .with_global_all_reduce_strategy(AllReduceStrategy::Tree(2)))
    }
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
