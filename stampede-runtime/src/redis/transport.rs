//! The transport: a configured Redis (its options, TLS, endpoints and their links, health and
//! refusals), its invalidation feed (pub/sub, announcements, heartbeats) and what a process
//! keeps of it (installed connections, keys changed while it was down). It uses the codec and
//! knows nothing of a key's protocol.

pub(in crate::redis) mod cleaning;
pub(crate) mod config;
pub(in crate::redis) mod dirty;
pub(in crate::redis) mod endpoint;
pub(in crate::redis) mod failure;
pub(in crate::redis) mod feed;
pub(in crate::redis) mod health;
pub(in crate::redis) mod installed;
pub(in crate::redis) mod invalidate;
pub(in crate::redis) mod link;
pub(in crate::redis) mod log;
pub(in crate::redis) mod mode;
pub(in crate::redis) mod pubsub;
pub(in crate::redis) mod refusal;
pub(in crate::redis) mod telemetry;
pub(in crate::redis) mod tls;
