//! Emits the cached function: same signature, a body that builds the key and makes one call on
//! the runtime, and the original body moved into the load that call may start.
//!
//! ```text
//! async fn product(id: u64, name: &str) -> Result<Product, AppError> {
//!     (PhantomData::<Result<Product, AppError>>,) /* checks of `Product` and `AppError` */
//!         .__stampede_witness()
//!         .get_result(
//!             { static SLOT: Slot = Slot::new(); &SLOT },
//!             || Config { .. },
//!             local,
//!             ((id,) /* checks */.0, (name.to_owned(),) /* checks */.0),
//!             move || {
//!                 // runs only when a load must start: owned copies of what the load needs
//!                 move |key: &_| {
//!                     let (id, name) = key.clone();
//!                     typed::<Result<Product, AppError>, _>(async move {
//!                         let name: &str = name.borrow();
//!                         /* the original body */
//!                     })
//!                 }
//!             },
//!         )
//!         .await
//! }
//! ```
//!
//! Each piece has its function: [`Expansion::witness`] (the checks of the returned type),
//! [`slot`], [`config`], [`shared`], [`Expansion::key`] (the key's parts),
//! [`Expansion::prepare`] (the captures of a load), [`Expansion::load`] (the closure that
//! starts one attempt of the load) and [`Expansion::call`], which puts them together.

use std::time::Duration;

use proc_macro2::TokenStream;
use proc_macro2::{Ident, Span};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Lifetime, Type};

use crate::attr::{BackendKind, BusyKind, LockKind};
use crate::checks::{Check, Finish, chain};
use crate::func::{Arg, Function, Returns, Shape};
use crate::receiver::{SELF, rename_self};
use crate::validate::Settings;

/// The cached function: its attributes and signature as written, and a body that calls the
/// runtime (inside `Box::pin(async move { .. })` for the shape `#[async_trait]` gave it).
pub(crate) fn expand(mut function: Function, settings: &Settings) -> TokenStream {
    if function.receiver.is_some() {
        rename_self(&mut function.body);
    }
    let call = Expansion::new(&function, settings).call();
    let Function {
        attrs,
        vis,
        sig,
        shape,
        ..
    } = &function;
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

/// What the pieces of the expansion are made from.
struct Expansion<'a> {
    function: &'a Function,
    settings: &'a Settings,
    /// `krate::__private`: the items of the runtime that generated code calls.
    private: TokenStream,
    /// The arguments that form the key, in the template's order.
    key_args: Vec<&'a Arg>,
    /// The other arguments: the load gets clones of them.
    other_args: Vec<&'a Arg>,
    /// Whether the cache keeps its keys and values in Redis, written with serde.
    in_redis: bool,
}

impl<'a> Expansion<'a> {
    fn new(function: &'a Function, settings: &'a Settings) -> Self {
        let krate = &settings.krate;
        let (key_args, other_args): (Vec<&Arg>, Vec<&Arg>) = function
            .args
            .iter()
            .partition(|arg| settings.key_args.contains(&arg.ident));
        // The key holds the template's arguments in the template's order.
        let key_args = settings
            .key_args
            .iter()
            .filter_map(|ident| key_args.iter().find(|arg| arg.ident == *ident).copied())
            .collect();
        Expansion {
            function,
            settings,
            private: quote!(#krate::__private),
            key_args,
            other_args,
            in_redis: settings.backend != BackendKind::Memory,
        }
    }

    /// The body of the cached function: one call on the runtime, through the witness of the
    /// returned type.
    fn call(&self) -> TokenStream {
        let private = &self.private;
        let witness = self.witness();
        let entry = match self.function.returns {
            Returns::Value(_) => quote!(get_value),
            Returns::Result { .. } => quote!(get_result),
        };
        let slot = slot(private);
        let config = config(
            &self.function.sig.ident,
            self.function.receiver.is_some(),
            self.settings,
            private,
        );
        let tier = tier(self.settings, private);
        let key = self.key();
        let prepare = self.prepare();
        // A method's cache is per instantiation of its impl: the slot tells them apart by `Self`.
        let site = match self.function.receiver {
            Some(_) => quote!(::core::any::type_name::<Self>()),
            None => quote!(""),
        };
        let clone_error = match self.function.returns {
            Returns::Value(_) => None,
            Returns::Result { .. } => Some(self.clone_error()),
        };
        let clone_error = clone_error.map(|clone| quote!(, #clone));
        quote! {
            #witness.#entry(
                #slot,
                #site,
                || #config,
                #tier,
                #key,
                #prepare
                #clone_error
            )
            .await
        }
    }

    /// `Some(E::clone)` when the function's error type is `Clone`, else `None`, chosen by method
    /// resolution on the returned type as written (so an alias such as `io::Result<T>` works).
    fn clone_error(&self) -> TokenStream {
        let private = &self.private;
        let output = &self.function.output;
        quote! {{
            use #private::{CloneError as _, NoCloneError as _};
            (&&#private::ErrorClone::<#output>::new()).__stampede_error_clone()
        }}
    }

    /// The witness of the returned type, its value (and error) type checked at the span the
    /// user wrote it. The runtime is called through the witness, so a failed check silences
    /// the call.
    fn witness(&self) -> TokenStream {
        let private = &self.private;
        let output = &self.function.output;
        let probe = quote!((::core::marker::PhantomData::<#output>,));
        match &self.function.returns {
            Returns::Value(value) => chain(
                first_span(value),
                private,
                probe,
                &Check::value(self.in_redis),
                Finish::Witness,
            ),
            Returns::Result { ok, err } => {
                let probe = chain(
                    first_span(ok),
                    private,
                    probe,
                    &Check::ok(self.in_redis),
                    Finish::Probe,
                );
                let error_span = first_span(err.as_deref().unwrap_or(output));
                chain(error_span, private, probe, Check::ERROR, Finish::Witness)
            }
        }
    }

    /// The key: a tuple that owns its parts. By-value arguments move in, borrowed ones are
    /// turned into owned; each part passes the key's checks at the span of its type.
    fn key(&self) -> TokenStream {
        let private = &self.private;
        let checks = Check::key(self.in_redis);
        let parts = self.key_args.iter().map(|arg| {
            let ident = &arg.ident;
            let part = match &arg.borrowed {
                Some(elem) => quote!(<#elem as ::std::borrow::ToOwned>::to_owned(#ident)),
                None => quote!(#ident),
            };
            chain(
                type_span(arg),
                private,
                quote!((#part,)),
                &checks,
                Finish::Value,
            )
        });
        quote!((#(#parts,)*))
    }

    /// The closure the runtime calls only when a load must start: it takes owned copies of
    /// what the load needs beyond the key (the receiver, borrowed arguments left out of the
    /// key), so that a hit clones nothing but the key; it returns the load.
    fn prepare(&self) -> TokenStream {
        let private = &self.private;
        let receiver = receiver_ident();
        let receiver_owned = self.function.receiver.map(|span| {
            let this = Ident::new("self", span);
            let this = chain(
                span,
                private,
                quote!(#private::witness(#this)),
                Check::RECEIVER,
                Finish::CloneOf(quote!(#this)),
            );
            quote!(let #receiver = #this;)
        });
        let others_owned = self.other_args.iter().filter_map(|arg| {
            let ident = &arg.ident;
            arg.borrowed.as_ref().map(
                |elem| quote!(let #ident = <#elem as ::std::borrow::ToOwned>::to_owned(#ident);),
            )
        });
        let load = self.load();
        quote! {
            move || {
                #receiver_owned
                #(#others_owned)*
                #load
            }
        }
    }

    /// The load: a closure that makes one attempt from the key and the captures of
    /// [`prepare`](Self::prepare), each attempt with its own copies, and runs the user's body
    /// with the arguments (and `self`) bound as the body expects them.
    fn load(&self) -> TokenStream {
        let private = &self.private;
        let output = &self.function.output;
        let key = Ident::new("__stampede_key", Span::mixed_site());
        let receiver = receiver_ident();
        let key_bindings = self.key_args.iter().map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
            quote!(#mutability #ident)
        });
        let receiver_copy = self
            .function
            .receiver
            .map(|_| quote!(let #receiver = ::core::clone::Clone::clone(&#receiver);));
        let others_copied = self.other_args.iter().map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
            let copy = chain(
                type_span(arg),
                private,
                quote!(#private::witness(&#ident)),
                Check::ARG,
                Finish::CloneOf(quote!(&#ident)),
            );
            quote!(let #mutability #ident = #copy;)
        });
        // Inside the load, `self` and borrowed arguments are lent back as the body expects.
        let self_ident = format_ident!("{SELF}");
        let receiver_borrow = self
            .function
            .receiver
            .map(|_| quote!(let #self_ident = &#receiver;));
        let reborrows = self.function.args.iter().filter_map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.mutability;
            arg.borrowed.as_ref().map(|elem| {
                let elem = with_elided_lifetimes(elem);
                quote!(let #mutability #ident: &#elem = ::core::borrow::Borrow::borrow(&#ident);)
            })
        });
        let body = &self.function.body;
        quote! {
            move |#key: &_| {
                let (#(#key_bindings,)*) = ::core::clone::Clone::clone(#key);
                #receiver_copy
                #(#others_copied)*
                #private::typed::<#output, _>(async move {
                    #receiver_borrow
                    #(#reborrows)*
                    #(#body)*
                })
            }
        }
    }
}

/// The name of the load's clone of the receiver; hygienic, so the user's body cannot see it.
fn receiver_ident() -> Ident {
    Ident::new("__stampede_receiver", Span::mixed_site())
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

/// The `Config` literal of the cache: its options, as the runtime reads them.
fn config(
    fn_name: &syn::Ident,
    is_method: bool,
    settings: &Settings,
    private: &TokenStream,
) -> TokenStream {
    let fn_name = fn_name.to_string();
    let name = match &settings.name {
        Some(name) => quote!(#name),
        // A method's cache is named after its type and, in a trait impl, its trait, which only
        // the body can name: the trait through the path of a type declared here.
        None if is_method => {
            let site = Ident::new("__StampedeSite", Span::mixed_site());
            quote!(#private::method_name(
                ::core::any::type_name::<Self>(),
                {
                    struct #site;
                    ::core::any::type_name::<#site>()
                },
                #fn_name,
            ))
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
            refresh_after: ::core::option::Option::None,
            fail_safe: ::core::option::Option::None,
            fail_safe_throttle: ::core::time::Duration::from_secs(5),
            soft_timeout: ::core::option::Option::None,
            breaker: ::core::option::Option::None,
            breaker_cooldown: ::core::time::Duration::from_secs(30),
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

/// A `Duration` expression, exact to the nanosecond.
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
