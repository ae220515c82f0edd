#[stampede::cached(ttl = "1s", stale = "3650d")]
async fn slip_of_the_unit(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "1s", fail_safe = "2h")]
async fn fail_safe_too_long(id: u64) -> u64 {
    id
}

fn main() {}
