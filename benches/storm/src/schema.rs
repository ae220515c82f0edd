//! The database's tables and the product query, shared by the orchestrator (which creates and
//! seeds them) and the instances (which query them).

/// Products in the table: ids `1..=PRODUCTS`.
pub const PRODUCTS: i32 = 100_000;

/// Categories: each holds `PRODUCTS / CATEGORIES` products, which the query aggregates.
pub const CATEGORIES: i32 = 50;

/// Creates the tables, seeds them and gathers planner statistics. `storm_knobs.extra_ms` is
/// the slowdown the orchestrator sets: every product query sleeps that long at the database.
pub const SETUP: &str = "
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
CREATE TABLE categories (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO categories SELECT c, 'category ' || c FROM generate_series(0, 49) c;
CREATE TABLE products (
    id int PRIMARY KEY,
    category_id int NOT NULL REFERENCES categories,
    name text NOT NULL,
    price_cents int NOT NULL,
    stock int NOT NULL
);
INSERT INTO products
    SELECT i, i % 50, 'product #' || i, 100 + (i * 7919) % 100000, (i * 31) % 500
    FROM generate_series(1, 100000) i;
CREATE INDEX products_category ON products (category_id);
CREATE TABLE storm_knobs (extra_ms float8 NOT NULL);
INSERT INTO storm_knobs VALUES (0);
VACUUM ANALYZE;
";

/// The query a product page costs: the product, its category, and where its price stands in
/// the category (count, average, how many are cheaper): an aggregate over the category's 2,000
/// products through an index, a few milliseconds. The last join sleeps `storm_knobs.extra_ms`
/// (0 but during the slow-database phase).
pub const PRODUCT_QUERY: &str = "
SELECT p.id, p.name, p.price_cents, p.stock, c.name AS category,
       s.in_category, s.average_cents, s.cheaper
FROM products p
JOIN categories c ON c.id = p.category_id
CROSS JOIN LATERAL (
    SELECT count(*) AS in_category,
           avg(q.price_cents)::int8 AS average_cents,
           count(*) FILTER (WHERE q.price_cents < p.price_cents) AS cheaper
    FROM products q
    WHERE q.category_id = p.category_id
) s
CROSS JOIN LATERAL (SELECT pg_sleep(k.extra_ms / 1000.0) FROM storm_knobs k) slow
WHERE p.id = $1";

/// What identifies the product query in `pg_stat_statements` (its normalized text).
pub const QUERY_MARK: &str = "CROSS JOIN LATERAL (SELECT pg_sleep(k.extra_ms";
