//! The database's tables and the product query, shared by the orchestrator (which creates and
//! seeds them) and the instances (which query them).

/// Products in the table: ids `1..=PRODUCTS`.
pub const PRODUCTS: i32 = 100_000;

/// Creates the tables and seeds them (then [`ANALYZE`] gathers the planner's statistics). `storm_knobs.extra_ms` is
/// the slowdown the orchestrator sets: every product query sleeps that long at the database.
pub const SETUP: &str = "
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
CREATE TABLE categories (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO categories SELECT c, 'category ' || c FROM generate_series(0, 24) c;
CREATE TABLE products (
    id int PRIMARY KEY,
    category_id int NOT NULL REFERENCES categories,
    name text NOT NULL,
    price_cents int NOT NULL,
    stock int NOT NULL
);
INSERT INTO products
    SELECT i, i % 25, 'product #' || i, 100 + (i * 7919) % 100000, (i * 31) % 500
    FROM generate_series(1, 100000) i;
CREATE INDEX products_category ON products (category_id);
CREATE TABLE storm_knobs (extra_ms float8 NOT NULL);
INSERT INTO storm_knobs VALUES (0);
";

/// The query a product page costs: the product, its category, and where its price stands in
/// the category (count, average, median, how many are cheaper): an aggregate with a sort over
/// the category's 4,000 products, found through an index; about 3.5 ms on an idle 2-core VM. The last join sleeps `storm_knobs.extra_ms`
/// (0 but during the slow-database phase).
pub const PRODUCT_QUERY: &str = "
SELECT p.id, p.name, p.price_cents, p.stock, c.name AS category,
       s.in_category, s.average_cents, s.median_cents, s.cheaper
FROM products p
JOIN categories c ON c.id = p.category_id
CROSS JOIN LATERAL (
    SELECT count(*) AS in_category,
           avg(q.price_cents)::int8 AS average_cents,
           (percentile_cont(0.5) WITHIN GROUP (ORDER BY q.price_cents))::int8 AS median_cents,
           count(*) FILTER (WHERE q.price_cents < p.price_cents) AS cheaper
    FROM products q
    WHERE q.category_id = p.category_id
) s
CROSS JOIN LATERAL (SELECT pg_sleep(k.extra_ms / 1000.0) FROM storm_knobs k) slow
WHERE p.id = $1";

/// Run after [`SETUP`] (not in a transaction, as one batch of statements is).
pub const ANALYZE: &str = "VACUUM ANALYZE";

/// What identifies the product query in `pg_stat_statements` (its normalized text).
pub const QUERY_MARK: &str = "CROSS JOIN LATERAL (SELECT pg_sleep(k.extra_ms";
