//! Emits the cached function: same signature, a body that builds the key and makes one call on
//! the runtime, and the original body moved into the load that call may start.
//!
//! ```text
//! async fn product(id: u64, name: &str) -> Result<Product, AppError> {
//!     (PhantomData::<Result<Product, AppError>>,) /* checks of `Product` and `AppError` */
//!         .__stampede_witness()
//!         .result(
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
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Lifetime, Type};

use crate::attr::{BackendKind, BusyKind, LockKind};
use crate::checks::{Check, Finish, chain};
use crate::func::{Arg, Function, Returns, Shape};
use crate::key::Segment;
use crate::receiver::{SELF, rename_self};
use crate::validate::Settings;

/// The cached function: its attributes and signature as written, and a body that calls the
/// runtime (inside `Box::pin(async move { .. })` for the shape `#[async_trait]` gave it).
pub(crate) fn expand(mut function: Function, settings: &Settings) -> TokenStream {
    // A method with companions keeps its body, `self` included, in a hidden method.
    if function.receiver.is_some() && settings.companion != Some(true) {
        rename_self(&mut function.body);
    }
    let expansion = Expansion::new(&function, settings);
    let call = expansion.call(Entry::Get);
    let companion = expansion.companion();
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
        #companion
    }
}

/// Which runtime call a body makes.
#[derive(Clone, Copy)]
enum Entry {
    /// A call of the function: cached.
    Get,
    /// A companion's `refresh`: loads now, through the key's flight.
    Refresh,
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
    companion: Option<Companion>,
}

/// Where the companion's items go.
enum Companion {
    /// A free function's: a type of the function's name.
    Type(Ident),
    /// A method's (`companion = true`, inherent impls): associated items named after it.
    Methods(Ident),
}

impl Companion {
    /// The name of a hidden item (`__slot`, `__config`, `__body`).
    fn hidden(&self, what: &str) -> Ident {
        match self {
            Companion::Type(_) => Ident::new(&format!("__{what}"), Span::call_site()),
            Companion::Methods(method) => {
                Ident::new(&format!("__{method}_{what}"), Span::call_site())
            }
        }
    }

    /// The path of a hidden item, from the function's scope.
    fn path(&self, what: &str) -> TokenStream {
        let hidden = self.hidden(what);
        match self {
            Companion::Type(name) => quote!(#name::#hidden),
            Companion::Methods(_) => quote!(Self::#hidden),
        }
    }

    /// The name of an operation, spanned at the function's name, where a call's "defined
    /// here" note then points.
    fn op(&self, op: &str) -> Ident {
        match self {
            Companion::Type(name) => Ident::new(op, name.span()),
            Companion::Methods(method) => Ident::new(&format!("{method}_{op}"), method.span()),
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
                (_, Shape::AsyncTrait, _) | (_, _, Some(false)) | (Some(_), _, None) => None,
                (Some(_), Shape::Async, Some(true)) => {
                    Some(Companion::Methods(function.sig.ident.clone()))
                }
                // A companion named like this crate would take the crate's name in the
                // function's module (`stampede::cached` there would name the companion), unless
                // asked for.
                (None, Shape::Async, None) if names_the_crate(&function.sig.ident, krate) => None,
                (None, Shape::Async, _) => Some(Companion::Type(function.sig.ident.clone())),
            },
        }
    }

    /// The body of the cached function: one call on the runtime, through the witness of the
    /// returned type.
    fn call(&self, entry: Entry) -> TokenStream {
        let witness = self.witness();
        let private = &self.private;
        let method = match &self.function.returns {
            Returns::Value(_) => quote!(value),
            Returns::Result { .. } => quote!(result),
        };
        let call = match entry {
            Entry::Get => quote!(#private::Call::Get),
            Entry::Refresh => quote!(#private::Call::Refresh),
        };
        let (slot, config, tier) = self.cache();
        let key = self.key();
        let tags = self.tags();
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
            #witness.#method(
                #slot,
                #call,
                #site,
                #config,
                #tier,
                #key,
                #tags,
                #prepare
                #clone_error
            )
            .await
        }
    }

    /// The cache's slot, the closure that builds its options and its tier. A free function's
    /// slot and options live in its companion, so that the companion reaches the same cache.
    fn cache(&self) -> (TokenStream, TokenStream, TokenStream) {
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
                    self.function.receiver.is_some(),
                    self.settings,
                    private,
                );
                (slot(private), quote!(|| #config), tier)
            }
        }
    }

    /// A free function's companion: a type of the function's name (types and functions live in
    /// different namespaces) whose associated functions act on the function's cache, with the
    /// key's arguments as the function takes them: `product::invalidate(id, region)`,
    /// `refresh`, `prime`, `peek`, `uncached`. It holds the cache's slot, its options and the
    /// body, so that it works in a process that never called the function.
    ///
    /// A type rather than a module: its items are in the function's own scope, so the types of
    /// the signature and the items the body names resolve there as they do for the function,
    /// even inside a block.
    fn companion(&self) -> Option<TokenStream> {
        let companion = self.companion.as_ref()?;
        let private = &self.private;
        let krate = &self.settings.krate;
        let function = self.function;
        let vis = &function.vis;
        let output = &function.output;
        let generics = &function.sig.generics;
        let where_clause = &generics.where_clause;
        let cfgs = self.cfgs();
        let lints = function.attrs.iter().filter(|attr| {
            ["allow", "warn", "deny", "forbid"]
                .iter()
                .any(|lint| attr.path().is_ident(lint))
        });
        let typed = |arg: &Arg| {
            let ident = &arg.ident;
            let ty = &arg.ty;
            quote!(#ident: #ty)
        };
        let all_inputs: Vec<TokenStream> = function.args.iter().map(typed).collect();
        let key_inputs: Vec<TokenStream> = self.key_args.iter().map(|arg| typed(arg)).collect();
        let body_inputs = function.args.iter().map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.mutability;
            let ty = &arg.ty;
            quote!(#mutability #ident: #ty)
        });
        let args: Vec<&Ident> = function.args.iter().map(|arg| &arg.ident).collect();
        let value = match &function.returns {
            Returns::Value(value) => value,
            Returns::Result { ok, .. } => ok,
        };
        let companion_of = self.companion_of();
        let is_method = function.receiver.is_some();
        let config = config(&function.sig.ident, is_method, self.settings, private);
        let (slot, config_fn, tier) = self.cache();
        let site = match is_method {
            true => quote!(::core::any::type_name::<Self>()),
            false => quote!(""),
        };
        // `&self` for the operations that run the body.
        let this = is_method.then(|| quote!(&self,));
        let this_arg = is_method.then(|| quote!(self,));
        let witness = self.witness();
        let key = self.key();
        let tags = self.tags();
        let refresh = self.call(Entry::Refresh);
        let body = &function.body;
        let slot_name = Ident::new("__STAMPEDE_SLOT", Span::mixed_site());
        let (slot_fn, config_item, body_fn, body_path) = (
            companion.hidden("slot"),
            companion.hidden("config"),
            companion.hidden("body"),
            companion.path("body"),
        );
        let (invalidate, refresh_fn, prime, peek, uncached) = (
            companion.op("invalidate"),
            companion.op("refresh"),
            companion.op("prime"),
            companion.op("peek"),
            companion.op("uncached"),
        );
        let fn_name = function.sig.ident.to_string();
        let shown = match companion {
            Companion::Type(_) => format!("[`{fn_name}()`](fn@{fn_name})"),
            Companion::Methods(_) => format!("[`Self::{fn_name}`]"),
        };
        let doc_invalidate = format!(
            "Drops the value {shown} holds for these arguments, in this process and, for a \
             cache backed by Redis, in Redis and in every other process's memory. After it \
             returns, no call here returns a value whose load began before it."
        );
        let doc_refresh = format!(
            "Loads the value of {shown} for these arguments now, whatever value is held, stores \
             it and returns what the function returns. Joins the load running for the key, if \
             any, so that concurrent callers still share one load."
        );
        let doc_prime = format!(
            "Stores `value` as the value of {shown} for these arguments, as if it had been \
             loaded now: fresh for the jittered `ttl`, and for a cache backed by Redis also \
             written to Redis (an error when Redis cannot be reached; the value is then kept in \
             this process only)."
        );
        let doc_peek = format!(
            "The value {shown} holds in this process's memory for these arguments, if it may be \
             served (fresh or stale); never loads, waits or reads Redis."
        );
        let doc_uncached =
            format!("Runs the body of {shown} directly: no cache is read or written.");
        let allow = quote!(#(#cfgs)* #[allow(dead_code, clippy::too_many_arguments)]);
        let items = quote! {
            #[doc(hidden)]
            #allow
            #vis fn #slot_fn() -> &'static #private::Slot {
                static #slot_name: #private::Slot = #private::Slot::new();
                &#slot_name
            }

            #[doc(hidden)]
            #allow
            #vis fn #config_item() -> #private::Config {
                #config
            }

            #[doc(hidden)]
            #allow
            #(#lints)*
            #vis async fn #body_fn #generics (#this #(#body_inputs),*) -> #output #where_clause {
                #(#body)*
            }

            #[doc = #doc_invalidate]
            #allow
            #vis async fn #invalidate #generics (#(#key_inputs),*) -> ::core::result::Result<(), #krate::Error> #where_clause {
                #witness.#companion_of().invalidate(#slot, #site, #config_fn, #tier, #key, #tags).await
            }

            #[doc = #doc_refresh]
            #allow
            #vis async fn #refresh_fn #generics (#this #(#all_inputs),*) -> #output #where_clause {
                #refresh
            }

            #[doc = #doc_prime]
            #allow
            #vis async fn #prime #generics (#(#key_inputs,)* value: #value) -> ::core::result::Result<(), #krate::Error> #where_clause {
                #witness.#companion_of().prime(#slot, #site, #config_fn, #tier, #key, #tags, value).await
            }

            #[doc = #doc_peek]
            #allow
            #vis fn #peek #generics (#(#key_inputs),*) -> ::core::option::Option<#value> #where_clause {
                #witness.#companion_of().peek(#slot, #site, #config_fn, #tier, #key, #tags)
            }

            #[doc = #doc_uncached]
            #allow
            #vis async fn #uncached #generics (#this #(#all_inputs),*) -> #output #where_clause {
                #body_path(#this_arg #(#args),*).await
            }
        };
        let linked = self.linked(&config_fn, &tier);
        Some(match companion {
            Companion::Methods(_) => items,
            Companion::Type(name) => {
                let doc = format!(
                    "The cache of {shown}, reachable without calling it (generated by \
                     `#[stampede::cached]`): `{fn_name}::invalidate`, `refresh`, `prime`, `peek` \
                     and `uncached`, which take the arguments of the key as the function does."
                );
                quote! {
                    #(#cfgs)*
                    #[doc = #doc]
                    #[allow(non_camel_case_types)]
                    #vis struct #name {
                        _private: (),
                    }

                    #(#cfgs)*
                    impl #name {
                        #items
                    }

                    #linked
                }
            }
        })
    }

    /// The function's `#[cfg]` attributes, which its companion's items repeat.
    fn cfgs(&self) -> Vec<&syn::Attribute> {
        self.function
            .attrs
            .iter()
            .filter(|attr| attr.path().is_ident("cfg"))
            .collect()
    }

    /// The witness's method that gives the companion's operations: by the returned type.
    fn companion_of(&self) -> TokenStream {
        match self.function.returns {
            Returns::Value(_) => quote!(value_companion),
            Returns::Result { .. } => quote!(ok_companion),
        }
    }

    /// A non-generic free function's listing in the runtime's registry of linked functions
    /// (before `main`), with a hidden `__build` in its companion that builds its cache: so that
    /// `stampede::invalidate(name, key)` reaches it in a process that never called it. Nothing
    /// for a method or a generic function, whose key types only a call can name.
    fn linked(&self, config_fn: &TokenStream, tier: &TokenStream) -> TokenStream {
        let Some(Companion::Type(name)) = &self.companion else {
            return TokenStream::new();
        };
        if !self.function.sig.generics.params.is_empty() {
            return TokenStream::new();
        }
        let private = &self.private;
        let vis = &self.function.vis;
        let cfgs = self.cfgs();
        let cfgs = quote!(#(#cfgs)*);
        let witness = self.witness();
        let companion_of = self.companion_of();
        let slot = Companion::Type(name.clone()).path("slot");
        let idents = self.key_args.iter().map(|arg| &arg.ident);
        let types = self
            .key_args
            .iter()
            .map(|arg| with_elided_lifetimes(&arg.ty));
        let key = self.key();
        let tags = self.tags();
        let tagged = !self.settings.tags.is_empty();
        quote! {
            #cfgs
            impl #name {
                #[doc(hidden)]
                #[allow(dead_code, unreachable_code, unused_variables, clippy::diverging_sub_expression, clippy::unused_unit)]
                #vis fn __build() {
                    #witness.#companion_of().build(
                        #slot(),
                        #config_fn,
                        #tier,
                        // Never called: its type is the key's.
                        || {
                            let (#(#idents,)*): (#(#types,)*) = ::core::unreachable!();
                            #key
                        },
                        #tags,
                    )
                }
            }

            #cfgs
            #private::inventory::submit! {
                #private::Linked::new(#name::__config, #name::__build, #tagged)
            }
        }
    }

    /// What the runtime knows of the error type: `clone` is `Some(E::clone)` when it is
    /// `Clone`, else `None`, chosen by method resolution on the returned type as written (so an
    /// alias such as `io::Result<T>` works); `retry_if` the option's function, checked to be a
    /// `fn(&E) -> bool` at the option's span.
    fn clone_error(&self) -> TokenStream {
        let private = &self.private;
        let output = &self.function.output;
        let retry_if = match &self.settings.retry_if {
            Some(path) => {
                let span = path
                    .segments
                    .last()
                    .map_or(Span::call_site(), |s| s.ident.span());
                quote_spanned!(span=> ::core::option::Option::Some(#path))
            }
            None => quote!(::core::option::Option::None),
        };
        quote! {
            #private::ErrorRules {
                clone: {
                    use #private::{CloneError as _, NoCloneError as _};
                    (&&#private::ErrorClone::<#output>::new()).__stampede_error_clone()
                },
                retry_if: #retry_if,
            }
        }
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

    /// How a key's tags are rendered: `None`, or a function from the key to its tags, each
    /// template's holes filled with the key's parts (`Display`, checked at the template).
    fn tags(&self) -> TokenStream {
        let private = &self.private;
        let tags = &self.settings.tags;
        if tags.is_empty() {
            return quote!(::core::option::Option::None);
        }
        let used = |ident: &Ident| {
            tags.iter()
                .any(|tag| tag.value.args().iter().any(|name| ident == name))
        };
        let bindings = self.key_args.iter().map(|arg| {
            let ident = &arg.ident;
            match used(ident) {
                true => quote!(#ident),
                false => quote!(_),
            }
        });
        let rendered = tags.iter().map(|tag| {
            let mut format = String::new();
            let mut holes = Vec::new();
            for segment in &tag.value.segments {
                match segment {
                    Segment::Text(text) => {
                        format.push_str(&text.replace('{', "{{").replace('}', "}}"));
                    }
                    Segment::Arg(name) => {
                        format.push_str("{}");
                        holes.push(Ident::new(name, tag.span));
                    }
                }
            }
            quote_spanned!(tag.span=> ::std::format!(#format, #(#holes),*))
        });
        let key = Ident::new("__stampede_key", Span::mixed_site());
        quote! {
            #private::tagged(|#key: &_| {
                let (#(#bindings,)*) = #key;
                ::std::vec![#(#rendered),*]
            })
        }
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
        // With a companion, the body is its own function, which binds `mut` arguments itself.
        let in_load = self.companion.is_none();
        let key_bindings = self.key_args.iter().map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
            let mutability = mutability.filter(|_| in_load);
            quote!(#mutability #ident)
        });
        let receiver_copy = self
            .function
            .receiver
            .map(|_| quote!(let #receiver = ::core::clone::Clone::clone(&#receiver);));
        let others_copied = self.other_args.iter().map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
            let mutability = mutability.filter(|_| in_load);
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
            .filter(|_| in_load)
            .map(|_| quote!(let #self_ident = &#receiver;));
        let reborrows = self.function.args.iter().filter_map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.mutability.filter(|_| in_load);
            arg.borrowed.as_ref().map(|elem| {
                let elem = with_elided_lifetimes(elem);
                quote!(let #mutability #ident: &#elem = ::core::borrow::Borrow::borrow(&#ident);)
            })
        });
        let body = match &self.companion {
            None => {
                let body = &self.function.body;
                quote!(#(#body)*)
            }
            Some(companion) => {
                let body = companion.path("body");
                let args = self.function.args.iter().map(|arg| &arg.ident);
                let this = self.function.receiver.map(|_| quote!(&#receiver,));
                quote!(#body(#this #(#args),*).await)
            }
        };
        quote! {
            move |#key: &_| {
                let (#(#key_bindings,)*) = ::core::clone::Clone::clone(#key);
                #receiver_copy
                #(#others_copied)*
                #private::typed::<#output, _>(async move {
                    #receiver_borrow
                    #(#reborrows)*
                    #body
                })
            }
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
    let some_duration = |d: Option<Duration>| match d {
        Some(d) => {
            let d = duration(d);
            quote!(::core::option::Option::Some(#d))
        }
        None => quote!(::core::option::Option::None),
    };
    let refresh_after = some_duration(settings.refresh_after);
    let fail_safe = some_duration(settings.fail_safe);
    let soft_timeout = some_duration(settings.soft_timeout);
    let fail_safe_throttle = duration(settings.fail_safe_throttle);
    let breaker_cooldown = duration(settings.breaker_cooldown);
    let breaker = match settings.breaker {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
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
            refresh_after: #refresh_after,
            fail_safe: #fail_safe,
            fail_safe_throttle: #fail_safe_throttle,
            soft_timeout: #soft_timeout,
            breaker: #breaker,
            breaker_cooldown: #breaker_cooldown,
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
