struct Repo {
    url: String,
}

impl Repo {
    #[stampede::cached(ttl = "60s")]
    async fn user(&self, id: u64) -> String {
        format!("{}/{id}", self.url)
    }
}

fn main() {}
