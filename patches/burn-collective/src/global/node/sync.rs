use std::{
    collections::HashMap,
    marker::PhantomData,
    sync::{Arc, Mutex},
};

use burn_communication::{CommunicationChannel, Message, Protocol, ProtocolClient};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, RwLock};

use crate::{NodeId, node::base::NodeState};

/// Handles the status of sync requests from other nodes
pub(crate) struct SyncService<P: Protocol> {
    /// Current node's state, shared with the thread that does aggregations
    node_state: Arc<RwLock<Option<NodeState>>>,
    /// How many times each node (this one included) has requested to sync. The n-th sync
    /// completes once every node has requested n times, so a fast node's next request, arriving
    /// before this node has finished the current sync, counts toward the next one.
    /// (burn-collective 0.21.0 kept a list of peers that it never cleared, so every sync after
    /// the first returned at once, or hung.)
    sync_counts: Mutex<HashMap<NodeId, u64>>,
    /// Notification on each incoming sync request
    sync_notif: Notify,

    _p: PhantomData<P>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SyncRequest(NodeId);

impl<P: Protocol> SyncService<P> {
    pub fn new(node_state: Arc<RwLock<Option<NodeState>>>) -> Self {
        Self {
            node_state,
            sync_counts: Mutex::new(HashMap::new()),
            sync_notif: Notify::new(),
            _p: PhantomData,
        }
    }

    /// Counts a sync request from `peer`, returning how many it has made.
    fn add_syncing_peer(&self, peer: NodeId) -> u64 {
        let mut sync_counts = self.sync_counts.lock().unwrap();
        let count = sync_counts.entry(peer).or_default();
        *count += 1;
        *count
    }

    /// Sync with all peers.
    pub async fn sync(&self) {
        // we can't sync while we register
        let node_state = self.node_state.read().await;
        let node_state = node_state
            .as_ref()
            .expect("Trying to sync a node before having registered to the orchestrator");

        // this peer is syncing
        let round = self.add_syncing_peer(node_state.node_id);
        for (id, addr) in &node_state.nodes {
            if *id == node_state.node_id {
                continue;
            }

            let mut connection = P::Client::connect(addr.clone(), "sync")
                .await
                .expect("Couldn't connect to peer for sync");
            let msg = SyncRequest(node_state.node_id);
            let sync_bytes = rmp_serde::to_vec(&msg).unwrap();
            connection
                .send(Message::new(sync_bytes.into()))
                .await
                .expect("Peer closed connection unexpectedly");
        }
        loop {
            {
                let sync_counts = self.sync_counts.lock().unwrap();
                let all_synced = node_state
                    .nodes
                    .keys()
                    .all(|id| sync_counts.get(id).is_some_and(|count| *count >= round));
                if all_synced {
                    return;
                }
            }
            // Wait for the next sync to come in (a permit stored by `notify_one` if it came in
            // since the check above)
            self.sync_notif.notified().await
        }
    }

    pub async fn handle_sync_connection<C: CommunicationChannel>(&self, mut channel: C) {
        let msg = channel.recv().await.unwrap();
        let Some(msg) = msg else {
            return;
        };

        let msg = rmp_serde::from_slice::<SyncRequest>(&msg.data).unwrap();

        self.add_syncing_peer(msg.0);

        self.sync_notif.notify_one();
    }
}
