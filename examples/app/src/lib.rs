//! What the examples of `stampede` share, each in a module, used by the programs under
//! `examples/` and by the tests under `tests/` of this package:
//!
//! - [`user_repository`]: users in SQLite behind an `#[async_trait]` repository whose reads are
//!   cached, each with its own options, and the scenario that shows what the cache saves
//!   (`examples/repository.rs` prints it, `tests/repository.rs` asserts it);
//! - [`product_repository`] and [`product_service`]: products in SQLite, looked up through
//!   `#[cached(lock = "redis")]`, and the HTTP service over them (`examples/service.rs` serves it,
//!   `tests/service.rs` starts it in-process and reads its metrics);
//! - [`multi_instance`]: several processes of one service, one Redis, one cold key
//!   (`examples/multi_instance.rs` prints what they saw, `tests/multi_process.rs` asserts it,
//!   the benchmarks' scenario runner measures it);
//! - [`sqlite`]: the database both repositories open, and their error.
//!
//! Run them from anywhere in the workspace:
//!
//! ```sh
//! cargo run -p stampede-examples --example repository
//! cargo run -p stampede-examples --example service
//! cargo run -p stampede-examples --example multi_instance -- redis://127.0.0.1:6379/
//! ```

pub mod multi_instance;
pub mod product_repository;
pub mod product_service;
pub mod sqlite;
pub mod user_repository;
