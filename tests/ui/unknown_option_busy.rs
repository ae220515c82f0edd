/// `busy` is in the list the suggestions come from, like every other option.
#[stampede::cached(ttl = "60s", lock = "redis", bussy = "wait")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}
