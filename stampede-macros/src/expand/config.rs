//! Where a function's cache lives and how it is built: its slot, its options (the runtime's
//! `Config`, made from a constant of the literals), and its tier.

use std::time::Duration;

use proc_macro2::{Ident, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};

use super::Expansion;
use crate::attr::{BackendKind, BusyKind, FullKind, LockKind, OrPath};
use crate::validate::Settings;

impl Expansion<'_> {
    /// The cache's slot, the closure that builds its options and its tier. A free function's
    /// slot and options live in its companion, so that the companion reaches the same cache.
    pub(super) fn cache(&self) -> (TokenStream, TokenStream, TokenStream) {
        let private = &self.private;
        let tier = tier(self.settings, private);
        match &self.companion {
            Some(companion) => {
                let slot = companion.path("slot");
                (quote!(#slot()), companion.path("config"), tier)
            }
            None => {
                let config = config(
                    &self.function.sig.ident,
                    self.named(),
                    self.settings,
                    private,
                    &self.ttl_from(),
                );
                (slot(private), quote!(|| #config), tier)
            }
        }
    }

    /// What the cache's name is made of: a method's type (and trait), a free function's path
    /// when its companion holds the cache, else its body's path.
    pub(super) fn named(&self) -> Named {
        match (self.function.receiver, &self.companion) {
            (Some(_), _) => Named::Method,
            (None, Some(_)) => Named::Path,
            (None, None) => Named::Body,
        }
    }

    /// The `ttl_from` field of the cache's options: `None`, or a function that reads a stored
    /// value's own fresh time: the option's function, of the value as the function returns it
    /// (checked to take a `&T` and return `Duration` or `Option<Duration>`, at the option's
    /// span), and for a batch function's key left out of its map, `missing_ttl`.
    pub(super) fn ttl_from(&self) -> TokenStream {
        let private = &self.private;
        let settings = self.settings;
        let none = quote!(::core::option::Option::None);
        let value = self.value_type();
        let value_ttl = |path: &syn::Path, value: TokenStream| quote_spanned!(last_span(path)=> #private::own_ttl(#path(#value)));
        let (stored, read) = match (&settings.batch, &settings.ttl_from, &settings.missing_ttl) {
            (_, None, None) | (None, None, Some(_)) => return none,
            (None, Some(path), _) => (quote!(#value), value_ttl(path, quote!(__stampede_value))),
            (Some(_), path, missing) => {
                let found = match path {
                    Some(path) => value_ttl(path, quote!(__stampede_found)),
                    None => none.clone(),
                };
                let missing = match missing {
                    Some(OrPath::Literal(missing)) => {
                        let missing = duration(*missing);
                        quote!(::core::option::Option::Some(#missing))
                    }
                    Some(OrPath::Path(path)) => {
                        let ty = quote!(::core::time::Duration);
                        let (read, cell) = (read_path(path, private), once_cell(&ty));
                        let function = function_path(&self.function.sig.ident);
                        quote!(#private::missing_ttl(#cell, #function, || #read))
                    }
                    None => none.clone(),
                };
                let read = quote! {
                    match __stampede_value {
                        ::core::option::Option::Some(__stampede_found) => #found,
                        ::core::option::Option::None => #missing,
                    }
                };
                (quote!(::core::option::Option<#value>), read)
            }
        };
        quote! {
            ::core::option::Option::Some(|__stampede_value: &(dyn ::core::any::Any + ::core::marker::Send + ::core::marker::Sync)| {
                let __stampede_value = __stampede_value.downcast_ref::<#stored>()?;
                #read
            })
        }
    }
}

/// The cache's slot: a static in a block of its own, so that its name is not in the scope of
/// the user's body.
fn slot(private: &TokenStream) -> TokenStream {
    let slot = Ident::new("__STAMPEDE_SLOT", Span::mixed_site());
    quote! {
        {
            static #slot: #private::Slot = #private::Slot::new();
            &#slot
        }
    }
}

/// `Some(value)` or `None`, as tokens.
fn some<T: ToTokens>(value: Option<T>) -> TokenStream {
    match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    }
}

/// The cache's options, as the runtime reads them: the attribute's literals as a constant
/// (`Written`), made into a `Config` with the name and `ttl_from` by one call, then the options
/// given as paths read into it.
pub(super) fn config(
    fn_name: &syn::Ident,
    named: Named,
    settings: &Settings,
    private: &TokenStream,
    ttl_from: &TokenStream,
) -> TokenStream {
    let name = name(fn_name, named, settings, private);
    let ttl = duration(settings.ttl);
    let jitter = settings.jitter;
    let stale = duration(settings.stale);
    let timeout = duration(settings.timeout);
    let retries = settings.retries;
    let backoff = duration(settings.backoff);
    let lock = match settings.lock {
        LockKind::Local => quote!(Local),
        LockKind::Redis => quote!(Redis),
        LockKind::None => quote!(None),
    };
    let backend = match settings.backend {
        BackendKind::Memory => quote!(Memory),
        BackendKind::Redis => quote!(Redis),
        BackendKind::Tiered => quote!(Tiered),
    };
    let capacity = settings.capacity;
    let refresh_after = some(settings.refresh_after.map(duration));
    let xfetch = some(settings.xfetch);
    let fail_safe = some(settings.fail_safe.map(duration));
    let soft_timeout = some(settings.soft_timeout.map(duration));
    let memory_ttl = some(settings.memory_ttl.map(duration));
    let compress = some(settings.compress);
    let fail_safe_throttle = duration(settings.fail_safe_throttle);
    let breaker_cooldown = duration(settings.breaker_cooldown);
    let breaker = some(settings.breaker);
    let max_loads = some(settings.max_loads);
    let max_loads_full = match settings.max_loads_full {
        FullKind::Wait => quote!(Wait),
        FullKind::Error => quote!(Error),
    };
    let version = some(settings.version.as_ref());
    let key = some(settings.key_template.as_ref());
    let batch_max = some(
        settings
            .batch_max
            .and_then(|most| usize::try_from(most).ok()),
    );
    // The literals as a constant: data in the binary, not code in every cached function.
    let literal = quote! {
        #private::Config::written(
            &(#name),
            #ttl_from,
            &const {
                #private::Written {
                    ttl: #ttl,
                    jitter: #jitter,
                    stale: #stale,
                    timeout: #timeout,
                    retries: #retries,
                    backoff: #backoff,
                    lock: #private::Lock::#lock,
                    backend: #private::Backend::#backend,
                    capacity: #capacity,
                    refresh_after: #refresh_after,
                    xfetch: #xfetch,
                    fail_safe: #fail_safe,
                    fail_safe_throttle: #fail_safe_throttle,
                    soft_timeout: #soft_timeout,
                    memory_ttl: #memory_ttl,
                    compress: #compress,
                    breaker: #breaker,
                    breaker_cooldown: #breaker_cooldown,
                    key: #key,
                    version: #version,
                    batch_max: #batch_max,
                    max_loads: #max_loads,
                    max_loads_full: #private::LoadsFull::#max_loads_full,
                }
            },
        )
    };
    from_code(literal, &settings.from_code, private)
}

/// What the path `path` of an option gives, as its own type (a function called, a constant
/// copied: `stampede::__private::Given`); errors about it point at the path.
pub(crate) fn read_path(path: &syn::Path, private: &TokenStream) -> TokenStream {
    quote_spanned! {last_span(path)=>
        {
            #[allow(unused_imports)]
            use #private::{FromConst as _, FromFn as _};
            (&#private::Given(&#path)).read()
        }
    }
}

/// The span of a path's last segment, where errors about what it names point.
pub(crate) fn last_span(path: &syn::Path) -> Span {
    path.segments
        .last()
        .map_or(Span::call_site(), |segment| segment.ident.span())
}

/// A free function's path, `module_path!()::function`, as a `&'static str` expression.
pub(crate) fn function_path(function: &Ident) -> TokenStream {
    let function = function.to_string();
    quote!(::core::concat!(::core::module_path!(), "::", #function))
}

/// A cell for a value read once, in a block of its own: `&'static OnceLock<Option<ty>>`.
pub(crate) fn once_cell(ty: &TokenStream) -> TokenStream {
    let cell = Ident::new("__STAMPEDE_ONCE", Span::mixed_site());
    quote! {
        {
            static #cell: ::std::sync::OnceLock<::core::option::Option<#ty>> = ::std::sync::OnceLock::new();
            &#cell
        }
    }
}

/// Whether an option that may be given as a path is an `Option` in `Config` (on when given).
fn optional(option: &str) -> bool {
    matches!(
        option,
        "refresh_after"
            | "xfetch"
            | "fail_safe"
            | "soft_timeout"
            | "memory_ttl"
            | "compress"
            | "breaker"
            | "max_loads"
            | "batch_max"
    )
}

/// `literal` with the options given as a path read from it when the cache is built
/// (`stampede::__private::from_code`, which checks them): a function is called, a constant
/// copied, and what it gives converted to the option's type, with errors at the path.
fn from_code(
    literal: TokenStream,
    paths: &[(&'static str, syn::Path)],
    private: &TokenStream,
) -> TokenStream {
    if paths.is_empty() {
        return literal;
    }
    let config = Ident::new("__stampede_config", Span::mixed_site());
    let reads = paths.iter().map(|(option, path)| {
        let field = Ident::new(option, Span::call_site());
        let read = read_path(path, private);
        // Converted to the field's type, which `set` infers from it; another type is an error
        // at the path.
        let set = match optional(option) {
            true => quote!(#private::set_on),
            false => quote!(#private::set),
        };
        quote!(#set(&mut #config.#field, #read).map_err(|why| (#option, why))?;)
    });
    quote! {
        #private::from_code(
            #literal,
            |#config: &mut #private::Config| -> ::core::result::Result<(), (&'static str, ::std::string::String)> {
                #(#reads)*
                ::core::result::Result::Ok(())
            },
        )
    }
}

/// The cache's tier: what it shares beyond this process, and the tier's own options.
pub(super) fn tier(settings: &Settings, private: &TokenStream) -> TokenStream {
    if settings.backend == BackendKind::Memory {
        return quote!(#private::local());
    }
    let connection = match &settings.redis {
        Some(connection) => quote!(::core::option::Option::Some(#connection)),
        None => quote!(::core::option::Option::None),
    };
    let busy = match settings.busy {
        BusyKind::Wait => quote!(Wait),
        BusyKind::Compute => quote!(Compute),
        BusyKind::Error => quote!(Error),
    };
    quote!(#private::redis(#connection, #private::Busy::#busy))
}

/// A `Duration` expression, exact to the nanosecond.
fn duration(duration: Duration) -> TokenStream {
    // `validate` has checked that every duration fits in u64 nanoseconds.
    let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_nanos(#nanos))
}

/// Where a function without a receiver is, as its body sees it: the type name of a closure
/// there, which names an associated function's impl with its generic arguments
/// (`app::Shelf<app::Euros>::item::{{closure}}`), where the attribute cannot tell it from a free
/// function. Its site, and what its name is made of.
pub(super) fn body_site() -> TokenStream {
    quote!(::core::any::type_name_of_val(&|| ()))
}

/// What a cache's name is made of, by where the function is.
#[derive(Clone, Copy)]
pub(super) enum Named {
    /// A free function with a companion: its path, a constant.
    Path,
    /// A method: its type's path and, in a trait impl, its trait's.
    Method,
    /// A function without a receiver or a companion, which may be an associated function of a
    /// generic impl: its path as its body sees it, whose type names the instantiation.
    Body,
}

/// The cache's name: `name = ".."` (in an impl, followed by the instantiation's generic
/// arguments), else the function's path (`module_path!()::function`), or for a method its
/// type's and, in a trait impl, its trait's; for a function named from its body, its path with
/// the impl's type.
pub(super) fn name(
    fn_name: &syn::Ident,
    named: Named,
    settings: &Settings,
    private: &TokenStream,
) -> TokenStream {
    let method = fn_name;
    let fn_name = fn_name.to_string();
    // A type declared in the generated code: its `type_name` writes the impl's parameters as
    // `_`, and its path runs through the function, so it tells a method's trait too.
    let shape = {
        let site = Ident::new("__StampedeSite", Span::mixed_site());
        quote!({
            struct #site;
            ::core::any::type_name::<#site>()
        })
    };
    match (&settings.name, named) {
        (Some(name), Named::Path) => quote!(#name),
        // In an impl or a trait's default method, what tells its caches apart follows the
        // written name.
        (Some(name), Named::Method | Named::Body) => {
            let site = body_site();
            quote!(#private::written_name(#name, #site, #shape))
        }
        (None, Named::Body) => {
            let site = body_site();
            quote!(#private::function_name(#site))
        }
        // A method's cache is named after its type and, in a trait impl, its trait, which only
        // the body can name: the trait through the path of a type declared here. The companion
        // `#[stampede::companions]` emits for a method of a trait impl lives in an inherent
        // impl: it names the trait through the method's own path, which `type_name` writes in
        // the same form (`<path::Type as path::Trait>::method`).
        (None, Named::Method) => {
            let (shape, site) = match &settings.trait_path {
                Some(trait_path) => {
                    let path =
                        quote!(::core::any::type_name_of_val(&<Self as #trait_path>::#method));
                    (path.clone(), path)
                }
                None => (shape, body_site()),
            };
            quote!(#private::method_name(
                ::core::any::type_name::<Self>(),
                #shape,
                #site,
                #fn_name,
            ))
        }
        (None, Named::Path) => function_path(method),
    }
}
