// The companion's functions take the key's arguments with the function's types: a wrong type is
// an error at the call.
#[derive(Debug)]
enum AppError {
    Cache(stampede::Error),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<stampede::Error> for AppError {
    fn from(error: stampede::Error) -> Self {
        AppError::Cache(error)
    }
}

#[stampede::cached(ttl = "60s")]
async fn product(id: u64, region: &str) -> Result<String, AppError> {
    Ok(format!("{id}@{region}"))
}

async fn after_a_write() -> Result<(), stampede::Error> {
    product::invalidate("42", "eu").await?;
    product::invalidate(42, String::from("eu")).await
}

fn main() {
    let _ = after_a_write();
}
