// An option given as a path: what it gives must be the option's type, and the options that fit
// together with others are still checked by presence where their value is read at run time.

mod config {
    pub fn name() -> String {
        "products".to_owned()
    }

    pub const BETA: &str = "1.0";

    pub fn memory_ttl() -> std::time::Duration {
        std::time::Duration::from_secs(5)
    }
}

#[stampede::cached(ttl = "60s", jitter = config::name)]
async fn jitter_of_text(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", xfetch = config::BETA)]
async fn beta_of_text(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", memory_ttl = config::memory_ttl)]
async fn memory_ttl_in_memory(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", missing_ttl = config::memory_ttl)]
async fn missing_ttl_without_batch(id: u64) -> u64 {
    id
}

fn main() {}
