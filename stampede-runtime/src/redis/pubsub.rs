//! The process's pub/sub connection (one per runtime). It carries the invalidation feed (every
//! invalidation any process announces drops the key from this process's memory) and, on a
//! standalone server, the wake-ups of flights: a key's channel is subscribed only while some
//! flight of this process waits on it, and every message is handed to the listeners of its
//! channel. On a cluster the wake-ups go through sharded pub/sub instead ([`Shards`]).
//!
//! A supervisor task owns the connection and replaces it in the background, with backoff, when
//! it is lost: its stream ends (the server closed it, `CLIENT KILL`), a subscription command
//! fails, or the heartbeat stops coming back. Every `heartbeat` it publishes a token on a channel
//! of its own through the command connection. Redis delivers a subscriber's messages in the order
//! it ran their `PUBLISH`es, so hearing a token sent at `s` proves that every invalidation Redis
//! ran before `s` has been handled here.
//!
//! # A lost invalidation is never silent
//!
//! `verified` is when the last token heard was sent (or when the session's `SUBSCRIBE` was). The
//! feed is *live* while a session is up and `now < verified + bound`, where
//! `bound = 2 × heartbeat + op_timeout` ([`RedisConfig::heartbeat`]). When the deadline passes or
//! the session ends, the feed is lost: the memory of every Redis-backed cache of the process is
//! dropped at once, and again when a new session is up; meanwhile values read from Redis are kept
//! no longer than `bound` (`Connection::memory_trusted_for`). An invalidation that Redis ran at
//! `t` and that this process missed ran after the last token heard was sent, so the loss is
//! noticed before `t + bound`: **a process serves a value from memory at most
//! `2 × heartbeat + op_timeout` after an invalidation it missed** (2.25 s with the defaults),
//! plus however late its runtime runs the supervisor.
//!
//! Subscriptions change through one ordered queue, served by the supervisor, so an `UNSUBSCRIBE`
//! left by a finished wait can never overtake the `SUBSCRIBE` of the next. A listener is
//! confirmed only after the queue has caught up with its subscription; a lost session ends every
//! listener's wait (a fill may have been missed) and the next session subscribes the channels
//! still listened to.
//!
//! [`RedisConfig::heartbeat`]: crate::RedisConfig::heartbeat

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::entry::after;
use crate::redis::connection::Connection;
use crate::redis::invalidate;

/// The first pause before opening a session again; doubled per failed attempt up to the most.
const BACKOFF_LEAST: Duration = Duration::from_millis(20);
const BACKOFF_MOST: Duration = Duration::from_secs(2);

/// The waits on each subscribed channel, by listener id.
type Listeners = HashMap<String, Vec<(u64, mpsc::UnboundedSender<Vec<u8>>)>>;

/// What the supervisor needs to open sessions and check them.
pub(crate) struct Settings {
    /// The nodes to subscribe on, tried in turn: on a cluster a plain `PUBLISH` reaches the
    /// subscribers of every node, so any one will do, and a session lost with its node is opened
    /// again on the next.
    pub(crate) nodes: Vec<redis::Client>,
    pub(crate) invalidations: String,
    /// This subscriber's own heartbeat channel.
    pub(crate) heartbeats: String,
    pub(crate) heartbeat: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// How long after the last token heard was sent the feed stays live.
    pub(crate) bound: Duration,
    /// Publishes the heartbeats, and hears of the feed being lost and back.
    pub(crate) connection: Weak<Connection>,
}

pub(crate) struct Subscriber {
    /// The wake-ups on a standalone server (on a cluster, [`Shards`] has them).
    waits: Arc<Waits>,
    feed: Mutex<Feed>,
    /// Whether a session is up, for the first link's setup to wait on.
    up: watch::Sender<bool>,
    bound: Duration,
    /// Dropped with the subscriber, which ends the supervisor.
    _closed: oneshot::Sender<()>,
}

/// What is known of the invalidation feed.
#[derive(Default)]
struct Feed {
    up: bool,
    verified: Option<Instant>,
    /// Heartbeat tokens of this session not heard yet, with when they were sent.
    sent: BTreeMap<u64, Instant>,
    next_token: u64,
    /// A session was up before: the next one to come up is a recovery.
    was_up: bool,
}

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
    async fn listen(self: &Arc<Self>, channel: &str, wait: Duration) -> Option<Listener> {
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
            Ok(Ok(true)) => Some(listener),
            _ => None,
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

impl Subscriber {
    /// Starts the supervisor on the current runtime; it opens the first session at once.
    pub(crate) fn start(settings: Settings) -> Arc<Subscriber> {
        let (waits, commands) = Waits::new();
        let (closed_sender, closed) = oneshot::channel();
        let subscriber = Arc::new(Subscriber {
            waits,
            feed: Mutex::new(Feed::default()),
            up: watch::channel(false).0,
            bound: settings.bound,
            _closed: closed_sender,
        });
        tokio::spawn(supervise(
            Arc::downgrade(&subscriber),
            settings,
            commands,
            closed,
        ));
        subscriber
    }

    /// Waits until a session is up; the caller bounds the wait.
    pub(crate) async fn wait_up(&self) {
        let mut up = self.up.subscribe();
        let _ = up.wait_for(|up| *up).await;
    }

    /// Whether the supervisor is gone (its runtime shut down): the subscriber is replaced.
    pub(crate) fn is_dead(&self) -> bool {
        self.waits.control.is_closed()
    }

    /// Whether every invalidation announced up to `bound` ago is known to have reached this
    /// process.
    pub(crate) fn is_live(&self, now: Instant) -> bool {
        let feed = self.feed();
        feed.up
            && feed
                .verified
                .is_some_and(|verified| now < after(verified, self.bound))
    }

    /// Subscribes to `channel` (plain pub/sub, on the session's node) and returns a listener for
    /// it once the subscription is in effect, or `None` if no session ran it within `wait`.
    pub(crate) async fn listen(&self, channel: &str, wait: Duration) -> Option<Listener> {
        self.waits.listen(channel, wait).await
    }

    /// When the feed stops being live unless a newer token is heard.
    fn deadline(&self) -> Instant {
        let verified = self.feed().verified.unwrap_or_else(Instant::now);
        after(verified, self.bound)
    }

    /// Publishes the next heartbeat token from a task of its own, unless the last one is still
    /// being published.
    fn beat(&self, settings: &Settings, publishing: &Arc<AtomicBool>) {
        if publishing.swap(true, Ordering::AcqRel) {
            return;
        }
        let token = {
            let mut feed = self.feed();
            let now = Instant::now();
            // A token sent longer than the bound ago proves nothing any more.
            feed.sent
                .retain(|_, sent| now.saturating_duration_since(*sent) < self.bound);
            let token = feed.next_token;
            feed.next_token += 1;
            feed.sent.insert(token, now);
            token
        };
        let connection = settings.connection.clone();
        let channel = settings.heartbeats.clone();
        let publishing = publishing.clone();
        tokio::spawn(async move {
            if let Some(connection) = connection.upgrade() {
                connection.heartbeat(&channel, token).await;
            }
            publishing.store(false, Ordering::Release);
        });
    }

    /// A heartbeat token came back: everything published before it was sent has been handled.
    fn heard(&self, payload: &[u8]) {
        let Some(token) = std::str::from_utf8(payload)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
        else {
            return;
        };
        let mut feed = self.feed();
        if let Some(sent) = feed.sent.get(&token).copied() {
            feed.sent.retain(|other, _| *other > token);
            feed.verified = Some(feed.verified.map_or(sent, |verified| verified.max(sent)));
        }
    }

    /// A session is up, subscribed since `sent`. Returns whether it replaces a lost one.
    fn went_up(&self, sent: Instant) -> bool {
        let recovered = {
            let mut feed = self.feed();
            feed.up = true;
            feed.verified = Some(sent);
            feed.sent.clear();
            std::mem::replace(&mut feed.was_up, true)
        };
        self.up.send_replace(true);
        recovered
    }

    /// The session is lost: no longer live, and every wait ends (a fill may have been missed).
    fn went_down(&self) {
        self.feed().up = false;
        self.up.send_replace(false);
        // The session's subscriptions are gone with it.
        self.waits.end_all();
    }

    fn feed(&self) -> MutexGuard<'_, Feed> {
        self.feed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Opens sessions one after another until the subscriber is dropped.
async fn supervise(
    subscriber: Weak<Subscriber>,
    settings: Settings,
    mut commands: mpsc::UnboundedReceiver<Control>,
    mut closed: oneshot::Receiver<()>,
) {
    let mut backoff = BACKOFF_LEAST;
    let mut attempt = 0_usize;
    loop {
        let node = &settings.nodes[attempt % settings.nodes.len().max(1)];
        attempt = attempt.wrapping_add(1);
        let opened = tokio::select! {
            biased;
            _ = &mut closed => return,
            opened = tokio::time::timeout(settings.connect_timeout, open(node, &subscriber, &settings)) => opened,
        };
        if let Ok(Some(session)) = opened {
            backoff = BACKOFF_LEAST;
            let Some(subscriber_now) = subscriber.upgrade() else {
                return;
            };
            if subscriber_now.went_up(session.sent) {
                // Invalidations announced while no session was up were missed.
                invalidate::forget_all();
                if let Some(connection) = settings.connection.upgrade() {
                    connection.feed_restored();
                }
            }
            drop(subscriber_now);
            let Some(reason) = session
                .run(&subscriber, &settings, &mut commands, &mut closed)
                .await
            else {
                return;
            };
            let Some(subscriber_now) = subscriber.upgrade() else {
                return;
            };
            // Not live first, then forget: a flow that keeps a value after this caps it.
            subscriber_now.went_down();
            invalidate::forget_all();
            if let Some(connection) = settings.connection.upgrade() {
                connection.feed_lost(reason);
            }
        }
        // Pause before the next attempt; no subscription is in effect meanwhile.
        let pause = tokio::time::sleep(backoff.mul_f64(rand::random_range(0.5..1.5)));
        tokio::pin!(pause);
        backoff = backoff.saturating_mul(2).min(BACKOFF_MOST);
        loop {
            tokio::select! {
                biased;
                _ = &mut closed => return,
                () = &mut pause => break,
                command = commands.recv() => match command {
                    None => return,
                    Some(Control::Confirm(_, answer)) => {
                        let _ = answer.send(false);
                    }
                    Some(Control::Subscribe(_) | Control::Unsubscribe(_)) => {}
                },
            }
        }
    }
}

/// One pub/sub connection, subscribed to the feed, the heartbeats and the channels listened to.
struct Session {
    sink: PubSubSink,
    stream: PubSubStream,
    /// When the feed's `SUBSCRIBE` was sent.
    sent: Instant,
}

async fn open(
    node: &redis::Client,
    subscriber: &Weak<Subscriber>,
    settings: &Settings,
) -> Option<Session> {
    let pubsub = match node.get_async_pubsub().await {
        Ok(pubsub) => pubsub,
        Err(error) => {
            tracing::debug!(%error, "stampede: cannot open the Redis pub/sub connection");
            return None;
        }
    };
    let (mut sink, stream) = pubsub.split();
    let sent = Instant::now();
    let feed = [
        settings.invalidations.as_str(),
        settings.heartbeats.as_str(),
    ];
    sink.subscribe(&feed[..]).await.ok()?;
    let channels = subscriber.upgrade()?.waits.channels();
    if !channels.is_empty() {
        sink.subscribe(&channels).await.ok()?;
    }
    Some(Session { sink, stream, sent })
}

impl Session {
    /// Serves the session until it is lost (`Some(why)`) or the subscriber is dropped (`None`).
    async fn run(
        mut self,
        subscriber: &Weak<Subscriber>,
        settings: &Settings,
        commands: &mut mpsc::UnboundedReceiver<Control>,
        closed: &mut oneshot::Receiver<()>,
    ) -> Option<&'static str> {
        let mut ticks = tokio::time::interval(settings.heartbeat);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let publishing = Arc::new(AtomicBool::new(false));
        loop {
            let deadline = subscriber.upgrade()?.deadline();
            tokio::select! {
                biased;
                _ = &mut *closed => return None,
                message = self.stream.next() => {
                    let Some(message) = message else {
                        return Some("the connection closed");
                    };
                    let channel = message.get_channel_name();
                    let payload = message.get_payload_bytes();
                    if channel == settings.invalidations {
                        invalidate::on_message(payload);
                    } else if channel == settings.heartbeats {
                        subscriber.upgrade()?.heard(payload);
                    } else {
                        subscriber.upgrade()?.waits.deliver(channel.as_bytes(), payload);
                    }
                }
                command = commands.recv() => {
                    let timeout = settings.op_timeout;
                    let outcome = match command? {
                        Control::Subscribe(channel) => {
                            tokio::time::timeout(timeout, self.sink.subscribe(channel)).await
                        }
                        Control::Unsubscribe(channel) => {
                            tokio::time::timeout(timeout, self.sink.unsubscribe(channel)).await
                        }
                        Control::Confirm(_, answer) => {
                            let _ = answer.send(true);
                            continue;
                        }
                    };
                    if !matches!(outcome, Ok(Ok(()))) {
                        return Some("a subscription failed");
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Some("the heartbeat did not come back");
                }
                _ = ticks.tick() => subscriber.upgrade()?.beat(settings, &publishing),
            }
        }
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

/// The wake-ups of flights on a Redis Cluster: sharded pub/sub, so that a fill's `SPUBLISH`
/// goes to the shard owning the key's slot (its master and that master's replicas) instead of
/// being carried to every node.
///
/// It owns a RESP3 cluster connection of its own, whose push messages it reads: `SSUBSCRIBE`
/// of a key's channel is routed by the channel's slot (the key's hash tag) to the master that
/// owns it, and is in effect once that master confirmed it. As for plain pub/sub, a channel is
/// subscribed only while some flight of this process waits on it, through one ordered queue.
/// The invalidation feed and the heartbeats stay on the [`Subscriber`]'s plain session: an
/// invalidation must reach every process, wherever it subscribed.
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
        connect_timeout: Duration,
        op_timeout: Duration,
        retry_every: Duration,
    ) -> Result<Arc<Shards>, redis::RedisError> {
        let (pushed, pushes) = mpsc::unbounded_channel();
        let client = redis::cluster::ClusterClientBuilder::new(
            nodes.iter().map(|node| node.get_connection_info().clone()),
        )
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushed)
        .connection_timeout(connect_timeout)
        .response_timeout(op_timeout)
        .build()?;
        let connection = client.get_async_connection().await?;
        let (waits, commands) = Waits::new();
        let (closed_sender, closed) = oneshot::channel();
        tokio::spawn(serve_shards(
            connection,
            Arc::downgrade(&waits),
            commands,
            pushes,
            closed,
            (op_timeout, retry_every),
        ));
        Ok(Arc::new(Shards {
            waits,
            _closed: closed_sender,
        }))
    }

    /// Subscribes to `channel` on the master owning its slot and returns a listener for it once
    /// the subscription is in effect, or `None` if it was not within `wait`.
    pub(crate) async fn listen(&self, channel: &str, wait: Duration) -> Option<Listener> {
        self.waits.listen(channel, wait).await
    }

    /// Whether its task is gone (its runtime shut down).
    pub(crate) fn is_dead(&self) -> bool {
        self.waits.control.is_closed()
    }
}

/// Serves the queue of [`Shards`] and the push messages of its connection until it is dropped.
async fn serve_shards(
    mut connection: redis::cluster_async::ClusterConnection,
    waits: Weak<Waits>,
    mut commands: mpsc::UnboundedReceiver<Control>,
    mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    mut closed: oneshot::Receiver<()>,
    (op_timeout, retry_every): (Duration, Duration),
) {
    let mut state = ShardState::default();
    let mut ticks = tokio::time::interval(retry_every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = &mut closed => return,
            push = pushes.recv() => {
                let (Some(push), Some(waits)) = (push, waits.upgrade()) else {
                    return;
                };
                state.heard(push, &waits);
            }
            command = commands.recv() => {
                let (Some(command), Some(waits)) = (command, waits.upgrade()) else {
                    return;
                };
                match command {
                    Control::Subscribe(channel) => {
                        let subscribed =
                            tokio::time::timeout(op_timeout, connection.ssubscribe(&channel)).await;
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
                            state.unsubscribe(&mut connection, channel, op_timeout).await;
                        }
                    }
                    Control::Confirm(channel, answer) => {
                        let _ = answer.send(state.subscribed.contains(&channel));
                    }
                }
            }
            _ = ticks.tick() => {
                let Some(waits) = waits.upgrade() else {
                    return;
                };
                for channel in std::mem::take(&mut state.retry) {
                    if !waits.is_listened(&channel) {
                        state.unsubscribe(&mut connection, channel, op_timeout).await;
                    }
                }
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
