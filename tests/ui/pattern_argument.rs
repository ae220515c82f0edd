#[stampede::cached(ttl = "60s")]
async fn area((width, height): (u32, u32)) -> u32 {
    width * height
}

#[async_trait::async_trait]
trait Shapes {
    async fn area(&self, size: (u32, u32)) -> u32;
}

#[derive(Clone)]
struct Db;

#[async_trait::async_trait]
impl Shapes for Db {
    #[stampede::cached(ttl = "60s")]
    async fn area(&self, (width, height): (u32, u32)) -> u32 {
        width * height
    }
}

fn main() {}
