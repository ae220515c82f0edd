//! This process's pub/sub, one per runtime: the subscriber ([`Subscriber`], in `plain`), which
//! carries the invalidation feed and its heartbeats (one session at a time, in `session`: the
//! server, or on a cluster the master owning the feed's slot, found through the nodes known, in
//! `topology`) and, on a standalone server, the wake-ups of flights; and on a Redis Cluster of
//! Redis 7 or later the sharded subscriptions of wake-ups ([`Shards`], in `shards`).
//!
//! Both serve waits the same way ([`Waits`]): a key's channel is subscribed only while some
//! flight of this process waits on it, through one ordered queue of commands, so that an
//! `UNSUBSCRIBE` left by a finished wait can never overtake the `SUBSCRIBE` of the next; a
//! listener is confirmed only after the queue has caught up with its subscription, and every
//! message is handed to the listeners of its channel.

mod plain;
mod session;
mod settings;
mod shards;
mod topology;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// Why a subscription to a key's channel gave no listener.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Unheard {
    /// The pub/sub connection failed, or refused the subscription.
    Failed,
    /// The subscription was not confirmed within this wait (the connection may be fine).
    Unconfirmed(Duration),
}

pub(crate) use plain::Subscriber;
pub(crate) use settings::{ClusterFeed, FeedOwner, Settings};
pub(crate) use shards::Shards;
pub(crate) use topology::{Topology, master_slots};

/// The waits on each subscribed channel, by listener id.
type Listeners = HashMap<String, Vec<(u64, mpsc::UnboundedSender<Vec<u8>>)>>;

enum Control {
    Subscribe(String),
    Unsubscribe(String),
    /// Answered once every command queued before it has run: `true` if the channel's
    /// subscription is in effect (for the session: if a session ran them).
    Confirm(String, oneshot::Sender<bool>),
}

/// The waits of this process on wake-up channels, and the one ordered queue through which a
/// channel is subscribed while some wait needs it and unsubscribed when none does: an
/// `UNSUBSCRIBE` left by a finished wait can never overtake the `SUBSCRIBE` of the next.
struct Waits {
    listeners: Mutex<Listeners>,
    next_id: AtomicU64,
    control: mpsc::UnboundedSender<Control>,
}

impl Waits {
    fn new() -> (Arc<Waits>, mpsc::UnboundedReceiver<Control>) {
        let (control, commands) = mpsc::unbounded_channel();
        let waits = Arc::new(Waits {
            listeners: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            control,
        });
        (waits, commands)
    }

    /// Subscribes to `channel` (if this process is not already) and returns a listener for it,
    /// once the subscription is in effect, or `None` if it was not within `wait`.
    async fn listen(self: &Arc<Self>, channel: &str, wait: Duration) -> Result<Listener, Unheard> {
        let (sender, messages) = mpsc::unbounded_channel();
        let (confirm, confirmed) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut listeners = self.lock();
            let waiting = listeners.entry(channel.to_owned()).or_default();
            if waiting.is_empty() {
                let _ = self.control.send(Control::Subscribe(channel.to_owned()));
            }
            waiting.push((id, sender));
            let _ = self
                .control
                .send(Control::Confirm(channel.to_owned(), confirm));
        }
        // Built before the wait, so that a failed or cancelled wait still unsubscribes.
        let listener = Listener {
            waits: self.clone(),
            channel: channel.to_owned(),
            id,
            messages,
        };
        match tokio::time::timeout(wait, confirmed).await {
            Ok(Ok(true)) => Ok(listener),
            Ok(_) => Err(Unheard::Failed),
            Err(_) => Err(Unheard::Unconfirmed(wait)),
        }
    }

    fn deliver(&self, channel: &[u8], payload: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        if let Some(waiting) = self.lock().get(channel) {
            for (_, sender) in waiting {
                let _ = sender.send(payload.to_vec());
            }
        }
    }

    fn is_listened(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// Ends every wait on `channel`: their listeners hear `None` and read again.
    fn end(&self, channel: &str) {
        // Dropping the senders ends the waits at once.
        self.lock().remove(channel);
    }

    /// Ends every wait; returns the channels they waited on.
    fn end_all(&self) -> Vec<String> {
        self.lock().drain().map(|(channel, _)| channel).collect()
    }

    fn channels(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, Listeners> {
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One wait on a channel. Dropping it unsubscribes once no other wait needs the channel.
pub(crate) struct Listener {
    waits: Arc<Waits>,
    channel: String,
    id: u64,
    messages: mpsc::UnboundedReceiver<Vec<u8>>,
}

impl Listener {
    /// The next payload published on the channel, or `None` if the connection was lost.
    pub(crate) async fn next(&mut self) -> Option<Vec<u8>> {
        self.messages.recv().await
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut listeners = self.waits.lock();
        if let Some(waiting) = listeners.get_mut(&self.channel) {
            waiting.retain(|(id, _)| *id != self.id);
            if waiting.is_empty() {
                listeners.remove(&self.channel);
                let _ = self
                    .waits
                    .control
                    .send(Control::Unsubscribe(self.channel.clone()));
            }
        }
    }
}
