//! `#[stampede::companions]` on a trait impl: the companions of its `#[cached(companion = true)]`
//! methods, which the trait impl cannot hold (it takes no items but the trait's), emitted in an
//! inherent impl of the type next to it.
//!
//! ```text
//! #[stampede::companions]              impl Catalog for Repo {
//! impl Catalog for Repo {                  #[cached(__stampede_companions = true, ttl = "60s", companion = true)]
//!     #[cached(ttl = "60s",       ==>      async fn count(&self, shop: u64) -> u64 { .. } // calls Self::__count_*
//!              companion = true)]      }
//!     async fn count(&self, shop: u64)  impl Repo {
//!         -> u64 { .. }                    fn __count_slot() .. fn __count_config() .. async fn __count_body(..) ..
//! }                                        async fn count_invalidate(shop: u64) .. fn count_peek(shop: u64) ..
//!                                      }
//! ```
//!
//! Read in the crate's three steps: [`Block::parse`] reads the impl and finds the methods that
//! ask for a companion, each method is analysed and validated as `#[cached]` does it, and
//! [`Block::expand`] emits the impl (each such method's `#[cached]` told, by a hidden option,
//! that its companion is emitted here) and the inherent impl. A method whose `#[cached]` has an
//! error gets no companion here: its own attribute reports the error.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{Attribute, ImplItem, ItemFn, ItemImpl, Meta, Path, Visibility};

use crate::attr::{IN_COMPANIONS_BLOCK, Options};
use crate::diag::{Errors, error};
use crate::expand::with_elided_lifetimes;
use crate::func::{Function, Shape};

/// The impl under the attribute, read.
struct Block {
    /// The visibility of the companions: the attribute's argument (`#[stampede::companions(pub)]`),
    /// else private to the module, as an item without one is.
    vis: Visibility,
    item: ItemImpl,
    /// The trait the impl implements, as written.
    trait_path: Path,
    /// The indices in `item.items` of the methods whose `#[cached]` says `companion = true`,
    /// each with the index of that attribute among the method's attributes.
    methods: Vec<(usize, usize)>,
}

/// The expansion of `#[stampede::companions(args)]` on `item`, or the error that it cannot go
/// there.
pub(crate) fn companions(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    // A wrong argument is reported next to the expansion, with private companions: the methods
    // then meet no error of their own.
    let (vis, wrong_args) = match syn::parse2::<Visibility>(args) {
        Ok(vis) => (vis, None),
        Err(e) => (Visibility::Inherited, Some(e)),
    };
    let block = Block::parse(vis, item)?;
    let mut expanded = block.expand();
    if let Some(e) = wrong_args {
        expanded.extend(
            error(
                e.span(),
                "`#[stampede::companions]` takes the companions' visibility at most",
                "write `#[stampede::companions]` for companions private to the module, or e.g. `#[stampede::companions(pub)]`, `#[stampede::companions(pub(crate))]`",
            )
            .into_compile_error(),
        );
    }
    Ok(expanded)
}

impl Block {
    fn parse(vis: Visibility, item: TokenStream) -> syn::Result<Block> {
        let item: ItemImpl = syn::parse2(item).map_err(|e| {
            error(
                e.span(),
                "`#[stampede::companions]` goes on a trait impl",
                "put it on the `impl Trait for Type` whose `#[stampede::cached(companion = true)]` methods should get their companions",
            )
        })?;
        let Some((trait_path, _)) = &item.trait_ else {
            return Err(error(
                item.impl_token.span,
                "an inherent impl needs no `#[stampede::companions]`",
                "remove it: there `companion = true` on a method's `#[stampede::cached]` emits its companion next to it (`Type::method_invalidate`, ...)",
            ));
        };
        let trait_path = trait_path.clone();
        let methods: Vec<(usize, usize)> = item
            .items
            .iter()
            .enumerate()
            .filter_map(|(at, member)| {
                let ImplItem::Fn(method) = member else {
                    return None;
                };
                let attr = method.attrs.iter().position(asks_for_a_companion)?;
                Some((at, attr))
            })
            .collect();
        if methods.is_empty() {
            return Err(error(
                trait_path.span(),
                "no method of this impl asks for a companion",
                "add `companion = true` to the `#[stampede::cached(..)]` of each method whose cache you invalidate, prime or peek, or remove `#[stampede::companions]`",
            ));
        }
        Ok(Block {
            vis,
            item,
            trait_path,
            methods,
        })
    }

    /// The impl, each companion method's `#[cached]` marked, and the inherent impl of their
    /// companions.
    fn expand(mut self) -> TokenStream {
        let mut companions = Vec::new();
        for &(at, attr) in &self.methods {
            let ImplItem::Fn(method) = &self.item.items[at] else {
                continue;
            };
            let mut attrs = method.attrs.clone();
            let cached = attrs.remove(attr);
            let args = cached_args(&cached);
            // A method whose companion is not emitted here keeps its attribute as written,
            // which reports what is wrong with it.
            let Some(companion) = self.companion(attrs, method, args.clone()) else {
                continue;
            };
            companions.push(companion);
            let ImplItem::Fn(method) = &mut self.item.items[at] else {
                continue;
            };
            let marker = syn::Ident::new(IN_COMPANIONS_BLOCK, proc_macro2::Span::call_site());
            if let Meta::List(list) = &mut method.attrs[attr].meta {
                list.tokens = quote!(#marker = true, #args);
            }
        }
        let item = &self.item;
        let (impl_generics, _, where_clause) = item.generics.split_for_impl();
        let self_ty = &item.self_ty;
        let cfgs = item.attrs.iter().filter(|attr| attr.path().is_ident("cfg"));
        quote! {
            #item

            #(#cfgs)*
            impl #impl_generics #self_ty #where_clause {
                #(#companions)*
            }
        }
    }

    /// The companion of one method, as `#[cached(args)]` reads it; `None` when the attribute
    /// finds an error in it, which it reports itself.
    fn companion(
        &self,
        attrs: Vec<Attribute>,
        method: &syn::ImplItemFn,
        args: TokenStream,
    ) -> Option<TokenStream> {
        let mut ignored = Errors::default();
        let mut options = Options::parse(args, &mut ignored);
        options.in_companions_block = true;
        let item = ItemFn {
            attrs,
            vis: self.vis.clone(),
            modifiers: method.modifiers.clone(),
            sig: method.sig.clone(),
            block: Box::new(method.block.clone()),
        };
        let mut function = Function::analyze(item, &mut ignored);
        if matches!(function.shape, Shape::AsyncTrait) {
            without_async_trait_lifetimes(&mut function);
        }
        let mut settings = crate::validate::validate(options, &function, &mut ignored);
        ignored.finish(()).ok()?;
        settings.trait_path = Some(self.trait_path.clone());
        Some(crate::expand::trait_method_companion(&function, &settings))
    }
}

/// Whether `attr` is a `#[cached(..)]` (by its last path segment: `stampede::cached`,
/// `cached`) that says `companion = true`.
fn asks_for_a_companion(attr: &Attribute) -> bool {
    if attr
        .path()
        .segments
        .last()
        .is_none_or(|s| s.ident != "cached")
    {
        return false;
    }
    let mut ignored = Errors::default();
    let options = Options::parse(cached_args(attr), &mut ignored);
    options.companion.is_some_and(|companion| companion.value)
}

/// The arguments of `#[cached(args)]`; none for a bare `#[cached]`.
fn cached_args(attr: &Attribute) -> TokenStream {
    match &attr.meta {
        Meta::List(list) => list.tokens.clone(),
        _ => TokenStream::new(),
    }
}

/// A method `#[async_trait]` rewrote before this attribute ran names the lifetimes the method
/// elided (`name: &'life1 str`, `'life0: 'async_trait`): its companion, whose signatures take
/// no future of `#[async_trait]`'s, elides them again.
fn without_async_trait_lifetimes(function: &mut Function) {
    function.sig.generics = syn::Generics::default();
    for arg in &mut function.args {
        arg.ty = with_elided_lifetimes(&arg.ty);
        arg.borrowed = arg.borrowed.as_ref().map(with_elided_lifetimes);
    }
}
