//! The process's pub/sub connection (one per runtime): a key's channel is subscribed only while
//! some flight of this process waits on it, and every message is handed to the listeners of its
//! channel.
//!
//! Subscriptions change through one ordered queue, served by a task that owns the connection's
//! sink, so an `UNSUBSCRIBE` left by a finished wait can never overtake the `SUBSCRIBE` of the
//! next. A listener is confirmed only after the queue has caught up with its subscription.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};

/// The waits on each subscribed channel, by listener id.
type Listeners = HashMap<String, Vec<(u64, mpsc::UnboundedSender<Vec<u8>>)>>;

pub(crate) struct Subscriber {
    listeners: Mutex<Listeners>,
    next_id: AtomicU64,
    control: mpsc::UnboundedSender<Control>,
    dead: AtomicBool,
    /// Dropped with the subscriber, which ends the task reading messages.
    _closed: oneshot::Sender<()>,
}

enum Control {
    Subscribe(String),
    Unsubscribe(String),
    /// Answered once every command queued before it has run: `true` if all went well.
    Confirm(oneshot::Sender<bool>),
}

impl Subscriber {
    /// Starts serving `pubsub` on the current runtime, subscribed to `invalidations`, whose
    /// messages drop this process's copies of invalidated keys.
    pub(crate) fn start(
        pubsub: redis::aio::PubSub,
        op_timeout: Duration,
        invalidations: String,
    ) -> Arc<Subscriber> {
        let (sink, mut stream) = pubsub.split();
        let (control, mut commands) = mpsc::unbounded_channel();
        let (closed_sender, mut closed) = oneshot::channel();
        let subscriber = Arc::new(Subscriber {
            listeners: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            control,
            dead: AtomicBool::new(false),
            _closed: closed_sender,
        });
        let _ = subscriber
            .control
            .send(Control::Subscribe(invalidations.clone()));

        let weak = Arc::downgrade(&subscriber);
        tokio::spawn(async move {
            let mut sink = sink;
            let mut healthy = true;
            while let Some(command) = commands.recv().await {
                let outcome = match command {
                    Control::Subscribe(channel) if healthy => {
                        tokio::time::timeout(op_timeout, sink.subscribe(channel)).await
                    }
                    Control::Unsubscribe(channel) if healthy => {
                        tokio::time::timeout(op_timeout, sink.unsubscribe(channel)).await
                    }
                    Control::Confirm(answer) => {
                        let _ = answer.send(healthy);
                        continue;
                    }
                    Control::Subscribe(_) | Control::Unsubscribe(_) => continue,
                };
                if !matches!(outcome, Ok(Ok(()))) {
                    healthy = false;
                    mark_dead(&weak);
                }
            }
        });

        let weak = Arc::downgrade(&subscriber);
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = stream.next() => message,
                    _ = &mut closed => return,
                };
                let Some(message) = message else { break };
                let channel = message.get_channel_name();
                if channel == invalidations {
                    crate::redis::invalidate::on_message(message.get_payload_bytes());
                } else if let Some(subscriber) = weak.upgrade() {
                    subscriber.deliver(channel, message.get_payload_bytes());
                }
            }
            mark_dead(&weak);
        });
        subscriber
    }

    /// Whether the connection has failed, or the runtime that served it has shut down (its
    /// tasks are gone); a dead subscriber is replaced, not repaired.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.control.is_closed()
    }

    /// Subscribes to `channel` (if this process is not already) and returns a listener for it,
    /// once the subscription is in effect, or `None` if the connection failed or took longer
    /// than `wait`.
    pub(crate) async fn listen(
        self: &Arc<Self>,
        channel: &str,
        wait: Duration,
    ) -> Option<Listener> {
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
            let _ = self.control.send(Control::Confirm(confirm));
        }
        // Built before the wait, so that a failed or cancelled wait still unsubscribes.
        let listener = Listener {
            subscriber: self.clone(),
            channel: channel.to_owned(),
            id,
            messages,
        };
        match tokio::time::timeout(wait, confirmed).await {
            Ok(Ok(true)) => Some(listener),
            _ => None,
        }
    }

    fn deliver(&self, channel: &str, payload: &[u8]) {
        if let Some(waiting) = self.lock().get(channel) {
            for (_, sender) in waiting {
                let _ = sender.send(payload.to_vec());
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Listeners> {
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn mark_dead(subscriber: &Weak<Subscriber>) {
    if let Some(subscriber) = subscriber.upgrade() {
        subscriber.dead.store(true, Ordering::Release);
        // Dropping the senders ends every listener's wait at once.
        subscriber.lock().clear();
    }
}

/// One wait on a channel. Dropping it unsubscribes once no other wait needs the channel.
pub(crate) struct Listener {
    subscriber: Arc<Subscriber>,
    channel: String,
    id: u64,
    messages: mpsc::UnboundedReceiver<Vec<u8>>,
}

impl Listener {
    /// The next payload published on the channel, or `None` if the connection died.
    pub(crate) async fn next(&mut self) -> Option<Vec<u8>> {
        self.messages.recv().await
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut listeners = self.subscriber.lock();
        if let Some(waiting) = listeners.get_mut(&self.channel) {
            waiting.retain(|(id, _)| *id != self.id);
            if waiting.is_empty() {
                listeners.remove(&self.channel);
                let _ = self
                    .subscriber
                    .control
                    .send(Control::Unsubscribe(self.channel.clone()));
            }
        }
    }
}
