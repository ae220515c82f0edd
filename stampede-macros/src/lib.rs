//! The `#[cached]` attribute of [`stampede`](https://docs.rs/stampede-cache) (the package
//! `stampede-cache`). Depend on that package, which re-exports the attribute with its
//! documentation; this crate holds no runtime logic.
//!
//! The attribute is read in three steps: `attr` parses the options into a typed struct, `func`
//! reads the function, `validate` checks them against each other and settles the defaults, and
//! `expand` emits the function again with a body that calls the runtime.

#![deny(missing_docs)]

mod attr;
mod batch;
mod checks;
mod companions;
mod diag;
mod expand;
mod func;
mod key;
mod loader;
mod receiver;
mod validate;

use proc_macro::TokenStream;

use crate::diag::Errors;

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
/// Every number and duration option also takes a path to a function of no arguments or a
/// constant (`ttl = config::product_ttl`), read and checked when the cache is built (the
/// guide's Options page, "Options from the code").
///
#[doc = attr::options_doc_table!()]
///
/// # The companion: operations on the cache
///
/// Next to a free function `product(id: u64, region: &str)`, the attribute emits a type of the
/// same name (types and functions live in different namespaces) whose associated functions act
/// on the function's cache, also in a process that never called the function:
///
/// ```text
/// product::invalidate(id, region).await?;        // Result<(), stampede::Error>: here, in Redis, everywhere
/// let fresh = product::refresh(id, region).await; // loads now (joining a running load), stores, returns
/// product::prime(id, region, value).await?;       // stores as if loaded (and writes it to Redis)
/// let held = product::peek(id, region);           // Option<V>: this process's servable value, no load
/// let direct = product::uncached(id, region).await; // the body, no cache
/// ```
///
/// `invalidate`, `prime` and `peek` take the key's arguments (those of the `key` template, else
/// all), `refresh` and `uncached` all the function's arguments, with the function's types. A
/// method gets them with `companion = true`, as associated functions named after it
/// (`Repo::user_invalidate(id)`, `repo.user_refresh(id)`). In a trait impl, which takes no other
/// items, they need [`macro@companions`] on the impl, which emits them in an inherent impl of the
/// type. `companion = false` leaves out a free function's companion (when its name is taken in
/// its module).
///
/// # What it accepts
///
/// - `async fn`, free or a method taking `&self`. The receiver is not part of the key; it is
///   cloned (so it must be `Clone + Send + Sync + 'static`) for the load, which runs detached.
/// - Methods of native async-fn-in-trait impls, and of `#[async_trait]` impls (the attribute
///   recognises the boxed-future shape `#[async_trait]` gives them first, also after
///   `#[tracing::instrument]`).
/// - A trait's default method, when the trait requires `Clone + Send + Sync + 'static` of its
///   implementors (`trait Priced: Clone + Send + Sync + 'static`): each implementor gets a cache
///   of its own. Without those supertraits it is refused with an error that says so.
/// - Arguments by value (`Hash + Eq + Clone + Debug + Send + Sync + 'static`) or by `&T`, which the key
///   holds as `T::Owned` (`&str` as `String`). Arguments left out of a `key` template are cloned
///   for the load instead.
/// - Return types: `T: Clone + Send + Sync + 'static` (an `Option<T>` caches `None` like any
///   value), and `Result<T, E>`, which caches only `Ok` and needs
///   `E: From<stampede::Error> + Display + Debug + Send + Sync + 'static`.
///
/// The function's own error comes back as itself: moved out to the only caller of a load
/// (whatever `E` is), cloned to every caller of a shared load when `E: Clone`, and otherwise as
/// `E::from(stampede::Error::Upstream(..))`, from which `stampede::Error::upstream::<E>()`
/// returns the original. What the cache itself fails with (a timeout, a panic, an open breaker)
/// arrives as `E::from(stampede::Error)`. A function returning a plain `T` has no error
/// channel: when its load panics or times out, every waiting caller panics with the error's
/// message.
///
/// Generic functions, `&mut self` and `self` by value, `&mut` arguments, `impl Trait` and patterns
/// in arguments are refused with a compile error that says what to do instead. A type that does
/// not meet a bound above is reported at the type as written, through the runtime's marker
/// traits (`stampede-runtime/src/checks.rs`).
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

/// Gives the `#[cached(companion = true)]` methods of a trait impl their companions, which the
/// trait impl itself cannot hold (it takes no items but the trait's): they are emitted in an
/// inherent impl of the type, next to the trait impl, with the names and signatures an
/// inherent method's companion has.
///
/// ```text
/// #[stampede::companions]
/// impl Catalog for Repo {
///     #[stampede::cached(ttl = "60s", companion = true)]
///     async fn count(&self, shop: u64) -> u64 { /* the query */ }
/// }
///
/// Repo::count_invalidate(shop).await?;      // the method's own cache: no name to spell
/// Repo::count_prime(shop, 12).await?;
/// let held = Repo::count_peek(shop);
/// let fresh = repo.count_refresh(shop).await;
/// ```
///
/// The cache keeps the method's name (`<path::Repo as path::Catalog>::count`, as
/// `stampede::caches()` lists it), so `stampede::invalidate(name, key)` still reaches it.
///
/// - The companions are private to the module, as an item without a visibility is;
///   `#[stampede::companions(pub)]` (or `pub(crate)`, ...) gives them that visibility.
/// - With `#[async_trait]`, either order works (above it, the attribute reads the methods as
///   written; below, as `#[async_trait]` rewrote them).
/// - A generic impl gets a generic inherent impl of the same parameters and bounds: each
///   instantiation has its own cache, as the method has.
/// - Methods without `companion = true` are left as they are. An impl where no method asks for
///   a companion, an inherent impl (where `companion = true` alone does it) and anything but an
///   impl are refused with an error that says so.
#[proc_macro_attribute]
pub fn companions(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match companions::companions(args.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        Err(error) => {
            let mut out = error.into_compile_error();
            out.extend(item);
            out.into()
        }
    }
}

/// The expansion of `#[cached(args)]` on `item`, or every error found in them.
fn cached_fn(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let mut errors = Errors::default();
    let options = attr::Options::parse(args, &mut errors);
    if options.batch_loader.is_some() {
        errors.finish(())?;
        return loader::expand(options, item);
    }
    let item = match func::Item::parse(item.clone()) {
        Ok(func::Item::Fn(item)) => *item,
        // rustc reports the function's syntax error when it reads the item again.
        Ok(func::Item::Unreadable) => return errors.finish(item),
        Err(not_a_function) => {
            errors.push(not_a_function);
            return errors.finish(item);
        }
    };
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
            .map_err(|errors| {
                let messages: Vec<String> = errors.into_iter().map(|e| e.to_string()).collect();
                messages.join("\n")
            })
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

    #[test]
    fn compress_needs_the_compress_feature() {
        let expanded = expand(
            r#"ttl = "1s", lock = "redis", compress = 4096"#,
            "async fn f(id: u64) -> u64 { id }",
        );
        if cfg!(feature = "compress") {
            let expanded = expanded.unwrap();
            assert!(
                expanded.contains("compress : :: core :: option :: Option :: Some (4096"),
                "{expanded}"
            );
        } else {
            let error = expanded.unwrap_err();
            assert!(
                error.contains("needs stampede's `compress` feature"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_function_that_does_not_parse_is_emitted_unchanged() {
        let item = "async fn f(id: u64) -> u64 { let x = ; id }";
        let emitted = expand(r#"ttl = "1s""#, item).unwrap();
        assert_eq!(
            emitted,
            item.parse::<proc_macro2::TokenStream>()
                .unwrap()
                .to_string()
        );
        // Its options are still checked.
        let error = expand(r#"ttl = "1s", bussy = "wait""#, item).unwrap_err();
        assert!(error.contains("did you mean `busy`?"), "{error}");
        // A signature that does not parse is the compiler's to report too.
        assert!(expand(r#"ttl = "1s""#, "pub async fn f(id: u64,, x) -> u64 { id }").is_ok());
    }

    #[test]
    fn an_item_that_is_not_a_function_is_refused() {
        for item in [
            "struct Product { id: u64 }",
            "pub const F: fn() -> u64 = f;",
            "extern \"C\" { fn f(); }",
            "unsafe impl Send for Product {}",
        ] {
            let error = expand(r#"ttl = "1s""#, item).unwrap_err();
            assert!(error.contains("goes on an `async fn`"), "{item}: {error}");
        }
    }

    #[test]
    fn busy_error_needs_a_result() {
        let args = r#"ttl = "1s", lock = "redis", busy = "error""#;
        let error = expand(args, "async fn f(id: u64) -> Option<u64> { Some(id) }").unwrap_err();
        assert!(error.contains("returns a plain value"), "{error}");
        let result = expand(args, "async fn f(id: u64) -> Result<u64, E> { Ok(id) }");
        assert!(!format!("{result:?}").contains("plain value"), "{result:?}");
    }

    #[test]
    fn a_boxed_error_must_be_send_and_sync() {
        let not = |error: &str| {
            let item = format!("async fn f(id: u64) -> Result<u64, {error}> {{ Ok(id) }}");
            match expand(r#"ttl = "1s""#, &item) {
                Ok(_) => None,
                Err(e) => Some(
                    e.split("it is not ")
                        .nth(1)
                        .map(|rest| rest[..6].to_owned())
                        .unwrap_or(e),
                ),
            }
        };
        assert_eq!(not("Box<dyn std::error::Error>").as_deref(), Some("`Send`"));
        assert_eq!(not("Box<dyn Error + Sync>").as_deref(), Some("`Send`"));
        assert_eq!(
            not("Box<dyn ::core::error::Error + Send>").as_deref(),
            Some("`Sync`")
        );
        assert_eq!(not("Box<dyn Error + Send + Sync + 'static>"), None);
        assert_eq!(
            not("Box<dyn std::error::Error + std::marker::Send + Sync>"),
            None
        );
        // Another trait may have `Send + Sync` among its supertraits: the runtime checks it.
        assert_eq!(not("Box<dyn AppError>"), None);
    }

    #[test]
    fn companions_of_an_async_trait_method_elide_its_lifetimes_and_name_the_trait() {
        // A method as `#[async_trait]` rewrites it, when it runs above `#[stampede::companions]`.
        let item = r#"impl Users for R {
            #[cached(ttl = "60s", companion = true)]
            fn greeting<'life0, 'life1, 'async_trait>(&'life0 self, name: &'life1 str) -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = String> + ::core::marker::Send + 'async_trait>>
            where 'life0: 'async_trait, 'life1: 'async_trait, Self: 'async_trait {
                Box::pin(async move { let __self = self; let __ret: String = { format!("{name}") }; __ret })
            }
        }"#;
        let out = super::companions::companions(quote::quote!(), item.parse().unwrap())
            .unwrap()
            .to_string();
        let (trait_impl, inherent) = out.split_once("impl R").unwrap();
        assert!(
            trait_impl.contains("__stampede_companions = true"),
            "{trait_impl}"
        );
        assert!(
            inherent.contains("fn greeting_peek (name : & '_ str)"),
            "{inherent}"
        );
        assert!(!inherent.contains("async_trait"), "{inherent}");
        assert!(
            inherent.contains("type_name_of_val (& < Self as Users > :: greeting)"),
            "{inherent}"
        );
    }

    #[test]
    fn companions_refuses_what_is_not_a_trait_impl_with_companions() {
        let refused = |args: &str, item: &str| {
            super::companions::companions(args.parse().unwrap(), item.parse().unwrap())
                .unwrap_err()
                .to_string()
        };
        let method =
            r#"#[stampede::cached(ttl = "1s", companion = true)] async fn f(&self) -> u64 { 1 }"#;
        assert!(refused("", &format!("impl R {{ {method} }}")).contains("an inherent impl"));
        assert!(refused("", "struct R;").contains("goes on a trait impl"));
        let wrong_args = super::companions::companions(
            "42".parse().unwrap(),
            format!("impl T for R {{ {method} }}").parse().unwrap(),
        )
        .unwrap()
        .to_string();
        assert!(wrong_args.contains("visibility at most"), "{wrong_args}");
        assert!(wrong_args.contains("impl R"), "{wrong_args}");
        let without = r#"impl T for R { #[cached(ttl = "1s")] async fn f(&self) -> u64 { 1 } }"#;
        assert!(refused("", without).contains("no method of this impl asks for a companion"));
    }
}
