//! The body of the cached function (and of its companion's `refresh`): one call on the
//! runtime through the witness of the returned type, with the function's [`Recipe`], the key,
//! and the closure that builds the load.
//!
//! [`Recipe`]: https://docs.rs/stampede-runtime (`__private::Recipe`)

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use super::config::body_site;
use super::{
    Call, Expansion, Holder, first_span, receiver_ident, type_span, typed, with_elided_lifetimes,
    with_static_lifetimes,
};
use crate::checks::{Check, Finish, chain};
use crate::func::{Arg, Returns};
use crate::key::Segment;
use crate::receiver::SELF;

impl Expansion<'_> {
    /// The body of the cached function (or of its companion's `refresh` or `read_through`) as
    /// an `async fn`: one call on the runtime, through the witness of the returned type; where
    /// the companion holds that call ([`Self::answer_item`]), a call of it.
    pub(super) fn call(&self, call: Call) -> TokenStream {
        let private = &self.private;
        let call = call_of(call, private);
        let answer = match self.shared_answer() {
            Some(answer) => {
                let args = self.function.args.iter().map(|arg| &arg.ident);
                quote!(#answer(#call, (#(#args,)*)))
            }
            None => self.answer(call),
        };
        // A hit is ready when the call is made: taken here, it goes straight to the caller
        // rather than through this future's state (issue 38).
        quote! {
            match #answer {
                #private::Answer::Ready(__stampede_value) => {
                    __stampede_value
                }
                __stampede_answer => __stampede_answer.await,
            }
        }
    }

    /// Where the companion holds `__answer` ([`Self::answer_item`]): the signature of the
    /// function (or of `refresh`, `read_through`) as a plain `fn` named `name`, and its body,
    /// the `Deferred` call of `__answer` with `call` and the arguments. No coroutine of its own:
    /// a coroutine is compiled into every codegen unit that polls it, where `Deferred`'s poll
    /// is compiled once (issue 38).
    pub(super) fn deferred(&self, name: &Ident, call: Call) -> Option<(TokenStream, TokenStream)> {
        let answer = self.shared_answer()?;
        let private = &self.private;
        let vis = &self.function.vis;
        let output = &self.function.output;
        let call = call_of(call, private);
        let inputs = self.function.args.iter().map(typed);
        let args = self.function.args.iter().map(|arg| &arg.ident);
        let signature = quote! {
            #vis fn #name(#(#inputs),*) -> impl ::core::future::Future<Output = #output> + use<>
        };
        let body = quote!(#private::Deferred::new(#call, #answer, (#(#args,)*)));
        Some((signature, body))
    }

    /// Whether the function may be emitted as a plain `fn` that returns its call
    /// ([`Self::deferred`]): its other attributes are ones that mean the same on either. An
    /// attribute macro beneath `#[cached]` (`#[tracing::instrument]`) gets the `async fn` it
    /// expects, whose future it can wrap.
    pub(super) fn deferrable(&self) -> bool {
        const PLAIN: [&str; 9] = [
            "doc",
            "cfg",
            "allow",
            "expect",
            "warn",
            "deny",
            "forbid",
            "must_use",
            "deprecated",
        ];
        self.function
            .attrs
            .iter()
            .all(|attr| PLAIN.iter().any(|name| attr.path().is_ident(name)))
    }

    /// The runtime's answer to `call` (an expression of `Call`): the witness of the returned
    /// type, the recipe, the key and the closure that builds the load.
    fn answer(&self, call: TokenStream) -> TokenStream {
        let witness = self.witness();
        let (method, rules) = match &self.function.returns {
            Returns::Value(_) => (quote!(value), quote!(())),
            Returns::Result { .. } => (quote!(result), self.rules()),
        };
        let recipe = self.recipe(rules);
        let key = self.key();
        let (args, context) = self.context();
        let attempt = self.attempt_fn();
        quote!(#witness.#method(#recipe, #call, #key, #args, #context, #attempt))
    }

    /// The path of the companion's `__answer`, when it has one: a free function whose
    /// arguments are all owned (nothing to lend the load) has its call on the runtime in one
    /// function of its companion, which the function, `refresh` and `read_through` return
    /// [`deferred`](Self::deferred) with their `Call`, so that it is type-checked once rather
    /// than three times (issue 38).
    fn shared_answer(&self) -> Option<TokenStream> {
        let Some(companion @ Holder::Type(_)) = &self.companion else {
            return None;
        };
        (self.lends_nothing() && self.settings.batch.is_none()).then(|| companion.path("answer"))
    }

    /// Whether the function takes nothing the load must lend back to its body: no receiver and
    /// no borrowed argument, so that the body's future owns all it needs.
    pub(super) fn lends_nothing(&self) -> bool {
        self.function.receiver.is_none()
            && self.function.args.iter().all(|arg| arg.borrowed.is_none())
    }

    /// The companion's `__answer` ([`Self::shared_answer`]): the runtime's answer to the `Call`
    /// it is given, inlined into its caller: `Deferred`'s poll, one for the function's three
    /// calls, or the `async fn` of a function that cannot be deferred.
    pub(super) fn answer_item(&self) -> TokenStream {
        let (Some(companion), Some(_)) = (&self.companion, self.shared_answer()) else {
            return TokenStream::new();
        };
        let name = companion.hidden("answer");
        let private = &self.private;
        let vis = &self.function.vis;
        let attrs = self.item_attrs();
        let output = &self.function.output;
        let call = Ident::new("__stampede_call", Span::mixed_site());
        let (idents, types): (Vec<_>, Vec<_>) = self
            .function
            .args
            .iter()
            .map(|arg| (&arg.ident, &arg.ty))
            .unzip();
        let answer = self.answer(quote!(#call));
        // The arguments as one tuple: `Deferred` holds them until it is polled.
        quote! {
            #[doc(hidden)]
            #attrs
            #[inline(always)]
            #vis fn #name(
                #call: #private::Call,
                (#(#idents,)*): (#(#types,)*),
            ) -> #private::Answer<'static, #output> {
                #answer
            }
        }
    }

    /// The function's recipe: its slot, its site (`Self` for a method: a generic impl's
    /// instantiations get caches of their own), the builders of its options and tier, its
    /// tags, and `rules` (what is known of its error type; `()` for none).
    pub(super) fn recipe(&self, rules: TokenStream) -> TokenStream {
        let private = &self.private;
        let (slot, config, tier) = self.cache();
        let site = match (self.function.receiver, &self.companion) {
            // The method and its companion's operations reach the cache alike; an impl with a
            // companion has its parameters in its type.
            (Some(_), Some(_)) => quote!(::core::any::type_name::<Self>()),
            // A free function: one instantiation.
            (None, Some(_)) => quote!(""),
            // Its instantiation, a trait's parameters included, as its body sees it.
            (_, None) => body_site(),
        };
        let tags = self.tags();
        let values = self.values();
        let entries = self.entries();
        quote! {
            #private::Recipe {
                slot: #slot,
                site: #site,
                config: #config,
                tier: #tier,
                tags: #tags,
                values: #values,
                entries: #entries,
                rules: #rules,
            }
        }
    }

    /// Whether the cache's entries are lean: the runtime's rule (`lean`), given the options the
    /// attribute turns on, evaluated when the function is compiled, so that only the store of
    /// that form is compiled for its value type.
    fn entries(&self) -> TokenStream {
        let private = &self.private;
        let settings = &self.settings;
        let tags = !settings.tags.is_empty();
        let refresh_after = settings.refresh_after.is_some();
        let xfetch = settings.xfetch.is_some();
        let fail_safe = settings.fail_safe.is_some();
        quote! {
            #private::Entries::<{ #private::lean(#tags, #refresh_after, #xfetch, #fail_safe) }>
        }
    }

    /// What the runtime knows of the values (`Values`): `source_version` the option's function,
    /// checked to be a `fn(&T) -> u64` (`T` the value as the cache stores it) at the option's
    /// span; for a batch function, whose cache holds `Option<T>`, a key its map left out has no
    /// version.
    fn values(&self) -> TokenStream {
        let private = &self.private;
        let some = quote!(::core::option::Option::Some);
        let source_version = match &self.settings.source_version {
            None => quote!(::core::option::Option::None),
            Some(path) => {
                let span = path
                    .segments
                    .last()
                    .map_or(Span::call_site(), |s| s.ident.span());
                // A function of another type fails the check, at the option's span, with a
                // message that names the `fn(&T) -> u64` it must be; the failed check is an
                // error type, which silences the call of it.
                let value = self.value_type();
                let function = chain(
                    span,
                    private,
                    quote_spanned!(span=> (#path, ::core::marker::PhantomData::<#value>)),
                    &[Check::SourceVersion],
                    Finish::Probe,
                );
                let version = quote_spanned!(span=> (#function.0)(__stampede_value));
                match self.settings.batch {
                    None => quote! {
                        #some(|__stampede_value| #some(#version))
                    },
                    Some(_) => quote! {
                        #some(|__stampede_value| {
                            ::core::option::Option::map(
                                ::core::option::Option::as_ref(__stampede_value),
                                |__stampede_value| #version,
                            )
                        })
                    },
                }
            }
        };
        quote! {
            #private::Values {
                source_version: #source_version,
            }
        }
    }

    /// What the runtime knows of the error type (`ErrorRules`): `clone` is `Some(E::clone)` when it is
    /// `Clone`, else `None`, chosen by method resolution on the returned type as written (so an
    /// alias such as `io::Result<T>` works); `retry_if` the option's function, checked to be a
    /// `fn(&E) -> bool` at the option's span.
    pub(super) fn rules(&self) -> TokenStream {
        let private = &self.private;
        let output = &self.function.output;
        let retry_if = optional_fn(self.settings.retry_if.as_ref());
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
    pub(super) fn witness(&self) -> TokenStream {
        self.witness_for(&self.function.output, &self.function.returns)
    }

    /// The witness of `output` (what `returns` reads of it), its value (and error) type checked
    /// at the span the user wrote it.
    pub(super) fn witness_for(&self, output: &syn::Type, returns: &Returns) -> TokenStream {
        let private = &self.private;
        let probe = quote!((::core::marker::PhantomData::<#output>,));
        match returns {
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
    pub(super) fn key(&self) -> TokenStream {
        self.key_of(&self.key_args)
    }

    /// The key made of `args` (the key's arguments, in the key's order), as [`Self::key`].
    pub(super) fn key_of(&self, args: &[&Arg]) -> TokenStream {
        let private = &self.private;
        let checks = Check::key(self.in_redis);
        let parts = args.iter().map(|arg| {
            let part = owned_part(arg);
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

    /// The key made of `args` as [`Self::key_of`] makes it, without the checks: for the
    /// companion's operations, whose `__ops` made them.
    pub(super) fn unchecked_key_of(args: &[&Arg]) -> TokenStream {
        let parts = args.iter().map(|arg| owned_part(arg));
        quote!((#(#parts,)*))
    }

    /// The type of the key made of `args`: each part's owned type, its lifetimes `'static`
    /// (a key is `'static`), so that the companion's `__ops` can name it.
    pub(super) fn key_type_of(args: &[&Arg]) -> TokenStream {
        let parts = args.iter().map(|arg| {
            let part: syn::Type = match &arg.borrowed {
                Some(elem) => syn::parse_quote!(<#elem as ::std::borrow::ToOwned>::Owned),
                None => arg.ty.clone(),
            };
            with_static_lifetimes(&part)
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

    /// What the runtime makes the load's context of, only when a load must start: the
    /// arguments it takes it from (the receiver, the arguments left out of the key, as the
    /// function has them) and a closure that captures nothing, which the runtime takes as a
    /// `fn` pointer, that makes owned copies of them, so that a hit clones nothing but the key.
    /// Neither names the function, so what takes them is compiled once per their types, not per
    /// function (issue 38); a function that needs nothing beyond its key hands `()` and the
    /// runtime's `no_context`.
    fn context(&self) -> (TokenStream, TokenStream) {
        let private = &self.private;
        if self.function.receiver.is_none() && self.other_args.is_empty() {
            return (quote!(()), quote!(#private::no_context));
        }
        // Each part passes its checks both as it is handed over and as it is copied, so that a
        // failed check silences the errors of both types (rustc reports it once).
        let this = self.function.receiver.map(|span| {
            let this = Ident::new("self", span);
            self.checked_receiver(span, quote!(#this), Finish::Checked(quote!(#this)))
        });
        let others = self.other_args.iter().map(|arg| {
            let ident = &arg.ident;
            self.checked_arg(arg, Finish::Checked(quote!(#ident)))
        });
        let args = this.into_iter().chain(others);
        let args = quote!((#(#args,)*));
        let parts = self.held();
        let copies = self.held_copies(&receiver_ident());
        let make = quote! {
            |(#(#parts,)*)| (#(#copies,)*)
        };
        (args, make)
    }

    /// The closure that builds `load` when a load must start, with the owned copies it needs of
    /// what is not part of the key, as [`Self::context`] makes them (a batch function's load).
    pub(super) fn prepare_with(&self, load: TokenStream) -> TokenStream {
        let this = Ident::new(
            "self",
            self.function.receiver.unwrap_or_else(Span::call_site),
        );
        let copies = self.held_copies(&this);
        let parts = self.held();
        quote! {
            move || {
                #(let #parts = #copies;)*
                #load
            }
        }
    }

    /// The receiver's checks, of `receiver` (a reference to it), at its span (`self` in the
    /// user's signature), finished by `finish`.
    fn checked_receiver(&self, span: Span, receiver: TokenStream, finish: Finish) -> TokenStream {
        let private = &self.private;
        chain(
            span,
            private,
            quote!(#private::probe(#receiver)),
            Check::RECEIVER,
            finish,
        )
    }

    /// The checks of an argument left out of the key, of the type the load holds of it (its
    /// owned type, for a borrowed one), at the span of its type, finished by `finish`.
    fn checked_arg(&self, arg: &Arg, finish: Finish) -> TokenStream {
        let private = &self.private;
        let held: syn::Type = match &arg.borrowed {
            Some(elem) => syn::parse_quote!(<#elem as ::std::borrow::ToOwned>::Owned),
            None => arg.ty.clone(),
        };
        let held = with_elided_lifetimes(&held);
        chain(
            type_span(arg),
            private,
            quote!((::core::marker::PhantomData::<#held>,)),
            Check::ARG,
            finish,
        )
    }

    /// The owned copies a load holds of what it needs beyond the key, in the order of
    /// [`Self::held`], each once its checks passed: a clone of the receiver (`receiver`, a
    /// reference to it; unused without one), and of each argument left out of the key, named as
    /// the function has it, an owned copy of a borrowed one or an owned one as it is.
    fn held_copies(&self, receiver: &Ident) -> Vec<TokenStream> {
        let this = self.function.receiver.map(|span| {
            self.checked_receiver(span, quote!(#receiver), Finish::CloneOf(quote!(#receiver)))
        });
        let others = self.other_args.iter().map(|arg| {
            let ident = &arg.ident;
            let finish = match arg.borrowed {
                Some(_) => Finish::OwnedOf(quote!(#ident)),
                None => Finish::Checked(quote!(#ident)),
            };
            self.checked_arg(arg, finish)
        });
        this.into_iter().chain(others).collect()
    }

    /// The names of what a load holds beyond the key, in the order of its context: the
    /// receiver's copy, then the arguments left out of the key.
    pub(super) fn held(&self) -> Vec<Ident> {
        let receiver = self.function.receiver.map(|_| receiver_ident());
        let others = self.other_args.iter().map(|arg| arg.ident.clone());
        receiver.into_iter().chain(others).collect()
    }

    /// The function that starts one attempt, from the load's context ([`Self::context`]) and
    /// the key: a closure that captures nothing, so that the runtime takes it as a `fn`
    /// pointer, and the load's type names no function (issue 38). It binds the key's
    /// arguments (owned) and the context's parts (by reference: each attempt copies what it
    /// takes), and boxes the attempt's future.
    fn attempt_fn(&self) -> TokenStream {
        let private = &self.private;
        let key = Ident::new("__stampede_key", Span::mixed_site());
        let context = Ident::new("__stampede_context", Span::mixed_site());
        // With a companion, the body is its own function, which binds `mut` arguments itself.
        let in_load = self.companion.is_none();
        let key_bindings = self.key_args.iter().map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
            let mutability = mutability.filter(|_| in_load);
            quote!(#mutability #ident)
        });
        let parts = self.held();
        let boxed = match &self.function.returns {
            Returns::Value(_) => quote!(#private::plain_attempt),
            Returns::Result { .. } => quote!(#private::attempt),
        };
        let attempt = self.attempt();
        quote! {
            |#context: &_, #key: &_| {
                let (#(#parts,)*) = #context;
                let (#(#key_bindings,)*) = ::core::clone::Clone::clone(#key);
                #boxed({ #attempt })
            }
        }
    }

    /// One attempt's future, with the key's arguments bound (owned) and the load's receiver
    /// and other arguments bound by reference: its own copies of them, and the user's body,
    /// with `self` and the borrowed arguments lent back as it expects them.
    pub(super) fn attempt(&self) -> TokenStream {
        let private = &self.private;
        let output = &self.function.output;
        let receiver = receiver_ident();
        // With a companion, the body is its own function, which binds `mut` arguments itself.
        let in_load = self.companion.is_none();
        let receiver_copy = self
            .function
            .receiver
            .map(|_| quote!(let #receiver = ::core::clone::Clone::clone(#receiver);));
        let others_copied = self.other_args.iter().map(|arg| {
            let ident = &arg.ident;
            let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
            let mutability = mutability.filter(|_| in_load);
            // Checked where the load's context is made ([`Self::checked_arg`]).
            quote!(let #mutability #ident = ::core::clone::Clone::clone(#ident);)
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
                let call = quote!(#body(#this #(#args),*));
                // What the body's function takes is all owned: its future is the attempt, with
                // no `async` block around it to compile per function (issue 38).
                if self.lends_nothing() {
                    return quote! {
                        #(#others_copied)*
                        #call
                    };
                }
                quote!(#call.await)
            }
        };
        quote! {
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

/// `Some(path)` for an option that names a function, spanned at the option's value so that a
/// function whose signature does not fit is reported there; `None` without the option.
fn optional_fn(path: Option<&syn::Path>) -> TokenStream {
    match path {
        Some(path) => {
            let span = path
                .segments
                .last()
                .map_or(Span::call_site(), |s| s.ident.span());
            quote_spanned!(span=> ::core::option::Option::Some(#path))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// The runtime's `Call` for `call`.
fn call_of(call: Call, private: &TokenStream) -> TokenStream {
    match call {
        Call::Get => quote!(#private::Call::Get),
        Call::Refresh => quote!(#private::Call::Refresh),
        Call::ReadThrough => quote!(#private::Call::ReadThrough),
    }
}

/// A key's part as the key owns it: a by-value argument moved in, a borrowed one turned owned.
fn owned_part(arg: &Arg) -> TokenStream {
    let ident = &arg.ident;
    match &arg.borrowed {
        Some(elem) => quote!(<#elem as ::std::borrow::ToOwned>::to_owned(#ident)),
        None => quote!(#ident),
    }
}
