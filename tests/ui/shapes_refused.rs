// Shapes the attribute refuses with an error that says what to do instead.

#[stampede::cached(ttl = "60s")]
async fn first_word(text: &str) -> &str {
    text.split(' ').next().unwrap_or("")
}

#[stampede::cached(ttl = "60s")]
async fn labelled<'a>(id: u64, label: &'a str) -> String {
    format!("{label} {id}")
}

#[derive(Clone)]
struct Tree;

impl Tree {
    #[stampede::cached(ttl = "60s")]
    async fn depth(&self, node: u64) -> u64 {
        if node == 0 { 0 } else { self.depth(node / 2).await + 1 }
    }
}

fn main() {}
