//! The shape of a batch function (`batch = ids`): the argument that holds its keys, the type of
//! one key, and the map it returns, read from the signature as written.
//!
//! ```text
//! async fn products(ids: Vec<u64>) -> Result<HashMap<u64, Product>, AppError>
//!                   ^^^ the keys: Vec<K>, &[K], HashSet<K>, BTreeSet<K>, or any C<K> (or &C<K>)
//!                                                  that is `IntoIterator` and `FromIterator`
//!                       the map: HashMap<K, V>, BTreeMap<K, V>, or any M<K, V, ..> that is
//!                       `IntoIterator<Item = (K, V)>` and `FromIterator<(K, V)>`, or a `Result`
//!                       of one with its error type written out
//! ```

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{GenericArgument, Ident, PathArguments, Type};

use crate::diag::{Errors, error, error_at};
use crate::func::{Function, Returns};

/// What a batch function is made of.
pub(crate) struct BatchShape {
    /// The argument that holds the keys.
    pub(crate) arg: Ident,
    /// The type of one key in it.
    pub(crate) element: Type,
    /// The type of the values of the returned map.
    pub(crate) value: Type,
    /// The error type of a `Result` of the map.
    pub(crate) error: Option<Type>,
}

impl BatchShape {
    /// Reads the batch function's shape, reporting what does not fit: `batch` must name an
    /// argument that holds a collection of keys, and the function must return a map.
    pub(crate) fn read(function: &Function, arg: &Ident, errors: &mut Errors) -> Option<Self> {
        let Some(keys) = function
            .args
            .iter()
            .find(|candidate| candidate.ident == *arg)
        else {
            let names: Vec<String> = function
                .args
                .iter()
                .map(|arg| format!("`{}`", arg.ident))
                .collect();
            errors.push(error(
                arg.span(),
                format!(
                    "`batch` names `{arg}`, which is not an argument of `{}`",
                    function.sig.ident
                ),
                match names.is_empty() {
                    true => "a batch function takes its keys as an argument, e.g. `ids: Vec<u64>`"
                        .to_owned(),
                    false => format!(
                        "name the argument that holds the keys: {}",
                        names.join(", ")
                    ),
                },
            ));
            return None;
        };
        let element = match element_of(keys.borrowed.as_ref().unwrap_or(&keys.ty)) {
            Some(element) => element,
            None => {
                errors.push(error_at(
                    &keys.ty,
                    format!(
                        "`{}: {}` is not a collection of keys",
                        keys.ident,
                        crate::func::written(&keys.ty)
                    ),
                    "a batch function takes its keys as `Vec<K>`, `&[K]`, `HashSet<K>` or `BTreeSet<K>` (or another collection of one type, by value or by reference); it is called with the keys it must load",
                ));
                return None;
            }
        };
        let (map, error_type) = match &function.returns {
            Returns::Value(map) => (map, None),
            Returns::Result { ok, err: Some(err) } => (ok, Some((**err).clone())),
            Returns::Result { err: None, .. } => {
                errors.push(error_at(
                    &function.output,
                    "a batch function's `Result` must be written out",
                    "write the return type as `Result<HashMap<K, V>, E>`: its single-key calls return `Result<Option<V>, E>`, which needs the `E`",
                ));
                return None;
            }
        };
        let Some(value) = map_value(map) else {
            errors.push(error_at(
                map,
                format!(
                    "a batch function returns a map of its keys to their values, and `{}` is not one",
                    crate::func::written(map)
                ),
                format!(
                    "return the values found, e.g. `HashMap<{}, V>` or `BTreeMap<{0}, V>` (or a `Result` of one); a key left out is answered as absent",
                    crate::func::written(&element)
                ),
            ));
            return None;
        };
        Some(BatchShape {
            arg: keys.ident.clone(),
            element,
            value,
            error: error_type,
        })
    }

    /// The span errors about one key point at: the key type as written.
    pub(crate) fn element_span(&self) -> Span {
        self.element.span()
    }
}

/// The type of one key in a collection type: `[K]`, or a path whose last segment takes one
/// type argument (`Vec<K>`, `HashSet<K>`, `BTreeSet<K>`, `VecDeque<K>`, ..).
fn element_of(collection: &Type) -> Option<Type> {
    match collection {
        Type::Slice(slice) => Some((*slice.elem).clone()),
        Type::Path(path) if path.qself.is_none() => {
            let types = type_args(&path.path.segments.last()?.arguments);
            match types.as_slice() {
                [element] => Some((*element).clone()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The value type of a map type: a path whose last segment takes at least two type arguments,
/// the key's and the value's (`HashMap<K, V>`, `HashMap<K, V, S>`, `BTreeMap<K, V>`, ..).
fn map_value(map: &Type) -> Option<Type> {
    let Type::Path(path) = map else {
        return None;
    };
    let types = type_args(&path.path.segments.last()?.arguments);
    match types.as_slice() {
        [_, value, ..] => Some((*value).clone()),
        _ => None,
    }
}

fn type_args(arguments: &PathArguments) -> Vec<&Type> {
    match arguments {
        PathArguments::AngleBracketed(args) => args
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}
