//! The `static` that `#[cached]` puts in each function, which holds its cache; the function's
//! [`Recipe`]; and the calls the generated code makes with them.

use std::any::{Any, TypeId};
use std::convert::Infallible;
use std::future::Future;
use std::sync::{OnceLock, PoisonError, RwLock};

use crate::answer::Answer;
use crate::cache::{Cache, New};
use crate::config::Config;
use crate::core::{Tags, Values};
use crate::error::{Error, LoadError};
use crate::kv::{Key, Value};
use crate::load::{Bound, ErasedAttempt, RetryIf};
use crate::registry;
use crate::tier::Tier;

mod batch;

pub use batch::{batch_answers, batch_values, groups};

type Erased = &'static (dyn Any + Send + Sync);

/// A cache and the site of the instantiation it was built for: the `Self` type of a method with a
/// companion, the type name of a closure in the body of a function without one (its path with
/// the impl's type and trait as instantiated), `""` for a free function with a companion.
#[derive(Clone, Copy)]
struct Built {
    site: &'static str,
    /// The cache's type, kept beside it: a hit compares it with a constant rather than asking
    /// the cache's vtable (`Any::type_id`, an indirect call on every hit, issue 38).
    type_id: TypeId,
    cache: Erased,
}

impl Built {
    fn new<C: Any + Send + Sync>(site: &'static str, cache: &'static C) -> Self {
        Built {
            site,
            type_id: TypeId::of::<C>(),
            cache,
        }
    }

    /// The cache, if it is a `C` built for `site`.
    #[inline(always)]
    fn cache<C: Any>(self, site: &str) -> Option<&'static C> {
        if self.type_id == TypeId::of::<C>() && same_site(self.site, site) {
            let cache: *const (dyn Any + Send + Sync) = self.cache;
            // SAFETY: `type_id` is the id of `cache`'s concrete type (`Built::new`), and it is
            // `C`'s: the cast is `<dyn Any>::downcast_ref`'s, without its call of the vtable.
            Some(unsafe { &*cache.cast::<C>() })
        } else {
            None
        }
    }
}

/// Holds the cache of one function. It is type-erased because a `static` inside a method may not
/// name `Self` or the impl's generic parameters; the key and value types are named at the call.
///
/// A function of a generic impl shares one `static` between instantiations, so a slot keeps a
/// cache per instantiation (its site) and (key, value) types: the first in a lock-free cell, any
/// others in a list. `Store<u8>::label` and `Store<u16>::label` never share a cache, even when
/// their keys and values have one type, nor do `Shelf<u8>::item` and `Shelf<u16>::item`
/// without a receiver.
pub struct Slot {
    first: OnceLock<Built>,
    others: RwLock<Vec<Built>>,
}

impl Slot {
    /// An empty slot; the cache is built at the first call.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Slot {
            first: OnceLock::new(),
            others: RwLock::new(Vec::new()),
        }
    }

    /// The cache of this call's site and types, built at the first call from `build` (what
    /// makes its options, and what makes its tier from them). Inlined into every
    /// call, as `Recipe::cache` is: out of line, it read the recipe back from the stack the
    /// caller had just written it to, 11% of a hit (issue 25, benches/README.md). Only where
    /// optimized: a debug build keeps one copy per function rather than one per call site.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn cache<K, V, S, T>(
        &'static self,
        site: &'static str,
        build: (fn() -> Config, S),
        tags: Tags<K>,
        values: Values<V>,
        new: New<K, V, T>,
    ) -> &'static Cache<K, V, T>
    where
        K: Key,
        V: Value,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
    {
        if let Some(cache) = self.first.get().and_then(|first| first.cache(site)) {
            return cache;
        }
        // Built once: the options and tier through an object, so that what builds a cache is
        // compiled once per key, value and tier type, not per cached function (issue 38).
        self.built(site, &mut Some(build), tags, values, new)
    }

    /// The cache of `site` and these types, built with `made` if there is none yet.
    #[cold]
    fn built<K: Key, V: Value, T: Tier<K, V>>(
        &'static self,
        site: &'static str,
        made: &mut dyn Make<T>,
        tags: Tags<K>,
        values: Values<V>,
        new: New<K, V, T>,
    ) -> &'static Cache<K, V, T> {
        let first = *self.first.get_or_init(|| {
            let (config, tier) = made.make();
            Built::new(site, leak(new(config, tier, tags, values)))
        });
        if let Some(cache) = first.cache(site) {
            return cache;
        }
        self.other(site, made, tags, values, new)
    }

    /// The cache of a further instantiation, in a generic impl.
    #[cold]
    fn other<K: Key, V: Value, T: Tier<K, V>>(
        &'static self,
        site: &'static str,
        made: &mut dyn Make<T>,
        tags: Tags<K>,
        values: Values<V>,
        new: New<K, V, T>,
    ) -> &'static Cache<K, V, T> {
        let find = |others: &[Built]| others.iter().find_map(|other| other.cache(site));
        if let Some(cache) = find(&self.others.read().unwrap_or_else(PoisonError::into_inner)) {
            return cache;
        }
        let mut others = self.others.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(cache) = find(&others) {
            return cache;
        }
        let (config, tier) = made.make();
        let cache = leak(new(config, tier, tags, values));
        others.push(Built::new(site, cache));
        cache
    }
}

/// What builds a cache's options and tier, called through an object. A trait of one method
/// rather than `dyn FnMut`, whose vtable would hold the body twice (`call_mut` and
/// `call_once`), in every cached function (issue 38).
trait Make<T> {
    /// The options, and the tier built from them; called once.
    fn make(&mut self) -> (Config, T);
}

impl<S, T> Make<T> for Option<(fn() -> Config, S)>
where
    S: FnOnce(&Config) -> T,
{
    fn make(&mut self) -> (Config, T) {
        let (config, tier) = self.take().expect("a cache is built once per call");
        let config = config();
        let tier = tier(&config);
        (config, tier)
    }
}

/// Whether a cached function's entries are kept in the lean form ([`lean`](crate::memory::lean)),
/// decided by the generated code when the function is compiled: only the store of that form
/// (and of the tier's kind, `Tier::SHARES`) is compiled for the function's value type, not all
/// three (issue 38).
pub struct Entries<const LEAN: bool>;

/// Everything the code generated for one cached function hands the runtime but the key and the
/// load: where its cache lives, how to build it (options, tier, tags, values) and what is known
/// of its error type. Every entry point of the generated code takes one.
pub struct Recipe<S, K, V, R, const LEAN: bool> {
    /// The function's slot, which holds its cache.
    pub slot: &'static Slot,
    /// `type_name::<Self>()` for a method (`""` for a free function): a generic impl's
    /// instantiations get caches of their own.
    pub site: &'static str,
    /// Builds the cache's options, at the first call.
    pub config: fn() -> Config,
    /// Builds the cache's tier from its options, at the first call.
    pub tier: S,
    /// How a key's tags are rendered.
    pub tags: Tags<K>,
    /// What the attribute says of the values (`source_version`).
    pub values: Values<V>,
    /// Whether the entries are kept in the lean form.
    pub entries: Entries<LEAN>,
    /// What is known of the function's error type ([`ErrorRules`]); `()` for a function that
    /// returns a plain value, and for the companion's operations.
    pub rules: R,
}

impl<S, K, V, R, const LEAN: bool> Recipe<S, K, V, R, LEAN> {
    /// The function's cache, built at the first call; and the rules. Inlined as
    /// [`Slot::cache`] is.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn cache<T>(self) -> (&'static Cache<K, V, T>, R)
    where
        K: Key,
        V: Value,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
    {
        let new = Cache::with_entries::<LEAN>();
        let build = (self.config, self.tier);
        let cache = self
            .slot
            .cache(self.site, build, self.tags, self.values, new);
        (cache, self.rules)
    }
}

impl<S, K, V, E, const LEAN: bool> Recipe<S, K, V, ErrorRules<E>, LEAN> {
    /// A call of a function returning `Result<V, E>`: only `Ok` values are cached. The
    /// function's own error reaches a caller as itself when that caller was the only one of the
    /// load, or when `E` is `Clone`; as `E::from(stampede::Error::Upstream(..))` (the original
    /// reachable through [`Error::upstream`]) when several callers shared it and `E` is not
    /// `Clone`. Timeouts, panics and the like arrive as `E::from(stampede::Error)`.
    ///
    /// `call` says which: a call of the function, or its companion's `refresh` (loads the key
    /// now through its flight, joining the load running for it, if any, and stores the value).
    ///
    /// The load is `context`, called with `args` only when a load must start (it makes what
    /// the load needs beyond the key), and `attempt`, which starts one attempt from that and the
    /// key: `fn` pointers, so that nothing the call compiles below it names the cached function
    /// (issue 38).
    ///
    /// Not an `async fn`: memory is looked in when it is called (see `Cache::call`); the
    /// generated code awaits it at once.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn result<'a, T, A, C>(
        self,
        call: Call,
        key: K,
        args: A,
        context: fn(A) -> C,
        attempt: fn(&C, &K) -> ErasedAttempt<V, E>,
    ) -> Answer<'a, Result<V, E>>
    where
        K: Key,
        V: Value,
        E: LoadError + From<Error>,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
        A: Send + 'a,
        C: Send + Sync + 'static,
    {
        let (cache, rules) = self.cache();
        let prepare = rules.retrying(bound(args, context, attempt));
        cache.call(call, key, prepare).map(own_result, rules.clone)
    }
}

impl<S, K, V, const LEAN: bool> Recipe<S, K, V, (), LEAN> {
    /// A call of a function returning a plain value (an `Option` included), or its companion's
    /// `refresh`. Such a function has no error channel: a load that panics or times out makes
    /// every waiting caller panic. Its load is made as [`Recipe::result`]'s is; not an
    /// `async fn`, as [`Recipe::result`] is not.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn value<'a, T, A, C>(
        self,
        call: Call,
        key: K,
        args: A,
        context: fn(A) -> C,
        attempt: fn(&C, &K) -> ErasedAttempt<V, Infallible>,
    ) -> Answer<'a, V>
    where
        K: Key,
        V: Value,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
        A: Send + 'a,
        C: Send + Sync + 'static,
    {
        let (cache, _) = self.cache();
        cache
            .call(call, key, bound(args, context, attempt))
            .map(plain_value, ())
    }
}

pub use crate::tier::Call;

/// What the generated code knows of a function's error type `E`.
pub struct ErrorRules<E> {
    /// `E::clone`, when `E` is `Clone`: every caller of a shared load then gets the original.
    pub clone: Option<fn(&E) -> E>,
    /// `#[cached(retry_if = "path")]`: only errors it accepts are retried (timeouts always are).
    pub retry_if: Option<fn(&E) -> bool>,
}

// Two function pointers: copied whatever `E` is (a derive would ask `E: Copy`).
impl<E> Clone for ErrorRules<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for ErrorRules<E> {}

impl<E> ErrorRules<E> {
    /// `prepare`, its loads retried only on the errors `retry_if` accepts (every error without).
    fn retrying<L>(
        self,
        prepare: impl FnOnce() -> L + Send,
    ) -> impl FnOnce() -> RetryIf<L, E> + Send {
        let retry_if = self.retry_if.unwrap_or(|_| true);
        move || RetryIf {
            load: prepare(),
            retry_if,
        }
    }
}

/// What builds a call's load, only when a load must start: its context, made by `context` of
/// `args` (owned copies of a method's receiver and of the arguments left out of the key, made
/// then, so that a hit clones nothing but the key), with the generated `attempt`. Generic over
/// types only, never a function's closure: it is compiled once per argument, context, key and
/// value type (issue 38).
fn bound<'a, A, C, K, V, E>(
    args: A,
    context: fn(A) -> C,
    attempt: fn(&C, &K) -> ErasedAttempt<V, E>,
) -> impl FnOnce() -> Bound<C, K, V, E> + Send + 'a
where
    A: Send + 'a,
    C: 'static,
    K: 'static,
    V: 'static,
    E: 'static,
{
    move || Bound {
        context: context(args),
        attempt,
    }
}

/// What a call of a function returning `Result<V, E>` gets of its cache's outcome.
fn own_result<V, E: LoadError + From<Error>>(
    outcome: Result<V, Error>,
    clone: Option<fn(&E) -> E>,
) -> Result<V, E> {
    outcome.map_err(|error| own_error(error, clone))
}

/// What a call of a function returning a plain value gets of its cache's outcome: the value,
/// or a panic with the error's message (it has no error channel).
fn plain_value<V>(outcome: Result<V, Error>, (): ()) -> V {
    match outcome {
        Ok(value) => value,
        Err(error) => panic!("{error}"),
    }
}

/// The function's own error out of a cache's error: itself when this caller was its load's
/// only one, a clone of it when it can be cloned, else wrapped with the original reachable;
/// the cache's own errors through `E::from`.
fn own_error<E: LoadError + From<Error>>(error: Error, clone_error: Option<fn(&E) -> E>) -> E {
    match error {
        Error::Upstream(upstream) => match upstream.into_original::<E>() {
            Ok(original) => original,
            Err(upstream) => match (clone_error, upstream.downcast_ref::<E>()) {
                (Some(clone), Some(original)) => clone(original),
                _ => E::from(Error::Upstream(upstream)),
            },
        },
        error => E::from(error),
    }
}

/// Builds a cache that lives as long as the process, and lists it in the registry.
fn leak<K, V, T>(cache: Cache<K, V, T>) -> &'static Cache<K, V, T>
where
    K: Key,
    V: Value,
    T: Tier<K, V>,
{
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(crate::telemetry::describe);
    let cache: &'static Cache<K, V, T> = Box::leak(Box::new(cache));
    registry::register(cache);
    cache
}

fn same_site(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// Gives an `async` block its output type, so that `?` and `return` in a function's body infer
/// as they did before the body moved into the load.
pub fn typed<T, F: Future<Output = T>>(future: F) -> F {
    future
}
