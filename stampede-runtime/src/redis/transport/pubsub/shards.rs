//! Sharded pub/sub on a Redis Cluster: the wake-ups of flights, on the shard that owns a key.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;

use super::{Control, Listener, Unheard, Waits};
use crate::redis::transport::tls::{self, Tls};

/// The wake-ups of flights on a Redis Cluster: sharded pub/sub, so that a fill's `SPUBLISH`
/// goes to the shard owning the key's slot (its master and that master's replicas) instead of
/// being carried to every node.
///
/// It owns a RESP3 cluster connection of its own, whose push messages it reads: `SSUBSCRIBE`
/// of a key's channel is routed by the channel's slot (the key's hash tag) to the master that
/// owns it, and is in effect once that master confirmed it. As for plain pub/sub, a channel is
/// subscribed only while some flight of this process waits on it, through one ordered queue.
/// The invalidation feed and the heartbeats are the [`Subscriber`](super::Subscriber)'s: one
/// session of its own on the master owning the feed's slot, where every process publishes them
/// (see `invalidate`).
///
/// A wake-up can be missed while a node's connection is down or a slot changes hands; every
/// wait that could have missed one ends then, and its flow reads the key again (and listens
/// again if the lock is still held), as it does when a plain session is lost:
///
/// - the connection to a node is lost (the crate's disconnection push): every wait ends. The
///   crate reconnects and subscribes the node's channels again; those no wait needs any more
///   are unsubscribed through the queue;
/// - a node drops a channel itself (an `sunsubscribe` this process did not ask for: the slot
///   moved to another master): the waits on that channel end; the flows' next `SSUBSCRIBE`
///   goes to the new owner.
///
/// No channel stays subscribed once no one waits on it: a subscription that could not be
/// removed (its node down) is tried again every `retry_every`, and one that the crate restores
/// after a reconnection or a topology change (its `ssubscribe` push) is removed again unless a
/// wait needs it.
pub(crate) struct Shards {
    waits: Arc<Waits>,
    /// Dropped with the shards, which ends their task and closes the connection.
    _closed: oneshot::Sender<()>,
}

/// What the task of [`Shards`] knows of the subscriptions.
#[derive(Default)]
struct ShardState {
    /// Channels whose `SSUBSCRIBE` was confirmed and not undone since.
    subscribed: HashSet<String>,
    /// `SUNSUBSCRIBE`s of this process whose confirmation was not heard yet, by channel: an
    /// `sunsubscribe` push beyond these is the server's own.
    unsubscribing: HashMap<String, u32>,
    /// Channels to unsubscribe again (a failed `SUNSUBSCRIBE`, or an `SSUBSCRIBE` that may
    /// have taken effect after it timed out).
    retry: HashSet<String>,
}

impl Shards {
    /// Connects to the cluster whose nodes are `nodes` (RESP3, with a push sender) and starts
    /// serving subscriptions on the current runtime.
    pub(crate) async fn open(
        nodes: &[redis::Client],
        tls: &Tls,
        connect_timeout: Duration,
        op_timeout: Duration,
        retry_every: Duration,
    ) -> Result<Arc<Shards>, redis::RedisError> {
        let (pushed, pushes) = mpsc::unbounded_channel();
        let client = tls::cluster_builder(nodes, tls)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushed)
            .connection_timeout(connect_timeout)
            .response_timeout(op_timeout)
            .build()?;
        let connection = client.get_async_connection().await?;
        let (waits, commands) = Waits::new();
        let (closed_sender, closed) = oneshot::channel();
        let task = ShardTask {
            connection,
            waits: Arc::downgrade(&waits),
            commands,
            pushes,
            closed,
            op_timeout,
            retry_every,
        };
        tokio::spawn(task.serve());
        Ok(Arc::new(Shards {
            waits,
            _closed: closed_sender,
        }))
    }

    /// Subscribes to `channel` on the master owning its slot and returns a listener for it once
    /// the subscription is in effect, or `None` if it was not within `wait`.
    pub(crate) async fn listen(&self, channel: &str, wait: Duration) -> Result<Listener, Unheard> {
        self.waits.listen(channel, wait).await
    }

    /// Whether its task is gone (its runtime shut down).
    pub(crate) fn is_dead(&self) -> bool {
        self.waits.control.is_closed()
    }
}

/// The task of [`Shards`]: its connection, the queue of subscriptions and the connection's push
/// messages.
struct ShardTask {
    connection: redis::cluster_async::ClusterConnection,
    waits: Weak<Waits>,
    commands: mpsc::UnboundedReceiver<Control>,
    pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    /// Closed when the [`Shards`] are dropped.
    closed: oneshot::Receiver<()>,
    op_timeout: Duration,
    /// How often subscriptions that could not be removed are tried again.
    retry_every: Duration,
}

impl ShardTask {
    /// Serves the queue and the push messages until the [`Shards`] are dropped.
    async fn serve(mut self) {
        let mut state = ShardState::default();
        let mut ticks = tokio::time::interval(self.retry_every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = &mut self.closed => return,
                push = self.pushes.recv() => {
                    let (Some(push), Some(waits)) = (push, self.waits.upgrade()) else {
                        return;
                    };
                    state.heard(push, &waits);
                }
                command = self.commands.recv() => {
                    let (Some(command), Some(waits)) = (command, self.waits.upgrade()) else {
                        return;
                    };
                    self.run(command, &mut state, &waits).await;
                }
                _ = ticks.tick() => {
                    let Some(waits) = self.waits.upgrade() else {
                        return;
                    };
                    for channel in std::mem::take(&mut state.retry) {
                        if !waits.is_listened(&channel) {
                            state.unsubscribe(&mut self.connection, channel, self.op_timeout).await;
                        }
                    }
                }
            }
        }
    }

    /// Runs one command of the queue.
    async fn run(&mut self, command: Control, state: &mut ShardState, waits: &Waits) {
        let op_timeout = self.op_timeout;
        match command {
            Control::Subscribe(channel) => {
                let subscribed =
                    tokio::time::timeout(op_timeout, self.connection.ssubscribe(&channel)).await;
                if matches!(subscribed, Ok(Ok(()))) {
                    state.retry.remove(&channel);
                    state.subscribed.insert(channel);
                } else {
                    // Not in effect: the waits end now (their confirmation says no).
                    waits.end(&channel);
                    state.retry.insert(channel);
                }
            }
            Control::Unsubscribe(channel) => {
                // A wait that came meanwhile keeps it (its `SSUBSCRIBE` follows).
                if !waits.is_listened(&channel) {
                    state
                        .unsubscribe(&mut self.connection, channel, op_timeout)
                        .await;
                }
            }
            Control::Confirm(channel, answer) => {
                let _ = answer.send(state.subscribed.contains(&channel));
            }
        }
    }
}

impl ShardState {
    /// Handles a push message of the cluster connection.
    fn heard(&mut self, push: redis::PushInfo, waits: &Waits) {
        match push.kind {
            redis::PushKind::SMessage => {
                if let [
                    redis::Value::BulkString(channel),
                    redis::Value::BulkString(payload),
                ] = &push.data[..]
                {
                    waits.deliver(channel, payload);
                }
            }
            redis::PushKind::Disconnection => {
                // A node's connection was lost: what it published meanwhile was missed.
                for channel in waits.end_all() {
                    self.subscribed.remove(&channel);
                    let _ = waits.control.send(Control::Unsubscribe(channel));
                }
            }
            redis::PushKind::SSubscribe => {
                // The crate subscribes again, after a reconnection or a topology change, every
                // channel it tracked then; one that no wait needs any more is undone.
                if let Some(channel) = channel_of(&push)
                    && !waits.is_listened(&channel)
                {
                    let _ = waits.control.send(Control::Unsubscribe(channel));
                }
            }
            redis::PushKind::SUnsubscribe => {
                let Some(channel) = channel_of(&push) else {
                    return;
                };
                if let Some(pending) = self.unsubscribing.get_mut(&channel) {
                    *pending -= 1;
                    if *pending == 0 {
                        self.unsubscribing.remove(&channel);
                    }
                } else if self.subscribed.remove(&channel) {
                    // The server dropped it (its slot moved): gone from the crate's
                    // subscriptions too, so nothing is left to unsubscribe.
                    waits.end(&channel);
                }
            }
            _ => {}
        }
    }

    /// Runs `SUNSUBSCRIBE channel`; on failure it is tried again later.
    async fn unsubscribe(
        &mut self,
        connection: &mut redis::cluster_async::ClusterConnection,
        channel: String,
        op_timeout: Duration,
    ) {
        self.subscribed.remove(&channel);
        *self.unsubscribing.entry(channel.clone()).or_default() += 1;
        let unsubscribed =
            tokio::time::timeout(op_timeout, connection.sunsubscribe(&channel)).await;
        if !matches!(unsubscribed, Ok(Ok(()))) {
            if let Some(pending) = self.unsubscribing.get_mut(&channel) {
                *pending -= 1;
                if *pending == 0 {
                    self.unsubscribing.remove(&channel);
                }
            }
            self.retry.insert(channel);
        }
    }
}

/// The channel a subscription push is about.
fn channel_of(push: &redis::PushInfo) -> Option<String> {
    match push.data.first() {
        Some(redis::Value::BulkString(channel)) => String::from_utf8(channel.clone()).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    fn bulk(text: &str) -> redis::Value {
        redis::Value::BulkString(text.as_bytes().to_vec())
    }

    fn push(kind: redis::PushKind, data: Vec<redis::Value>) -> redis::PushInfo {
        redis::PushInfo { kind, data }
    }

    /// A wait on `channel`, registered as `Waits::listen` does (without its confirmation).
    fn wait_on(waits: &Waits, channel: &str) -> mpsc::UnboundedReceiver<Vec<u8>> {
        let (sender, messages) = mpsc::unbounded_channel();
        let id = waits.next_id.fetch_add(1, Ordering::Relaxed);
        waits
            .lock()
            .entry(channel.to_owned())
            .or_default()
            .push((id, sender));
        messages
    }

    fn queued(commands: &mut mpsc::UnboundedReceiver<Control>) -> Vec<String> {
        let mut unsubscribed = Vec::new();
        while let Ok(command) = commands.try_recv() {
            match command {
                Control::Unsubscribe(channel) => unsubscribed.push(channel),
                Control::Subscribe(_) | Control::Confirm(..) => panic!("only unsubscriptions"),
            }
        }
        unsubscribed
    }

    #[test]
    fn a_sharded_message_reaches_the_waits_on_its_channel_only() {
        let (waits, _commands) = Waits::new();
        let mut state = ShardState::default();
        let mut a = wait_on(&waits, "a");
        let mut b = wait_on(&waits, "b");
        state.heard(
            push(redis::PushKind::SMessage, vec![bulk("a"), bulk("filled")]),
            &waits,
        );
        assert_eq!(a.try_recv().unwrap(), b"filled");
        assert!(b.try_recv().is_err());
    }

    #[test]
    fn a_lost_node_connection_ends_every_wait_and_unsubscribes_their_channels() {
        let (waits, mut commands) = Waits::new();
        let mut state = ShardState::default();
        let mut a = wait_on(&waits, "a");
        state.subscribed.insert("a".to_owned());
        state.heard(push(redis::PushKind::Disconnection, vec![]), &waits);
        assert!(
            matches!(a.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)),
            "the wait ended: its flow reads again"
        );
        assert!(!state.subscribed.contains("a"));
        assert_eq!(queued(&mut commands), ["a"]);
    }

    #[test]
    fn only_an_unsubscription_this_process_did_not_ask_for_ends_the_waits() {
        let (waits, mut commands) = Waits::new();
        let mut state = ShardState::default();
        let mut a = wait_on(&waits, "a");
        state.subscribed.insert("a".to_owned());
        // The confirmation of an earlier SUNSUBSCRIBE of this process: the new wait stays.
        state.unsubscribing.insert("a".to_owned(), 1);
        let confirmation = || {
            push(
                redis::PushKind::SUnsubscribe,
                vec![bulk("a"), redis::Value::Int(0)],
            )
        };
        state.heard(confirmation(), &waits);
        assert!(matches!(
            a.try_recv(),
            Err(mpsc::error::TryRecvError::Empty)
        ));
        assert!(state.unsubscribing.is_empty(), "no count left behind");
        // The server dropped the channel (its slot moved): the wait ends, nothing to undo.
        state.heard(confirmation(), &waits);
        assert!(matches!(
            a.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
        assert!(!state.subscribed.contains("a"));
        assert!(queued(&mut commands).is_empty());
    }

    #[test]
    fn a_subscription_restored_by_the_client_is_undone_unless_a_wait_needs_it() {
        let (waits, mut commands) = Waits::new();
        let mut state = ShardState::default();
        let _a = wait_on(&waits, "a");
        for channel in ["a", "stale"] {
            state.heard(
                push(
                    redis::PushKind::SSubscribe,
                    vec![bulk(channel), redis::Value::Int(1)],
                ),
                &waits,
            );
        }
        assert_eq!(queued(&mut commands), ["stale"]);
    }
}
