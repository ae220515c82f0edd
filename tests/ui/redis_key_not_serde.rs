#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Region {
    code: u16,
}

#[stampede::cached(ttl = "60s", lock = "redis")]
async fn shipping(region: Region, weight: u32) -> u64 {
    u64::from(region.code) * u64::from(weight)
}


/// Written to Redis keys, but its shape (part of the cache's identity) cannot be read.
#[derive(Clone, Debug, Hash, PartialEq, Eq, serde::Serialize)]
struct Zone {
    code: u16,
}

#[stampede::cached(ttl = "60s", lock = "redis")]
async fn delivery(zone: Zone) -> u64 {
    u64::from(zone.code)
}

fn main() {}
