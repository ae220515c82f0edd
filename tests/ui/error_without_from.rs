#[derive(Debug)]
struct DbError;

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("database error")
    }
}

#[stampede::cached(ttl = "60s")]
async fn user(id: u64) -> Result<u64, DbError> {
    Ok(id)
}

fn main() {}
