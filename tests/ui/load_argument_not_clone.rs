/// A handle that is not part of the key (the template leaves it out): the load gets a clone.
struct Tracer;

#[stampede::cached(ttl = "60s", key = "user:{id}")]
async fn user(tracer: &Tracer, id: u64) -> u64 {
    let _ = tracer;
    id
}

fn main() {}
