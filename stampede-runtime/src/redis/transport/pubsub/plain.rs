//! The process's pub/sub connection (one per runtime). It carries the invalidation feed (every
//! invalidation any process announces drops the key from this process's memory) and, on a
//! standalone server, the wake-ups of flights: a key's channel is subscribed only while some
//! flight of this process waits on it, and every message is handed to the listeners of its
//! channel. On a cluster the wake-ups go through sharded pub/sub instead ([`Shards`]).
//!
//! A supervisor task owns the connection (a [`Session`]: on a standalone server, the server; on
//! a cluster, the master owning the feed's slot, found through the cluster's topology) and
//! replaces it in the background, with backoff, when it is lost: its stream ends (the server
//! closed it, `CLIENT KILL`, the node died), a subscription command fails, the master drops the
//! feed's sharded subscription (its slot moved), or the heartbeat stops coming back. Every
//! `heartbeat` it publishes a token on a channel of its own through the command connection, the
//! way invalidations are published (see `invalidate`): on the one server, or on a cluster on the
//! feed's master, which the client routes the channel to. Redis delivers a subscriber's
//! messages in the order it ran their publications, so hearing a token sent at `s` proves that
//! every invalidation that server ran before `s` has been handled here; and every invalidation
//! of the feed is run there.
//!
//! [`Shards`]: super::Shards
//!
//! # A lost invalidation is never silent
//!
//! `verified` is when the last token heard was sent (or when the session's `SUBSCRIBE` was). The
//! feed is *live* while a session is up and `now < verified + bound`, where
//! `bound = 2 × heartbeat + op_timeout` ([`RedisConfig::heartbeat`]). When the deadline passes or
//! the session ends, however it ends (lost, the subscriber dropped, or its runtime shut down,
//! which drops the supervisor's task: caches live in statics, so their memory outlives the
//! runtime whose feed vouched for it), the feed is lost: the memory of every Redis-backed cache
//! of the process is dropped at once, and again when the next session of that Redis is up, in
//! this runtime or another (one that idles hears nothing either), before it counts as live;
//! meanwhile values read from Redis are kept no longer than `bound`
//! (`Endpoint::trusted_for`). With `trust_while_deaf`, that trust takes the place of `bound` in
//! what memory keeps once the feed is lost: what it held, up to the trust after the last token
//! heard was sent, and what it reads meanwhile, up to the trust after the read. An invalidation that Redis ran at
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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::session::{Heard, Session};
use super::settings::{FeedOwner, Settings};
use super::{Control, Listener, Unheard, Waits};
use crate::clock::after;
use crate::redis::transport::feed;
use crate::redis::transport::log::LogId;

/// The first pause before opening a session again; doubled per failed attempt up to the most.
const BACKOFF_LEAST: Duration = Duration::from_millis(20);
const BACKOFF_MOST: Duration = Duration::from_secs(2);

pub(crate) struct Subscriber {
    /// The wake-ups on a standalone server (on a cluster, [`Shards`](super::Shards) has them).
    waits: Arc<Waits>,
    feed: Mutex<Feed>,
    /// Whether a session is up, for the first link's setup to wait on.
    up: watch::Sender<bool>,
    bound: Duration,
    /// `Settings::trusted`.
    trusted: Duration,
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
    /// The session's server's run, if it told.
    run: Option<Arc<str>>,
    /// The latest token of this session heard.
    heard: Option<u64>,
    /// The log's last entry when each token of this session was published, as Redis answered
    /// the heartbeat, for the tokens not heard yet (a reply may come before or after its token).
    logged: BTreeMap<u64, LogId>,
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
            trusted: settings.trusted,
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
    /// it once the subscription is in effect, or why not (no session ran it within `wait`, or
    /// the session failed).
    pub(crate) async fn listen(&self, channel: &str, wait: Duration) -> Result<Listener, Unheard> {
        self.waits.listen(channel, wait).await
    }

    /// The channels listened to now, for a new session to subscribe.
    pub(super) fn listened(&self) -> Vec<String> {
        self.waits.channels()
    }

    /// When the feed stops being live unless a newer token is heard.
    fn deadline(&self) -> Instant {
        let verified = self.feed().verified.unwrap_or_else(Instant::now);
        after(verified, self.bound)
    }

    /// Until when what memory holds stays in service once the feed is lost: the trust while
    /// deaf after the last token heard was sent (an invalidation missed came after it).
    fn trusted_until(&self) -> Instant {
        let verified = self.feed().verified.unwrap_or_else(Instant::now);
        after(verified, self.trusted)
    }

    /// Publishes the next heartbeat token from a task of its own, unless the last one is still
    /// being published.
    fn beat(self: &Arc<Self>, settings: &Settings, publishing: &Arc<AtomicBool>) {
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
        let subscriber = Arc::downgrade(self);
        tokio::spawn(async move {
            if let Some(connection) = connection.upgrade() {
                let logged = connection.heartbeat(&channel, token).await;
                if let (Some(id), Some(subscriber)) = (logged, subscriber.upgrade()) {
                    subscriber.logged(token, id, connection.as_ref());
                }
            }
            publishing.store(false, Ordering::Release);
        });
    }

    /// Redis answered the heartbeat `token`: its log's last entry was `id` when the token was
    /// published, so once the token is heard, the log up to `id` has been handled here.
    fn logged(&self, token: u64, id: LogId, connection: &dyn FeedOwner) {
        let mut feed = self.feed();
        match feed.heard >= Some(token) {
            true => {
                if let Some(run) = &feed.run {
                    connection.heard_up_to(run, id);
                }
            }
            false => {
                feed.logged.insert(token, id);
            }
        }
    }

    /// A heartbeat token came back: everything published before it was sent has been handled.
    fn heard(&self, payload: &[u8], connection: &Weak<dyn FeedOwner>) {
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
        feed.heard = feed.heard.max(Some(token));
        let later = feed.logged.split_off(&token.saturating_add(1));
        let handled = std::mem::replace(&mut feed.logged, later)
            .into_values()
            .max();
        if let (Some(id), Some(run), Some(connection)) = (handled, &feed.run, connection.upgrade())
        {
            connection.heard_up_to(run, id);
        }
    }

    /// A session is up, subscribed since `sent`, on the server of run `run`.
    fn went_up(&self, sent: Instant, run: Option<Arc<str>>) {
        {
            let mut feed = self.feed();
            feed.up = true;
            feed.verified = Some(sent);
            feed.sent.clear();
            feed.run = run;
            feed.heard = None;
            feed.logged.clear();
        }
        self.up.send_replace(true);
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
        // Taken now: a channel listened to or dropped meanwhile has its command in the queue,
        // which the session serves once up.
        let Some(listened) = subscriber.upgrade().map(|subscriber| subscriber.listened()) else {
            return;
        };
        let opening = Session::open(&settings, attempt, &listened);
        attempt = attempt.wrapping_add(1);
        let opened = tokio::select! {
            biased;
            _ = &mut closed => return,
            opened = tokio::time::timeout(settings.connect_timeout, opening) => opened,
        };
        if let Ok(Some(mut session)) = opened {
            backoff = BACKOFF_LEAST;
            // A session of this Redis was up before (this subscriber's, or another runtime's,
            // which may be gone or idle): invalidations announced since it heard were missed.
            // They are read from the log, or when the log cannot tell, memory is dropped; either
            // before this session counts as live, which a new link waits for: no call is served
            // from that memory after it.
            let connection = settings.connection.upgrade();
            if connection
                .as_ref()
                .is_none_or(|connection| connection.feed_up())
            {
                recover(&mut session, &settings, connection.as_deref()).await;
            }
            drop(connection);
            session.up();
            let Some(subscriber_now) = subscriber.upgrade() else {
                return;
            };
            // From here on, however the session ends, it is a loss (see `Up`).
            let mut up = Up {
                subscriber: subscriber.clone(),
                connection: settings.connection.clone(),
                lost: None,
            };
            subscriber_now.went_up(session.sent, session.run.clone());
            drop(subscriber_now);
            let Some(reason) =
                run(session, &subscriber, &settings, &mut commands, &mut closed).await
            else {
                return;
            };
            up.lost = Some(reason);
            drop(up);
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

/// A session that is up. Dropped when the session ends, however it ends: lost (`lost` says
/// why), the subscriber dropped, or the supervisor's task dropped with its runtime, which hears
/// nothing more and never will. Every way, the feed is no longer live and the memory it vouched
/// for is dropped; and the next session of this Redis, in any runtime, is a recovery.
struct Up {
    subscriber: Weak<Subscriber>,
    connection: Weak<dyn FeedOwner>,
    lost: Option<&'static str>,
}

impl Drop for Up {
    fn drop(&mut self) {
        // Not live first, then forget: a flow that keeps a value after this caps it. A lost
        // session's feed vouches for what it held until the trust while deaf after the last
        // heartbeat heard was sent (an invalidation missed was announced after it; by default
        // the deadline it would have been lost at), and the next session reads the log; a feed that ended with its runtime or subscriber
        // vouches for nothing more: no session of it follows to hear what comes next.
        let until = match self.subscriber.upgrade() {
            Some(subscriber) => {
                subscriber.went_down();
                match self.lost {
                    Some(_) => subscriber.trusted_until(),
                    None => Instant::now(),
                }
            }
            None => Instant::now(),
        };
        let connection = self.connection.upgrade();
        // Another runtime's session of this Redis still live (a test's runtime beside another,
        // or a second runtime of a service) hears what comes next; what came before it was
        // up, it dropped when it came up (every session after the first is a recovery).
        if connection.as_ref().is_some_and(|c| c.feed_live()) {
            return;
        }
        feed::suspend_all(connection.as_ref().map(|c| c.name()), until);
        if let Some(connection) = connection {
            connection.feed_lost(self.lost);
        }
    }
}

/// How many of the log's entries one read of a replay takes.
const REPLAY_BATCH: usize = 500;

/// A session is up after another of this Redis: the invalidations announced since the process
/// last heard are read from the feed's log, from its position, and handled as if heard, and
/// then the memory taken out of service when the feed was lost is served again. When the log
/// cannot tell what was missed (no position of this server's run: the server restarted, or
/// `INFO` is refused; the log trimmed past the position; a read failed), memory is dropped but
/// for what was kept while deaf, which keeps its trust bound.
async fn recover(session: &mut Session, settings: &Settings, connection: Option<&dyn FeedOwner>) {
    let name = connection.map(|c| c.name());
    let replayed = match connection {
        Some(connection) => replay(session, settings, connection).await,
        None => None,
    };
    if let Some(connection) = connection {
        connection.recovered(replayed);
    }
    match replayed {
        Some(_) => feed::resume_all(name),
        None => feed::forget_all(name),
    }
}

/// Reads the log after the process's position on the session's server and hands each message
/// to the feed, as if heard; how many, or `None` when the log cannot cover the gap.
async fn replay(
    session: &mut Session,
    settings: &Settings,
    connection: &dyn FeedOwner,
) -> Option<u64> {
    let run = session.run.clone()?;
    let mut from = connection.position().filter(|at| at.run == run)?.id;
    let mut count = 0;
    loop {
        let read = session.log_after(&settings.log, from, REPLAY_BATCH);
        let entries = tokio::time::timeout(settings.op_timeout, read)
            .await
            .ok()
            .flatten()?;
        for (id, message) in &entries {
            feed::on_message(message);
            from = *id;
        }
        count += entries.len() as u64;
        connection.heard_up_to(&run, from);
        if entries.len() < REPLAY_BATCH {
            return Some(count);
        }
    }
}

/// Serves `session` until it is lost (`Some(why)`) or the subscriber is dropped (`None`).
async fn run(
    mut session: Session,
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
            heard = session.next() => {
                let message = match heard {
                    Heard::Message(message) => message,
                    Heard::Lost(reason) => return Some(reason),
                };
                let (channel, payload) = (message.channel(), message.payload());
                if channel == settings.invalidations.as_bytes() {
                    feed::on_message(payload);
                } else if channel == settings.heartbeats.as_bytes() {
                    subscriber.upgrade()?.heard(payload, &settings.connection);
                } else {
                    subscriber.upgrade()?.waits.deliver(channel, payload);
                }
            }
            command = commands.recv() => {
                let timeout = settings.op_timeout;
                let outcome = match command? {
                    Control::Subscribe(channel) => {
                        tokio::time::timeout(timeout, session.subscribe(&channel)).await
                    }
                    Control::Unsubscribe(channel) => {
                        tokio::time::timeout(timeout, session.unsubscribe(&channel)).await
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
