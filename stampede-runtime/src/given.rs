//! Options the attribute takes from the user's code: `ttl = config::product_ttl` names a
//! function (called) or a constant or static (copied) instead of a literal. The generated code
//! reads each such path once, when the cache is built, converts its value to the option's type
//! ([`Setting`]) and hands the options to [`from_code`], which checks them as the attribute
//! checks a literal ([`Config::check`]).
//!
//! A value refused there (a zero `ttl`, a `"5 parsecs"` duration, a `jitter` of 300) is an
//! error in the log naming the cache, the option and why, and the cache runs uncached: a
//! value loaded is kept nowhere, each call loads (concurrent calls of one key still share one
//! load). It never panics and never serves a value under options that were refused.

use std::fmt::Display;
use std::sync::OnceLock;
use std::time::Duration;

use crate::config::{Config, Refusal};

/// The value of a path the attribute names, read by [`FromFn::read`] when the path is a
/// function and by [`FromConst::read`] otherwise: the generated code writes
/// `(&Given(&path)).read()`, and method lookup picks the first that applies.
pub struct Given<'a, T>(pub &'a T);

/// A path to a function of no arguments: its value is the function's result.
pub trait FromFn {
    /// What the function returns.
    type Out;
    /// Calls the function.
    fn read(&self) -> Self::Out;
}

impl<F: Fn() -> R, R> FromFn for Given<'_, F> {
    type Out = R;
    fn read(&self) -> R {
        (self.0)()
    }
}

/// A path to a constant or a static: its value is a copy of it.
pub trait FromConst {
    /// The constant's type.
    type Out;
    /// Copies the constant.
    fn read(&self) -> Self::Out;
}

impl<T: Clone> FromConst for &Given<'_, T> {
    type Out = T;
    fn read(&self) -> T {
        self.0.clone()
    }
}

/// A value a path may give for an option of type `T`: a `Duration` or a humantime string
/// (`"60s"`, `"1h 30m"`) for a duration, any integer type for a count (converted if it fits).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot give this option's value",
    label = "this path's value",
    note = "a duration option takes a `Duration`, a `&str` or a `String` (\"60s\"); a count takes an integer; `xfetch` an `f64`"
)]
pub trait Setting<T> {
    /// The option's value, or why this one is not one.
    fn setting(self) -> Result<T, String>;
}

impl Setting<Duration> for Duration {
    fn setting(self) -> Result<Duration, String> {
        Ok(self)
    }
}

impl Setting<Duration> for &str {
    fn setting(self) -> Result<Duration, String> {
        humantime::parse_duration(self)
            .map_err(|error| format!("`{self}` is not a duration ({error})"))
    }
}

impl Setting<Duration> for String {
    fn setting(self) -> Result<Duration, String> {
        self.as_str().setting()
    }
}

impl Setting<Duration> for &String {
    fn setting(self) -> Result<Duration, String> {
        self.as_str().setting()
    }
}

/// Counts: from any integer type, when the value fits. One impl per pair of types (not a
/// blanket one over `TryFrom`), so that another type's error is the trait's own message.
macro_rules! counts {
    ($($count:ty),*) => {$(
        counts!(@from $count: u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);
    )*};
    (@from $count:ty: $($integer:ty),*) => {$(
        impl Setting<$count> for $integer {
            #[allow(clippy::useless_conversion)]
            fn setting(self) -> Result<$count, String> {
                <$count>::try_from(self).map_err(|_| fits_not(self, stringify!($count)))
            }
        }
    )*};
}
counts!(u8, u32, u64, usize);

fn fits_not(value: impl Display, count: &str) -> String {
    format!("{value} does not fit in {count}")
}

impl Setting<f64> for f64 {
    fn setting(self) -> Result<f64, String> {
        Ok(self)
    }
}

impl Setting<f64> for f32 {
    fn setting(self) -> Result<f64, String> {
        Ok(self.into())
    }
}

/// Sets `option` (a field of the options [`from_code`] reads) to what its path gave, converted
/// to the field's type; or why it cannot be.
pub fn set<T, S: Setting<T>>(option: &mut T, given: S) -> Result<(), String> {
    *option = given.setting()?;
    Ok(())
}

/// [`set`] for an option that is on when given (an `Option` field).
pub fn set_on<T, S: Setting<T>>(option: &mut Option<T>, given: S) -> Result<(), String> {
    *option = Some(given.setting()?);
    Ok(())
}

/// The options of a cache with the values its paths give: `literal` holds the attribute's
/// literals (and a stand-in for each path's option), `read` sets each path's option, or
/// returns the first it cannot with why. The result is checked as the attribute checks its
/// literals; refused, it is `literal` under which nothing is cached, and the log says why.
pub fn from_code(
    literal: Config,
    read: impl FnOnce(&mut Config) -> Result<(), (&'static str, String)>,
) -> Config {
    let mut given = literal.clone();
    let refusal = match read(&mut given) {
        Ok(()) => given.check().err(),
        Err((option, why)) => Some(Refusal { option, why }),
    };
    let Some(Refusal { option, why }) = refusal else {
        return given;
    };
    tracing::error!(
        cache = %literal.name,
        option,
        "stampede: cache `{}`: with the values its options' paths gave, `{option}` is refused: {why}; the cache keeps nothing (each call loads) until a fixed value is deployed",
        literal.name
    );
    Config {
        ttl_from: Some(never_kept),
        ..literal
    }
}

/// A batch function's `missing_ttl` given as a path, which the function's `ttl_from` reads by
/// each fill of a key left out of its map: read once per process into `cell`. Refused (not a
/// duration), it is logged once with `function` and the option, and such a key is not cached.
pub fn missing_ttl<S: Setting<Duration>>(
    cell: &OnceLock<Option<Duration>>,
    function: &str,
    read: impl FnOnce() -> S,
) -> Option<Duration> {
    let refused = "a key the function leaves out is not cached";
    let read = || read().setting();
    read_once(cell, function, "missing_ttl", refused, read).or(Some(Duration::ZERO))
}

/// A `batch_loader` function's `batch_window` given as a path, read by each call: once per
/// process into `cell`. Refused (not a duration, or zero), it is logged once with `function`
/// and the option, and each call loads its key alone.
pub fn batch_window<S: Setting<Duration>>(
    cell: &OnceLock<Option<Duration>>,
    function: &str,
    read: impl FnOnce() -> S,
) -> Option<Duration> {
    let refused = "each call loads its key alone";
    let read = || match read().setting()? {
        zero if zero.is_zero() => Err("it cannot be zero".to_owned()),
        window => Ok(window),
    };
    read_once(cell, function, "batch_window", refused, read)
}

/// An option no cache's `Config` holds, read where it is used: once per process into `cell`;
/// a value refused is logged once (with what the function does `refused`) and is `None`.
fn read_once<T: Copy>(
    cell: &OnceLock<Option<T>>,
    function: &str,
    option: &'static str,
    refused: &str,
    read: impl FnOnce() -> Result<T, String>,
) -> Option<T> {
    *cell.get_or_init(|| match read() {
        Ok(value) => Some(value),
        Err(why) => {
            tracing::error!(
                function,
                option,
                "stampede: `{function}`: the value of `{option}` its path gave is refused: {why}; {refused} until a fixed value is deployed"
            );
            None
        }
    })
}

/// Every value's own fresh time is zero: it is kept nowhere ([`Config::lifetime_of`]).
fn never_kept(_: &(dyn std::any::Any + Send + Sync)) -> Option<Duration> {
    Some(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECONDS: Duration = Duration::from_secs(7);
    const TEXT: &str = "1m 30s";
    const COUNT: i64 = 3;

    fn minutes() -> Duration {
        Duration::from_secs(120)
    }

    /// What `given` gives for an option of type `T`.
    fn setting<T, S: Setting<T>>(given: S) -> Result<T, String> {
        given.setting()
    }

    // The form the generated code writes, whatever the path names.
    #[allow(clippy::needless_borrow)]
    #[test]
    fn a_function_is_called_and_a_constant_copied() {
        assert_eq!(
            setting::<Duration, _>((&Given(&minutes)).read()),
            Ok(minutes())
        );
        assert_eq!(
            setting::<Duration, _>((&Given(&SECONDS)).read()),
            Ok(SECONDS)
        );
        assert_eq!(
            setting::<Duration, _>((&Given(&TEXT)).read()),
            Ok(Duration::from_secs(90))
        );
        assert_eq!(setting::<u32, _>((&Given(&COUNT)).read()), Ok(3));
        assert_eq!(setting::<f64, _>((&Given(&1.5_f32)).read()), Ok(1.5));
    }

    #[test]
    fn a_value_that_is_not_one_says_why() {
        let bad = setting::<Duration, _>("5 parsecs").unwrap_err();
        assert!(bad.contains("`5 parsecs` is not a duration"), "{bad}");
        let big = setting::<u8, _>(300_u32).unwrap_err();
        assert_eq!(big, "300 does not fit in u8");
        assert!(setting::<u32, _>(-1_i32).is_err());
    }
}
