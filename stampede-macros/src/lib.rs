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
#[doc = attr::options_doc_table!()]
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
