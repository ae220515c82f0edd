//! Checks that the options fit together and fit the function, and settles every default.

use std::time::Duration;

use proc_macro2::Span;
use syn::{Ident, LitStr, Path};

use crate::attr::{BackendKind, BusyKind, FullKind, LockKind, Options, OrPath, Spanned};
use crate::batch::BatchShape;
use crate::diag::{Errors, error};
use crate::func::{Function, Returns};
use crate::key::KeyTemplate;

/// The options with their defaults applied: everything the expansion needs.
pub(crate) struct Settings {
    pub(crate) ttl: Duration,
    pub(crate) jitter: u8,
    pub(crate) stale: Duration,
    pub(crate) timeout: Duration,
    pub(crate) retries: u32,
    pub(crate) backoff: Duration,
    pub(crate) lock: LockKind,
    pub(crate) backend: BackendKind,
    /// The Redis connection's name; `None` for the default connection.
    pub(crate) redis: Option<LitStr>,
    pub(crate) busy: BusyKind,
    pub(crate) capacity: u64,
    pub(crate) refresh_after: Option<Duration>,
    pub(crate) fail_safe: Option<Duration>,
    pub(crate) fail_safe_throttle: Duration,
    /// `xfetch = beta`: probabilistic early refresh.
    pub(crate) xfetch: Option<f64>,
    pub(crate) soft_timeout: Option<Duration>,
    /// `memory_ttl = ".."`: a tiered cache's life of a value in memory.
    pub(crate) memory_ttl: Option<Duration>,
    /// `compress = N`: payloads over N bytes go to Redis compressed.
    pub(crate) compress: Option<usize>,
    pub(crate) retry_if: Option<Path>,
    /// `source_version = ".."`: the function giving a value's source version.
    pub(crate) source_version: Option<Path>,
    pub(crate) breaker: Option<u32>,
    pub(crate) breaker_cooldown: Duration,
    /// `max_loads = N`: the most loads of the cache at once in a process.
    pub(crate) max_loads: Option<u32>,
    pub(crate) max_loads_full: FullKind,
    /// The arguments that form the key, in the order the key holds them.
    pub(crate) key_args: Vec<Ident>,
    /// The key template in canonical form, if one was given.
    pub(crate) key_template: Option<String>,
    /// The tag templates, each naming key arguments only, with the span of its literal.
    pub(crate) tags: Vec<Spanned<KeyTemplate>>,
    pub(crate) name: Option<LitStr>,
    /// `version = ".."`: part of the cache's identity in Redis.
    pub(crate) version: Option<LitStr>,
    pub(crate) krate: Path,
    /// `companion = ..` as written; the expansion settles the default by the function's shape.
    pub(crate) companion: Option<bool>,
    /// Where `companion = true` was written, for what the expansion reports there.
    pub(crate) companion_span: Option<proc_macro2::Span>,
    /// The method is in an impl under `#[stampede::companions]`, which emits its companion in an
    /// inherent impl of the type: the method only calls the items there.
    pub(crate) in_companions_block: bool,
    /// Set by `#[stampede::companions]` when it emits a method's companion: the trait the method
    /// implements, which the cache's name includes (`<path::Type as path::Trait>::method`).
    pub(crate) trait_path: Option<Path>,
    /// `ttl_from = path`: each value's own fresh time.
    pub(crate) ttl_from: Option<Path>,
    /// `batch = ids`: the shape of a batch function.
    pub(crate) batch: Option<BatchShape>,
    /// With `batch`: the most keys one call of the function is given.
    pub(crate) batch_max: Option<u64>,
    /// With `batch`: how long a key the function's map leaves out is cached as absent.
    pub(crate) missing_ttl: Option<OrPath<Duration>>,
    /// The options given as a path (`ttl = config::product_ttl`), read when the cache is built;
    /// their fields above hold stand-ins (the default, or a value that fits the literals).
    pub(crate) from_code: Vec<(&'static str, Path)>,
}

const DEFAULT_JITTER: u8 = 10;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_BACKOFF: Duration = Duration::from_millis(50);
const DEFAULT_CAPACITY: u64 = 10_000;

pub(crate) fn validate(options: Options, function: &Function, errors: &mut Errors) -> Settings {
    let key_args = key_args(&options, function, errors);
    let tags = tags(&options, &key_args, function, errors);
    let lock = options
        .lock
        .as_ref()
        .map_or(LockKind::Local, |lock| lock.value);
    let (backend, redis, busy) = shared_tier(&options, lock, errors);
    busy_error_needs_result(&options, function, errors);
    companion_fits_the_shape(&options, function, errors);
    let timing = timing(&options, lock, errors);
    let policies = policies(&options, function, lock, &timing, errors);
    without_memory(&options, backend, errors);
    let memory_ttl = memory_ttl(&options, backend, &timing, errors);
    let compress = compress(&options, backend, errors);
    let capacity = capacity(&options, errors);
    name_is_not_empty(&options, errors);
    version_is_shared(&options, backend, errors);
    long_windows(&options, errors);
    let batch = batch(&options, function, &key_args, timing.ttl_literal, errors);
    let from_code = from_code(&options);
    Settings {
        ttl: timing.ttl,
        jitter: timing.jitter,
        stale: timing.stale,
        timeout: timing.timeout,
        retries: timing.retries,
        backoff: timing.backoff,
        lock,
        backend,
        redis,
        busy,
        capacity,
        refresh_after: policies.refresh_after,
        fail_safe: policies.fail_safe,
        fail_safe_throttle: policies.fail_safe_throttle,
        xfetch: policies.xfetch,
        soft_timeout: policies.soft_timeout,
        memory_ttl,
        compress,
        retry_if: policies.retry_if,
        source_version: options
            .source_version
            .as_ref()
            .map(|path| path.value.clone()),
        breaker: policies.breaker,
        breaker_cooldown: policies.breaker_cooldown,
        max_loads: policies.max_loads,
        max_loads_full: policies.max_loads_full,
        key_args,
        key_template: options.key.as_ref().map(|key| key.value.canonical()),
        tags,
        name: options.name,
        version: options.version,
        companion: options.companion.map(|companion| companion.value),
        companion_span: options.companion.map(|companion| companion.span),
        in_companions_block: options.in_companions_block,
        trait_path: None,
        ttl_from: options.ttl_from.as_ref().map(|path| path.value.clone()),
        batch_max: batch
            .as_ref()
            .and(on(&options.batch_max, STAND_IN_BATCH_MAX)),
        missing_ttl: batch
            .as_ref()
            .and(options.missing_ttl.as_ref())
            .map(|missing| missing.value.clone()),
        batch,
        from_code,
        krate: options
            .krate
            .map_or_else(|| syn::parse_quote!(::stampede), |krate| krate.value),
    }
}

/// How many times `ttl` a `stale` or `fail_safe` window may be before it is refused as a likely
/// slip of the unit (`"3650d"` for `"3650s"`), unless `long_windows = true`.
const LONGEST_WINDOW_RATIO: u32 = 1_000;

/// A `stale` or `fail_safe` more than [`LONGEST_WINDOW_RATIO`] times `ttl` serves a value that
/// long after it stopped being fresh: refused unless `long_windows = true` says it is meant.
fn long_windows(options: &Options, errors: &mut Errors) {
    let Some(ttl_given) = options.ttl.as_ref().and_then(Spanned::literal) else {
        return;
    };
    let ttl = ttl_given.value;
    if options.long_windows.is_some_and(|long| long.value) || ttl.is_zero() {
        return;
    }
    let longest = ttl.saturating_mul(LONGEST_WINDOW_RATIO);
    for (name, window, what) in [
        (
            "stale",
            options.stale.as_ref().and_then(Spanned::literal),
            "served stale (while one refresh runs)",
        ),
        (
            "fail_safe",
            options.fail_safe.as_ref().and_then(Spanned::literal),
            "served as the last good value when a load fails",
        ),
    ] {
        let Some(window) = window.filter(|window| window.value > longest) else {
            continue;
        };
        let times = window.value.as_secs_f64() / ttl_given.value.as_secs_f64();
        errors.push(error(
            window.span,
            format!(
                "`{name} = \"{}\"` is {} times `ttl = \"{}\"`: a value would be {what} for that long after it stopped being fresh",
                humantime::format_duration(window.value),
                times_text(times),
                humantime::format_duration(ttl),
            ),
            format!(
                "check the unit; if it is meant, add `long_windows = true` (a window over {LONGEST_WINDOW_RATIO} times `ttl` is refused without it)"
            ),
        ));
    }
}

/// A ratio for a message: whole, with thousands separated (`3,153,600,000`), or `over a
/// trillion`.
fn times_text(times: f64) -> String {
    if times >= 1e12 {
        return "over a trillion".to_owned();
    }
    let digits = format!("{}", times.round() as u64);
    let mut out = String::new();
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The options of a batch function (`batch`, `batch_max`, `missing_ttl`), checked against the
/// function and each other; the function's shape, when it is one.
fn batch(
    options: &Options,
    function: &Function,
    key_args: &[Ident],
    ttl: Option<Duration>,
    errors: &mut Errors,
) -> Option<BatchShape> {
    if let Some(window) = &options.batch_window {
        errors.push(error(
            window.span,
            "`batch_window` coalesces the single-key calls of a batch function's cache, and this function names no batch loader",
            "add `batch_loader = products` (the batch function that loads its keys) and remove the other options, which are the batch function's; or remove `batch_window`",
        ));
    }
    let Some(named) = &options.batch else {
        let needs_batch = |given: Option<Span>, name: &str| {
            given.map(|span| {
                error(
                    span,
                    format!("`{name}` is an option of a batch function, and this function has no `batch`"),
                    "add `batch = ids` (the argument that holds the keys), or remove it",
                )
            })
        };
        let checks = [
            needs_batch(
                options.batch_max.as_ref().map(|most| most.span),
                "batch_max",
            ),
            needs_batch(
                options.missing_ttl.as_ref().map(|missing| missing.span),
                "missing_ttl",
            ),
        ];
        for error in checks.into_iter().flatten() {
            errors.push(error);
        }
        return None;
    };
    let shape = BatchShape::read(function, &named.value, errors)?;
    if !key_args.contains(&shape.arg) {
        errors.push(error(
            options.key.as_ref().map_or(named.span, |key| key.span),
            format!(
                "the key template leaves out `{}`, which holds the batch's keys",
                shape.arg
            ),
            format!(
                "each key of the batch is cached on its own: name `{{{}}}` in the template, where it stands for one key",
                shape.arg
            ),
        ));
    }
    if let Some(most) = options.batch_max.as_ref().and_then(Spanned::literal)
        && most.value == 0
    {
        errors.push(error(
            most.span,
            "`batch_max = 0` would never load a key",
            "give the most keys one call of the function may be given, e.g. `batch_max = 100`",
        ));
    }
    if let Some(missing) = options.missing_ttl.as_ref().and_then(Spanned::literal)
        && ttl.is_some_and(|ttl| missing.value > ttl)
    {
        errors.push(error(
            missing.span,
            "`missing_ttl` is longer than `ttl`",
            "a key the function leaves out is cached as absent at most as long as a value: give `missing_ttl` at most `ttl`, `\"0s\"` not to cache it",
        ));
    }
    Some(shape)
}

/// `companion = true` asks for items next to the method, which a trait impl cannot take: there
/// `#[stampede::companions]` on the impl emits them in an inherent impl of the type. The shape
/// `#[async_trait]` gives a method tells that it is in a trait impl; a native one cannot be told
/// from an inherent method here (the expansion makes rustc's error name the fix).
fn companion_fits_the_shape(options: &Options, function: &Function, errors: &mut Errors) {
    if let Some(companion) = &options.companion
        && companion.value
        && matches!(function.shape, crate::func::Shape::AsyncTrait)
        && !options.in_companions_block
    {
        errors.push(error(
            companion.span,
            "`companion = true` on a method of a trait impl (here under `#[async_trait]`) needs `#[stampede::companions]` on the impl: a trait impl takes no items but the trait's",
            "put `#[stampede::companions]` on the impl (above or below `#[async_trait]`): it emits the companion (`Type::method_invalidate`, `_prime`, `_peek`, ...) in an inherent impl of the type",
        ));
    }
}

/// How long values live and loads run: `ttl`, `jitter`, `stale`, `timeout`, `retries`,
/// `backoff`.
struct Timing {
    ttl: Duration,
    /// `ttl` if a literal gave it: the other literals are checked against it.
    ttl_literal: Option<Duration>,
    jitter: u8,
    stale: Duration,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
}

fn timing(options: &Options, lock: LockKind, errors: &mut Errors) -> Timing {
    let ttl = match &options.ttl {
        None if options.incomplete => Duration::ZERO, // misspelt or malformed: reported already
        None => {
            errors.push(error(
                Span::call_site(),
                "`#[cached]` needs a `ttl`",
                "say how long a value stays fresh, e.g. `#[cached(ttl = \"60s\")]`",
            ));
            Duration::ZERO
        }
        Some(ttl) => match ttl.literal() {
            Some(ttl) => non_zero(
                ttl,
                "ttl",
                "a value that is never fresh would be loaded on every call",
                errors,
            ),
            None => STAND_IN_TTL,
        },
    };
    let jitter = match options.jitter.as_ref().and_then(Spanned::literal) {
        None => DEFAULT_JITTER,
        Some(Spanned { value, span }) => u8::try_from(value).ok().filter(|j| *j <= 100).unwrap_or_else(|| {
            errors.push(error(
                span,
                format!("`jitter = {value}` is out of range"),
                "`jitter` is the percent of `ttl` a fill may be shortened by: write a number from 0 to 100",
            ));
            0
        }),
    };
    let stale = options.stale.as_ref().and_then(Spanned::literal).map_or(Duration::ZERO, |stale| {
        if lock == LockKind::None && !stale.value.is_zero() {
            errors.push(error(
                stale.span,
                "`stale` needs a lock, and this cache has `lock = \"none\"`",
                "stale-while-revalidate runs one refresh per stale key, which takes a lock; remove `stale` or use `lock = \"local\"`",
            ));
        }
        stale.value
    });
    let timeout =
        options
            .timeout
            .as_ref()
            .and_then(Spanned::literal)
            .map_or(DEFAULT_TIMEOUT, |timeout| {
                non_zero(
                    timeout,
                    "timeout",
                    "every attempt would time out at once",
                    errors,
                )
            });
    Timing {
        ttl,
        ttl_literal: options.ttl.as_ref().and_then(|ttl| ttl.value.literal()),
        jitter,
        stale,
        timeout,
        retries: value_or(&options.retries, 0),
        backoff: value_or(&options.backoff, DEFAULT_BACKOFF),
    }
}

fn capacity(options: &Options, errors: &mut Errors) -> u64 {
    options
        .capacity
        .as_ref()
        .and_then(Spanned::literal)
        .map_or(DEFAULT_CAPACITY, |capacity| {
            if capacity.value == 0 {
                errors.push(error(
                    capacity.span,
                    "`capacity = 0` would keep nothing",
                    "give the number of entries to keep in memory, e.g. `capacity = 10_000`",
                ));
            }
            capacity.value
        })
}

fn name_is_not_empty(options: &Options, errors: &mut Errors) {
    if let Some(name) = &options.name
        && name.value().trim().is_empty()
    {
        errors.push(error(
            name.span(),
            "`name` cannot be empty",
            "leave `name` out to use the function's path, or give a name such as \"users::by_id\"",
        ));
    }
}

/// `version` is part of the identity a cache has in Redis: not empty, and only on a cache that
/// has one.
fn version_is_shared(options: &Options, backend: BackendKind, errors: &mut Errors) {
    let Some(version) = &options.version else {
        return;
    };
    if version.value().trim().is_empty() {
        errors.push(error(
            version.span(),
            "`version` cannot be empty",
            "give a version such as \"2\", or leave `version` out",
        ));
    } else if backend == BackendKind::Memory {
        errors.push(error(
            version.span(),
            "`version` is part of a cache's identity in Redis, and this cache keeps its values in memory only",
            "add `lock = \"redis\"` or `backend = \"tiered\"`, or remove `version`",
        ));
    }
}

/// With `backend = "redis"` values live in Redis only: the options of the memory tier have
/// nothing to act on.
fn without_memory(options: &Options, backend: BackendKind, errors: &mut Errors) {
    if backend != BackendKind::Redis {
        return;
    }
    if let Some(capacity) = &options.capacity {
        errors.push(error(
            capacity.span,
            "`capacity` bounds the entries kept in memory, and with `backend = \"redis\"` no value is kept in memory",
            "remove `capacity`, or use `backend = \"tiered\"` to keep values in memory in front of Redis",
        ));
    }
    if let Some(throttle) = &options.fail_safe_throttle {
        errors.push(error(
            throttle.span,
            "`fail_safe_throttle` keeps a served last good value in memory for the throttle, and with `backend = \"redis\"` no value is kept in memory",
            "remove `fail_safe_throttle`: each call past the stale window asks the source and, when it fails, gets the last good value Redis keeps; bound the source's load with `breaker = N`, or use `backend = \"tiered\"`",
        ));
    }
    if let Some(beta) = &options.xfetch {
        errors.push(error(
            beta.span,
            "`xfetch` scales each key's early refresh by its load time as the process that loaded it measured it, in memory, and with `backend = \"redis\"` no value is kept in memory",
            "use `backend = \"tiered\"` (the process that loads a key refreshes it early; the others read the fresh value from Redis), or `refresh_after` for a fixed point",
        ));
    }
}

/// `memory_ttl`: the life of a value in memory in front of Redis, so only for a tiered cache,
/// above zero and at most `ttl`.
fn memory_ttl(
    options: &Options,
    backend: BackendKind,
    timing: &Timing,
    errors: &mut Errors,
) -> Option<Duration> {
    let given = options.memory_ttl.as_ref()?;
    let misplaced = match backend {
        BackendKind::Tiered => None,
        BackendKind::Memory => Some((
            "`memory_ttl` is how long a value lives in memory in front of Redis, and this cache keeps its values in memory only",
            "its `ttl` is how long a value lives in memory: remove `memory_ttl`, or add `lock = \"redis\"` (or `backend = \"tiered\"`) to keep values in Redis behind memory",
        )),
        BackendKind::Redis => Some((
            "`memory_ttl` is how long a value lives in memory in front of Redis, and with `backend = \"redis\"` no value is kept in memory",
            "remove `memory_ttl`, or use `backend = \"tiered\"` to keep values in memory for that long in front of Redis",
        )),
    };
    if let Some((message, fix)) = misplaced {
        errors.push(error(given.span, message, fix));
    }
    // A path's value is checked when the cache is built; its stand-in is `ttl`'s.
    let Some(literal) = given.literal() else {
        return Some(timing.ttl);
    };
    let ttl = timing.ttl_literal;
    if misplaced.is_none()
        && (literal.value.is_zero() || ttl.is_some_and(|ttl| literal.value > ttl))
    {
        let kept = ttl.map_or_else(
            || "for `ttl`".to_owned(),
            |ttl| format!("for `ttl = \"{}\"`", humantime::format_duration(ttl)),
        );
        errors.push(error(
            given.span,
            "`memory_ttl` must be above zero and at most `ttl`",
            format!(
                "memory serves a value for `memory_ttl`, then reads Redis, which keeps it {kept}: e.g. `memory_ttl = \"5s\"`; to keep nothing in memory, use `backend = \"redis\"`"
            ),
        ));
    }
    Some(literal.value)
}

/// `compress = N`: how values are written to Redis, so only with a Redis tier, and only with
/// the `compress` feature (which also reads them back).
fn compress(options: &Options, backend: BackendKind, errors: &mut Errors) -> Option<usize> {
    let given = options.compress.as_ref()?;
    if backend == BackendKind::Memory {
        errors.push(error(
            given.span,
            "`compress` shrinks the values written to Redis, and this cache keeps its values in memory only",
            "remove `compress`, or add `lock = \"redis\"` (or `backend = \"tiered\"`) to keep values in Redis",
        ));
    } else if !cfg!(feature = "compress") {
        errors.push(error(
            given.span,
            "`compress` needs stampede's `compress` feature, which is disabled",
            "enable it in Cargo.toml, in every binary that shares this cache (each needs it to read compressed values): add `features = [\"compress\"]` to the `stampede-cache` dependency",
        ));
    }
    Some(given.value.literal().unwrap_or(STAND_IN_COMPRESS))
}

/// The freshness and failure policies, as they fit the rest of the options.
struct Policies {
    refresh_after: Option<Duration>,
    xfetch: Option<f64>,
    fail_safe: Option<Duration>,
    fail_safe_throttle: Duration,
    soft_timeout: Option<Duration>,
    retry_if: Option<Path>,
    breaker: Option<u32>,
    breaker_cooldown: Duration,
    max_loads: Option<u32>,
    max_loads_full: FullKind,
}

const DEFAULT_FAIL_SAFE_THROTTLE: Duration = Duration::from_secs(5);
const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

fn policies(
    options: &Options,
    function: &Function,
    lock: LockKind,
    timing: &Timing,
    errors: &mut Errors,
) -> Policies {
    let refresh_after = refresh_after(options, lock, timing, errors);
    let xfetch = xfetch(options, lock, errors);
    fail_safe_companions(options, lock, errors);
    let breaker = breaker(options, errors);
    let (max_loads, max_loads_full) = max_loads(options, function, errors);
    if let Some(retry_if) = &options.retry_if
        && matches!(function.returns, crate::func::Returns::Value(_))
    {
        errors.push(error(
            retry_if.span,
            "`retry_if` classifies a function's errors, and this function returns no `Result`",
            "return `Result<T, E>` to have errors to retry, or remove `retry_if`",
        ));
    }
    Policies {
        refresh_after,
        xfetch,
        fail_safe: on(&options.fail_safe, Duration::ZERO),
        fail_safe_throttle: value_or(&options.fail_safe_throttle, DEFAULT_FAIL_SAFE_THROTTLE),
        soft_timeout: on(&options.soft_timeout, timing.timeout),
        retry_if: options.retry_if.as_ref().map(|path| path.value.clone()),
        breaker,
        breaker_cooldown: value_or(&options.breaker_cooldown, DEFAULT_BREAKER_COOLDOWN),
        max_loads,
        max_loads_full,
    }
}

fn refresh_after(
    options: &Options,
    lock: LockKind,
    timing: &Timing,
    errors: &mut Errors,
) -> Option<Duration> {
    let after = options.refresh_after.as_ref()?;
    let literal = after.value.literal();
    if literal
        .is_some_and(|after| after.is_zero() || timing.ttl_literal.is_some_and(|ttl| after >= ttl))
    {
        errors.push(error(
            after.span,
            "`refresh_after` must be above zero and below `ttl`",
            "a value is refreshed ahead of its expiry: e.g. `ttl = \"60s\", refresh_after = \"45s\"`",
        ));
    }
    if lock == LockKind::None {
        errors.push(error(
            after.span,
            "`refresh_after` needs a lock, and this cache has `lock = \"none\"`",
            "refresh-ahead runs one background refresh per key, which takes a lock; remove `refresh_after` or use `lock = \"local\"`",
        ));
    }
    Some(literal.unwrap_or(timing.ttl / 2))
}

/// `fail_safe_throttle` and `soft_timeout` need `fail_safe`; `soft_timeout` also needs a load
/// that goes on without its caller, which `lock = "none"` does not run.
fn fail_safe_companions(options: &Options, lock: LockKind, errors: &mut Errors) {
    let needs_fail_safe = |option: &Option<Spanned<OrPath<Duration>>>, name: &str, what: &str| {
        option.as_ref().and_then(|given| {
            options.fail_safe.is_none().then(|| {
                error(
                    given.span,
                    format!("`{name}` needs `fail_safe`"),
                    format!("{what}; add `fail_safe = \"1h\"` (how long past its stale deadline a last good value may be served)"),
                )
            })
        })
    };
    let checks = [
        needs_fail_safe(
            &options.fail_safe_throttle,
            "fail_safe_throttle",
            "it paces the source while the last good value is served",
        ),
        needs_fail_safe(
            &options.soft_timeout,
            "soft_timeout",
            "after it a waiting caller gets the last good value, which only `fail_safe` keeps",
        ),
    ];
    for error in checks.into_iter().flatten() {
        errors.push(error);
    }
    if let Some(soft) = &options.soft_timeout
        && lock == LockKind::None
    {
        errors.push(error(
            soft.span,
            "`soft_timeout` needs a lock, and this cache has `lock = \"none\"`",
            "after the soft timeout the load goes on in the background and stores its value, and with `lock = \"none\"` every load runs on its caller's task; remove `soft_timeout` or use `lock = \"local\"`",
        ));
    }
}

/// `xfetch = beta`: a positive number, on a cache with a lock and without `refresh_after` (two
/// early refreshes would be one too many; the fixed point or the draw, not both).
fn xfetch(options: &Options, lock: LockKind, errors: &mut Errors) -> Option<f64> {
    let beta = options.xfetch.as_ref()?;
    let literal = beta.value.literal();
    if literal.is_some_and(|beta| !(beta.is_finite() && beta > 0.0)) {
        errors.push(error(
            beta.span,
            "`xfetch` takes a `beta` above zero",
            "1.0 is the paper's choice; above it refreshes earlier, below it later, e.g. `xfetch = 1.0`",
        ));
    }
    if let Some(after) = &options.refresh_after {
        errors.push(error(
            after.span,
            "`refresh_after` and `xfetch` both refresh a value early: keep one",
            "`refresh_after = \"45s\"` refreshes at a fixed age; `xfetch = 1.0` at a random one that nears the deadline as the load is slow",
        ));
    }
    if lock == LockKind::None {
        errors.push(error(
            beta.span,
            "`xfetch` needs a lock, and this cache has `lock = \"none\"`",
            "an early refresh runs one background refresh per key, which takes a lock; remove `xfetch` or use `lock = \"local\"`",
        ));
    }
    Some(literal.unwrap_or(1.0))
}

fn breaker(options: &Options, errors: &mut Errors) -> Option<u32> {
    let breaker = options.breaker.as_ref().map(|breaker| {
        if breaker.value.literal() == Some(0) {
            errors.push(error(
                breaker.span,
                "`breaker = 0` would never let a load run",
                "give the number of consecutive failed loads that open it, e.g. `breaker = 5`",
            ));
        }
        breaker.value.literal().unwrap_or(STAND_IN_COUNT)
    });
    if let Some(cooldown) = &options.breaker_cooldown
        && breaker.is_none()
    {
        errors.push(error(
            cooldown.span,
            "`breaker_cooldown` needs `breaker`",
            "add `breaker = 5` (the consecutive failed loads that open the breaker)",
        ));
    }
    breaker
}

/// `max_loads` and `max_loads_full`: a cap that lets a load run, a policy only with a cap, and
/// `"error"` only for a function with an error channel.
fn max_loads(
    options: &Options,
    function: &Function,
    errors: &mut Errors,
) -> (Option<u32>, FullKind) {
    let most = options.max_loads.as_ref().map(|most| {
        if most.value.literal() == Some(0) {
            errors.push(error(
                most.span,
                "`max_loads = 0` would never let a load run",
                "give the most loads of this cache to run at once in a process, e.g. `max_loads = 16`",
            ));
        }
        most.value.literal().unwrap_or(STAND_IN_COUNT)
    });
    let Some(full) = &options.max_loads_full else {
        return (most, FullKind::Wait);
    };
    if most.is_none() {
        errors.push(error(
            full.span,
            "`max_loads_full` needs `max_loads`",
            "add `max_loads = 16` (the most loads of this cache at once in a process)",
        ));
    }
    if full.value == FullKind::Error
        && let Returns::Value(_) = function.returns
    {
        errors.push(error(
            full.span,
            format!(
                "`max_loads_full = \"error\"` fails a miss while `max_loads` loads run, and `{}` returns a plain value: its callers would have no error channel, and would panic under load",
                function.sig.ident
            ),
            "return `Result<T, E>`, whose `E: From<stampede::Error>` receives `stampede::Error::LoadsFull`, or leave `max_loads_full` out to wait for a free load",
        ));
    }
    (most, full.value)
}

/// What stands in the written options (`Written`) for an option given as a path until the path
/// is read (and, if its value is refused, what the cache keeps nothing under): the option's
/// default, or where it has none, one that fits the other options.
const STAND_IN_TTL: Duration = Duration::from_secs(60);
const STAND_IN_COUNT: u32 = 16;
const STAND_IN_COMPRESS: usize = 16_384;
const STAND_IN_BATCH_MAX: u64 = 100;

/// An option with a default: its literal, else (left out, or given as a path) `default`.
fn value_or<T: Copy>(given: &Option<Spanned<OrPath<T>>>, default: T) -> T {
    given
        .as_ref()
        .and_then(|given| given.value.literal())
        .unwrap_or(default)
}

/// An option that is off when left out: its literal, or `stand_in` when given as a path.
fn on<T: Copy>(given: &Option<Spanned<OrPath<T>>>, stand_in: T) -> Option<T> {
    given
        .as_ref()
        .map(|given| given.value.literal().unwrap_or(stand_in))
}

/// The options given as a path, by name: the expansion reads each when the cache is built.
fn from_code(options: &Options) -> Vec<(&'static str, Path)> {
    macro_rules! paths {
        ($($option:ident),*) => {
            [$((stringify!($option), options.$option.as_ref().and_then(|given| given.value.path()))),*]
        };
    }
    paths!(
        ttl,
        jitter,
        stale,
        timeout,
        retries,
        backoff,
        capacity,
        refresh_after,
        xfetch,
        fail_safe,
        fail_safe_throttle,
        soft_timeout,
        memory_ttl,
        compress,
        breaker,
        breaker_cooldown,
        max_loads,
        batch_max
    )
    .into_iter()
    .filter_map(|(option, path)| Some((option, path?.clone())))
    .collect()
}

fn non_zero(setting: Spanned<Duration>, name: &str, why: &str, errors: &mut Errors) -> Duration {
    if setting.value.is_zero() {
        errors.push(error(
            setting.span,
            format!("`{name}` cannot be zero: {why}"),
            format!("give `{name}` a positive duration, e.g. \"60s\""),
        ));
    }
    setting.value
}

/// The Redis options: the backend (tiered by default with `lock = "redis"`), the connection,
/// and the busy policy, each checked against the others.
fn shared_tier(
    options: &Options,
    lock: LockKind,
    errors: &mut Errors,
) -> (BackendKind, Option<LitStr>, BusyKind) {
    let backend = match (&options.backend, lock) {
        (Some(backend), _) => backend.value,
        (None, LockKind::Redis) => BackendKind::Tiered,
        (None, _) => BackendKind::Memory,
    };
    if let (Some(written), LockKind::Redis) = (&options.backend, lock)
        && written.value == BackendKind::Memory
    {
        errors.push(error(
            written.span,
            "`lock = \"redis\"` cannot go with `backend = \"memory\"`",
            "other processes wait for the lock holder's value, so it must be stored where they can read it: use `backend = \"tiered\"` (the default with this lock) or `backend = \"redis\"`",
        ));
    }
    if let Some(connection) = &options.redis
        && backend == BackendKind::Memory
    {
        errors.push(error(
            connection.span(),
            "`redis` names a Redis connection, but this cache keeps its values in memory only",
            "add `lock = \"redis\"` or `backend = \"tiered\"` to use that connection, or remove `redis`",
        ));
    }
    if let Some(busy) = &options.busy
        && lock != LockKind::Redis
    {
        errors.push(error(
            busy.span,
            "`busy` says what to do while another process holds the Redis lock, and this cache has no Redis lock",
            "add `lock = \"redis\"`, or remove `busy`",
        ));
    }
    if !cfg!(feature = "redis") {
        let lock_span = options
            .lock
            .as_ref()
            .filter(|l| l.value == LockKind::Redis)
            .map(|l| l.span);
        let backend_span = options
            .backend
            .as_ref()
            .filter(|b| b.value != BackendKind::Memory)
            .map(|b| b.span);
        let redis_span = options.redis.as_ref().map(LitStr::span);
        for span in [lock_span, backend_span, redis_span].into_iter().flatten() {
            errors.push(error(
                span,
                "this option needs stampede's `redis` feature, which is disabled",
                "enable it in Cargo.toml: add `features = [\"redis\"]` to the `stampede-cache` dependency, or drop its `default-features = false` (it is on by default)",
            ));
        }
    }
    let busy = options
        .busy
        .as_ref()
        .map_or(BusyKind::Wait, |busy| busy.value);
    (backend, options.redis.clone(), busy)
}

/// `busy = "error"` fails a call with `stampede::Error::LockBusy`, which only a function that
/// returns `Result` can hand to its caller.
fn busy_error_needs_result(options: &Options, function: &Function, errors: &mut Errors) {
    if let Some(busy) = &options.busy
        && busy.value == BusyKind::Error
        && let Returns::Value(_) = function.returns
    {
        errors.push(error(
            busy.span,
            format!(
                "`busy = \"error\"` fails a call while another process holds the lock, and `{}` returns a plain value: its callers would have no error channel, and would panic under contention",
                function.sig.ident
            ),
            "return `Result<T, E>`, whose `E: From<stampede::Error>` receives `stampede::Error::LockBusy`, or use `busy = \"wait\"` (wait for the other process's value) or `busy = \"compute\"` (load it here)",
        ));
    }
}

/// The key's arguments: those the template names, or every argument but the receiver.
fn key_args(options: &Options, function: &Function, errors: &mut Errors) -> Vec<Ident> {
    let Some(template) = &options.key else {
        return function.args.iter().map(|arg| arg.ident.clone()).collect();
    };
    let mut key_args = Vec::new();
    for name in template.value.args() {
        match function.args.iter().find(|arg| arg.ident == name) {
            Some(arg) => key_args.push(arg.ident.clone()),
            None => errors.push(unknown_arg(template.span, "key", name, function)),
        }
    }
    key_args
}

/// The tag templates, each checked to name only arguments of the key: a tag is rendered from
/// the key, so that every entry of one key has the same tags.
fn tags(
    options: &Options,
    key_args: &[Ident],
    function: &Function,
    errors: &mut Errors,
) -> Vec<Spanned<KeyTemplate>> {
    let Some(tags) = &options.tags else {
        return Vec::new();
    };
    for tag in &tags.value {
        for name in tag.value.args() {
            if key_args.iter().any(|arg| arg == name) {
                continue;
            }
            let in_signature = function.args.iter().any(|arg| arg.ident == name);
            errors.push(if in_signature {
                error(
                    tag.span,
                    format!("the tag template names `{name}`, which is not part of the key"),
                    format!(
                        "a tag is rendered from the key; add `{name}` to the `key` template, or leave it out of the tag"
                    ),
                )
            } else {
                unknown_arg(tag.span, "tag", name, function)
            });
        }
    }
    tags.value.clone()
}

fn unknown_arg(span: Span, what: &str, name: &str, function: &Function) -> syn::Error {
    let help = if name == "self" {
        "the receiver is never part of the key; name the arguments that tell calls apart".to_owned()
    } else if function.args.is_empty() {
        format!(
            "`{}` takes no arguments; use a constant key such as \"all\"",
            function.sig.ident
        )
    } else {
        let names: Vec<String> = function
            .args
            .iter()
            .map(|arg| format!("`{}`", arg.ident))
            .collect();
        format!(
            "the arguments of `{}` are {}",
            function.sig.ident,
            names.join(", ")
        )
    };
    error(
        span,
        format!(
            "the {what} template names `{name}`, which is not an argument of `{}`",
            function.sig.ident
        ),
        help,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::options_doc_table;

    /// The settings of `#[cached(ttl = "1s")]` on a plain function: every other option left to
    /// its default.
    fn defaults() -> Settings {
        let mut errors = Errors::default();
        let options = Options::parse(r#"ttl = "1s""#.parse().unwrap(), &mut errors);
        let item = syn::parse_str("async fn f(id: u64) -> u64 { id }").unwrap();
        let function = Function::analyze(item, &mut errors);
        let settings = validate(options, &function, &mut errors);
        assert!(errors.finish(()).is_ok());
        settings
    }

    /// The default column of the rustdoc table, by option.
    fn documented(option: &str) -> String {
        let row = options_doc_table!()
            .lines()
            .find(|row| row.starts_with(&format!("| `{option}` |")))
            .unwrap_or_else(|| panic!("no row for `{option}`"));
        row.trim_end_matches(" |")
            .rsplit(" | ")
            .next()
            .unwrap()
            .replace('_', "")
    }

    #[test]
    fn the_documented_defaults_are_the_applied_ones() {
        let settings = defaults();
        let duration = |d: Duration| format!("`\"{}\"`", humantime::format_duration(d));
        assert_eq!(documented("jitter"), format!("`{}`", settings.jitter));
        assert_eq!(documented("stale"), duration(settings.stale));
        assert_eq!(documented("timeout"), duration(settings.timeout));
        assert_eq!(documented("retries"), format!("`{}`", settings.retries));
        assert_eq!(documented("backoff"), duration(settings.backoff));
        assert_eq!(documented("capacity"), format!("`{}`", settings.capacity));
        assert_eq!(
            documented("fail_safe_throttle"),
            duration(settings.fail_safe_throttle)
        );
        assert_eq!(
            documented("breaker_cooldown"),
            duration(settings.breaker_cooldown)
        );
        assert!(settings.lock == LockKind::Local && documented("lock") == "`\"local\"`");
        assert!(
            settings.backend == BackendKind::Memory
                && documented("backend").starts_with("`\"memory\"`")
        );
        assert!(settings.busy == BusyKind::Wait && documented("busy") == "`\"wait\"`");
        assert!(settings.redis.is_none() && settings.name.is_none());
    }
}
