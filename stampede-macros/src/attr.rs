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

/// Every option the attribute takes, in the order the README lists them.
pub(crate) const OPTIONS: &[&str] = &[
    "ttl", "jitter", "stale", "timeout", "retries", "backoff", "lock", "backend", "capacity",
    "key", "name", "crate",
];

/// A value as written, with the span of its literal for errors about it.
#[derive(Clone)]
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

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BusyKind {
    Wait,
    Compute,
    Error,
}

/// The attribute's options as written; `None` where an option was left out.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) ttl: Option<Spanned<Duration>>,
    pub(crate) jitter: Option<Spanned<u64>>,
    pub(crate) stale: Option<Spanned<Duration>>,
    pub(crate) timeout: Option<Spanned<Duration>>,
    pub(crate) retries: Option<Spanned<u32>>,
    pub(crate) backoff: Option<Spanned<Duration>>,
    pub(crate) lock: Option<Spanned<LockKind>>,
    pub(crate) backend: Option<Spanned<BackendKind>>,
    pub(crate) redis: Option<LitStr>,
    pub(crate) busy: Option<Spanned<BusyKind>>,
    pub(crate) capacity: Option<Spanned<u64>>,
    pub(crate) key: Option<Spanned<KeyTemplate>>,
    pub(crate) name: Option<LitStr>,
    pub(crate) krate: Option<Spanned<syn::Path>>,
    /// Some option was misspelt or had a bad value: checks of what is missing would mislead.
    pub(crate) incomplete: bool,
}

/// One `name = value` pair.
struct Pair {
    name: Ident,
    value: Lit,
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
        let value = input.parse::<Lit>().map_err(|e| {
            error(
                e.span(),
                format!("the value of `{name}` must be a literal"),
                "write a string such as `\"60s\"` or a number such as `20`",
            )
        })?;
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
        let value = &pair.value;
        match name.as_str() {
            "ttl" => put(&mut self.ttl, pair, duration(value, &name)?),
            "jitter" => put(&mut self.jitter, pair, int(value, &name)?),
            "stale" => put(&mut self.stale, pair, duration(value, &name)?),
            "timeout" => put(&mut self.timeout, pair, duration(value, &name)?),
            "retries" => put(&mut self.retries, pair, int(value, &name)?),
            "backoff" => put(&mut self.backoff, pair, duration(value, &name)?),
            "lock" => {
                let lock = choice(
                    value,
                    &name,
                    &[
                        ("local", LockKind::Local),
                        ("redis", LockKind::Redis),
                        ("none", LockKind::None),
                    ],
                )?;
                put(&mut self.lock, pair, lock)
            }
            "backend" => {
                let backend = choice(
                    value,
                    &name,
                    &[
                        ("memory", BackendKind::Memory),
                        ("redis", BackendKind::Redis),
                        ("tiered", BackendKind::Tiered),
                    ],
                )?;
                put(&mut self.backend, pair, backend)
            }
            "redis" => {
                let connection = string(
                    value,
                    &name,
                    "the name a connection was installed under, e.g. \"sessions\"",
                )?;
                put_raw(&mut self.redis, pair, connection)
            }
            "busy" => {
                let busy = choice(
                    value,
                    &name,
                    &[
                        ("wait", BusyKind::Wait),
                        ("compute", BusyKind::Compute),
                        ("error", BusyKind::Error),
                    ],
                )?;
                put(&mut self.busy, pair, busy)
            }
            "capacity" => put(&mut self.capacity, pair, int(value, &name)?),
            "key" => {
                let template = string(value, &name, "a key template such as \"user:{id}\"")?;
                put(&mut self.key, pair, KeyTemplate::parse(&template)?)
            }
            "name" => {
                let name_lit = string(value, &name, "a name such as \"users::by_id\"")?;
                put_raw(&mut self.name, pair, name_lit)
            }
            "crate" => {
                let path = string(
                    value,
                    &name,
                    "the path of the renamed crate, e.g. \"my_stampede\"",
                )?;
                let parsed = path.parse_with(syn::Path::parse_mod_style).map_err(|_| {
                    error(
                        path.span(),
                        format!("`{}` is not a crate path", path.value()),
                        "name the dependency as it is renamed in Cargo.toml, e.g. `crate = \"my_stampede\"`",
                    )
                })?;
                put(&mut self.krate, pair, parsed)
            }
            _ => Err(unknown(&pair.name)),
        }
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

fn unknown(name: &Ident) -> syn::Error {
    let written = name.to_string();
    let nearest = OPTIONS
        .iter()
        .map(|option| (strsim::damerau_levenshtein(&written, option), option))
        .min()
        .filter(|(distance, _)| *distance <= 2);
    let help = match nearest {
        Some((_, option)) => format!("did you mean `{option}`?"),
        None => format!(
            "the options are {}",
            OPTIONS
                .iter()
                .map(|o| format!("`{o}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    error(name.span(), format!("unknown option `{written}`"), help)
}

fn string(value: &Lit, name: &str, example: &str) -> syn::Result<LitStr> {
    match value {
        Lit::Str(s) => Ok(s.clone()),
        other => Err(error(
            other.span(),
            format!("`{name}` takes a string"),
            format!("write {example}"),
        )),
    }
}

fn duration(value: &Lit, name: &str) -> syn::Result<Duration> {
    let text = string(
        value,
        name,
        "a duration such as \"500ms\", \"60s\" or \"5m\"",
    )?;
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

fn int<T: std::str::FromStr>(value: &Lit, name: &str) -> syn::Result<T>
where
    T::Err: std::fmt::Display,
{
    let not_a_number = |span| {
        error(
            span,
            format!("`{name}` takes a whole number"),
            format!(
                "write it without quotes, e.g. `{name} = {}`",
                example_number(name)
            ),
        )
    };
    match value {
        Lit::Int(int) => int.base10_parse().map_err(|_| not_a_number(int.span())),
        other => Err(not_a_number(other.span())),
    }
}

fn example_number(name: &str) -> &'static str {
    match name {
        "jitter" => "20",
        "retries" => "2",
        _ => "10_000",
    }
}

fn choice<T: Copy>(value: &Lit, name: &str, choices: &[(&str, T)]) -> syn::Result<T> {
    let words = choices
        .iter()
        .map(|(word, _)| format!("\"{word}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = string(value, name, &format!("one of {words}"))?;
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
