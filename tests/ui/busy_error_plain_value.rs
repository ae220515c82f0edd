/// `busy = "error"` fails a call while another process holds the lock: the function needs an
/// error channel.
#[stampede::cached(ttl = "60s", lock = "redis", busy = "error")]
async fn session(token: String) -> Option<u64> {
    token.parse().ok()
}

fn main() {}
