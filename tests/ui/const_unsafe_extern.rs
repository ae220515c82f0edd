#[stampede::cached(ttl = "60s")]
const fn constant(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s")]
async unsafe fn dangerous(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s")]
async extern "C" fn foreign(id: u64) -> u64 {
    id
}

fn main() {}
