//! `list_changed` notifications after a snapshot swap, in both protocol
//! eras: a legacy (2025-11-25 and older) session gets them on its peer from
//! the moment it is initialized, a 2026-07-28 client on the
//! `subscriptions/listen` stream it opened. Only a swap that changed what
//! clients see wakes anyone ([`super::snapshot::SnapshotCell::replace`]),
//! so an unchanged rebuild sends nothing.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::SubscriptionFilter;
use rmcp::service::SubscriptionContext;
use rmcp::{ErrorData as McpError, Peer, RoleServer};

use super::state::ServerState;

/// How often a legacy follower with nothing to send checks whether its
/// session is gone. rmcp's peer has no "closed" future; without this a
/// session that ended between two swaps would hold its follower until the
/// next swap.
const CLOSED_CHECK: Duration = Duration::from_secs(30);

/// The categories this server announces and accepts on a listen stream.
pub fn offered() -> SubscriptionFilter {
    SubscriptionFilter::builder().tools_list_changed().prompts_list_changed().resources_list_changed().build()
}

/// What a `subscriptions/listen` request may have of [`offered`].
pub fn accepted(requested: &SubscriptionFilter) -> SubscriptionFilter {
    requested.intersection(&offered())
}

/// Follow the snapshot for one legacy session: every change that matters
/// becomes tools/prompts/resources `list_changed` on its peer, until the
/// session is gone.
pub fn follow_legacy(state: Arc<ServerState>, peer: Peer<RoleServer>) {
    let mut changes = state.snapshots.subscribe();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CLOSED_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let sent = async {
                        peer.notify_tool_list_changed().await?;
                        peer.notify_prompt_list_changed().await?;
                        peer.notify_resource_list_changed().await
                    };
                    if let Err(err) = sent.await {
                        tracing::debug!(%err, "session gone; stopping its list_changed follower");
                        return;
                    }
                }
                _ = tick.tick() => {
                    if peer.is_transport_closed() {
                        return;
                    }
                }
            }
        }
    });
}

/// Serve one `subscriptions/listen` stream until the client cancels it.
pub async fn listen(state: Arc<ServerState>, context: SubscriptionContext) -> Result<(), McpError> {
    let mut changes = state.snapshots.subscribe();
    let accepted = context.accepted().clone();
    loop {
        tokio::select! {
            _ = context.cancelled() => return Ok(()),
            changed = changes.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let sink = context.sink();
                let sent = async {
                    if accepted.tools_list_changed == Some(true) {
                        sink.notify_tool_list_changed().await?;
                    }
                    if accepted.prompts_list_changed == Some(true) {
                        sink.notify_prompt_list_changed().await?;
                    }
                    if accepted.resources_list_changed == Some(true) {
                        sink.notify_resource_list_changed().await?;
                    }
                    Ok::<(), rmcp::service::SubscriptionSendError>(())
                };
                if let Err(err) = sent.await {
                    tracing::debug!(%err, "listen stream closed");
                    return Ok(());
                }
            }
        }
    }
}
