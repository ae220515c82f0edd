use std::collections::HashMap;

#[stampede::cached(ttl = "60s", batch = idz)]
async fn misnamed(ids: Vec<u64>) -> HashMap<u64, String> {
    ids.into_iter().map(|id| (id, id.to_string())).collect()
}

#[stampede::cached(ttl = "60s", batch = ids)]
async fn not_a_map(ids: Vec<u64>) -> Vec<String> {
    ids.into_iter().map(|id| id.to_string()).collect()
}

fn main() {}
