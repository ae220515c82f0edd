//! The companion of a cached function: the operations on its cache (`invalidate`,
//! `invalidate_found`, `expire`, `clear`, `refresh`, `read_through`, `prime`, `peek`,
//! `uncached`) with the key's arguments as the function takes them, and the
//! hidden items they share with the function (its slot, its options, its body). For a free
//! function they are associated functions of a type of the function's name; for a method with
//! `companion = true`, associated functions named after it in its impl, or for a method of a
//! trait impl, in the inherent impl `#[stampede::companions]` emits next to it.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned};

use super::config::{Named, config, name as cache_name};
use super::{Call, Expansion, Holder, typed, with_elided_lifetimes, with_static_lifetimes};
use crate::func::{Arg, Returns};

/// The operations of a companion, by the name they end in.
const OPERATIONS: [&str; 9] = [
    "invalidate",
    "invalidate_found",
    "expire",
    "clear",
    "refresh",
    "read_through",
    "prime",
    "peek",
    "uncached",
];

impl Expansion<'_> {
    /// A free function's companion type (types and functions live in different namespaces), or
    /// a method's companion items. It holds the cache's slot, its options and the body, so that
    /// it works in a process that never called the function.
    ///
    /// A type rather than a module: its items are in the function's own scope, so the types of
    /// the signature and the items the body names resolve there as they do for the function,
    /// even inside a block.
    pub(super) fn companion(&self) -> Option<TokenStream> {
        let companion = self.companion.as_ref()?;
        let items = [
            self.hidden_items(companion),
            self.answer_item(),
            self.operations(companion),
        ];
        let Holder::Type(_) = companion else {
            let hint = self.trait_impl_hint();
            return Some(quote!(#hint #(#items)*));
        };
        let cfgs = self.cfgs();
        let vis = &self.function.vis;
        let fn_name = self.function.sig.ident.to_string();
        let doc = format!(
            "The cache of [`{fn_name}()`](fn@{fn_name}), reachable without calling it (generated \
             by `#[stampede::cached]`): `{fn_name}::invalidate`, `invalidate_found`, `expire`, \
             `clear`, `refresh`, `read_through`, `prime`, `peek` and `uncached`, which take the \
             arguments of the key as the function does (`clear` none)."
        );
        // Named at the attribute: the name is the function's, in the style of a function, and
        // the lints of type names are for the types a user writes.
        let name = Ident::new(&fn_name, Span::call_site());
        let linked = self.linked(name.clone(), companion.path("ops"));
        Some(quote! {
            #(#cfgs)*
            #[doc = #doc]
            #vis struct #name {
                _private: (),
            }

            #(#cfgs)*
            impl #name {
                #(#items)*
            }

            #linked
        })
    }

    /// For a method whose companion goes next to it: an item whose name says what a trait impl
    /// needs, first, so that rustc's first error in a native trait impl, which this attribute
    /// cannot tell from an inherent one, names the fix ("const
    /// `__count_companion_needs_stampede_companions_on_this_trait_impl` is not a member of
    /// trait `Catalog`"), at `companion = true`. Nothing under `#[stampede::companions]`.
    fn trait_impl_hint(&self) -> TokenStream {
        if self.settings.in_companions_block {
            return TokenStream::new();
        }
        let span = self.settings.companion_span.unwrap_or_else(Span::call_site);
        let hint = Ident::new(
            &format!(
                "__{}_companion_needs_stampede_companions_on_this_trait_impl",
                self.function.sig.ident
            ),
            span,
        );
        let attrs = self.item_attrs();
        quote_spanned! {span=>
            #attrs
            #[doc(hidden)]
            #[allow(dead_code, non_upper_case_globals)]
            const #hint: () = ();
        }
    }

    /// The function's own `cfg` and lint attributes, which every companion item repeats: an
    /// item that takes the function's arguments meets the lints its signature meets.
    pub(super) fn item_attrs(&self) -> TokenStream {
        let attrs = self.function.attrs.iter().filter(|attr| {
            ["cfg", "allow", "expect", "warn", "deny", "forbid"]
                .iter()
                .any(|name| attr.path().is_ident(name))
        });
        quote!(#(#attrs)*)
    }

    /// The function's `#[cfg]` attributes, which the companion type repeats.
    fn cfgs(&self) -> Vec<&syn::Attribute> {
        self.function
            .attrs
            .iter()
            .filter(|attr| attr.path().is_ident("cfg"))
            .collect()
    }

    /// What the function and its operations share: the slot, the options and the body.
    fn hidden_items(&self, companion: &Holder) -> TokenStream {
        let private = &self.private;
        let function = self.function;
        let vis = &function.vis;
        let attrs = self.item_attrs();
        let config = config(
            &function.sig.ident,
            self.named(),
            self.settings,
            private,
            &self.ttl_from(),
        );
        let (slot_fn, config_fn, body_fn) = (
            companion.hidden("slot"),
            companion.hidden("config"),
            companion.hidden("body"),
        );
        let slot = Ident::new("__STAMPEDE_SLOT", Span::mixed_site());
        let this = function.receiver.map(|_| quote!(&self,));
        let inputs = function.args.iter().map(|arg| {
            let (ident, mutability, ty) = (&arg.ident, arg.mutability, &arg.ty);
            quote!(#mutability #ident: #ty)
        });
        let output = &function.output;
        let generics = &function.sig.generics;
        let where_clause = &generics.where_clause;
        let body = &function.body;
        quote! {
            #[doc(hidden)]
            #attrs
            #vis fn #slot_fn() -> &'static #private::Slot {
                static #slot: #private::Slot = #private::Slot::new();
                &#slot
            }

            #[doc(hidden)]
            #attrs
            #vis fn #config_fn() -> #private::Config {
                #config
            }

            #[doc(hidden)]
            #attrs
            #vis async fn #body_fn #generics (#this #(#inputs),*) -> #output #where_clause {
                #(#body)*
            }
        }
    }

    /// The operations on the cache, each documented.
    fn operations(&self, companion: &Holder) -> TokenStream {
        let krate = &self.settings.krate;
        let function = self.function;
        let vis = &function.vis;
        let attrs = self.item_attrs();
        let output = &function.output;
        let generics = &function.sig.generics;
        let where_clause = &generics.where_clause;
        let all_inputs: Vec<TokenStream> = function.args.iter().map(typed).collect();
        let args = function.args.iter().map(|arg| &arg.ident);
        let value = self.value_type();
        let this = function.receiver.map(|_| quote!(&self,));
        let this_arg = function.receiver.map(|_| quote!(self,));
        let private = &self.private;
        let OneKey {
            inputs: key_inputs,
            key,
            refresh,
            read_through,
            primed,
            peeked,
            one,
        } = self.one_key(companion);
        let ops = companion.path("ops");
        let body = companion.path("body");
        let [
            invalidate,
            invalidate_found,
            expire,
            clear,
            refresh_fn,
            read_through_fn,
            prime,
            peek,
            uncached,
        ] = OPERATIONS.map(|op| companion.op(op));
        let [
            doc_invalidate,
            doc_invalidate_found,
            doc_expire,
            doc_clear,
            doc_refresh,
            doc_read_through,
            doc_prime,
            doc_peek,
            doc_uncached,
        ] = self.docs(companion);
        // `refresh` and `read_through`: deferred calls of the companion's `__answer` where it
        // has one, else `async fn`s that make the call.
        let full = |name: &Ident, call: Call, body: TokenStream| match self.deferred(name, call) {
            Some((signature, deferred)) => quote!(#signature { #deferred }),
            None => quote! {
                #vis async fn #name #generics (#this #(#all_inputs),*) -> #output #where_clause {
                    #body
                }
            },
        };
        let (refresh, read_through) = (
            full(&refresh_fn, Call::Refresh, refresh),
            full(&read_through_fn, Call::ReadThrough, read_through),
        );
        let keyed =
            |name: &Ident, inputs: TokenStream, output: TokenStream, future: TokenStream| {
                self.keyed_operation(companion, name, inputs, output, future)
            };
        let (unit, found) = (
            quote!(::core::result::Result<(), #krate::Error>),
            quote!(::core::result::Result<bool, #krate::Error>),
        );
        let keys = quote!(#(#key_inputs),*);
        let [invalidate, invalidate_found, expire, clear, prime] = [
            keyed(
                &invalidate,
                keys.clone(),
                unit.clone(),
                quote!(#private::ops::invalidate(#ops, #key)),
            ),
            keyed(
                &invalidate_found,
                keys.clone(),
                found,
                quote!(#private::ops::invalidate_found(#ops, #key)),
            ),
            keyed(
                &expire,
                keys.clone(),
                unit.clone(),
                quote!(#private::ops::expire(#ops, #key)),
            ),
            keyed(
                &clear,
                TokenStream::new(),
                unit.clone(),
                quote!(#private::ops::clear(#ops)),
            ),
            keyed(
                &prime,
                quote!(#(#key_inputs,)* value: #value),
                unit,
                quote!(#private::ops::prime(#ops, #key, #primed)),
            ),
        ];
        let ops_item = self.ops_item(companion);
        // A free function that lends its body nothing returns the body's future as it is: no
        // coroutine of its own to compile.
        let uncached_fn = match companion {
            Holder::Type(_) if self.lends_nothing() => quote! {
                #vis fn #uncached(#(#all_inputs),*)
                    -> impl ::core::future::Future<Output = #output> + use<>
                {
                    #body(#(#args),*)
                }
            },
            _ => quote! {
                #vis async fn #uncached #generics (#this #(#all_inputs),*) -> #output #where_clause {
                    #body(#this_arg #(#args),*).await
                }
            },
        };
        quote! {

            #[doc = #doc_invalidate]
            #attrs
            #invalidate

            #[doc = #doc_invalidate_found]
            #attrs
            #invalidate_found

            #[doc = #doc_expire]
            #attrs
            #expire

            #[doc = #doc_clear]
            #attrs
            #clear

            #[doc = #doc_refresh]
            #attrs
            #refresh

            #[doc = #doc_read_through]
            #attrs
            #read_through

            #[doc = #doc_prime]
            #attrs
            #prime

            #[doc = #doc_peek]
            #attrs
            #vis fn #peek #generics (#(#key_inputs),*) -> #peeked #where_clause {
                #private::ops::peek(#ops, #key)
            }

            #one

            #[doc = #doc_uncached]
            #attrs
            #uncached_fn

            #ops_item
        }
    }

    /// An operation that needs only the key (`invalidate`, `expire`, `clear`, `prime`...),
    /// whose `future` is the runtime's: a plain `fn` that returns that future, no coroutine of
    /// its own to compile. It copies the key when called and borrows no argument: for a free
    /// function, which has no generic parameters, the future says so (`use<>`); a method's
    /// leaves its capture to the edition's default, as its impl's generics, which a `use<..>`
    /// would have to name, are not known here (the future names no lifetime: a key and a
    /// value are `'static`).
    fn keyed_operation(
        &self,
        companion: &Holder,
        name: &Ident,
        inputs: TokenStream,
        output: TokenStream,
        future: TokenStream,
    ) -> TokenStream {
        let vis = &self.function.vis;
        let generics = &self.function.sig.generics;
        let where_clause = &generics.where_clause;
        match companion {
            Holder::Type(_) => {
                quote! {
                    #vis fn #name (#inputs)
                        -> impl ::core::future::Future<Output = #output> + use<>
                        #where_clause
                    {
                        #future
                    }
                }
            }
            Holder::Methods(_) => quote! {
                #vis fn #name #generics (#inputs)
                    -> impl ::core::future::Future<Output = #output>
                    #where_clause
                {
                    #future
                }
            },
        }
    }

    /// How the operations reach one key: a single-key function's key, or one key of a batch
    /// function, whose operations act on that key alone and keep `None` for a key its map
    /// leaves out.
    fn one_key(&self, companion: &Holder) -> OneKey {
        let args = self.one_key_args();
        let args: Vec<&Arg> = args.iter().collect();
        let key = Self::unchecked_key_of(&args);
        match &self.settings.batch {
            None => OneKey {
                inputs: self.key_args.iter().map(|arg| typed(arg)).collect(),
                key,
                refresh: self.call(Call::Refresh),
                read_through: self.call(Call::ReadThrough),
                primed: quote!(value),
                peeked: {
                    let value = self.value_type();
                    quote!(::core::option::Option<#value>)
                },
                one: TokenStream::new(),
            },
            Some(_) => OneKey {
                inputs: args.iter().map(|arg| typed(arg)).collect(),
                key,
                refresh: self.batch_call(Call::Refresh),
                read_through: self.batch_call(Call::ReadThrough),
                primed: self.primed(),
                peeked: self.peeked(),
                one: self.one_operation(companion),
            },
        }
    }

    /// The arguments of the key the operations take: the key's, or for a batch function the
    /// key's with one element of the batch in place of the batch.
    fn one_key_args(&self) -> Vec<Arg> {
        match &self.settings.batch {
            None => self.key_args.iter().map(|arg| (*arg).clone()).collect(),
            Some(_) => self.element_args(),
        }
    }

    /// The companion's hidden `__ops`, which the operations that load nothing call: the
    /// function's cache as an object, once the key's and the value's checks have passed at the
    /// spans the user wrote those types. The operations pass their key unchecked and prove no
    /// bound, so a type that fails a check is reported once, here and at the call (issue 38).
    fn ops_item(&self, companion: &Holder) -> TokenStream {
        let private = &self.private;
        let vis = &self.function.vis;
        let attrs = self.item_attrs();
        let name = companion.hidden("ops");
        let recipe = self.recipe(quote!(()));
        let args = self.one_key_args();
        let args: Vec<&Arg> = args.iter().collect();
        let key_type = Self::key_type_of(&args);
        let value = with_static_lifetimes(self.value_type());
        let stored = match &self.settings.batch {
            None => quote!(#value),
            Some(_) => quote!(::core::option::Option<#value>),
        };
        let (on, key_of) = self.checked_companion();
        quote! {
            #[doc(hidden)]
            #attrs
            #vis fn #name() -> &'static dyn #private::ops::Ops<#key_type, #stored> {
                // Through a `let`: the key's type is then the checked key's, an error type
                // (and no further error) when a check fails, not the declared one.
                let ops = #on.ops(#recipe, #key_of);
                ops
            }
        }
    }

    /// The companion handle of the cache (`witness.value_companion()`, a batch function's of
    /// its map's value), and a closure from the key's arguments to the key, never called: both
    /// with the checks at the spans the user wrote the types, for `__ops`, which reaches the
    /// cache without a call.
    fn checked_companion(&self) -> (TokenStream, TokenStream) {
        let (witness, companion_of, key) = match &self.settings.batch {
            None => (self.witness(), self.companion_of(), self.key()),
            Some(_) => (
                self.batch_witness(),
                self.batch_companion_of(),
                self.element_key(),
            ),
        };
        let args = self.one_key_args();
        (quote!(#witness.#companion_of()), key_closure(&args, &key))
    }

    /// The operations' doc comments, in the order of [`OPERATIONS`].
    fn docs(&self, companion: &Holder) -> [String; 9] {
        let fn_name = self.function.sig.ident.to_string();
        let shown = match (companion, &self.settings.trait_path) {
            (Holder::Type(_), _) => format!("[`{fn_name}()`](fn@{fn_name})"),
            (Holder::Methods(_), None) => format!("[`Self::{fn_name}`]"),
            // A method of a trait impl, for `#[stampede::companions]`: not a link, which rustdoc
            // could not resolve from the inherent impl to the trait's.
            (Holder::Methods(_), Some(trait_path)) => {
                format!(
                    "`{fn_name}` (of `impl {} for Self`)",
                    crate::func::written(trait_path)
                )
            }
        };
        [
            format!(
                "Drops the value {shown} holds for these arguments, in this process and, for a \
                 cache backed by Redis, in Redis and in every other process's memory. After it \
                 returns, no call here returns a value whose load began before it."
            ),
            format!(
                "Invalidates {shown} as `invalidate` does, and tells whether the cache held a \
                 value for these arguments: in this process's memory, or in Redis for a cache \
                 backed by it. `false` means the invalidation reached no value, which an admin \
                 tool can check (a wrong key, or another cache's name or value shape)."
            ),
            format!(
                "Ends the freshness of the value {shown} holds for these arguments without \
                 dropping it, in this process and, for a cache backed by Redis, in Redis and in \
                 every other process's memory: the next call gets it stale at once (for the \
                 cache's `stale` at most, from now) while one refresh runs, and with `fail_safe` \
                 it stays the last good value. A load running meanwhile stores no fresh value."
            ),
            format!(
                "Drops every value {shown} holds, in this process and, for a cache backed by \
                 Redis, in Redis (every key of its name, found by `SCAN`: an admin tool's \
                 operation) and in every other process's memory. Loads running meanwhile store \
                 nothing."
            ),
            format!(
                "Loads the value of {shown} for these arguments now, whatever value is held, \
                 stores it and returns what the function returns. Joins the load running for \
                 the key, if any, so that concurrent callers still share one load."
            ),
            format!(
                "Calls {shown} as if this process's memory held nothing for these arguments: \
                 for a cache backed by Redis, reads Redis (and loads only if Redis has no fresh \
                 value), then keeps the value in memory as a call does. For when this call must \
                 see what another process wrote (a `prime`, a fill) before the copy held here \
                 expires; on a cache without Redis, the key's load, shared with one running."
            ),
            format!(
                "Stores `value` as the value of {shown} for these arguments, as if it had been \
                 loaded now: fresh for the jittered `ttl`, and for a cache backed by Redis also \
                 written to Redis (an error when Redis cannot be reached; the value is then kept \
                 in this process only)."
            ),
            format!(
                "The value {shown} holds in this process's memory for these arguments, if it may \
                 be served (fresh or stale); never loads, waits or reads Redis."
            ),
            format!("Runs the body of {shown} directly: no cache is read or written."),
        ]
    }

    /// The paths of the operations, which the function's body names so that none is unused
    /// code in a crate that calls only some of them.
    pub(super) fn used_operations(&self) -> TokenStream {
        let Some(companion) = &self.companion else {
            return TokenStream::new();
        };
        let paths = OPERATIONS.map(|op| {
            let op = companion.op(op);
            match companion {
                Holder::Type(name) => {
                    let name = Ident::new(&name.to_string(), Span::call_site());
                    quote!(#name::#op)
                }
                Holder::Methods(_) => quote!(Self::#op),
            }
        });
        quote!(let _ = (#(#paths,)*);)
    }

    /// The witness's method that gives the companion's operations: by the returned type.
    fn companion_of(&self) -> TokenStream {
        match self.function.returns {
            Returns::Value(_) => quote!(value_companion),
            Returns::Result { .. } => quote!(ok_companion),
        }
    }

    /// A non-generic free function's listing in the runtime's registry of linked functions
    /// (before `main`), with a hidden `__build` in its companion that builds its cache through
    /// `ops` (the path of its `__ops`): so that `stampede::invalidate(name, key)` reaches it in
    /// a process that never called it. Nothing for a method or a generic function, whose key
    /// types only a call can name.
    fn linked(&self, name: Ident, ops: TokenStream) -> TokenStream {
        if !self.function.sig.generics.params.is_empty() {
            return TokenStream::new();
        }
        let private = &self.private;
        let vis = &self.function.vis;
        let cfgs = self.cfgs();
        let cfgs = quote!(#(#cfgs)*);
        let tagged = !self.settings.tags.is_empty();
        // A free function's name is a constant (`name = ".."` or its path): the registry finds a
        // function by it without building its options, whose paths it would read.
        let cache = cache_name(
            &self.function.sig.ident,
            Named::Path,
            self.settings,
            private,
        );
        quote! {
            #cfgs
            impl #name {
                #[doc(hidden)]
                #vis fn __build() {
                    // The cache as the operations reach it, built at the first use.
                    #ops();
                }
            }

            #cfgs
            #private::inventory::submit! {
                #private::Linked::new(#cache, #name::__build, #tagged)
            }
        }
    }
}

/// What the operations that take a key need of it, which differs between a single-key function
/// and a batch function (whose operations act on one of its keys).
struct OneKey {
    /// The key's arguments as the operations take them (`id: u64`).
    inputs: Vec<TokenStream>,
    /// The expression of the key, built from those arguments without the checks (`__ops`
    /// makes them).
    key: TokenStream,
    /// The body of `refresh`.
    refresh: TokenStream,
    /// The body of `read_through`.
    read_through: TokenStream,
    /// What `prime` stores for its `value` argument.
    primed: TokenStream,
    /// The type `peek` returns.
    peeked: TokenStream,
    /// The operation only a batch function's companion has, or nothing.
    one: TokenStream,
}

/// `|(a, b,): (A, B,)| key`: a closure from the key's arguments (as one tuple) to the key, never
/// called, whose type names the key's ([`Expansion::checked_companion`]); lifetimes elided.
fn key_closure(args: &[Arg], key: &TokenStream) -> TokenStream {
    let (idents, types): (Vec<_>, Vec<_>) = args
        .iter()
        .map(|arg| (&arg.ident, with_elided_lifetimes(&arg.ty)))
        .unzip();
    quote!(|(#(#idents,)*): (#(#types,)*)| #key)
}
