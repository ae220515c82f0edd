#[derive(Clone, Hash, PartialEq, Eq)]
struct TenantId(u64);

#[stampede::cached(ttl = "60s")]
async fn plan(tenant: TenantId) -> u64 {
    tenant.0
}

fn main() {}
