//! A single-key function that names its batch loader (`#[cached(batch_loader = products)]`):
//! its calls are single-key calls of the batch function's cache, which it shares with the batch
//! function (its options, its values, its flights, its loads). Its arguments are the batch
//! function's, with one key in place of the keys; it returns `Option<V>` (`Result<Option<V>, E>`
//! for a batch function returning a `Result`), `None` for a key the batch function leaves out.
//! With `batch_window`, calls that must load within the window of each other are loaded by one
//! call of the batch function.
//!
//! Its body is never run: write it as a declaration, `async fn product(id: u64) ->
//! Option<Product>;`, or with an empty body (`{}`, the form `#[async_trait]` needs), or a body
//! of `unreachable!()`. Any other body is refused, as its code would be silently skipped.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Block, Expr, ItemFn, Pat, Signature, Stmt, Token, Visibility};

use crate::attr::{Options, Spanned};
use crate::diag::{Errors, error, error_at};
use crate::func::{Function, Shape};

/// The options a function with `batch_loader` takes; the others are the batch function's.
const ITS_OWN: &[&str] = &["batch_loader", "batch_window", "crate"];

/// A function, or a function's declaration without a body.
struct Declared(ItemFn);

impl Parse for Declared {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        let block: Block = match input.peek(Token![;]) {
            true => {
                input.parse::<Token![;]>()?;
                syn::parse_quote!({})
            }
            false => input.parse()?,
        };
        Ok(Declared(ItemFn {
            attrs,
            vis,
            modifiers: Default::default(),
            sig,
            block: Box::new(block),
        }))
    }
}

/// The function, whose calls go to its batch loader's hidden single-key call.
pub(crate) fn expand(options: Options, item: TokenStream) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let loader = options
        .batch_loader
        .as_ref()
        .expect("called for a function with `batch_loader`");
    let shown = crate::func::written(&loader.value);
    for (name, span) in &options.given {
        if !ITS_OWN.contains(name) {
            errors.push(error(
                *span,
                format!("`{name}` is an option of the batch function's cache, which this function shares with `{shown}`"),
                format!("give it on `{shown}`, or remove it here: a function with `batch_loader` takes `batch_window` only"),
            ));
        }
    }
    if let Some(window) = options.batch_window.as_ref().and_then(Spanned::literal)
        && window.value.is_zero()
    {
        errors.push(error(
            window.span,
            "`batch_window` cannot be zero",
            "give the window in which single-key calls are loaded together, e.g. \"2ms\", or remove it",
        ));
    }
    let Declared(item) = match syn::parse2::<Declared>(item) {
        Ok(declared) => declared,
        Err(not_a_function) => {
            errors.push(error(
                not_a_function.span(),
                "`#[cached(batch_loader = ..)]` goes on an `async fn`",
                "declare the single-key function, e.g. `async fn product(id: u64) -> Option<Product>;`",
            ));
            return errors.finish(TokenStream::new());
        }
    };
    let function = Function::analyze(item, &mut errors);
    let name = &function.sig.ident;
    if let Some(body) = written_body(&function.shape, &function.body)
        && !never_run(body)
    {
        errors.push(error_at(
            quote!(#(#body)*),
            format!("the body of `{name}` is never run: with `batch_loader`, its calls are served by the cache of `{shown}`, which loads their keys"),
            format!("end the declaration with `;` after the return type, or leave the body empty (`{{}}`, which `#[async_trait]` needs) or `unreachable!()`; what loads the keys goes in `{shown}`"),
        ));
    }
    errors.finish(())?;
    let Function {
        attrs,
        vis,
        sig,
        shape,
        receiver,
        args,
        ..
    } = function;
    let args: Vec<_> = args.into_iter().map(|arg| arg.ident).collect();
    let call = crate::expand::loader_call(
        &loader.value,
        receiver.is_some(),
        &args,
        options.batch_window.map(|window| window.value),
        &options
            .krate
            .map_or_else(|| syn::parse_quote!(::stampede), |krate| krate.value),
        &sig.ident,
    );
    let block = match shape {
        Shape::Async => call,
        Shape::AsyncTrait => quote!(::std::boxed::Box::pin(async move { #call })),
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #block
        }
    })
}

/// The statements the user wrote in the body: all of it for an `async fn`; for what
/// `#[async_trait]` made of one, the block it binds to `__ret`, if it did (`None`: unknown).
fn written_body<'a>(shape: &Shape, body: &'a [Stmt]) -> Option<&'a [Stmt]> {
    match shape {
        Shape::Async => Some(body),
        Shape::AsyncTrait => body.iter().find_map(|stmt| {
            let Stmt::Local(local) = stmt else {
                return None;
            };
            let Pat::Type(typed) = &local.pat else {
                return None;
            };
            let Pat::Ident(binding) = &*typed.pat else {
                return None;
            };
            match &local.init {
                Some(init) if binding.ident == "__ret" => match &*init.expr {
                    Expr::Block(block) => Some(block.block.stmts.as_slice()),
                    _ => None,
                },
                _ => None,
            }
        }),
    }
}

/// Whether a body says it is not run: empty, or only `unreachable!(..)`.
fn never_run(body: &[Stmt]) -> bool {
    let unreachable = |mac: &syn::Macro| {
        mac.path
            .segments
            .last()
            .is_some_and(|s| s.ident == "unreachable")
    };
    match body {
        [] => true,
        [Stmt::Macro(stmt)] => unreachable(&stmt.mac),
        [Stmt::Expr(Expr::Macro(expr), _)] => unreachable(&expr.mac),
        _ => false,
    }
}
