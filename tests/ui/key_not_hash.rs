#[derive(Clone, PartialEq)]
struct Point {
    x: f64,
    y: f64,
}

#[stampede::cached(ttl = "60s")]
async fn nearest(point: Point) -> u64 {
    (point.x + point.y) as u64
}

fn main() {}
