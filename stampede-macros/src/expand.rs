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
    let key_parts = key_args.iter().map(|arg| {
        let ident = &arg.ident;
        match &arg.borrowed {
            Some(elem) => quote!(<#elem as ::std::borrow::ToOwned>::to_owned(#ident)),
            None => quote!(#ident),
        }
    });

    // `prepare` runs only when a load must start: it takes owned copies of what the load needs
    // beyond the key, so a hit clones nothing but the key.
    let receiver_owned =
        receiver.map(|_| quote!(let __stampede_receiver = ::core::clone::Clone::clone(self);));
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
        quote!(let #mutability #ident = ::core::clone::Clone::clone(&#ident);)
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
    // Values kept in Redis must be serde types; the check sits on the return type's span.
    let shared = match settings.backend {
        BackendKind::Memory => quote!(#private::local),
        BackendKind::Redis | BackendKind::Tiered => {
            quote_spanned!(output.span()=> #private::redis)
        }
    };
    let call = quote! {
        static __STAMPEDE_SLOT: #private::Slot = #private::Slot::new();
        #private::Slot::#entry(
            &__STAMPEDE_SLOT,
            || #config,
            #shared,
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
    let redis = match &settings.redis {
        Some(connection) => {
            quote!(::core::option::Option::Some(::std::sync::Arc::from(#connection)))
        }
        None => quote!(::core::option::Option::None),
    };
    let busy = match settings.busy {
        BusyKind::Wait => quote!(Wait),
        BusyKind::Compute => quote!(Compute),
        BusyKind::Error => quote!(Error),
    };
    let capacity = settings.capacity;
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
            redis: #redis,
            busy: #private::Busy::#busy,
            capacity: #capacity,
        }
    }
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
