//! Reads the function under the attribute into a [`Function`]: its receiver, its arguments, the
//! type it returns and the statements of its body, refusing the shapes a cache cannot serve.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{
    Attribute, Block, Expr, FnArg, GenericArgument, GenericParam, Ident, ItemFn, LitStr, Pat,
    PathArguments, ReceiverKind, ReturnType, Safety, Signature, Stmt, Token, Type, TypeParamBound,
    Visibility,
};

use crate::diag::{Errors, error, error_at};

/// The function as the expansion needs it.
pub(crate) struct Function {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    /// The signature to emit: the user's, with `mut` moved off the arguments into the load.
    pub(crate) sig: Signature,
    pub(crate) shape: Shape,
    /// The span of `self` in `&self`, for a method.
    pub(crate) receiver: Option<Span>,
    pub(crate) args: Vec<Arg>,
    /// What a call produces: the declared return type, or a boxed future's `Output`.
    pub(crate) output: Type,
    /// How the cache treats `output`.
    pub(crate) returns: Returns,
    /// The statements that compute the value.
    pub(crate) body: Vec<Stmt>,
}

/// What a cached function returns, as the cache treats it. The types are the user's tokens:
/// errors about their bounds point at them.
pub(crate) enum Returns {
    /// A plain `T` (`Option<T>` among them): every value is cached.
    Value(Type),
    /// `Result<T, E>`: only `Ok` is cached, and `E` carries the cache's own errors.
    Result {
        /// `T`; the whole return type when an alias such as `type R = Result<T, E>` hides it.
        ok: Type,
        /// `E` when written; an alias such as `io::Result<T>` leaves it out, and the runtime's
        /// bounds check it at the span of the whole return type.
        err: Option<Box<Type>>,
    },
}

impl Returns {
    /// Reads `Result<T, E>` by its last path segment, which also covers aliases such as
    /// `anyhow::Result<T>`; the runtime's bounds reject a type that only shares the name.
    fn of(output: &Type) -> Returns {
        let Type::Path(path) = output else {
            return Returns::Value(output.clone());
        };
        let Some(last) = path.path.segments.last().filter(|s| s.ident == "Result") else {
            return Returns::Value(output.clone());
        };
        let mut types = match &last.arguments {
            PathArguments::AngleBracketed(args) => args
                .args
                .iter()
                .filter_map(|arg| match arg {
                    GenericArgument::Type(ty) => Some(ty.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
        .into_iter();
        Returns::Result {
            ok: types.next().unwrap_or_else(|| output.clone()),
            err: types.next().map(Box::new),
        }
    }
}

/// How the function was written.
pub(crate) enum Shape {
    /// `async fn`.
    Async,
    /// What `#[async_trait]` makes of an `async fn` before this attribute runs:
    /// `fn .. -> Pin<Box<dyn Future<Output = T> + Send + 'async_trait>>` with a body of
    /// `Box::pin(async move { .. })`.
    AsyncTrait,
}

/// What the attribute was put on.
pub(crate) enum Item {
    /// A function, read.
    Fn(Box<ItemFn>),
    /// A function syn cannot read, such as one whose body has a syntax error. It is emitted
    /// unchanged, so that rustc reports the syntax error at its token rather than this
    /// attribute reporting that it expected a function (tracing-attributes' `MaybeItemFn` keeps
    /// such a body as tokens for the same reason).
    Unreadable,
}

impl Item {
    /// Reads the item under the attribute; anything but a function is an error.
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Item> {
        let not_a_function = match syn::parse2::<ItemFn>(tokens.clone()) {
            Ok(function) => return Ok(Item::Fn(Box::new(function))),
            Err(e) => e,
        };
        if starts_like_fn.parse2(tokens).unwrap_or(false) {
            Ok(Item::Unreadable)
        } else {
            Err(error(
                not_a_function.span(),
                "`#[cached]` goes on an `async fn`",
                "put it on the async function or method whose result should be cached",
            ))
        }
    }
}

/// Whether the tokens start as a function does: attributes, visibility, qualifiers
/// (`const`, `async`, `unsafe`, `extern "abi"`), then `fn`.
fn starts_like_fn(input: ParseStream) -> syn::Result<bool> {
    input.call(Attribute::parse_outer)?;
    input.parse::<Visibility>()?;
    while input.peek(Token![const])
        || input.peek(Token![async])
        || input.peek(Token![unsafe])
        || input.peek(Token![extern])
        || input.peek(LitStr)
    {
        input.parse::<TokenTree>()?;
    }
    let is_fn = input.peek(Token![fn]);
    input.parse::<TokenStream>()?;
    Ok(is_fn)
}

/// One argument, bound to a plain name.
#[derive(Clone)]
pub(crate) struct Arg {
    pub(crate) ident: Ident,
    pub(crate) mutability: Option<Token![mut]>,
    /// For `&T`, the `T`: the key and the load hold an owned `T::Owned` and lend it back.
    pub(crate) borrowed: Option<Type>,
    /// The declared type: errors about the argument's bounds point at it.
    pub(crate) ty: Type,
}

impl Function {
    /// Reads `item`, reporting every shape it cannot serve. The result leaves out the
    /// arguments that were refused, so that the options can still be checked against the rest.
    pub(crate) fn analyze(item: ItemFn, errors: &mut Errors) -> Function {
        let ItemFn {
            attrs,
            vis,
            sig,
            block,
            ..
        } = item;
        check_qualifiers(&sig, errors);
        check_generics(&sig, errors);
        let (shape, output, body) = shape_of(&sig, block, errors);
        check_output(&output, errors);
        if matches!(shape, Shape::Async) {
            check_lifetimes(&sig, errors);
        }
        if let Some(span) = find_self_call(&sig, &body) {
            errors.push(error(
                span,
                format!("a cached function cannot call itself: `{}` is recursive", sig.ident),
                "the future of a recursive `async fn` would contain itself: move the body into a plain `async fn` that recurses through `Box::pin(..)`, and cache a function that calls it",
            ));
        }
        let (receiver, args) = inputs(&sig, &shape, errors);

        let returns = Returns::of(&output);
        check_boxed_error(&returns, errors);
        let sig = match shape {
            Shape::Async => without_arg_mutability(sig),
            Shape::AsyncTrait => sig,
        };
        Function {
            attrs,
            vis,
            sig,
            shape,
            receiver,
            args,
            output,
            returns,
            body,
        }
    }
}

/// How the function was written, what a call of it produces and the statements that compute
/// it: an `async fn` as written, or the future `#[async_trait]` boxed. A function that is
/// neither is reported and read as an `async fn`, so that the rest can still be checked.
fn shape_of(sig: &Signature, block: Box<Block>, errors: &mut Errors) -> (Shape, Type, Vec<Stmt>) {
    match (&sig.asyncness, async_trait_parts(sig, &block)) {
        (Some(_), _) => (Shape::Async, declared_output(sig), block.stmts),
        (None, Some((output, body))) => (Shape::AsyncTrait, output, body),
        (None, None) => {
            errors.push(error(
                sig.fn_token.span,
                format!("`#[cached]` goes on an `async fn`, and `{}` is not async", sig.ident),
                "make it `async fn`: the cache runs its load on the tokio runtime and callers await it",
            ));
            (Shape::Async, declared_output(sig), block.stmts)
        }
    }
}

/// Refuses what a call produces when the cache cannot keep it and hand out clones of it: an
/// `impl Trait` or a reference.
fn check_output(output: &Type, errors: &mut Errors) {
    if let Some(span) = find_impl_trait(output) {
        errors.push(error(
            span,
            "a cached function cannot return `impl Trait`",
            "name the returned type: the cache stores values of it and clones them for each caller",
        ));
    }
    if let Some(span) = find_borrowed(output) {
        errors.push(error(
            span,
            "a cached function cannot return a reference",
            "return an owned value (`String` for `&str`, `T` or `Arc<T>` for `&T`): the cache keeps the value after the call and hands each caller a clone of it; a `&'static T` is fine",
        ));
    }
}

/// The span of `self` in `&self`, for a method, and the arguments bound to plain names; every
/// other receiver and every pattern argument is reported and left out.
fn inputs(sig: &Signature, shape: &Shape, errors: &mut Errors) -> (Option<Span>, Vec<Arg>) {
    let mut receiver = None;
    let mut args = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(r) => match &r.kind {
                ReceiverKind::Reference(_, _, None) => receiver = Some(r.self_token.span),
                ReceiverKind::Reference(_, _, Some(_)) => errors.push(error_at(
                    r,
                    "a cached method cannot take `&mut self`",
                    "take `&self`: the load runs detached and serves every caller of the key, so it cannot hold a unique borrow; keep what must change behind a lock",
                )),
                _ => errors.push(error_at(
                    r,
                    "a cached method cannot take `self` by value",
                    "take `&self`: a cached call may not run the body at all, and the load that does runs detached on a clone of the receiver (which must be `Clone + Send + Sync + 'static`)",
                )),
            },
            // `#[async_trait]` has already bound a pattern argument to `__argN`.
            FnArg::Typed(typed) if matches!(shape, Shape::AsyncTrait) && is_positional(&typed.pat) => {
                errors.push(pattern_error(&typed.pat));
            }
            FnArg::Typed(typed) => match argument(&typed.pat, &typed.ty) {
                Ok(arg) => args.push(arg),
                Err(e) => errors.push(e),
            },
        }
    }
    (receiver, args)
}

fn check_qualifiers(sig: &Signature, errors: &mut Errors) {
    if let Some(constness) = &sig.constness {
        errors.push(error(
            constness.span,
            "a cached function cannot be `const`",
            "remove `const`: a cache lives at run time",
        ));
    }
    if let Safety::Unsafe(unsafety) = &sig.safety {
        errors.push(error(
            unsafety.span,
            "a cached function cannot be `unsafe`",
            "cache a safe wrapper that states why its call of the unsafe function is sound",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(error_at(
            abi,
            "a cached function cannot be `extern`",
            "cache a Rust-ABI wrapper around it",
        ));
    }
}

/// `Box<dyn std::error::Error>` without `+ Send + Sync`, as many examples write it, cannot
/// carry a failed load to the callers on other tasks. The runtime's check of the error type
/// reports a named type in the cache's words, but rustc drops those words for a type with a
/// lifetime in it, as a trait object has: so the attribute reports this common case itself, in
/// the same words. Only the standard `Error` trait is recognised (`Error`, `std::error::Error`,
/// `core::error::Error`): another trait may have `Send + Sync` among its supertraits.
fn check_boxed_error(returns: &Returns, errors: &mut Errors) {
    let Returns::Result { err: Some(err), .. } = returns else {
        return;
    };
    let Some(object) = last_segment(err, "Box")
        .and_then(single_type_arg)
        .and_then(|ty| match ty {
            Type::TraitObject(object) => Some(object),
            _ => None,
        })
    else {
        return;
    };
    let traits: Vec<&syn::Path> = object
        .bounds
        .iter()
        .filter_map(|bound| match bound {
            TypeParamBound::Trait(t) => Some(&t.path),
            _ => None,
        })
        .collect();
    let names = |path: &syn::Path| -> Vec<String> {
        path.segments.iter().map(|s| s.ident.to_string()).collect()
    };
    let Some(error_trait) = traits.iter().find(|path| {
        matches!(
            names(path)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice(),
            ["Error"] | ["std" | "core", "error", "Error"]
        )
    }) else {
        return;
    };
    let has = |marker: &str| {
        traits
            .iter()
            .any(|path| path.segments.last().is_some_and(|s| s.ident == marker))
    };
    let missing = match (has("Send"), has("Sync")) {
        (true, true) => return,
        (false, _) => "Send",
        (true, false) => "Sync",
    };
    let error_trait = written(error_trait);
    errors.push(error_at(
        err,
        format!(
            "`{}` cannot be the error type of a cached function: it is not `{missing}`",
            written(err)
        ),
        format!(
            "write `Box<dyn {error_trait} + Send + Sync>`: a failed load's error is shared by every caller waiting on it, so it must be `Display + Debug + Send + Sync + 'static`"
        ),
    ));
}

/// A type or path as the user wrote it, for a message: its tokens without the spaces `quote`
/// puts around punctuation.
pub(crate) fn written(tokens: impl quote::ToTokens) -> String {
    tokens
        .to_token_stream()
        .to_string()
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" <", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
}

/// A lifetime parameter of an `async fn` as the user wrote it (`#[async_trait]`'s own are added to
/// the shape it gives, which is not checked here).
fn check_lifetimes(sig: &Signature, errors: &mut Errors) {
    for param in &sig.generics.params {
        if let GenericParam::Lifetime(lifetime) = param {
            errors.push(error_at(
                lifetime,
                "a cached function cannot have a lifetime parameter",
                "take the arguments by value, or by `&` with the lifetime elided (`name: &str`): the key is an owned copy of them, and the load runs detached, after the call may have returned",
            ));
        }
    }
}

/// The span of a reference in the returned type, but `&'static T`.
fn find_borrowed(ty: &Type) -> Option<Span> {
    struct Find(Option<Span>);
    impl<'ast> Visit<'ast> for Find {
        fn visit_type_reference(&mut self, node: &'ast syn::TypeReference) {
            let is_static = node
                .lifetime
                .as_ref()
                .is_some_and(|lifetime| lifetime.ident == "static");
            if !is_static && self.0.is_none() {
                self.0 = Some(node.and_token.span);
            }
            syn::visit::visit_type_reference(self, node);
        }
    }
    let mut find = Find(None);
    find.visit_type(ty);
    find.0
}

/// The span of a call of the function in its own body: `name(..)`, `Self::name(..)` or
/// `self.name(..)` (not inside a nested item, which is another function).
fn find_self_call(sig: &Signature, body: &[Stmt]) -> Option<Span> {
    struct Find<'a> {
        name: &'a Ident,
        method: bool,
        found: Option<Span>,
    }
    impl<'ast> Visit<'ast> for Find<'_> {
        fn visit_item(&mut self, _: &'ast syn::Item) {}
        fn visit_expr_call(&mut self, node: &'ast syn::ExprCall) {
            if let Expr::Path(path) = &*node.func
                && path.qself.is_none()
                && let Some(last) = path.path.segments.last()
                && last.ident == *self.name
            {
                let segments: Vec<&syn::PathSegment> = path.path.segments.iter().collect();
                let own = match segments.as_slice() {
                    [_] => !self.method,
                    [first, _] => self.method && first.ident == "Self",
                    _ => false,
                };
                if own && self.found.is_none() {
                    self.found = Some(last.ident.span());
                }
            }
            syn::visit::visit_expr_call(self, node);
        }
        fn visit_expr_method_call(&mut self, node: &'ast syn::ExprMethodCall) {
            if self.method
                && node.method == *self.name
                && let Expr::Path(path) = &*node.receiver
                && path.path.is_ident("self")
                && self.found.is_none()
            {
                self.found = Some(node.method.span());
            }
            syn::visit::visit_expr_method_call(self, node);
        }
    }
    let method = sig
        .inputs
        .iter()
        .any(|input| matches!(input, FnArg::Receiver(_)));
    let mut find = Find {
        name: &sig.ident,
        method,
        found: None,
    };
    for stmt in body {
        find.visit_stmt(stmt);
    }
    find.found
}

fn check_generics(sig: &Signature, errors: &mut Errors) {
    for param in &sig.generics.params {
        if !matches!(param, GenericParam::Lifetime(_)) {
            errors.push(error_at(
                param,
                "a generic function cannot be cached",
                "each `#[cached]` function has one cache; cache a non-generic function that calls this one with concrete types",
            ));
        }
    }
}

fn pattern_error(pat: &Pat) -> syn::Error {
    error_at(
        pat,
        "a cached function's arguments must be plain names",
        "bind the argument to a name, e.g. `pair: (u32, u32)`, and destructure it in the body; the name is what a `key` template refers to",
    )
}

/// The name `#[async_trait]` gives an argument written as a pattern.
fn is_positional(pat: &Pat) -> bool {
    matches!(pat, Pat::Ident(p) if p.ident.to_string().strip_prefix("__arg").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())))
}

fn argument(pat: &Pat, ty: &Type) -> syn::Result<Arg> {
    let ident = match pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p,
        _ => return Err(pattern_error(pat)),
    };
    if let Some(span) = find_impl_trait(ty) {
        return Err(error(
            span,
            "a cached function cannot take `impl Trait` arguments",
            "name a concrete type: arguments form the cache key, whose type must be known",
        ));
    }
    let borrowed = match ty {
        Type::Reference(r) if r.mutability.is_some() => {
            return Err(error_at(
                ty,
                "a cached function cannot take `&mut` arguments",
                "take the argument by value or by `&`: the load may run for another caller, after this call has returned",
            ));
        }
        // A `&'static T` is itself a fine owned key part: keep it as it is.
        Type::Reference(r) if r.lifetime.as_ref().is_some_and(|l| l.ident == "static") => None,
        Type::Reference(r) => Some((*r.elem).clone()),
        _ => None,
    };
    Ok(Arg {
        ident: ident.ident.clone(),
        mutability: ident.mutability,
        borrowed,
        ty: ty.clone(),
    })
}

fn declared_output(sig: &Signature) -> Type {
    match &sig.output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) => (**ty).clone(),
    }
}

/// Recognises the shape `#[async_trait]` gives an `async fn`: the future's `Output` and the
/// statements inside `Box::pin(async move { .. })`.
fn async_trait_parts(sig: &Signature, block: &Block) -> Option<(Type, Vec<Stmt>)> {
    let ReturnType::Type(_, ty) = &sig.output else {
        return None;
    };
    let boxed = single_type_arg(last_segment(ty, "Pin")?)?;
    let Type::TraitObject(object) = single_type_arg(last_segment(boxed, "Box")?)? else {
        return None;
    };
    let output = object.bounds.iter().find_map(|bound| match bound {
        TypeParamBound::Trait(t) => {
            let future = t.path.segments.last().filter(|s| s.ident == "Future")?;
            let PathArguments::AngleBracketed(args) = &future.arguments else {
                return None;
            };
            args.args.iter().find_map(|arg| match arg {
                GenericArgument::AssocType(a) if a.ident == "Output" => Some(a.ty.clone()),
                _ => None,
            })
        }
        _ => None,
    })?;
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    if func.path.segments.last().is_none_or(|s| s.ident != "pin") || call.args.len() != 1 {
        return None;
    }
    match call.args.first() {
        Some(Expr::Async(body)) if body.capture.is_some() => {
            Some((output, body.block.stmts.clone()))
        }
        _ => None,
    }
}

fn last_segment<'a>(ty: &'a Type, name: &str) -> Option<&'a PathArguments> {
    let Type::Path(p) = ty else { return None };
    let segment = p.path.segments.last()?;
    (segment.ident == name).then_some(&segment.arguments)
}

fn single_type_arg(arguments: &PathArguments) -> Option<&Type> {
    let PathArguments::AngleBracketed(args) = arguments else {
        return None;
    };
    match args.args.first() {
        Some(GenericArgument::Type(ty)) if args.args.len() == 1 => Some(ty),
        _ => None,
    }
}

fn find_impl_trait(ty: &Type) -> Option<Span> {
    struct Find(Option<Span>);
    impl Visit<'_> for Find {
        fn visit_type_impl_trait(&mut self, node: &syn::TypeImplTrait) {
            self.0.get_or_insert(node.span());
        }
    }
    let mut find = Find(None);
    find.visit_type(ty);
    find.0
}

/// `mut` on an argument is a property of the binding in the body, which now lives in the load.
fn without_arg_mutability(mut sig: Signature) -> Signature {
    for input in &mut sig.inputs {
        if let FnArg::Typed(typed) = input
            && let Pat::Ident(p) = &mut *typed.pat
        {
            p.mutability = None;
        }
    }
    sig
}
