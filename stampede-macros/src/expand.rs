//! Emits the cached function: same signature, a body that builds the key and makes one call on
//! the runtime, and the original body moved into the load that call may start.
//!
//! ```text
//! async fn product(id: u64, name: &str) -> Result<Product, AppError> {
//!     static SLOT: Slot = Slot::new();
//!     Slot::get_result(&SLOT, || Config { .. }, (id, name.to_owned()), move || {
//!         // runs only when a load must start: owned copies of what the load needs
//!         move |key: &_| {
//!             let (id, name) = key.clone();
//!             typed::<Result<Product, AppError>, _>(async move {
//!                 let name: &str = name.borrow();
//!                 /* the original body */
//!             })
//!         }
//!     }).await
//! }
//! ```

use std::time::Duration;

use proc_macro2::TokenStream;
use proc_macro2::{Ident, Span};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Lifetime, Type};

use crate::attr::{BackendKind, BusyKind, LockKind};
use crate::func::{Arg, Function, Shape};
use crate::receiver::{SELF, rename_self};
use crate::validate::Settings;

pub(crate) fn expand(function: Function, settings: &Settings) -> TokenStream {
    let Function {
        attrs,
        vis,
        sig,
        shape,
        receiver,
        args,
        output,
        returns_result,
        value_ty,
        error_ty,
        mut body,
    } = function;
    let krate = &settings.krate;
    let private = quote!(#krate::__private);
    let (key_args, other_args): (Vec<&Arg>, Vec<&Arg>) = args
        .iter()
        .partition(|arg| settings.key_args.contains(&arg.ident));
    // The key holds the template's arguments in the template's order.
    let key_args: Vec<&Arg> = settings
        .key_args
        .iter()
        .filter_map(|ident| key_args.iter().find(|arg| arg.ident == *ident).copied())
        .collect();

    let config = config(&sig.ident, receiver.is_some(), settings, &private);

    // The key owns its parts: by-value arguments move in, borrowed ones are turned into owned.
    // Each part passes the key's checks at the span of the argument's type (see `checks`).
    // A cache backed by Redis also writes its keys and values with serde.
    let in_redis = settings.backend != BackendKind::Memory;
    let with_redis = |local: &[&'static str], redis: &[&'static str]| -> Vec<&'static str> {
        let mut names = local.to_vec();
        if in_redis {
            names.extend_from_slice(redis);
        }
        names
    };
    let key_checks = with_redis(KEY_CHECKS, &["key_serialize"]);
    let value_checks = with_redis(VALUE_CHECKS, &["value_serialize", "value_deserialize"]);
    let ok_checks = with_redis(OK_CHECKS, &["ok_serialize", "ok_deserialize"]);
    let key_parts = key_args.iter().map(|arg| {
        let ident = &arg.ident;
        let part = match &arg.borrowed {
            Some(elem) => quote!(<#elem as ::std::borrow::ToOwned>::to_owned(#ident)),
            None => quote!(#ident),
        };
        checks(
            type_span(arg),
            quote!(#private::Checked(#part)),
            &key_checks,
            Some(quote!(into_inner())),
        )
    });

    // The returned value (and error) type is checked through a witness at the span the user
    // wrote it; the runtime is called through that witness, so a failed check silences it.
    let witness = quote!(#private::Witness::<#output>::new());
    let witness = match (returns_result, &error_ty) {
        (false, _) => checks(first_span(&value_ty), witness, &value_checks, None),
        (true, error_ty) => {
            let error_span = first_span(error_ty.as_ref().unwrap_or(&output));
            let witness = checks(first_span(&value_ty), witness, &ok_checks, None);
            checks(error_span, witness, ERROR_CHECKS, None)
        }
    };

    // `prepare` runs only when a load must start: it takes owned copies of what the load needs
    // beyond the key, so a hit clones nothing but the key.
    let receiver_owned = receiver.map(|span| {
        let this = Ident::new("self", span);
        let this = checks(
            span,
            quote!(#private::witness(#this)),
            RECEIVER_CHECKS,
            Some(quote!(clone_of(#this))),
        );
        quote!(let __stampede_receiver = #this;)
    });
    let others_owned = other_args.iter().filter_map(|arg| {
        let ident = &arg.ident;
        arg.borrowed
            .as_ref()
            .map(|elem| quote!(let #ident = <#elem as ::std::borrow::ToOwned>::to_owned(#ident);))
    });

    // Each attempt of the load gets its own copies, rebuilt from the key and the captures.
    let key_bindings = key_args.iter().map(|arg| {
        let ident = &arg.ident;
        let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
        quote!(#mutability #ident)
    });
    let receiver_copy = receiver.map(
        |_| quote!(let __stampede_receiver = ::core::clone::Clone::clone(&__stampede_receiver);),
    );
    let others_copied = other_args.iter().map(|arg| {
        let ident = &arg.ident;
        let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
        let copy = checks(
            type_span(arg),
            quote!(#private::witness(&#ident)),
            ARG_CHECKS,
            Some(quote!(clone_of(&#ident))),
        );
        quote!(let #mutability #ident = #copy;)
    });

    // Inside the load, borrowed arguments are lent back as the body expects them.
    let self_ident = format_ident!("{SELF}");
    let receiver_borrow = receiver.map(|_| quote!(let #self_ident = &__stampede_receiver;));
    let reborrows = args.iter().filter_map(|arg| {
        let ident = &arg.ident;
        let mutability = arg.mutability;
        arg.borrowed.as_ref().map(|elem| {
            let elem = with_elided_lifetimes(elem);
            quote!(let #mutability #ident: &#elem = ::core::borrow::Borrow::borrow(&#ident);)
        })
    });
    if receiver.is_some() {
        rename_self(&mut body);
    }

    let entry = if returns_result {
        quote!(get_result)
    } else {
        quote!(get_value)
    };
    let tier = tier(settings, &private);
    let call = quote! {
        use #private::checks::*;
        static __STAMPEDE_SLOT: #private::Slot = #private::Slot::new();
        #witness.#entry(
            &__STAMPEDE_SLOT,
            || #config,
            #tier,
            (#(#key_parts,)*),
            move || {
                #receiver_owned
                #(#others_owned)*
                move |__stampede_key: &_| {
                    let (#(#key_bindings,)*) = ::core::clone::Clone::clone(__stampede_key);
                    #receiver_copy
                    #(#others_copied)*
                    #private::typed::<#output, _>(async move {
                        #receiver_borrow
                        #(#reborrows)*
                        #(#body)*
                    })
                }
            },
        )
        .await
    };
    let block = match shape {
        Shape::Async => call,
        Shape::AsyncTrait => quote!(::std::boxed::Box::pin(async move { #call })),
    };
    quote! {
        #(#attrs)*
        #vis #sig {
            #block
        }
    }
}

fn config(
    fn_name: &syn::Ident,
    is_method: bool,
    settings: &Settings,
    private: &TokenStream,
) -> TokenStream {
    let fn_name = fn_name.to_string();
    let name = match &settings.name {
        Some(name) => quote!(#name),
        // A method's cache is named after its type, which only the body can name.
        None if is_method => {
            quote!(::std::format!("{}::{}", ::core::any::type_name::<Self>(), #fn_name))
        }
        None => quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
    };
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
    let key = match &settings.key_template {
        Some(template) => {
            quote!(::core::option::Option::Some(::std::sync::Arc::from(#template)))
        }
        None => quote!(::core::option::Option::None),
    };
    quote! {
        #private::Config {
            name: ::std::sync::Arc::from(#name),
            ttl: #ttl,
            jitter: #jitter,
            stale: #stale,
            timeout: #timeout,
            retries: #retries,
            backoff: #backoff,
            lock: #private::Lock::#lock,
            backend: #private::Backend::#backend,
            capacity: #capacity,
            key: #key,
        }
    }
}

/// The cache's tier: what it shares beyond this process, and the tier's own options.
fn tier(settings: &Settings, private: &TokenStream) -> TokenStream {
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

fn duration(duration: Duration) -> TokenStream {
    // `validate` has checked that every duration fits in u64 nanoseconds.
    let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_nanos(#nanos))
}

/// A type for a `let` inside the load, where the signature's named lifetimes do not exist.
fn with_elided_lifetimes(ty: &Type) -> Type {
    struct Elide;
    impl VisitMut for Elide {
        fn visit_lifetime_mut(&mut self, lifetime: &mut Lifetime) {
            if lifetime.ident != "static" {
                *lifetime = Lifetime::new("'_", lifetime.apostrophe);
            }
        }
    }
    let mut ty = ty.clone();
    Elide.visit_type_mut(&mut ty);
    ty
}

/// The span errors about an argument's bounds point at: its type, or for `&T` the `T`.
fn type_span(arg: &Arg) -> Span {
    first_span(arg.borrowed.as_ref().unwrap_or(&arg.ty))
}

/// The span of a type's first token (stable Rust cannot join the spans of several tokens).
fn first_span(ty: &Type) -> Span {
    ty.span()
}

const KEY_CHECKS: &[&str] = &[
    "key_hash",
    "key_eq",
    "key_clone",
    "key_debug",
    "key_send",
    "key_sync",
];
const ARG_CHECKS: &[&str] = &["arg_clone", "arg_send", "arg_sync"];
const RECEIVER_CHECKS: &[&str] = &["receiver_clone", "receiver_send", "receiver_sync"];
const VALUE_CHECKS: &[&str] = &["value_clone", "value_send", "value_sync"];
const OK_CHECKS: &[&str] = &["ok_clone", "ok_send", "ok_sync"];
const ERROR_CHECKS: &[&str] = &[
    "error_from",
    "error_display",
    "error_debug",
    "error_send",
    "error_sync",
];

/// `value.__stampede_check()...finish`: the runtime's checks of one bound each, in order, with
/// every token at `span` so that a failed check is reported on the user's token. A failed check
/// makes the expression an error type, which silences the follow-on errors of the runtime call
/// it flows into (see `stampede-runtime/src/bounds.rs`).
fn checks(
    span: Span,
    value: TokenStream,
    names: &[&str],
    finish: Option<TokenStream>,
) -> TokenStream {
    let methods = names
        .iter()
        .map(|name| Ident::new(&format!("__stampede_{name}"), span));
    let finish = finish.map(|finish| quote_spanned!(span=> .#finish));
    quote_spanned!(span=> #value #(.#methods())* #finish)
}
