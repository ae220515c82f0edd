#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Region {
    code: u16,
}

#[stampede::cached(ttl = "60s", lock = "redis")]
async fn shipping(region: Region, weight: u32) -> u64 {
    u64::from(region.code) * u64::from(weight)
}

fn main() {}
