struct Report {
    rows: Vec<u64>,
}

#[stampede::cached(ttl = "60s")]
async fn report(id: u64) -> Report {
    Report { rows: vec![id] }
}

fn main() {
    let _ = report(1);
}
