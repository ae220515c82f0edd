/// A syntax error in the body is reported at its token, as without the attribute.
#[stampede::cached(ttl = "60s")]
async fn product(id: u64) -> u64 {
    let x = ;
    id + x
}

fn main() {}
