//! Compile errors in the form every diagnostic of this crate takes: what is wrong, at the
//! offending token, then a `help:` line with the fix.

use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;

/// An error at `span` whose message ends in a `help:` line.
pub(crate) fn error(span: Span, message: impl Display, help: impl Display) -> syn::Error {
    syn::Error::new(span, text(message, help))
}

/// An error spanning all of `tokens`, whose message ends in a `help:` line.
pub(crate) fn error_at(
    tokens: impl ToTokens,
    message: impl Display,
    help: impl Display,
) -> syn::Error {
    syn::Error::new_spanned(tokens, text(message, help))
}

fn text(message: impl Display, help: impl Display) -> String {
    format!("{message}\n= help: {help}")
}

/// Gathers errors so that one expansion reports all of them at once.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// `value` if nothing went wrong, else every error gathered.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        self.0.map_or(Ok(value), Err)
    }
}
