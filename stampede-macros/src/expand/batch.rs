//! A batch function (`batch = ids`): its body (one call on the runtime with every key of the
//! call, answered with the map of the values found), its load (one call of the user's body per
//! group of keys that share the other key arguments), and what its companion adds: the
//! operations on one key, and the hidden single-key call that a function naming it as its
//! `batch_loader` makes.
//!
//! ```text
//! async fn products(ids: Vec<u64>) -> Result<HashMap<u64, Product>, AppError> {
//!     witness::<Product, AppError>.results(recipe, Call::Get,
//!         ids.into_iter().map(|ids| (ids /* checks */,)).collect(),   // one key per id
//!         move || move |keys: &Vec<(u64,)>| {
//!             batch_answers(/* each key's id */, groups(keys, |key| ()).map(|((), places)| {
//!                 let ids: Vec<u64> = /* the ids at `places` */;
//!                 (places, typed::<Result<HashMap<u64, Product>, AppError>, _>(async move { /* body */ }))
//!             }))
//!         })
//!         .await
//!         .map(|found| found.into_iter().filter_map(|(key, value)| Some((key.0, value?))).collect())
//! }
//! ```

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Index, Type};

use super::config::{function_path, last_span, once_cell, read_path};
use super::{Call, Expansion, Holder, with_elided_lifetimes};
use crate::attr::OrPath;
use crate::batch::BatchShape;
use crate::checks::{Check, Finish, chain};
use crate::func::{Arg, Returns};

impl Expansion<'_> {
    /// The batch function's shape; only for a batch function.
    pub(super) fn shape(&self) -> &BatchShape {
        self.settings
            .batch
            .as_ref()
            .expect("called for a batch function only")
    }

    /// Where the batch argument's key sits in the key's tuple.
    fn element_index(&self) -> Index {
        let arg = &self.shape().arg;
        let at = self
            .key_args
            .iter()
            .position(|key_arg| key_arg.ident == *arg)
            .unwrap_or(0);
        Index::from(at)
    }

    /// The key's arguments as one key of the batch has them: the batch argument holding one
    /// key, by value.
    pub(super) fn element_args(&self) -> Vec<Arg> {
        let shape = self.shape();
        self.key_args
            .iter()
            .map(|arg| match arg.ident == shape.arg {
                true => Arg {
                    ident: arg.ident.clone(),
                    mutability: None,
                    borrowed: None,
                    ty: shape.element.clone(),
                },
                false => (*arg).clone(),
            })
            .collect()
    }

    /// Every argument of the function as its single-key call takes them: the batch argument
    /// holding one key.
    pub(super) fn one_args(&self) -> Vec<Arg> {
        let shape = self.shape();
        self.function
            .args
            .iter()
            .map(|arg| match arg.ident == shape.arg {
                true => Arg {
                    ident: arg.ident.clone(),
                    mutability: None,
                    borrowed: None,
                    ty: shape.element.clone(),
                },
                false => arg.clone(),
            })
            .collect()
    }

    /// The key of one key of the batch, made of [`Self::element_args`].
    pub(super) fn element_key(&self) -> TokenStream {
        let args = self.element_args();
        let args: Vec<&Arg> = args.iter().collect();
        self.key_of(&args)
    }

    /// The type a single-key call of the batch function's cache returns: `Option<V>`, or
    /// `Result<Option<V>, E>`.
    pub(super) fn one_output(&self) -> TokenStream {
        let shape = self.shape();
        let value = &shape.value;
        match &shape.error {
            None => quote!(::core::option::Option<#value>),
            Some(error) => quote!(::core::result::Result<::core::option::Option<#value>, #error>),
        }
    }

    /// The witness of the map's value (and error) type, which a batch function's calls are made
    /// through; the checks at the spans the user wrote them.
    pub(super) fn batch_witness(&self) -> TokenStream {
        let shape = self.shape();
        let value = shape.value.clone();
        match &shape.error {
            None => self.witness_for(&value, &Returns::Value(value.clone())),
            Some(error) => {
                let output: Type = syn::parse_quote!(::core::result::Result<#value, #error>);
                let returns = Returns::Result {
                    ok: value,
                    err: Some(Box::new(error.clone())),
                };
                self.witness_for(&output, &returns)
            }
        }
    }

    /// The witness's method that gives a batch function's companion operations.
    pub(super) fn batch_companion_of(&self) -> TokenStream {
        match self.shape().error {
            None => quote!(values_companion),
            Some(_) => quote!(results_companion),
        }
    }

    /// The body of the batch function (and of its companion's `refresh`): one call on the
    /// runtime with every key of the call, and the map of the values found.
    pub(super) fn batch_call(&self, call: Call) -> TokenStream {
        let private = &self.private;
        let witness = self.batch_witness();
        let (method, rules) = match self.shape().error {
            None => (quote!(values), quote!(())),
            Some(_) => (quote!(results), self.rules()),
        };
        let call = match call {
            Call::Get => quote!(#private::Call::Get),
            Call::Refresh => quote!(#private::Call::Refresh),
            Call::ReadThrough => quote!(#private::Call::ReadThrough),
        };
        let recipe = self.recipe(rules);
        let keys = self.batch_keys();
        let prepare = self.prepare_with(self.batch_load());
        let at = self.element_index();
        let map = match &self.function.returns {
            Returns::Value(map) | Returns::Result { ok: map, .. } => map,
        };
        let found = |found: TokenStream| {
            quote! {
                ::core::iter::Iterator::collect::<#map>(
                    ::core::iter::Iterator::filter_map(
                        ::core::iter::IntoIterator::into_iter(#found),
                        |(__stampede_key, __stampede_value)| ::core::option::Option::map(
                            __stampede_value,
                            |__stampede_value| (__stampede_key.#at, __stampede_value),
                        ),
                    ),
                )
            }
        };
        let answered = quote!(#witness.#method(#recipe, #call, #keys, #prepare).await);
        let values = Ident::new("__stampede_found", Span::mixed_site());
        let map_of = found(quote!(#values));
        match self.shape().error {
            None => quote!({
                let #values = #answered;
                #map_of
            }),
            Some(_) => quote!(match #answered {
                ::core::result::Result::Ok(#values) => ::core::result::Result::Ok(#map_of),
                ::core::result::Result::Err(__stampede_error) => ::core::result::Result::Err(__stampede_error),
            }),
        }
    }

    /// The keys of a call: one per key in the batch argument, each with the call's other key
    /// arguments (owned once, cloned per key), every part checked at the span of its type.
    fn batch_keys(&self) -> TokenStream {
        let private = &self.private;
        let shape = self.shape();
        let checks = Check::key(self.in_redis);
        let ids = &shape.arg;
        let batch_arg = self
            .function
            .args
            .iter()
            .find(|arg| arg.ident == *ids)
            .expect("the batch argument was found in validation");
        let part = |at: usize| Ident::new(&format!("__stampede_part_{at}"), Span::mixed_site());
        let mut owned_parts = Vec::new();
        let parts = self.key_args.iter().enumerate().map(|(at, arg)| {
            if arg.ident == *ids {
                return chain(
                    shape.element_span(),
                    private,
                    quote!((#ids,)),
                    &checks,
                    Finish::Value,
                );
            }
            let ident = &arg.ident;
            let owned = match &arg.borrowed {
                Some(elem) => quote!(<#elem as ::std::borrow::ToOwned>::to_owned(#ident)),
                None => quote!(#ident),
            };
            let checked = chain(
                super::type_span(arg),
                private,
                quote!((#owned,)),
                &checks,
                Finish::Value,
            );
            let name = part(at);
            owned_parts.push(quote!(let #name = #checked;));
            quote!(::core::clone::Clone::clone(&#name))
        });
        let parts: Vec<TokenStream> = parts.collect();
        let keys = match batch_arg.borrowed {
            Some(_) => quote!(::core::iter::Iterator::map(
                ::core::iter::IntoIterator::into_iter(#ids),
                ::core::clone::Clone::clone,
            )),
            None => quote!(::core::iter::IntoIterator::into_iter(#ids)),
        };
        quote! {
            {
                #(#owned_parts)*
                ::core::iter::Iterator::collect::<::std::vec::Vec<_>>(
                    ::core::iter::Iterator::map(#keys, |#ids| (#(#parts,)*)),
                )
            }
        }
    }

    /// The batch load: from the keys to load, one call of the body per group of keys that share
    /// the other key arguments (all of them, in a call of the function), each given the
    /// collection of its keys as the function takes it; each key answered from its group's map.
    fn batch_load(&self) -> TokenStream {
        let private = &self.private;
        let shape = self.shape();
        let ids = &shape.arg;
        let at = self.element_index();
        let keys = Ident::new("__stampede_keys", Span::mixed_site());
        let key = Ident::new("__stampede_key", Span::mixed_site());
        let places = Ident::new("__stampede_places", Span::mixed_site());
        let in_load = self.companion.is_none();
        let (rest_parts, rest_bindings): (Vec<TokenStream>, Vec<TokenStream>) = self
            .key_args
            .iter()
            .enumerate()
            .filter(|(_, arg)| arg.ident != *ids)
            .map(|(index, arg)| {
                let index = Index::from(index);
                let ident = &arg.ident;
                let mutability = arg.borrowed.is_none().then_some(arg.mutability).flatten();
                let mutability = mutability.filter(|_| in_load);
                (
                    quote!(::core::clone::Clone::clone(&#key.#index)),
                    quote!(#mutability #ident),
                )
            })
            .unzip();
        let batch_arg = self
            .function
            .args
            .iter()
            .find(|arg| arg.ident == *ids)
            .expect("the batch argument was found in validation");
        let collection = match &batch_arg.borrowed {
            Some(elem) => {
                let elem = with_elided_lifetimes(elem);
                quote!(<#elem as ::std::borrow::ToOwned>::Owned)
            }
            None => {
                let ty = with_elided_lifetimes(&batch_arg.ty);
                quote!(#ty)
            }
        };
        let mutability = batch_arg
            .borrowed
            .is_none()
            .then_some(batch_arg.mutability)
            .flatten()
            .filter(|_| in_load);
        let attempt = self.attempt();
        // The attempt copies what the load holds beyond the key from references to it.
        let held = self.held();
        let answers = match shape.error {
            None => quote!(batch_values),
            Some(_) => quote!(batch_answers),
        };
        quote! {
            move |#keys: &::std::vec::Vec<_>| {
                let (#(#held,)*) = (#(&#held,)*);
                let __stampede_calls = ::core::iter::Iterator::collect::<::std::vec::Vec<_>>(
                    ::core::iter::Iterator::map(
                        ::core::iter::IntoIterator::into_iter(
                            #private::groups(#keys, |#key| (#(#rest_parts,)*)),
                        ),
                        |(__stampede_rest, #places)| {
                            let (#(#rest_bindings,)*) = __stampede_rest;
                            let #mutability #ids: #collection = ::core::iter::Iterator::collect(
                                ::core::iter::Iterator::map(
                                    ::core::iter::IntoIterator::into_iter(&#places),
                                    |__stampede_at| ::core::clone::Clone::clone(&#keys[*__stampede_at].#at),
                                ),
                            );
                            (#places, { #attempt })
                        },
                    ),
                );
                let __stampede_batch = ::core::iter::Iterator::collect::<::std::vec::Vec<_>>(
                    ::core::iter::Iterator::map(
                        ::core::iter::IntoIterator::into_iter(#keys),
                        |#key| ::core::clone::Clone::clone(&#key.#at),
                    ),
                );
                #private::#answers(__stampede_batch, __stampede_calls)
            }
        }
    }

    /// The hidden single-key call of the batch function's cache, which a function naming it
    /// as its `batch_loader` makes: every argument as the function takes them, the batch
    /// argument holding one key, and the window in which loads are made together.
    pub(super) fn one_operation(&self, companion: &Holder) -> TokenStream {
        let vis = &self.function.vis;
        let attrs = self.item_attrs();
        let generics = &self.function.sig.generics;
        let where_clause = &generics.where_clause;
        let one = companion.hidden("one");
        let this = self.function.receiver.map(|_| quote!(&self,));
        let inputs = self.one_args();
        let inputs = inputs.iter().map(|arg| {
            let (ident, ty) = (&arg.ident, &arg.ty);
            quote!(#ident: #ty)
        });
        let output = self.one_output();
        let witness = self.batch_witness();
        let (method, rules) = match self.shape().error {
            None => (quote!(value_one), quote!(())),
            Some(_) => (quote!(result_one), self.rules()),
        };
        let recipe = self.recipe(rules);
        let key = self.element_key();
        let prepare = self.prepare_with(self.batch_load());
        let window = Ident::new("__stampede_window", Span::mixed_site());
        quote! {
            #[doc(hidden)]
            #[allow(dead_code)]
            #attrs
            #vis async fn #one #generics (#this #(#inputs,)* #window: ::core::option::Option<::core::time::Duration>) -> #output #where_clause {
                #witness.#method(#recipe, #key, #prepare, #window).await
            }
        }
    }

    /// What a batch function's `prime` stores for a key given its value.
    pub(super) fn primed(&self) -> TokenStream {
        quote!(::core::option::Option::Some(value))
    }

    /// What a batch function's `peek` returns: `Some(None)` for a key cached as absent.
    pub(super) fn peeked(&self) -> TokenStream {
        let value = &self.shape().value;
        quote!(::core::option::Option<::core::option::Option<#value>>)
    }
}

/// A single-key function that names its batch loader (`batch_loader = products`): a call of the
/// batch function's hidden single-key call, with the window in which loads are made together.
pub(crate) fn loader_call(
    loader: &syn::Path,
    receiver: bool,
    args: &[Ident],
    window: Option<OrPath<std::time::Duration>>,
    krate: &syn::Path,
    function: &Ident,
) -> TokenStream {
    let span = last_span(loader);
    let mut segments: Vec<&Ident> = loader.segments.iter().map(|s| &s.ident).collect();
    let name = segments.pop();
    let path = match (segments.as_slice(), name) {
        ([this], Some(method)) if *this == "Self" => {
            let hidden = Ident::new(&format!("__{method}_one"), span);
            quote_spanned!(span=> Self::#hidden)
        }
        (_, Some(function)) => {
            let leading = loader.leading_colon;
            let hidden = Ident::new("__one", span);
            quote_spanned!(span=> #leading #(#segments::)* #function::#hidden)
        }
        (_, None) => quote!(),
    };
    let window = match window {
        Some(OrPath::Literal(window)) => {
            let nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
            quote!(::core::option::Option::Some(::core::time::Duration::from_nanos(#nanos)))
        }
        Some(OrPath::Path(window)) => {
            let private = quote!(#krate::__private);
            let ty = quote!(::core::time::Duration);
            let (read, cell) = (read_path(&window, &private), once_cell(&ty));
            let function = function_path(function);
            quote!(#private::batch_window(#cell, #function, || #read))
        }
        None => quote!(::core::option::Option::None),
    };
    let this = receiver.then(|| quote!(self,));
    quote!(#path(#this #(#args,)* #window).await)
}
