// A tag naming no argument.
#[stampede::cached(ttl = "60s", tags = ["user:{user_id}"])]
async fn user(id: u64) -> u64 {
    id
}

// A tag naming an argument the key leaves out: a tag is rendered from the key.
#[stampede::cached(ttl = "60s", key = "{id}", tags = ["trace:{trace}"])]
async fn order(id: u64, trace: &str) -> u64 {
    let _ = trace;
    id
}

// Tags are a list.
#[stampede::cached(ttl = "60s", tags = "catalog")]
async fn catalog(id: u64) -> u64 {
    id
}

// A broken template.
#[stampede::cached(ttl = "60s", tags = ["user:{id"])]
async fn broken(id: u64) -> u64 {
    id
}

// A part of the key a tag cannot print.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Sku(u64);

#[stampede::cached(ttl = "60s", tags = ["sku:{sku}"])]
async fn stock(sku: Sku) -> u64 {
    sku.0
}

fn main() {}
