//! The nodes of a Redis Cluster as this process knows them: the seeds it was given, and every
//! node the cluster named (`CLUSTER SLOTS`) the last time it was asked. The subscriber asks in
//! turn each node known for the master owning the feed's slot, and the links connect through all
//! of them, so that a process given one node's URL still finds the cluster once that node is
//! gone (a replica serving its slots, or another master the feed's slot).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use redis::ConnectionAddr;

/// Slots of a Redis Cluster.
const SLOTS: u16 = 16_384;

/// The seeds given, and the nodes the cluster named last.
pub(crate) struct Topology {
    seeds: Vec<redis::Client>,
    /// Every node of the last slot map heard that is not a seed.
    learned: Mutex<Vec<redis::Client>>,
    /// Which node to ask next.
    next: AtomicUsize,
}

/// A node as `CLUSTER SLOTS` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Address {
    host: String,
    port: u16,
}

/// One range of slots of a `CLUSTER SLOTS` reply: its master, then its replicas.
#[derive(Debug, PartialEq, Eq)]
struct Range {
    first: u16,
    last: u16,
    nodes: Vec<Address>,
}

impl Topology {
    pub(crate) fn new(seeds: Vec<redis::Client>) -> Topology {
        Topology {
            seeds,
            learned: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
        }
    }

    /// Every node known: the seeds, then those the cluster named.
    pub(crate) fn nodes(&self) -> Vec<redis::Client> {
        let mut nodes = self.seeds.clone();
        nodes.extend(self.learned().iter().cloned());
        nodes
    }

    /// Asks the next node known in turn for the slot map, learns the nodes it names, and
    /// returns the client of the master that owns `slot` then, if it answered. The caller
    /// bounds the wait.
    pub(super) async fn owner(&self, slot: u16) -> Option<redis::Client> {
        let nodes = self.nodes();
        let asked = nodes.get(self.next.fetch_add(1, Ordering::Relaxed) % nodes.len().max(1))?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let slots = async {
            let mut connection = asked
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<redis::Value>(&mut connection)
                .await
        };
        let reply = match slots.await {
            Ok(reply) => reply,
            Err(error) => {
                tracing::debug!(%error, "stampede: a cluster node did not give its slot map");
                return None;
            }
        };
        let host = match asked.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
            _ => String::new(),
        };
        let ranges = ranges(&reply, &host);
        self.learn(&ranges);
        let owner = ranges
            .iter()
            .find(|range| (range.first..=range.last).contains(&slot))?
            .nodes
            .first()?;
        client_at(asked, owner)
    }

    /// Keeps the nodes of `ranges` that are not seeds, in place of those known before.
    fn learn(&self, ranges: &[Range]) {
        let Some(template) = self.seeds.first() else {
            return;
        };
        let mut learned: Vec<redis::Client> = Vec::new();
        for address in ranges.iter().flat_map(|range| &range.nodes) {
            let known = self
                .seeds
                .iter()
                .chain(&learned)
                .any(|node| is_at(node, address));
            if !known && let Some(node) = client_at(template, address) {
                learned.push(node);
            }
        }
        if !learned.is_empty() {
            *self.learned() = learned;
        }
    }

    fn learned(&self) -> MutexGuard<'_, Vec<redis::Client>> {
        self.learned.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The client of the node at `address`, with `template`'s settings (user, password, protocol,
/// TLS and its certificates).
fn client_at(template: &redis::Client, address: &Address) -> Option<redis::Client> {
    let info = template.get_connection_info().clone();
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: address.host.clone(),
            port: address.port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(address.host.clone(), address.port),
    };
    redis::Client::open(info.set_addr(addr)).ok()
}

fn is_at(node: &redis::Client, address: &Address) -> bool {
    match node.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            *host == address.host && *port == address.port
        }
        _ => false,
    }
}

/// One slot of each master a `CLUSTER SLOTS` reply names: where a scan of every key goes.
pub(crate) fn master_slots(reply: &redis::Value) -> Vec<u16> {
    let mut masters: Vec<(Address, u16)> = Vec::new();
    for range in ranges(reply, "") {
        if let Some(master) = range.nodes.first()
            && !masters.iter().any(|(known, _)| known == master)
        {
            masters.push((master.clone(), range.first));
        }
    }
    masters.into_iter().map(|(_, slot)| slot).collect()
}

/// The ranges of a `CLUSTER SLOTS` reply (`[first, last, [host, port, id, ...], ...]` each, the
/// master first); a node named by an empty host is at `asked`, the host that answered, and one
/// whose host is unknown (`?`) is left out.
fn ranges(reply: &redis::Value, asked: &str) -> Vec<Range> {
    let redis::Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let text = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        redis::Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    let number = |value: &redis::Value| match value {
        redis::Value::Int(number) => u16::try_from(*number).ok(),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let redis::Value::Array(fields) = range else {
                return None;
            };
            let first = number(fields.first()?)?;
            let last = number(fields.get(1)?)?;
            let nodes = fields[2..]
                .iter()
                .filter_map(|node| {
                    let redis::Value::Array(node) = node else {
                        return None;
                    };
                    let host = match text(node.first()?)? {
                        host if host.is_empty() => asked.to_owned(),
                        host if host == "?" => return None,
                        host => host,
                    };
                    Some(Address {
                        host,
                        port: number(node.get(1)?)?,
                    })
                })
                .collect();
            Some(Range { first, last, nodes })
        })
        .collect()
}

/// The slot of `key` (of its hash tag, the text between its first `{` and the next `}`, when
/// that is not empty), as Redis Cluster computes it: CRC16 (XMODEM) modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|byte| *byte == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|byte| *byte == b'}')?;
            (close > 0).then_some(&rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for byte in tag {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> redis::Value {
        redis::Value::BulkString(text.as_bytes().to_vec())
    }

    fn node(host: &str, port: i64) -> redis::Value {
        redis::Value::Array(vec![bulk(host), redis::Value::Int(port), bulk("id")])
    }

    #[test]
    fn slots_are_those_redis_computes() {
        // `CLUSTER KEYSLOT` of these, as Redis answers.
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"somekey"), 11_058);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(
            slot(b"foo{}{bar}"),
            slot(b"foo{}{bar}"),
            "an empty tag: the whole key"
        );
        for key in [
            "stampede:{feed|stampede}:invalidations",
            "a{b}c",
            "{}",
            "x{y",
        ] {
            assert_eq!(
                redis::cluster_routing::Slot::new(slot(key.as_bytes())),
                Some(redis::cluster_routing::Slot::for_key(key)),
                "{key}"
            );
        }
        assert_eq!(
            slot(b"test:{feed|test}:invalidations"),
            slot(b"test:{feed|test}:heartbeat:00ff"),
            "the feed's channels share one slot"
        );
    }

    #[test]
    fn a_slot_map_names_each_range_with_its_master_first() {
        let reply = redis::Value::Array(vec![
            redis::Value::Array(vec![
                redis::Value::Int(0),
                redis::Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            redis::Value::Array(vec![
                redis::Value::Int(5461),
                redis::Value::Int(16383),
                node("", 7001),
                node("?", 7004),
            ]),
        ]);
        let found = ranges(&reply, "10.0.0.9");
        let at = |host: &str, port| Address {
            host: host.to_owned(),
            port,
        };
        assert_eq!(
            found,
            [
                Range {
                    first: 0,
                    last: 5460,
                    nodes: vec![at("10.0.0.1", 7000), at("10.0.0.4", 7003)],
                },
                Range {
                    first: 5461,
                    last: 16383,
                    nodes: vec![at("10.0.0.9", 7001)],
                },
            ]
        );
        assert!(ranges(&redis::Value::Nil, "").is_empty());
    }

    #[test]
    fn nodes_learned_keep_the_seeds_settings_and_do_not_repeat_them() {
        let seed = redis::Client::open("redis://cache:pw@127.0.0.1:7000/").unwrap();
        let topology = Topology::new(vec![seed]);
        let range = |ports: &[u16]| Range {
            first: 0,
            last: 1,
            nodes: ports
                .iter()
                .map(|port| Address {
                    host: "127.0.0.1".to_owned(),
                    port: *port,
                })
                .collect(),
        };
        topology.learn(&[range(&[7000, 7003]), range(&[7001, 7003])]);
        let ports: Vec<String> = topology
            .nodes()
            .iter()
            .map(|node| node.get_connection_info().addr().to_string())
            .collect();
        assert_eq!(
            ports,
            ["127.0.0.1:7000", "127.0.0.1:7003", "127.0.0.1:7001"]
        );
        let learned = &topology.nodes()[1];
        let settings = learned.get_connection_info().redis_settings();
        assert_eq!(settings.username(), Some("cache"));
        assert_eq!(settings.password(), Some("pw"));
        // A later map replaces what was learned; an empty one changes nothing.
        topology.learn(&[range(&[7002])]);
        topology.learn(&[]);
        assert_eq!(topology.nodes().len(), 2);
    }
}
