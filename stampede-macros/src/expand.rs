//! Emits the cached function: same signature, a body that builds the key and makes one call on
//! the runtime, and the original body moved into the load that call may start.
//!
//! ```text
//! async fn product(id: u64, name: &str) -> Result<Product, AppError> {
//!     (PhantomData::<Result<Product, AppError>>,) /* checks of `Product` and `AppError` */
//!         .__stampede_witness()
//!         .result(
//!             Recipe { slot, site: "", config: || Config::written(..), tier: local(), tags: None,
//!                      values, entries: Entries::<{ lean(..) }>, rules },
//!             Call::Get,
//!             ((id,) /* checks */.0, (name.to_owned(),) /* checks */.0),
//!             // what the load needs beyond the key (a receiver, arguments left out of the
//!             // key), as the function has them, and a closure that captures nothing, which
//!             // makes owned copies of them only when a load must start; here nothing
//!             (),
//!             no_context,
//!             // one attempt, from the context and the key: a closure that captures nothing,
//!             // which the runtime takes as a `fn` pointer
//!             |context: &_, key: &_| {
//!                 let () = context;
//!                 let (id, name) = key.clone();
//!                 attempt({
//!                     typed::<Result<Product, AppError>, _>(async move {
//!                         let name: &str = name.borrow();
//!                         /* the original body */
//!                     })
//!                 })
//!             },
//!         )
//!         .await
//! }
//! ```
//!
//! A free function whose arguments are all owned has that call in its companion's `__answer`,
//! and becomes `fn product(id: u64) -> impl Future<Output = ..> + use<>`, whose body is
//! `Deferred::new(Call::Get, product::__answer, (id,))`: the call is made when the future is first
//! polled, and no coroutine is compiled for the function (`call::deferred`).
//!
//! `call` emits the body (the witness of the returned type, the recipe, the key, the load),
//! `companion` the operations on the cache next to the function, and `config` where the cache
//! lives and how it is built (its slot, its options, its tier).

mod batch;
mod call;
mod companion;
mod config;

pub(crate) use batch::loader_call;

/// The companion of a method of a trait impl, for `#[stampede::companions]` to emit in an
/// inherent impl of the type: the items `#[cached]` would put next to the method in an inherent
/// impl, with the cache named after the trait (`settings.trait_path`) as the method's is.
pub(crate) fn trait_method_companion(function: &Function, settings: &Settings) -> TokenStream {
    Expansion::new(function, settings)
        .companion()
        .unwrap_or_default()
}

use proc_macro2::TokenStream;
use proc_macro2::{Ident, Span};
use quote::quote;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Lifetime, Type};

use crate::attr::BackendKind;
use crate::func::{Arg, Function, Shape};
use crate::receiver::rename_self;
use crate::validate::Settings;

/// The cached function: its attributes and signature as written, and a body that calls the
/// runtime (inside `Box::pin(async move { .. })` for the shape `#[async_trait]` gave it).
pub(crate) fn expand(mut function: Function, settings: &Settings) -> TokenStream {
    // A method with companions keeps its body, `self` included, in a hidden method.
    if function.receiver.is_some() && settings.companion != Some(true) {
        rename_self(&mut function.body);
    }
    let expansion = Expansion::new(&function, settings);
    let call = match settings.batch {
        Some(_) => expansion.batch_call(Call::Get),
        None => expansion.call(Call::Get),
    };
    let used = expansion.used_operations();
    let companion = expansion.companion();
    let Function {
        attrs,
        vis,
        sig,
        shape,
        ..
    } = &function;
    // Under `#[stampede::companions]`, the companion is that attribute's to emit.
    let companion = companion.filter(|_| !settings.in_companions_block);
    let deferred = expansion
        .deferred(&sig.ident, Call::Get)
        .filter(|_| expansion.deferrable());
    if let Some((signature, deferred)) = deferred {
        return quote! {
            #(#attrs)*
            #signature {
                #used
                #deferred
            }
            #companion
        };
    }
    let block = match shape {
        Shape::Async => quote!(#used #call),
        Shape::AsyncTrait => quote!(::std::boxed::Box::pin(async move { #used #call })),
    };
    quote! {
        #(#attrs)*
        #vis #sig {
            #block
        }
        #companion
    }
}

/// Which runtime call a body makes.
#[derive(Clone, Copy)]
enum Call {
    /// A call of the function: cached.
    Get,
    /// A companion's `refresh`: loads now, through the key's flight.
    Refresh,
    /// A companion's `read_through`: what a call gets when memory holds nothing.
    ReadThrough,
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
    /// For a free function, its name, which its companion type also has: the slot, the
    /// options and the body live there, so that the companion reaches the cache without a call.
    companion: Option<Holder>,
}

/// Where the companion's items go.
enum Holder {
    /// A free function's: a type of the function's name.
    Type(Ident),
    /// A method's (`companion = true`): associated items named after it, in its inherent impl,
    /// or for a method of a trait impl in the inherent impl `#[stampede::companions]` emits.
    Methods(Ident),
}

impl Holder {
    /// The name of a hidden item (`__slot`, `__config`, `__body`, `__answer`).
    fn hidden(&self, what: &str) -> Ident {
        match self {
            Holder::Type(_) => Ident::new(&format!("__{what}"), Span::call_site()),
            Holder::Methods(method) => Ident::new(&format!("__{method}_{what}"), Span::call_site()),
        }
    }

    /// The path of a hidden item, from the function's scope.
    fn path(&self, what: &str) -> TokenStream {
        let hidden = self.hidden(what);
        match self {
            Holder::Type(name) => quote!(#name::#hidden),
            Holder::Methods(_) => quote!(Self::#hidden),
        }
    }

    /// The name of an operation, spanned at the function's name, where a call's "defined
    /// here" note then points.
    fn op(&self, op: &str) -> Ident {
        match self {
            Holder::Type(name) => Ident::new(op, name.span()),
            Holder::Methods(method) => Ident::new(&format!("{method}_{op}"), method.span()),
        }
    }
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
            companion: match (function.receiver, &function.shape, settings.companion) {
                // In a trait impl, under `#[stampede::companions]`, natively or `#[async_trait]`.
                (Some(_), _, Some(true)) if settings.in_companions_block => {
                    Some(Holder::Methods(function.sig.ident.clone()))
                }
                (_, Shape::AsyncTrait, _) | (_, _, Some(false)) | (Some(_), _, None) => None,
                (Some(_), Shape::Async, Some(true)) => {
                    Some(Holder::Methods(function.sig.ident.clone()))
                }
                // A companion named like this crate would take the crate's name in the
                // function's module (`stampede::cached` there would name the companion), unless
                // asked for.
                (None, Shape::Async, None) if names_the_crate(&function.sig.ident, krate) => None,
                (None, Shape::Async, _) => Some(Holder::Type(function.sig.ident.clone())),
            },
        }
    }
}

impl Expansion<'_> {
    /// The type of the values the function's calls are answered with: the function's value (the
    /// `T` of a `Result<T, E>`), or for a batch function the value of one key in its map.
    fn value_type(&self) -> &Type {
        if let Some(batch) = &self.settings.batch {
            return &batch.value;
        }
        match &self.function.returns {
            crate::func::Returns::Value(value) => value,
            crate::func::Returns::Result { ok, .. } => ok,
        }
    }
}

/// Whether `ident` is the name of the crate's path (`stampede` in `::stampede`).
fn names_the_crate(ident: &Ident, krate: &syn::Path) -> bool {
    krate
        .segments
        .last()
        .is_some_and(|segment| segment.ident == *ident)
}

/// The name of the load's clone of the receiver; hygienic, so the user's body cannot see it.
fn receiver_ident() -> Ident {
    Ident::new("__stampede_receiver", Span::mixed_site())
}

/// A type for a `let` inside the load, where the signature's named lifetimes do not exist.
pub(crate) fn with_elided_lifetimes(ty: &Type) -> Type {
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

/// `ty` with every lifetime `'static`: a type named where the signature's lifetimes do not exist
/// and only `'static` ones may be (a key's or a value's, in the companion's `__ops`).
pub(crate) fn with_static_lifetimes(ty: &Type) -> Type {
    struct Static;
    impl VisitMut for Static {
        fn visit_lifetime_mut(&mut self, lifetime: &mut Lifetime) {
            *lifetime = Lifetime::new("'static", lifetime.apostrophe);
        }

        fn visit_type_reference_mut(&mut self, reference: &mut syn::TypeReference) {
            let span = reference.and_token.span;
            reference
                .lifetime
                .get_or_insert_with(|| Lifetime::new("'static", span));
            syn::visit_mut::visit_type_reference_mut(self, reference);
        }
    }
    let mut ty = ty.clone();
    Static.visit_type_mut(&mut ty);
    ty
}

/// An argument as a parameter of an operation: `ident: ty` (without its `mut`, which is the
/// body's).
fn typed(arg: &Arg) -> TokenStream {
    let (ident, ty) = (&arg.ident, &arg.ty);
    quote!(#ident: #ty)
}

/// The span errors about an argument's bounds point at: its type, or for `&T` the `T`.
fn type_span(arg: &Arg) -> Span {
    first_span(arg.borrowed.as_ref().unwrap_or(&arg.ty))
}

/// The span of a type's first token (stable Rust cannot join the spans of several tokens).
fn first_span(ty: &Type) -> Span {
    ty.span()
}
