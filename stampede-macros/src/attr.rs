//! Parses the attribute's arguments, `ttl = "60s", jitter = 20, ...`, into typed [`Options`].
//!
//! Each value is checked for its own form here (a duration parses, a number is a number, a
//! choice is one of its words); how the options fit together is `validate`'s job.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Ident, Lit, LitStr, Token};

use crate::diag::{Errors, error};
use crate::key::KeyTemplate;

/// One option of the attribute: its name and how its value is read into [`Options`].
pub(crate) struct OptionSpec {
    pub(crate) name: &'static str,
    /// Reads the value of a `name = value` pair into its field of [`Options`].
    set: fn(&mut Options, &Pair) -> syn::Result<()>,
}

/// Declares every option once, in the order the documentation lists them: its name, how its
/// value is read, what it means and its default. From that one list come the [`OPTIONS`]
/// table, which parsing, "did you mean" suggestions and the list of valid options read, and
/// `options_doc_table!()`, the string literal of the options table on the rustdoc page of
/// `#[cached]` (a macro, because `#[doc = ...]` takes a literal, not a constant). The defaults
/// shown there are the ones `validate` applies; a unit test compares them.
macro_rules! options {
    ($($name:literal => $set:expr, doc: $doc:literal, default: $default:literal;)*) => {
        /// Every option the attribute takes.
        pub(crate) const OPTIONS: &[OptionSpec] = &[
            $(OptionSpec { name: $name, set: $set },)*
        ];

        /// The options as a Markdown table (option, meaning, default): a string literal, for
        /// `#[doc = ...]`.
        macro_rules! options_doc_table {
            () => {
                concat!(
                    "| option | meaning | default |\n|---|---|---|\n",
                    $("| `", $name, "` | ", $doc, " | ", $default, " |\n",)*
                )
            };
        }
        pub(crate) use options_doc_table;
    };
}

options! {
    "ttl" => |o, p| put(&mut o.ttl, p, or_path(p, duration)?),
        doc: "how long a value is fresh, e.g. `\"500ms\"`, `\"60s\"`, `\"5m\"`",
        default: "required";
    "jitter" => |o, p| put(&mut o.jitter, p, or_path(p, percent)?),
        doc: "percent 0..=100: each fill is fresh for `ttl * (1 - u)`, `u` uniform in `[0, jitter/100]`",
        default: "`10`";
    "stale" => |o, p| put(&mut o.stale, p, or_path(p, duration)?),
        doc: "window after the fresh time in which the old value is served while one refresh runs",
        default: "`\"0s\"`";
    "timeout" => |o, p| put(&mut o.timeout, p, or_path(p, duration)?),
        doc: "bound on one load attempt",
        default: "`\"10s\"`";
    "retries" => |o, p| put(&mut o.retries, p, or_path(p, |p| int(p, "2"))?),
        doc: "extra attempts after a failed or timed-out attempt, inside the one load",
        default: "`0`";
    "backoff" => |o, p| put(&mut o.backoff, p, or_path(p, duration)?),
        doc: "base delay before a retry, doubled per retry and jittered by ±50%",
        default: "`\"50ms\"`";
    "lock" => |o, p| put(&mut o.lock, p, choice(p, LOCKS)?),
        doc: "`\"local\"`: one load per key per process; `\"redis\"`: one load per key across the processes sharing a Redis; `\"none\"`: every miss loads",
        default: "`\"local\"`";
    "backend" => |o, p| put(&mut o.backend, p, choice(p, BACKENDS)?),
        doc: "`\"memory\"`: values live in this process, in a bounded store; `\"tiered\"`: in memory in front of Redis; `\"redis\"`: in Redis only",
        default: "`\"memory\"`; `\"tiered\"` with `lock = \"redis\"`";
    "redis" => |o, p| put_raw(&mut o.redis, p, string(p, "the name a connection was installed under, e.g. \"sessions\"")?),
        doc: "the Redis connection, by the name `RedisConfig::install_as` gave it",
        default: "the connection of `RedisConfig::install`";
    "busy" => |o, p| put(&mut o.busy, p, choice(p, BUSY)?),
        doc: "with `lock = \"redis\"`, what a call does while another process holds the key's lock: `\"wait\"` for its value, `\"compute\"` the value here, or `\"error\"`: fail with `stampede::Error::LockBusy` (a function that returns `Result`)",
        default: "`\"wait\"`";
    "refresh_after" => |o, p| put(&mut o.refresh_after, p, or_path(p, duration)?),
        doc: "refresh-ahead: past this age (below `ttl`, jittered like it) a hit also starts one background refresh, so a key read steadily never expires",
        default: "off";
    "xfetch" => |o, p| put(&mut o.xfetch, p, or_path(p, |p| number(p, "1.0"))?),
        doc: "probabilistic early refresh (XFetch, VLDB 2015) with this `beta`: a hit starts one background refresh when `now - load time * beta * ln(u) >= fresh deadline` (`u` uniform per hit), the load time being the key's last load's here; likelier as the deadline nears and for slower loads, so a hot key is refreshed before it expires (a higher `beta`, earlier)",
        default: "off";
    "fail_safe" => |o, p| put(&mut o.fail_safe, p, or_path(p, duration)?),
        doc: "when a load fails (error, timeout, panic), serve the last good value for this long past its stale deadline",
        default: "off";
    "fail_safe_throttle" => |o, p| put(&mut o.fail_safe_throttle, p, or_path(p, duration)?),
        doc: "with `fail_safe`, how long a served last good value stands before the source is asked again",
        default: "`\"5s\"`";
    "soft_timeout" => |o, p| put(&mut o.soft_timeout, p, or_path(p, duration)?),
        doc: "with `fail_safe`, a caller waiting for a load gets the last good value after this; the load goes on and stores its result",
        default: "off";
    "memory_ttl" => |o, p| put(&mut o.memory_ttl, p, or_path(p, duration)?),
        doc: "with a tiered cache (`backend = \"tiered\"`, the default with `lock = \"redis\"`): how long this process serves a value from memory before it reads Redis again (at most `ttl`), while Redis keeps it for `ttl`; past it the value is still the last good one for `fail_safe`",
        default: "`ttl`";
    "compress" => |o, p| put(&mut o.compress, p, or_path(p, |p| int(p, "16_384"))?),
        doc: "with Redis and stampede's `compress` feature: a value whose payload takes more than this many bytes is written to Redis LZ4-compressed (where that makes it smaller); every binary sharing the cache reads either form with the feature, and the option is not part of the cache's identity",
        default: "off";
    "retry_if" => |o, p| put(&mut o.retry_if, p, fn_path(p, "a `fn(&E) -> bool`", "is_transient")?),
        doc: "path of a `fn(&E) -> bool` (`retry_if = is_transient`, or in quotes): only errors it accepts are retried (timeouts always are)",
        default: "every error";
    "ttl_from" => |o, p| put(&mut o.ttl_from, p, fn_path(p, "a `fn(&T) -> Duration` or `fn(&T) -> Option<Duration>`", "max_age")?),
        doc: "path of a `fn(&T) -> Duration` or `fn(&T) -> Option<Duration>` (`None`: `ttl`): each value's own fresh time (an HTTP `max-age`, a token's expiry), capped at `ttl`; `jitter` and `stale` apply on top",
        default: "off";
    "long_windows" => |o, p| put(&mut o.long_windows, p, boolean(p)?),
        doc: "`true` accepts a `stale` or `fail_safe` more than 1,000 times `ttl`, which is otherwise refused as a likely slip of the unit",
        default: "`false`";
    "batch" => |o, p| put(&mut o.batch, p, ident(p, "the argument that holds the keys, e.g. `batch = ids`")?),
        doc: "makes this a batch function: names the argument holding its keys (`Vec<K>`, `&[K]`, `HashSet<K>`, `BTreeSet<K>`), and the function returns a map of the keys it found (`HashMap<K, V>`, `BTreeMap<K, V>`, or a `Result` of one); each key is cached on its own (see the guide's [Batch functions](https://docs.rs/stampede-cache/latest/stampede/guide/batch/index.html) page)",
        default: "off";
    "batch_max" => |o, p| put(&mut o.batch_max, p, or_path(p, |p| int(p, "100"))?),
        doc: "with `batch`: the most keys one call of the function is given; a larger batch is split into calls of at most this many keys, made at once",
        default: "no bound";
    "missing_ttl" => |o, p| put(&mut o.missing_ttl, p, or_path(p, duration)?),
        doc: "with `batch`: how long a key the function's map leaves out is cached as absent (at most `ttl`; `\"0s\"`: not cached, every call asks the function again)",
        default: "`ttl`";
    "batch_loader" => |o, p| put(&mut o.batch_loader, p, fn_path(p, "a batch function", "products")?),
        doc: "makes this single-key function a call of a batch function's cache: the path of that function (`batch_loader = products`, `Self::products` for a method), whose options, cache and loads it shares; its arguments are the batch function's, with one key in place of the keys",
        default: "off";
    "batch_window" => |o, p| put(&mut o.batch_window, p, or_path(p, duration)?),
        doc: "with `batch_loader`: single-key calls that must load within this window of each other are loaded by one call of the batch function (DataLoader's pattern)",
        default: "off: each call loads its key alone";
    "source_version" => |o, p| put(&mut o.source_version, p, fn_path(p, "a `fn(&T) -> u64`", "row_version")?),
        doc: "path of a `fn(&T) -> u64` giving the source version a value was read at (a row version, an `updated_at`): a load, refresh or `prime` of an older version than the value stored is not stored, in memory or in Redis",
        default: "off";
    "breaker" => |o, p| put(&mut o.breaker, p, or_path(p, |p| int(p, "5"))?),
        doc: "after this many consecutive failed loads of the cache, skip the source for `breaker_cooldown` (the fail-safe value, else `stampede::Error::CircuitOpen` at once), then one probe",
        default: "off";
    "breaker_cooldown" => |o, p| put(&mut o.breaker_cooldown, p, or_path(p, duration)?),
        doc: "how long an open breaker skips the source before one probe load",
        default: "`\"30s\"`";
    "max_loads" => |o, p| put(&mut o.max_loads, p, or_path(p, |p| int(p, "16"))?),
        doc: "the most loads of this cache that run at once in a process (a batch's load counts once): a miss beyond them waits for a free one, at most `timeout`, then fails with `stampede::Error::LoadsFull` (as a stale or fail-safe value allows, like any failed load); singleflight bounds one key's loads, this bounds a cold start's many keys",
        default: "no bound";
    "max_loads_full" => |o, p| put(&mut o.max_loads_full, p, choice(p, FULL)?),
        doc: "with `max_loads`: `\"wait\"` for a free load (at most `timeout`), or `\"error\"`: fail at once with `stampede::Error::LoadsFull` (a function that returns `Result`)",
        default: "`\"wait\"`";
    "capacity" => |o, p| put(&mut o.capacity, p, or_path(p, |p| int(p, "10_000"))?),
        doc: "maximum entries kept in memory",
        default: "`10_000`";
    "key" => |o, p| put(&mut o.key, p, KeyTemplate::parse(&string(p, "a key template such as \"user:{id}\"")?, "key")?),
        doc: "template naming the arguments that form the key, e.g. `\"user:{id}\"`",
        default: "all arguments";
    "tags" => |o, p| put(&mut o.tags, p, tags(p)?),
        doc: "templates rendered from the key's arguments, e.g. `[\"user:{user_id}\", \"catalog\"]`: `stampede::invalidate_tag(\"user:42\")` drops every entry of every function tagged so",
        default: "none";
    "name" => |o, p| put_raw(&mut o.name, p, string(p, "a name such as \"users::by_id\"")?),
        doc: "the cache's name in stats and errors",
        default: "`module::path::fn`, `path::Type::method`";
    "version" => |o, p| put_raw(&mut o.version, p, string(p, "a version such as \"2\" or \"2024-06-prices-in-cents\"")?),
        doc: "with Redis, a part of the cache's identity beside its name and the shape of its key and value types: change it when a type's meaning changes and its shape does not (cents where there were euros), or when a type's shape cannot be traced (`serde_json::Value`, untagged or internally tagged enums, `flatten`)",
        default: "none";
    "companion" => |o, p| put(&mut o.companion, p, boolean(p)?),
        doc: "emit the typed operations on the cache (`invalidate`, `refresh`, `read_through`, `prime`, `peek`, `uncached`): a free function's companion type `product::`, a method's associated functions `Type::method_invalidate` (in a trait impl, with `#[stampede::companions]` on the impl)",
        default: "`true` on a free function, `false` on a method";
    "crate" => |o, p| put(&mut o.krate, p, crate_path(p)?),
        doc: "path of the `stampede` crate when renamed in `Cargo.toml`",
        default: "`\"stampede\"`";
}

/// The hidden option `#[stampede::companions]` adds to the `#[cached]` of each method it emits
/// a companion for (`__stampede_companions = true`); not one of [`OPTIONS`], not documented.
pub(crate) const IN_COMPANIONS_BLOCK: &str = "__stampede_companions";

const LOCKS: &[(&str, LockKind)] = &[
    ("local", LockKind::Local),
    ("redis", LockKind::Redis),
    ("none", LockKind::None),
];
const BACKENDS: &[(&str, BackendKind)] = &[
    ("memory", BackendKind::Memory),
    ("redis", BackendKind::Redis),
    ("tiered", BackendKind::Tiered),
];
const FULL: &[(&str, FullKind)] = &[("wait", FullKind::Wait), ("error", FullKind::Error)];
const BUSY: &[(&str, BusyKind)] = &[
    ("wait", BusyKind::Wait),
    ("compute", BusyKind::Compute),
    ("error", BusyKind::Error),
];

/// The value of a number or duration option: a literal, checked at compile time, or a path to a
/// function or a constant (`ttl = config::product_ttl`), read and checked when the cache is
/// built.
#[derive(Clone)]
pub(crate) enum OrPath<T> {
    Literal(T),
    Path(syn::Path),
}

impl<T: Copy> OrPath<T> {
    /// The literal, if the value is one.
    pub(crate) fn literal(&self) -> Option<T> {
        match self {
            OrPath::Literal(value) => Some(*value),
            OrPath::Path(_) => None,
        }
    }
}

impl<T> OrPath<T> {
    /// The path, if the value is one.
    pub(crate) fn path(&self) -> Option<&syn::Path> {
        match self {
            OrPath::Literal(_) => None,
            OrPath::Path(path) => Some(path),
        }
    }
}

impl<T: Copy> Spanned<OrPath<T>> {
    /// The literal with its span, if the value is one.
    pub(crate) fn literal(&self) -> Option<Spanned<T>> {
        self.value.literal().map(|value| Spanned {
            value,
            span: self.span,
        })
    }
}

/// A value as written, with the span of its literal for errors about it.
#[derive(Clone, Copy)]
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockKind {
    Local,
    Redis,
    None,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendKind {
    Memory,
    Redis,
    Tiered,
}

/// `max_loads_full`: what a miss does when `max_loads` loads run already.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FullKind {
    Wait,
    Error,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BusyKind {
    Wait,
    Compute,
    Error,
}

/// The attribute's options as written; `None` where an option was left out.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) ttl: Option<Spanned<OrPath<Duration>>>,
    pub(crate) jitter: Option<Spanned<OrPath<u64>>>,
    pub(crate) stale: Option<Spanned<OrPath<Duration>>>,
    pub(crate) timeout: Option<Spanned<OrPath<Duration>>>,
    pub(crate) retries: Option<Spanned<OrPath<u32>>>,
    pub(crate) backoff: Option<Spanned<OrPath<Duration>>>,
    pub(crate) lock: Option<Spanned<LockKind>>,
    pub(crate) backend: Option<Spanned<BackendKind>>,
    pub(crate) redis: Option<LitStr>,
    pub(crate) busy: Option<Spanned<BusyKind>>,
    pub(crate) capacity: Option<Spanned<OrPath<u64>>>,
    pub(crate) refresh_after: Option<Spanned<OrPath<Duration>>>,
    pub(crate) xfetch: Option<Spanned<OrPath<f64>>>,
    pub(crate) fail_safe: Option<Spanned<OrPath<Duration>>>,
    pub(crate) fail_safe_throttle: Option<Spanned<OrPath<Duration>>>,
    pub(crate) soft_timeout: Option<Spanned<OrPath<Duration>>>,
    pub(crate) memory_ttl: Option<Spanned<OrPath<Duration>>>,
    pub(crate) compress: Option<Spanned<OrPath<usize>>>,
    pub(crate) retry_if: Option<Spanned<syn::Path>>,
    pub(crate) source_version: Option<Spanned<syn::Path>>,
    pub(crate) breaker: Option<Spanned<OrPath<u32>>>,
    pub(crate) breaker_cooldown: Option<Spanned<OrPath<Duration>>>,
    pub(crate) max_loads: Option<Spanned<OrPath<u32>>>,
    pub(crate) max_loads_full: Option<Spanned<FullKind>>,
    pub(crate) key: Option<Spanned<KeyTemplate>>,
    /// The tag templates, each with the span of its literal.
    pub(crate) tags: Option<Spanned<Vec<Spanned<KeyTemplate>>>>,
    pub(crate) name: Option<LitStr>,
    pub(crate) version: Option<LitStr>,
    pub(crate) krate: Option<Spanned<syn::Path>>,
    pub(crate) companion: Option<Spanned<bool>>,
    pub(crate) ttl_from: Option<Spanned<syn::Path>>,
    pub(crate) long_windows: Option<Spanned<bool>>,
    /// `batch = ids`: the argument holding a batch function's keys.
    pub(crate) batch: Option<Spanned<Ident>>,
    pub(crate) batch_max: Option<Spanned<OrPath<u64>>>,
    pub(crate) missing_ttl: Option<Spanned<OrPath<Duration>>>,
    /// `batch_loader = products`: the batch function whose cache this single-key function calls.
    pub(crate) batch_loader: Option<Spanned<syn::Path>>,
    pub(crate) batch_window: Option<Spanned<OrPath<Duration>>>,
    /// Set by `#[stampede::companions]` on the trait impl around the method (the hidden option
    /// [`IN_COMPANIONS_BLOCK`]): the companion's items are emitted there, in an inherent impl.
    pub(crate) in_companions_block: bool,
    /// Every option written, with the span of its name, in order.
    pub(crate) given: Vec<(&'static str, Span)>,
    /// Some option was misspelt or had a bad value: checks of what is missing would mislead.
    pub(crate) incomplete: bool,
}

/// One `name = value` pair.
struct Pair {
    name: Ident,
    value: Value,
}

/// The value of a pair: one literal, a bracketed list of them (`tags = ["a", "b"]`), or a
/// path written bare (`retry_if = is_transient`).
enum Value {
    One(Lit),
    List { items: Vec<Lit>, span: Span },
    Path(syn::Path),
}

impl Value {
    fn span(&self) -> Span {
        match self {
            Value::One(lit) => lit.span(),
            Value::List { span, .. } => *span,
            Value::Path(path) => path
                .segments
                .first()
                .map_or_else(Span::call_site, |segment| segment.ident.span()),
        }
    }
}

impl Pair {
    /// The one literal of the pair: a list is an error, except for the options that take one.
    fn lit(&self) -> syn::Result<&Lit> {
        match &self.value {
            Value::One(lit) => Ok(lit),
            Value::List { span, .. } => Err(error(
                *span,
                format!("`{}` takes one value, not a list", self.name),
                format!("write it as `{} = ...`, e.g. `ttl = \"60s\"`", self.name),
            )),
            Value::Path(path) => Err(error(
                self.value.span(),
                format!(
                    "the value of `{}` must be a literal, not `{}`",
                    self.name,
                    path_text(path)
                ),
                "write a string such as `\"60s\"` or a number such as `20`",
            )),
        }
    }
}

impl Parse for Pair {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        // `parse_any` so that `crate = "..."` parses although `crate` is a keyword.
        let name = Ident::parse_any(input)?;
        if !input.peek(Token![=]) {
            return Err(error(
                name.span(),
                format!("`{name}` needs a value"),
                format!("write it as `{name} = ...`, e.g. `ttl = \"60s\"`"),
            ));
        }
        input.parse::<Token![=]>()?;
        let not_literal = |e: syn::Error| {
            error(
                e.span(),
                format!("the value of `{name}` must be a literal"),
                "write a string such as `\"60s\"` or a number such as `20`",
            )
        };
        if input.peek(syn::token::Bracket) {
            let content;
            let brackets = syn::bracketed!(content in input);
            let items = Punctuated::<Lit, Token![,]>::parse_terminated(&content)
                .map_err(not_literal)?
                .into_iter()
                .collect();
            let span = brackets.span.join();
            return Ok(Pair {
                name,
                value: Value::List { items, span },
            });
        }
        // A bare path names a function (`retry_if = is_transient`) or an argument (`batch =
        // ids`); `true` and `false` are literals.
        if !input.peek(Lit) && (input.peek(Ident::peek_any) || input.peek(Token![::])) {
            let path = input
                .call(syn::Path::parse_mod_style)
                .map_err(not_literal)?;
            return Ok(Pair {
                name,
                value: Value::Path(path),
            });
        }
        let value = Value::One(input.parse::<Lit>().map_err(not_literal)?);
        Ok(Pair { name, value })
    }
}

impl Options {
    /// Parses the attribute's arguments. A bad option is reported and left out, so that the
    /// others are still checked; arguments that do not parse as `name = value` at all are
    /// reported and give no options.
    pub(crate) fn parse(args: TokenStream, errors: &mut Errors) -> Options {
        let mut options = Options::default();
        match Punctuated::<Pair, Token![,]>::parse_terminated.parse2(args) {
            Ok(pairs) => {
                for pair in pairs {
                    if let Err(e) = options.set(&pair) {
                        options.incomplete = true;
                        errors.push(e);
                    }
                }
            }
            Err(e) => {
                options.incomplete = true;
                errors.push(e);
            }
        }
        options
    }

    fn set(&mut self, pair: &Pair) -> syn::Result<()> {
        let name = pair.name.to_string();
        if name == IN_COMPANIONS_BLOCK {
            self.in_companions_block = true;
            return Ok(());
        }
        match OPTIONS.iter().find(|option| option.name == name) {
            Some(option) => {
                self.given.push((option.name, pair.name.span()));
                (option.set)(self, pair)
            }
            None => Err(unknown(&pair.name)),
        }
    }
}

/// A number or duration option's value: a path as written, else the literal `literal` reads.
fn or_path<T>(pair: &Pair, literal: fn(&Pair) -> syn::Result<T>) -> syn::Result<OrPath<T>> {
    match &pair.value {
        Value::Path(path) => Ok(OrPath::Path(path.clone())),
        _ => literal(pair).map(OrPath::Literal),
    }
}

fn put<T>(slot: &mut Option<Spanned<T>>, pair: &Pair, value: T) -> syn::Result<()> {
    put_raw(
        slot,
        pair,
        Spanned {
            value,
            span: pair.value.span(),
        },
    )
}

fn put_raw<T>(slot: &mut Option<T>, pair: &Pair, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(error(
            pair.name.span(),
            format!("`{}` is given twice", pair.name),
            "keep one of them",
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// An option no entry of [`OPTIONS`] names: the nearest name when it looks misspelt, else the
/// list of every option.
fn unknown(name: &Ident) -> syn::Error {
    let written = name.to_string();
    let nearest = OPTIONS
        .iter()
        .map(|option| {
            (
                strsim::damerau_levenshtein(&written, option.name),
                option.name,
            )
        })
        .min_by_key(|(distance, _)| *distance)
        .filter(|(distance, _)| *distance <= 2);
    let help = match nearest {
        Some((_, option)) => format!("did you mean `{option}`?"),
        None => format!(
            "the options are {}",
            OPTIONS
                .iter()
                .map(|o| format!("`{}`", o.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    error(name.span(), format!("unknown option `{written}`"), help)
}

/// A string value; `example` completes the help "write ...".
fn string(pair: &Pair, example: &str) -> syn::Result<LitStr> {
    match pair.lit()? {
        Lit::Str(s) => Ok(s.clone()),
        other => Err(error(
            other.span(),
            format!("`{}` takes a string", pair.name),
            format!("write {example}"),
        )),
    }
}

/// A duration in the humantime syntax, `"500ms"`, `"60s"`, `"5m"`, that fits in `u64`
/// nanoseconds.
fn duration(pair: &Pair) -> syn::Result<Duration> {
    let name = &pair.name;
    let text = string(pair, "a duration such as \"500ms\", \"60s\" or \"5m\"")?;
    let parsed = humantime::parse_duration(&text.value()).map_err(|e| {
        error(
            text.span(),
            format!("`{}` is not a duration ({e})", text.value()),
            format!("write `{name}` as a number and a unit, such as \"500ms\", \"60s\", \"5m\" or \"1h 30m\""),
        )
    })?;
    if u64::try_from(parsed.as_nanos()).is_err() {
        return Err(error(
            text.span(),
            format!("`{}` is too long", text.value()),
            "durations up to 500 years are accepted",
        ));
    }
    Ok(parsed)
}

/// A number, whole or not, written without quotes like `example`.
fn number(pair: &Pair, example: &str) -> syn::Result<f64> {
    let name = &pair.name;
    match pair.lit()? {
        Lit::Float(float) => float.base10_parse(),
        Lit::Int(int) => int.base10_parse(),
        other => Err(error(
            other.span(),
            format!("`{name}` takes a number"),
            format!("write it without quotes, e.g. `{name} = {example}`"),
        )),
    }
}

/// A whole number, written without quotes like `example`.
fn int<T: std::str::FromStr>(pair: &Pair, example: &str) -> syn::Result<T>
where
    T::Err: std::fmt::Display,
{
    let name = &pair.name;
    match pair.lit()? {
        Lit::Int(int) => int.base10_parse().map_err(|e| {
            error(
                int.span(),
                format!("`{name} = {}` does not fit ({e})", int.base10_digits()),
                format!("write a smaller number, e.g. `{name} = {example}`"),
            )
        }),
        Lit::Str(text) => Err(error(
            text.span(),
            format!("`{name}` takes a whole number"),
            format!("write it without quotes, e.g. `{name} = {example}`"),
        )),
        Lit::Float(float) => {
            let help = match whole(float) {
                Some(whole) => format!("write it without a fraction: `{name} = {whole}`"),
                None => format!("write a whole number, e.g. `{name} = {example}`"),
            };
            Err(error(
                float.span(),
                format!(
                    "`{name}` takes a whole number, not `{}`",
                    float.base10_digits()
                ),
                help,
            ))
        }
        other => Err(error(
            other.span(),
            format!("`{name}` takes a whole number"),
            format!("write e.g. `{name} = {example}`"),
        )),
    }
}

/// `jitter`'s whole percent, `jitter = 20` for 20% (its range is checked with the other
/// options). A fraction, `jitter = 0.2`, is the likely slip: the fix names its percent.
fn percent(pair: &Pair) -> syn::Result<u64> {
    let name = &pair.name;
    let Ok(Lit::Float(float)) = pair.lit() else {
        return int(pair, "20");
    };
    let help = match (whole(float), float.base10_parse::<f64>()) {
        (Some(whole), _) => format!("write it without a fraction: `{name} = {whole}` for {whole}%"),
        (None, Ok(fraction)) if fraction > 0.0 && fraction < 1.0 => {
            let percent = (fraction * 100.0).round();
            format!(
                "write the percent as a whole number, `{name} = {percent}` for {percent}%, not a fraction of 1"
            )
        }
        (None, _) => format!("write a whole number from 0 to 100, e.g. `{name} = 20` for 20%"),
    };
    Err(error(
        float.span(),
        format!(
            "`{name}` is a whole percent from 0 to 100, not `{}`",
            float.base10_digits()
        ),
        help,
    ))
}

/// The whole number a float literal is equal to (`20.0`, `1e4`), if it is one.
fn whole(float: &syn::LitFloat) -> Option<u64> {
    let value = float.base10_parse::<f64>().ok()?;
    // Below 2^53 every whole number is exact in an f64.
    (value.fract() == 0.0 && (0.0..9.0e15).contains(&value)).then_some(value as u64)
}

/// `true` or `false`, written without quotes.
fn boolean(pair: &Pair) -> syn::Result<bool> {
    match pair.lit()? {
        Lit::Bool(value) => Ok(value.value),
        other => Err(error(
            other.span(),
            format!("`{}` takes `true` or `false`", pair.name),
            format!("write it without quotes, e.g. `{} = false`", pair.name),
        )),
    }
}

/// One of the words of `choices`, written as a string.
fn choice<T: Copy>(pair: &Pair, choices: &[(&str, T)]) -> syn::Result<T> {
    let name = &pair.name;
    let words = choices
        .iter()
        .map(|(word, _)| format!("\"{word}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = string(pair, &format!("one of {words}"))?;
    choices
        .iter()
        .find(|(word, _)| *word == text.value())
        .map(|(_, choice)| *choice)
        .ok_or_else(|| {
            error(
                text.span(),
                format!("`{name}` cannot be \"{}\"", text.value()),
                format!("choose one of {words}"),
            )
        })
}

/// A list of tag templates, `["user:{user_id}", "catalog"]`.
fn tags(pair: &Pair) -> syn::Result<Vec<Spanned<KeyTemplate>>> {
    let help =
        "write the tags as a list of templates, e.g. `tags = [\"user:{user_id}\", \"catalog\"]`";
    let Value::List { items, .. } = &pair.value else {
        return Err(error(pair.value.span(), "`tags` takes a list", help));
    };
    items
        .iter()
        .map(|item| match item {
            Lit::Str(text) => Ok(Spanned {
                value: KeyTemplate::parse(text, "tag")?,
                span: text.span(),
            }),
            other => Err(error(other.span(), "a tag is a string template", help)),
        })
        .collect()
}

/// The path of the `stampede` crate as renamed in `Cargo.toml`.
fn crate_path(pair: &Pair) -> syn::Result<syn::Path> {
    let path = string(pair, "the path of the renamed crate, e.g. \"my_stampede\"")?;
    path.parse_with(syn::Path::parse_mod_style).map_err(|_| {
        error(
            path.span(),
            format!("`{}` is not a crate path", path.value()),
            "name the dependency as it is renamed in Cargo.toml, e.g. `crate = \"my_stampede\"`",
        )
    })
}

/// The path of a function in scope of the cached one, written bare (`is_transient`,
/// `errors::retryable`) or as a string (`"is_transient"`); `what` says what it must be, and
/// `example` names one.
fn fn_path(pair: &Pair, what: &str, example: &str) -> syn::Result<syn::Path> {
    let name = &pair.name;
    if let Value::Path(path) = &pair.value {
        return Ok(path.clone());
    }
    let path = string(
        pair,
        &format!("the path of {what}, e.g. `{name} = {example}`"),
    )?;
    let mut parsed: syn::Path = path.parse().map_err(|_| {
        error(
            path.span(),
            format!("`{}` is not a path", path.value()),
            format!("name {what} in scope, e.g. `{name} = {example}`"),
        )
    })?;
    // Errors about the function (it does not resolve, its signature does not fit) point at the
    // option's value.
    for segment in &mut parsed.segments {
        segment.ident.set_span(path.span());
    }
    Ok(parsed)
}

/// The name of an argument, written bare (`ids`) or as a string (`"ids"`).
fn ident(pair: &Pair, example: &str) -> syn::Result<Ident> {
    let not_a_name = |span| {
        error(
            span,
            format!("`{}` takes the name of an argument", pair.name),
            format!("write {example}"),
        )
    };
    match &pair.value {
        Value::Path(path) => path
            .get_ident()
            .cloned()
            .ok_or_else(|| not_a_name(pair.value.span())),
        _ => {
            let text = string(pair, example)?;
            syn::parse_str::<Ident>(&text.value())
                .map(|ident| Ident::new(&ident.to_string(), text.span()))
                .map_err(|_| not_a_name(text.span()))
        }
    }
}

/// A path as written, for a message.
fn path_text(path: &syn::Path) -> String {
    quote::ToTokens::to_token_stream(path)
        .to_string()
        .replace(" :: ", "::")
        .replace(":: ", "::")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(args: &str) -> String {
        let mut errors = Errors::default();
        Options::parse(args.parse().unwrap(), &mut errors);
        match errors.finish(()) {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_misspelt_option_gets_the_nearest_name() {
        for (written, meant) in [
            ("bussy", "busy"),
            ("tll", "ttl"),
            ("rediss", "redis"),
            ("capacty", "capacity"),
            ("krate", "crate"),
        ] {
            let error = errors_of(&format!("{written} = \"x\""));
            assert!(
                error.contains(&format!("did you mean `{meant}`?")),
                "{written}: {error}"
            );
        }
    }

    #[test]
    fn an_unknown_option_lists_every_option() {
        let error = errors_of("colour = \"red\"");
        for option in OPTIONS {
            assert!(error.contains(&format!("`{}`", option.name)), "{error}");
        }
    }

    #[test]
    fn every_option_of_the_table_parses() {
        let args = r#"ttl = "1s", jitter = 5, stale = "1s", timeout = "1s", retries = 1,
            backoff = "1ms", lock = "redis", backend = "tiered", redis = "r", busy = "compute",
            capacity = 5, key = "{id}", tags = ["user:{id}", "all"], name = "n",
            companion = false, crate = "s""#;
        assert_eq!(errors_of(args), "");
        let mut errors = Errors::default();
        let options = Options::parse(args.parse().unwrap(), &mut errors);
        assert!(options.ttl.is_some() && options.busy.is_some() && options.krate.is_some());
    }

    #[test]
    fn a_fractional_jitter_is_told_its_whole_percent() {
        let error = errors_of("jitter = 0.2");
        assert!(
            error.contains("`jitter` is a whole percent from 0 to 100, not `0.2`"),
            "{error}"
        );
        assert!(error.contains("`jitter = 20` for 20%"), "{error}");
        assert!(!error.contains("quotes"), "{error}");
        let error = errors_of("jitter = 20.0");
        assert!(error.contains("`jitter = 20` for 20%"), "{error}");
        let error = errors_of("jitter = 12.5");
        assert!(error.contains("e.g. `jitter = 20` for 20%"), "{error}");
    }

    #[test]
    fn a_quoted_number_is_told_to_drop_the_quotes() {
        let error = errors_of("jitter = \"20\"");
        assert!(error.contains("`jitter` takes a whole number"), "{error}");
        assert!(
            error.contains("write it without quotes, e.g. `jitter = 20`"),
            "{error}"
        );
        let error = errors_of("retries = \"2\"");
        assert!(
            error.contains("write it without quotes, e.g. `retries = 2`"),
            "{error}"
        );
    }

    #[test]
    fn a_float_or_an_overflowing_count_is_told_what_is_wrong() {
        let error = errors_of("capacity = 1e4");
        assert!(
            error.contains("`capacity` takes a whole number, not `1e4`"),
            "{error}"
        );
        assert!(error.contains("`capacity = 10000`"), "{error}");
        let error = errors_of("retries = 1.5");
        assert!(error.contains("e.g. `retries = 2`"), "{error}");
        let error = errors_of("retries = 99999999999999999999999");
        assert!(error.contains("does not fit"), "{error}");
        assert!(!error.contains("quotes"), "{error}");
    }

    #[test]
    fn the_rustdoc_table_has_one_row_per_option() {
        let rows: Vec<&str> = options_doc_table!()
            .lines()
            .skip(2)
            .map(|row| row.split('`').nth(1).unwrap())
            .collect();
        let names: Vec<&str> = OPTIONS.iter().map(|option| option.name).collect();
        assert_eq!(rows, names);
    }
}
