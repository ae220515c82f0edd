//! Moves a method's body off `self`: the load runs detached on a clone of the receiver, so the
//! body's `self` is renamed to a binding that borrows that clone.

use proc_macro2::{Group, Ident, TokenStream, TokenTree};
use syn::visit_mut::{self, VisitMut};
use syn::{ExprPath, Item, Macro, Stmt};

/// The name `self` takes inside the load.
pub(crate) const SELF: &str = "__stampede_self";

pub(crate) fn rename_self(body: &mut [Stmt]) {
    for stmt in body {
        RenameSelf.visit_stmt_mut(stmt);
    }
}

struct RenameSelf;

impl VisitMut for RenameSelf {
    fn visit_expr_path_mut(&mut self, node: &mut ExprPath) {
        if node.qself.is_none() && node.path.is_ident("self") {
            let span = node.path.segments[0].ident.span();
            node.path = Ident::new(SELF, span).into();
        }
        visit_mut::visit_expr_path_mut(self, node);
    }

    // A nested item has its own `self`, if any.
    fn visit_item_mut(&mut self, _item: &mut Item) {}

    // Macro arguments are tokens, not expressions: rename `self` where it is not the start of a
    // module path (`self::x`).
    fn visit_macro_mut(&mut self, node: &mut Macro) {
        node.tokens = rename_in_tokens(std::mem::take(&mut node.tokens));
    }
}

fn rename_in_tokens(tokens: TokenStream) -> TokenStream {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut out = Vec::with_capacity(tokens.len());
    for (i, token) in tokens.iter().enumerate() {
        out.push(match token {
            TokenTree::Ident(ident) if ident == "self" && !starts_path(&tokens[i + 1..]) => {
                TokenTree::Ident(Ident::new(SELF, ident.span()))
            }
            TokenTree::Group(group) => {
                let mut renamed = Group::new(group.delimiter(), rename_in_tokens(group.stream()));
                renamed.set_span(group.span());
                TokenTree::Group(renamed)
            }
            other => other.clone(),
        });
    }
    out.into_iter().collect()
}

fn starts_path(rest: &[TokenTree]) -> bool {
    matches!(rest, [TokenTree::Punct(a), TokenTree::Punct(b), ..] if a.as_char() == ':' && b.as_char() == ':')
}
