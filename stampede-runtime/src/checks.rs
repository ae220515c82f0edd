//! The bounds `#[cached]` puts on the user's types, checked one at a time at the span of the
//! user's token, each with a message that says what the cache does with the type and the fix.
//!
//! Each bound is a marker trait carrying `#[diagnostic::on_unimplemented]`, implemented for
//! `(T,)` (a key argument) or [`Probe<T>`] (a type: the receiver, an argument the load gets a
//! clone of, the returned value and error) when `T` has the bound, and a method that exists
//! only where the marker is implemented. The generated code calls these methods in a chain,
//! with each method's name spanned at the user's token. A missing bound is then a
//! method-resolution error at that token, which rustc words with the marker's message; and the
//! failed call has an error type, so the runtime call it flows into (the key into the call, the
//! call itself made through the returned type's [`Witness`]) reports nothing more.
//!
//! rustc drops the marker's message when the checked type holds a lifetime (a trait object
//! does): the receiver and the unmet bound then carry different region variables. The macro
//! reports the common case of that, `Box<dyn std::error::Error>`, itself.
//!
//! The macro names each check's trait and method in one table (`stampede-macros/src/checks.rs`);
//! a name that does not match is an unresolved import in every expansion.
//!
//! A plain `fn check<T: Bound>()` shows the same message, but rustc then also reports the
//! runtime's own `K: Key` or `V: Value` bound, at the attribute, in terms of `__private` items;
//! the trybuild suite in `tests/ui` pins what the compiler prints.

use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::marker::PhantomData;

use crate::error::Error;

/// A type under check, without a value of it: the returned type, or the type of `self` or of
/// an argument that the load gets a clone of. A key part under check is a `(K,)`.
///
/// A tuple rather than a type of this crate: rustc's report of a failed check then names the
/// tuple, and does not quote this file to show a struct that "doesn't satisfy" the bound.
pub type Probe<T> = (PhantomData<T>,);

/// The probe of the type of `*value` (`__private::probe`, as the generated code knows it).
#[inline(always)]
pub fn probe<T: ?Sized>(_value: &T) -> Probe<T> {
    (PhantomData,)
}

/// What a probe gives once every check of its type has passed.
pub trait Probed<T>: Sized {
    /// The witness of `T` that the runtime is called through.
    fn __stampede_witness(self) -> Witness<T>;

    /// A clone of `value`, for the load.
    fn __stampede_clone_of(self, value: &T) -> T
    where
        T: Clone;

    /// `value` (the receiver, an argument left out of the key) as it is: what the load's
    /// context is made of, when a load starts.
    fn __stampede_checked<U>(self, value: U) -> U;

    /// An owned copy of `value`, a borrowed argument left out of the key, for the load.
    fn __stampede_owned_of<B>(self, value: &B) -> T
    where
        B: ?Sized + ToOwned<Owned = T>;
}

impl<T> Probed<T> for Probe<T> {
    #[inline(always)]
    fn __stampede_witness(self) -> Witness<T> {
        Checked(PhantomData)
    }

    #[inline(always)]
    fn __stampede_clone_of(self, value: &T) -> T
    where
        T: Clone,
    {
        value.clone()
    }

    #[inline(always)]
    fn __stampede_checked<U>(self, value: U) -> U {
        value
    }

    #[inline(always)]
    fn __stampede_owned_of<B>(self, value: &B) -> T
    where
        B: ?Sized + ToOwned<Owned = T>,
    {
        value.to_owned()
    }
}

/// The base of [`Witness`]: a struct of this crate, so that the runtime's entry points are
/// inherent methods, which need no import in the scope of the user's body.
pub struct Checked<T>(pub T);

/// The returned type, once its checks have passed: the runtime is called through it, so that
/// a failed check (an error type, which this then is too) silences the call.
pub type Witness<T> = Checked<PhantomData<T>>;

macro_rules! check {
    (
        $(#[$doc:meta])*
        $marker:ident, $check:ident, $method:ident,
        impl<$($g:ident),+> for $on:ty where $param:ident: [$($bound:tt)+],
        message = $message:literal, label = $label:literal, $(note = $note:literal),+ $(,)?
    ) => {
        $(#[$doc])*
        #[diagnostic::on_unimplemented(message = $message, label = $label, $(note = $note),+)]
        pub trait $marker<T: ?Sized> {}

        impl<$($g),+> $marker<$param> for $on where $param: $($bound)+ {}

        #[doc = concat!("The check of `", stringify!($marker), "`.")]
        pub trait $check: Sized {
            #[doc = concat!("`self`, where `", stringify!($marker), "` holds.")]
            #[inline(always)]
            fn $method(self) -> Self {
                self
            }
        }

        impl<$($g),+> $check for $on where $on: $marker<$param> {}
    };
}
// For the checks of a shared tier (the Redis tier's serde bounds); unused without one.
#[cfg_attr(not(feature = "redis"), allow(unused_imports))]
pub(crate) use check;

check!(
    /// An argument that is part of the key is hashed.
    KeyHash, KeyHashCheck, __stampede_key_hash,
    impl<T> for (T,) where T: [Hash],
    message = "`{T}` cannot be part of a cache key: it does not implement `Hash`",
    label = "this argument is part of the key, which must be `Hash + Eq + Clone + Debug + Send + Sync + 'static`",
    note = "derive or implement `Hash` for it, or leave this argument out of the key with a `key = \"...\"` template that names the others",
);
check!(
    /// An argument that is part of the key is compared.
    KeyEq, KeyEqCheck, __stampede_key_eq,
    impl<T> for (T,) where T: [Eq],
    message = "`{T}` cannot be part of a cache key: it does not implement `Eq`",
    label = "this argument is part of the key, which must be `Hash + Eq + Clone + Debug + Send + Sync + 'static`",
    note = "derive or implement `PartialEq` and `Eq` for it (a float is not `Eq`: key on its bits or a rounded integer), or leave this argument out of the key with a `key = \"...\"` template",
);
check!(
    /// An argument that is part of the key is cloned for the load.
    KeyClone, KeyCloneCheck, __stampede_key_clone,
    impl<T> for (T,) where T: [Clone],
    message = "`{T}` cannot be part of a cache key: it does not implement `Clone`",
    label = "this argument is part of the key, which the cache stores and the load gets a copy of, so it must be `Hash + Eq + Clone + Debug + Send + Sync + 'static`",
    note = "derive or implement `Clone` for it, or leave this argument out of the key with a `key = \"...\"` template",
);
check!(
    /// An argument that is part of the key is printed in stats and traces.
    KeyDebug, KeyDebugCheck, __stampede_key_debug,
    impl<T> for (T,) where T: [Debug],
    message = "`{T}` cannot be part of a cache key: it does not implement `Debug`",
    label = "this argument is part of the key, which stats and traces print, so it must be `Hash + Eq + Clone + Debug + Send + Sync + 'static`",
    note = "derive `Debug` for it, or leave this argument out of the key with a `key = \"...\"` template",
);
check!(
    /// An argument that is part of the key is shared with the detached load.
    KeySend, KeySendCheck, __stampede_key_send,
    impl<T> for (T,) where T: [Send],
    message = "`{T}` cannot be part of a cache key: it is not `Send`",
    label = "this argument is part of the key, which the load gets on another task, so it must be `Hash + Eq + Clone + Debug + Send + Sync + 'static`",
    note = "key on a value that can cross threads (an `Arc` instead of an `Rc`, an id instead of a handle)",
);
check!(
    /// An argument that is part of the key is shared between tasks.
    KeySync, KeySyncCheck, __stampede_key_sync,
    impl<T> for (T,) where T: [Sync],
    message = "`{T}` cannot be part of a cache key: it is not `Sync`",
    label = "this argument is part of the key, which callers on other tasks compare against, so it must be `Hash + Eq + Clone + Debug + Send + Sync + 'static`",
    note = "key on a value that can be shared between threads (no `Cell` or `RefCell` inside)",
);

check!(
    /// An argument left out of the key is cloned for the load.
    ArgClone, ArgCloneCheck, __stampede_arg_clone,
    impl<T> for Probe<T> where T: [Clone],
    message = "`{T}` cannot be passed to a cached function's load: it does not implement `Clone`",
    label = "this argument is not part of the key: the load, which runs detached and may be retried, gets a clone of it, so it must be `Clone + Send + Sync + 'static`",
    note = "derive or implement `Clone` for it, or wrap it in an `Arc`",
);
check!(
    /// An argument left out of the key is moved to the detached load.
    ArgSend, ArgSendCheck, __stampede_arg_send,
    impl<T> for Probe<T> where T: [Send],
    message = "`{T}` cannot be passed to a cached function's load: it is not `Send`",
    label = "this argument is not part of the key: the load, which runs detached on another task, gets a clone of it, so it must be `Clone + Send + Sync + 'static`",
    note = "pass a value that can cross threads (an `Arc` instead of an `Rc`)",
);
check!(
    /// An argument left out of the key is shared by the load's attempts.
    ArgSync, ArgSyncCheck, __stampede_arg_sync,
    impl<T> for Probe<T> where T: [Sync],
    message = "`{T}` cannot be passed to a cached function's load: it is not `Sync`",
    label = "this argument is not part of the key: the load, which runs detached on another task, gets a clone of it, so it must be `Clone + Send + Sync + 'static`",
    note = "pass a value that can be shared between threads (no `Cell` or `RefCell` inside)",
);

/// The receiver of a cached method is sized. In a trait's default method `Self` is any
/// implementor, unsized ones too, unless the trait requires `Sized` (as `Clone` does): the
/// check fails there first, with a message about the default method rather than `Self: Sized`
/// and the internals of the next checks. Written out, as `check!` takes only sized parameters.
#[diagnostic::on_unimplemented(
    message = "`#[cached]` on a trait's default method needs the trait to require `Clone + Send + Sync + 'static`: `self` there is any implementor, and the load runs on a clone of it",
    label = "in a default method, `Self` is any implementor of the trait, unsized ones too",
    note = "require it of every implementor, e.g. `trait Catalog: Clone + Send + Sync + 'static`: each implementor then gets a cache of its own",
    note = "or put `#[cached]` on the method in each impl of the trait, where `self` has a type"
)]
pub trait ReceiverSized<T: ?Sized> {}

impl<T> ReceiverSized<T> for Probe<T> {}

/// The check of `ReceiverSized`.
pub trait ReceiverSizedCheck: Sized {
    /// `self`, where `ReceiverSized` holds.
    #[inline(always)]
    fn __stampede_receiver_sized(self) -> Self {
        self
    }
}

impl<T: ?Sized> ReceiverSizedCheck for Probe<T> where Probe<T>: ReceiverSized<T> {}

check!(
    /// The receiver of a cached method is cloned for the load.
    ReceiverClone, ReceiverCloneCheck, __stampede_receiver_clone,
    impl<T> for Probe<T> where T: [Clone],
    message = "the receiver of a cached method must be `Clone`, and `{T}` is not",
    label = "the load runs detached from this call, on a clone of `self`, so `self` must be `Clone + Send + Sync + 'static`",
    note = "derive `Clone` for `{T}`, keeping shared state behind an `Arc` (as a connection pool does)",
);
check!(
    /// The receiver of a cached method is moved to the detached load.
    ReceiverSend, ReceiverSendCheck, __stampede_receiver_send,
    impl<T> for Probe<T> where T: [Send],
    message = "the receiver of a cached method must be `Send`, and `{T}` is not",
    label = "the load runs detached from this call, on a clone of `self`, so `self` must be `Clone + Send + Sync + 'static`",
    note = "keep the state of `{T}` in types that can cross threads (an `Arc` instead of an `Rc`)",
);
check!(
    /// The receiver of a cached method is shared by the load's attempts.
    ReceiverSync, ReceiverSyncCheck, __stampede_receiver_sync,
    impl<T> for Probe<T> where T: [Sync],
    message = "the receiver of a cached method must be `Sync`, and `{T}` is not",
    label = "the load runs detached from this call, on a clone of `self`, so `self` must be `Clone + Send + Sync + 'static`",
    note = "keep the state of `{T}` in types that can be shared between threads (a `Mutex` instead of a `RefCell`)",
);

check!(
    /// A cached value is cloned for every caller.
    ValueClone, ValueCloneCheck, __stampede_value_clone,
    impl<T> for Probe<T> where T: [Clone],
    message = "a cached function cannot return `{T}`: it does not implement `Clone`",
    label = "the cache keeps this value and hands each caller a clone, so it must be `Clone + Send + Sync + 'static`",
    note = "derive or implement `Clone` for it, or return an `Arc` of it",
);
check!(
    /// A cached value crosses from the load's task to the callers'.
    ValueSend, ValueSendCheck, __stampede_value_send,
    impl<T> for Probe<T> where T: [Send],
    message = "a cached function cannot return `{T}`: it is not `Send`",
    label = "the load runs on its own task and the cache hands the value to callers on others, so it must be `Clone + Send + Sync + 'static`",
    note = "return a value that can cross threads (an `Arc` instead of an `Rc`)",
);
check!(
    /// A cached value is shared between tasks.
    ValueSync, ValueSyncCheck, __stampede_value_sync,
    impl<T> for Probe<T> where T: [Sync],
    message = "a cached function cannot return `{T}`: it is not `Sync`",
    label = "the cache shares this value between the tasks that call the function, so it must be `Clone + Send + Sync + 'static`",
    note = "return a value that can be shared between threads (a `Mutex` instead of a `RefCell`)",
);

check!(
    /// The `T` of a cached `Result<T, E>` is cloned for every caller.
    OkClone, OkCloneCheck, __stampede_ok_clone,
    impl<T, E> for Probe<Result<T, E>> where T: [Clone],
    message = "a cached function cannot return `{T}`: it does not implement `Clone`",
    label = "the cache keeps this value and hands each caller a clone, so it must be `Clone + Send + Sync + 'static`",
    note = "derive or implement `Clone` for it, or return an `Arc` of it",
);

check!(
    /// The `T` of a cached `Result<T, E>` crosses from the load's task to the callers'.
    OkSend, OkSendCheck, __stampede_ok_send,
    impl<T, E> for Probe<Result<T, E>> where T: [Send],
    message = "a cached function cannot return `{T}`: it is not `Send`",
    label = "the load runs on its own task and the cache hands the value to callers on others, so it must be `Clone + Send + Sync + 'static`",
    note = "return a value that can cross threads (an `Arc` instead of an `Rc`)",
);

check!(
    /// The `T` of a cached `Result<T, E>` is shared between tasks.
    OkSync, OkSyncCheck, __stampede_ok_sync,
    impl<T, E> for Probe<Result<T, E>> where T: [Sync],
    message = "a cached function cannot return `{T}`: it is not `Sync`",
    label = "the cache shares this value between the tasks that call the function, so it must be `Clone + Send + Sync + 'static`",
    note = "return a value that can be shared between threads (a `Mutex` instead of a `RefCell`)",
);

check!(
    /// The error type receives the cache's own errors.
    ErrorFrom, ErrorFromCheck, __stampede_error_from,
    impl<T, E> for Probe<Result<T, E>> where E: [From<Error>],
    message = "`{T}` cannot be the error type of a cached function: it does not implement `From<stampede::Error>`",
    label = "timeouts, panics and the failure of a load shared by several callers reach each caller through this type",
    note = "add `impl From<stampede::Error> for {T}`, e.g. a variant that holds the `stampede::Error`; `stampede::Error::upstream` recovers the load's own error",
    note = "if `{T}` belongs to another crate, the orphan rule forbids that impl: return an error type of your crate instead, e.g. `enum AppError {{ Cache(stampede::Error), Source({T}) }}` with a `From` impl for each, or `Box<dyn std::error::Error + Send + Sync>`",
);
check!(
    /// The error type is shown to every waiter of a failed load.
    ErrorDisplay, ErrorDisplayCheck, __stampede_error_display,
    impl<T, E> for Probe<Result<T, E>> where E: [Display],
    message = "`{T}` cannot be the error type of a cached function: it does not implement `Display`",
    label = "a failed load's error is shared by every caller waiting on it, so it must be `Display + Debug + Send + Sync + 'static`",
    note = "implement `Display` for it (`thiserror` does)",
);
check!(
    /// The error type is debugged through the shared failure.
    ErrorDebug, ErrorDebugCheck, __stampede_error_debug,
    impl<T, E> for Probe<Result<T, E>> where E: [Debug],
    message = "`{T}` cannot be the error type of a cached function: it does not implement `Debug`",
    label = "a failed load's error is shared by every caller waiting on it, so it must be `Display + Debug + Send + Sync + 'static`",
    note = "derive `Debug` for it",
);
check!(
    /// The error type crosses from the load's task to the callers'.
    ErrorSend, ErrorSendCheck, __stampede_error_send,
    impl<T, E> for Probe<Result<T, E>> where E: [Send],
    message = "`{T}` cannot be the error type of a cached function: it is not `Send`",
    label = "a failed load's error is shared by every caller waiting on it, so it must be `Display + Debug + Send + Sync + 'static`",
    note = "keep the error's contents in types that can cross threads",
);
check!(
    /// The error type is shared between the callers of a failed load.
    ErrorSync, ErrorSyncCheck, __stampede_error_sync,
    impl<T, E> for Probe<Result<T, E>> where E: [Sync],
    message = "`{T}` cannot be the error type of a cached function: it is not `Sync`",
    label = "a failed load's error is shared by every caller waiting on it, so it must be `Display + Debug + Send + Sync + 'static`",
    note = "keep the error's contents in types that can be shared between threads (`anyhow::Error` and `Box<dyn Error + Send + Sync>` are)",
);

/// What the function named by `ttl_from` returns: a value's own fresh time, or `None` for the
/// cache's `ttl`.
#[diagnostic::on_unimplemented(
    message = "`ttl_from` must name a function returning `Duration` or `Option<Duration>`, and this one returns `{Self}`",
    label = "this function's result is the value's fresh time",
    note = "write it as `fn(&T) -> std::time::Duration`, or `fn(&T) -> Option<std::time::Duration>` to fall back to `ttl`"
)]
pub trait OwnTtl {
    /// The fresh time, `None` for `ttl`.
    fn own_ttl(self) -> Option<std::time::Duration>;
}

impl OwnTtl for std::time::Duration {
    fn own_ttl(self) -> Option<std::time::Duration> {
        Some(self)
    }
}

impl OwnTtl for Option<std::time::Duration> {
    fn own_ttl(self) -> Option<std::time::Duration> {
        self
    }
}

/// A value's own fresh time, from what the function named by `ttl_from` returned.
#[inline(always)]
pub fn own_ttl(ttl: impl OwnTtl) -> Option<std::time::Duration> {
    ttl.own_ttl()
}

/// The function `F` named by `source_version` reads the version of a stored value `V`: it is a
/// `fn(&V) -> u64`. The generated code checks a `(function, PhantomData<V>)` it builds at the
/// option's span, with `V` as the cache stores it, so that a function of another type is
/// reported there in these words, not as a mismatch with a signature of the runtime. (rustc
/// words a failed method call with the marker's message only when the marker is on the
/// receiver's own type: hence the tuple, and `F` as a parameter to name the function.)
#[diagnostic::on_unimplemented(
    message = "`source_version` must name a `fn(&{V}) -> u64`, and this one is `{F}`",
    label = "the cache calls this function on each value it stores, to keep the newest version",
    note = "write it as `fn(value: &{V}) -> u64`: it gets each value as the cache stores it (the returned type, or the `T` of a `Result<T, E>`, `Option` and all; for a batch function, a value of its map) and returns the version of the source the value was read at, e.g. a row version"
)]
pub trait SourceVersion<F, V> {}

impl<F, V> SourceVersion<F, V> for (F, PhantomData<V>) where F: Fn(&V) -> u64 {}

/// The check of `SourceVersion`.
pub trait SourceVersionCheck: Sized {
    /// `self`, where `SourceVersion` holds: the function is then `.0`.
    #[inline(always)]
    fn __stampede_source_version(self) -> Self {
        self
    }
}

impl<F, V> SourceVersionCheck for (F, PhantomData<V>) where (F, PhantomData<V>): SourceVersion<F, V> {}

/// Every check's trait, by name, and what a chain of checks ends with. The generated code
/// imports the traits a chain calls in a block around that chain only
/// (`{ use checks::{KeyHashCheck as _, ..}; .. }`), so that no name reaches the scope of the
/// user's body.
pub mod names {
    pub use super::{
        ArgCloneCheck, ArgSendCheck, ArgSyncCheck, ErrorDebugCheck, ErrorDisplayCheck,
        ErrorFromCheck, ErrorSendCheck, ErrorSyncCheck, KeyCloneCheck, KeyDebugCheck, KeyEqCheck,
        KeyHashCheck, KeySendCheck, KeySyncCheck, OkCloneCheck, OkSendCheck, OkSyncCheck, Probe,
        Probed, ReceiverCloneCheck, ReceiverSendCheck, ReceiverSizedCheck, ReceiverSyncCheck,
        SourceVersionCheck, ValueCloneCheck, ValueSendCheck, ValueSyncCheck,
    };
}
