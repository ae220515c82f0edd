//! The runtime's bound checks that the expansion calls on the user's types (see
//! `stampede-runtime/src/checks.rs`), in one table.
//!
//! Each check is a trait of `__private::checks` with one method, which exists only where the
//! bound holds; its `#[diagnostic::on_unimplemented]` message speaks of the cache. The
//! generated code imports the traits a chain of checks calls by name, in a block around that
//! chain only, so the names reach neither the user's body nor its scope; a name that does not
//! match the runtime's is an unresolved import in every expansion (the `tests/ui/pass` suite).

use proc_macro2::{Ident, Span, TokenStream};
use quote::quote_spanned;

/// Declares the checks: the variant, then the runtime's trait and method.
macro_rules! checks {
    ($($(#[$doc:meta])* $check:ident => $trait:ident :: $method:ident,)*) => {
        /// One bound check of the runtime.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Check {
            $($(#[$doc])* $check,)*
        }

        impl Check {
            /// The check's trait in `__private::checks`.
            fn trait_name(self) -> &'static str {
                match self {
                    $(Check::$check => stringify!($trait),)*
                }
            }

            /// The trait's method, which exists only where the bound holds.
            fn method(self) -> &'static str {
                match self {
                    $(Check::$check => stringify!($method),)*
                }
            }
        }
    };
}

checks! {
    /// A key part is `Hash`.
    KeyHash => KeyHashCheck::__stampede_key_hash,
    /// A key part is `Eq`.
    KeyEq => KeyEqCheck::__stampede_key_eq,
    /// A key part is `Clone`.
    KeyClone => KeyCloneCheck::__stampede_key_clone,
    /// A key part is `Debug`.
    KeyDebug => KeyDebugCheck::__stampede_key_debug,
    /// A key part is `Send`.
    KeySend => KeySendCheck::__stampede_key_send,
    /// A key part is `Sync`.
    KeySync => KeySyncCheck::__stampede_key_sync,
    /// A key part of a cache backed by Redis is `serde::Serialize`.
    KeySerialize => KeySerializeCheck::__stampede_key_serialize,
    /// A key part of a cache backed by Redis is `serde::Deserialize` (its shape is traced).
    KeyDeserialize => KeyDeserializeCheck::__stampede_key_deserialize,
    /// An argument the load gets a clone of is `Clone`.
    ArgClone => ArgCloneCheck::__stampede_arg_clone,
    /// An argument the load gets a clone of is `Send`.
    ArgSend => ArgSendCheck::__stampede_arg_send,
    /// An argument the load gets a clone of is `Sync`.
    ArgSync => ArgSyncCheck::__stampede_arg_sync,
    /// The receiver is sized (in a trait's default method, `Self` may not be).
    ReceiverSized => ReceiverSizedCheck::__stampede_receiver_sized,
    /// The receiver is `Clone`.
    ReceiverClone => ReceiverCloneCheck::__stampede_receiver_clone,
    /// The receiver is `Send`.
    ReceiverSend => ReceiverSendCheck::__stampede_receiver_send,
    /// The receiver is `Sync`.
    ReceiverSync => ReceiverSyncCheck::__stampede_receiver_sync,
    /// A plain returned value is `Clone`.
    ValueClone => ValueCloneCheck::__stampede_value_clone,
    /// A plain returned value is `Send`.
    ValueSend => ValueSendCheck::__stampede_value_send,
    /// A plain returned value is `Sync`.
    ValueSync => ValueSyncCheck::__stampede_value_sync,
    /// A plain returned value of a cache backed by Redis is `serde::Serialize`.
    ValueSerialize => ValueSerializeCheck::__stampede_value_serialize,
    /// A plain returned value of a cache backed by Redis is `serde::Deserialize`.
    ValueDeserialize => ValueDeserializeCheck::__stampede_value_deserialize,
    /// The `T` of a returned `Result<T, E>` is `Clone`.
    OkClone => OkCloneCheck::__stampede_ok_clone,
    /// The `T` of a returned `Result<T, E>` is `Send`.
    OkSend => OkSendCheck::__stampede_ok_send,
    /// The `T` of a returned `Result<T, E>` is `Sync`.
    OkSync => OkSyncCheck::__stampede_ok_sync,
    /// The `T` of a `Result<T, E>` cached in Redis is `serde::Serialize`.
    OkSerialize => OkSerializeCheck::__stampede_ok_serialize,
    /// The `T` of a `Result<T, E>` cached in Redis is `serde::Deserialize`.
    OkDeserialize => OkDeserializeCheck::__stampede_ok_deserialize,
    /// The `E` of a returned `Result<T, E>` is `From<stampede::Error>`.
    ErrorFrom => ErrorFromCheck::__stampede_error_from,
    /// The `E` of a returned `Result<T, E>` is `Display`.
    ErrorDisplay => ErrorDisplayCheck::__stampede_error_display,
    /// The `E` of a returned `Result<T, E>` is `Debug`.
    ErrorDebug => ErrorDebugCheck::__stampede_error_debug,
    /// The `E` of a returned `Result<T, E>` is `Send`.
    ErrorSend => ErrorSendCheck::__stampede_error_send,
    /// The `E` of a returned `Result<T, E>` is `Sync`.
    ErrorSync => ErrorSyncCheck::__stampede_error_sync,
    /// The function named by `source_version` is a `fn(&T) -> u64` of the stored value.
    SourceVersion => SourceVersionCheck::__stampede_source_version,
}

impl Check {
    /// The checks of an argument that is part of the key.
    pub(crate) fn key(in_redis: bool) -> Vec<Check> {
        let mut checks = vec![
            Check::KeyHash,
            Check::KeyEq,
            Check::KeyClone,
            Check::KeyDebug,
            Check::KeySend,
            Check::KeySync,
        ];
        if in_redis {
            checks.extend([Check::KeySerialize, Check::KeyDeserialize]);
        }
        checks
    }

    /// The checks of an argument left out of the key, which the load gets a clone of.
    pub(crate) const ARG: &[Check] = &[Check::ArgClone, Check::ArgSend, Check::ArgSync];

    /// The checks of the receiver, which the load gets a clone of.
    pub(crate) const RECEIVER: &[Check] = &[
        Check::ReceiverSized,
        Check::ReceiverClone,
        Check::ReceiverSend,
        Check::ReceiverSync,
    ];

    /// The checks of a plain returned value.
    pub(crate) fn value(in_redis: bool) -> Vec<Check> {
        let mut checks = vec![Check::ValueClone, Check::ValueSend, Check::ValueSync];
        if in_redis {
            checks.extend([Check::ValueSerialize, Check::ValueDeserialize]);
        }
        checks
    }

    /// The checks of the `T` of a returned `Result<T, E>`.
    pub(crate) fn ok(in_redis: bool) -> Vec<Check> {
        let mut checks = vec![Check::OkClone, Check::OkSend, Check::OkSync];
        if in_redis {
            checks.extend([Check::OkSerialize, Check::OkDeserialize]);
        }
        checks
    }

    /// The checks of the `E` of a returned `Result<T, E>`.
    pub(crate) const ERROR: &[Check] = &[
        Check::ErrorFrom,
        Check::ErrorDisplay,
        Check::ErrorDebug,
        Check::ErrorSend,
        Check::ErrorSync,
    ];
}

/// What a chain of checks gives.
pub(crate) enum Finish {
    /// The probe itself, for more checks.
    Probe,
    /// The witness of the probe's type, which the runtime is called through.
    Witness,
    /// A clone of this value (the receiver, an argument left out of the key), for the load.
    CloneOf(TokenStream),
    /// This value as it is (the receiver, an argument left out of the key), which the load's
    /// context is made of.
    Checked(TokenStream),
    /// An owned copy of this borrowed value (an argument left out of the key), for the load.
    OwnedOf(TokenStream),
    /// The value under check, out of its `(value,)`: a key part.
    Value,
}

/// `{ use checks::{..}; subject.__stampede_check()...finish }`: `checks` run on `subject` (a
/// probe of a type or a `(value,)`) in order, each at `span`, so that a failed check is reported
/// on the user's token. A failed check makes the expression an error type, which silences the
/// follow-on errors of the runtime call it flows into. The block confines the traits' import to
/// the chain.
pub(crate) fn chain(
    span: Span,
    private: &TokenStream,
    subject: TokenStream,
    checks: &[Check],
    finish: Finish,
) -> TokenStream {
    let mut traits: Vec<Ident> = checks
        .iter()
        .map(|check| Ident::new(check.trait_name(), span))
        .collect();
    let methods = checks.iter().map(|check| Ident::new(check.method(), span));
    let finish = match finish {
        Finish::Probe => None,
        Finish::Value => Some(quote_spanned!(span=> .0)),
        Finish::Witness => {
            traits.push(Ident::new("Probed", span));
            Some(quote_spanned!(span=> .__stampede_witness()))
        }
        Finish::CloneOf(value) => {
            traits.push(Ident::new("Probed", span));
            Some(quote_spanned!(span=> .__stampede_clone_of(#value)))
        }
        Finish::Checked(value) => {
            traits.push(Ident::new("Probed", span));
            Some(quote_spanned!(span=> .__stampede_checked(#value)))
        }
        Finish::OwnedOf(value) => {
            traits.push(Ident::new("Probed", span));
            Some(quote_spanned!(span=> .__stampede_owned_of(#value)))
        }
    };
    quote_spanned! {span=>
        {
            use #private::checks::{#(#traits as _),*};
            #subject #(.#methods())* #finish
        }
    }
}
