//! The `#[cached]` attribute of [`stampede`](https://docs.rs/stampede). Depend on `stampede`,
//! which re-exports it with its documentation; this crate holds no runtime logic.
//!
//! The attribute is read in three steps: `attr` parses the options into a typed struct, `func`
//! reads the function, `validate` checks them against each other and settles the defaults, and
//! `expand` emits the function again with a body that calls the runtime.

mod attr;
mod diag;
mod expand;
mod func;
mod key;
mod receiver;
mod validate;

use proc_macro::TokenStream;
use syn::ItemFn;

use crate::diag::{Errors, error};

/// Caches an async function's result per key, so that concurrent callers of a cold or expiring
/// key share one load instead of stampeding the database.
///
/// ```text
/// #[stampede::cached(ttl = "60s", jitter = 20, stale = "30s", timeout = "800ms", retries = 1)]
/// async fn product(id: u64) -> Result<Product, AppError> {
///     /* the query */
/// }
/// ```
///
/// # Options
///
/// | option | meaning | default |
/// |---|---|---|
/// | `ttl` | how long a value is fresh (`"500ms"`, `"60s"`, `"5m"`) | required |
/// | `jitter` | percent 0..=100: each fill is fresh for `ttl * (1 - u)`, `u` uniform in `[0, jitter/100]` | `10` |
/// | `stale` | window after the fresh time in which the old value is served while one refresh runs | `"0s"` |
/// | `timeout` | bound on one load attempt | `"10s"` |
/// | `retries` | extra attempts after a failed or timed-out attempt, inside the one load | `0` |
/// | `backoff` | base delay before a retry, doubled per retry and jittered by ±50% | `"50ms"` |
/// | `lock` | `"local"`: one load per key per process; `"none"`: every miss loads | `"local"` |
/// | `backend` | `"memory"`: values live in this process (moka) | `"memory"` |
/// | `capacity` | maximum entries kept in memory | `10_000` |
/// | `key` | template naming the arguments that form the key, e.g. `"user:{id}"` | all arguments |
/// | `name` | the cache's name in stats and errors | `module::path::fn`, `path::Type::method` |
/// | `crate` | path of the `stampede` crate when renamed in `Cargo.toml` | `"stampede"` |
///
/// # What it accepts
///
/// - `async fn`, free or a method taking `&self`. The receiver is not part of the key; it is
///   cloned (so it must be `Clone + Send + Sync + 'static`) for the load, which runs detached.
/// - Methods of native async-fn-in-trait impls, and of `#[async_trait]` impls (the attribute
///   recognises the boxed-future shape `#[async_trait]` gives them first, also after
///   `#[tracing::instrument]`).
/// - Arguments by value (`Hash + Eq + Clone + Debug + Send + Sync + 'static`) or by `&T`, which the key
///   holds as `T::Owned` (`&str` as `String`). Arguments left out of a `key` template are cloned
///   for the load instead.
/// - Return types: `T: Clone + Send + Sync + 'static` (an `Option<T>` caches `None` like any
///   value), and `Result<T, E>`, which caches only `Ok` and needs
///   `E: From<stampede::Error> + Display + Debug + Send + Sync + 'static`.
///
/// A failed load is shared by every caller that waited for it, as
/// `E::from(stampede::Error::Upstream(..))`; `stampede::Error::upstream::<E>()` returns the
/// original error. A function returning a plain `T` has no error channel: when its load panics or
/// times out, every waiting caller panics with the error's message.
///
/// Generic functions, `&mut self` and `self` by value, `&mut` arguments, `impl Trait` and patterns
/// in arguments are refused with a compile error that says what to do instead. A type that does
/// not meet a bound above is reported at the type as written, through the runtime's marker
/// traits (`stampede-runtime/src/bounds.rs`).
#[proc_macro_attribute]
pub fn cached(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match cached_fn(args.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        // Emit the function unchanged next to the errors, so that rustc reports only them and
        // the rest of the crate still type-checks against the function.
        Err(errors) => {
            let mut out = errors.into_compile_error();
            out.extend(item);
            out.into()
        }
    }
}

fn cached_fn(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let item: ItemFn = syn::parse2(item).map_err(|e| {
        error(
            e.span(),
            "`#[cached]` goes on an `async fn`",
            "put it on the async function or method whose result should be cached",
        )
    })?;
    let mut errors = Errors::default();
    let options = attr::Options::parse(args, &mut errors);
    let function = func::Function::analyze(item, &mut errors);
    let settings = validate::validate(options, &function, &mut errors);
    errors.finish(())?;
    Ok(expand::expand(function, &settings))
}

#[cfg(test)]
mod tests {
    fn expand(args: &str, item: &str) -> Result<String, String> {
        super::cached_fn(args.parse().unwrap(), item.parse().unwrap())
            .map(|tokens| tokens.to_string())
            .map_err(|errors| errors.to_string())
    }

    #[test]
    fn redis_options_need_the_redis_feature() {
        let expanded = expand(
            r#"ttl = "1s", lock = "redis""#,
            "async fn f(id: u64) -> u64 { id }",
        );
        if cfg!(feature = "redis") {
            let expanded = expanded.unwrap();
            assert!(
                expanded.contains("Lock :: Redis") && expanded.contains("Backend :: Tiered"),
                "{expanded}"
            );
        } else {
            let error = expanded.unwrap_err();
            assert!(
                error.contains("needs stampede's `redis` feature"),
                "{error}"
            );
        }
    }
}
