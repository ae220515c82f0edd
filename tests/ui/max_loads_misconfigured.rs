/// `max_loads = 0` would never let a load run.
#[stampede::cached(ttl = "60s", max_loads = 0)]
async fn none(id: u64) -> u64 {
    id
}

/// `max_loads_full` is a policy of the cap, and needs one.
#[stampede::cached(ttl = "60s", max_loads_full = "error")]
async fn uncapped(id: u64) -> Result<u64, std::io::Error> {
    Ok(id)
}

/// `max_loads_full = "error"` fails a miss: the function needs an error channel.
#[stampede::cached(ttl = "60s", max_loads = 4, max_loads_full = "error")]
async fn plain(id: u64) -> u64 {
    id
}

/// Neither `"wait"` nor `"error"`.
#[stampede::cached(ttl = "60s", max_loads = 4, max_loads_full = "drop")]
async fn unknown(id: u64) -> Result<u64, std::io::Error> {
    Ok(id)
}

fn main() {}
