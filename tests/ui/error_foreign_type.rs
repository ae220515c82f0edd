/// An error type of another crate cannot be given `impl From<stampede::Error>`: the orphan rule
/// forbids it, and the help says what to return instead.
#[stampede::cached(ttl = "60s")]
async fn settings(path: String) -> Result<String, std::io::Error> {
    std::fs::read_to_string(path)
}

fn main() {}
