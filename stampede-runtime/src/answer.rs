//! What a call of a cached function gets when it is made: its value at once (a hit), or a
//! future to await (a miss, a `refresh`, a `read_through`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A call's answer: ready when the call was made, or pending.
///
/// A hit is looked up when the generated code makes the call, which takes a ready answer's
/// value at once and awaits only a pending one: so a hit polls no future of the miss path, and
/// its value goes to the caller without passing through the function's future (issue 38). What
/// is pending is boxed: the miss path's future is compiled once per key, value, error and tier
/// rather than into every cached function's future, for one allocation on a path that makes
/// several. Other callers await the answer whole.
///
/// The tag is a byte of its own (`repr(u8)`) rather than a niche in the value (a `String`'s
/// capacity): the ready value then moves as a whole, not as the word checked for the variant
/// and the rest, whose two stores the caller read back as one wider load, a stalled store
/// forward (issue 38: a hit of a `String` 2.6ns faster).
#[must_use = "an answer does nothing unless awaited"]
#[repr(u8)]
pub enum Answer<'a, T> {
    /// The value.
    Ready(T),
    /// What to await for it.
    Pending(Pin<Box<dyn Future<Output = T> + Send + 'a>>),
    /// Polled to its end.
    Taken,
}

impl<'a, T: 'a> Answer<'a, T> {
    /// This answer with `f` applied to its value and `with`, ready or when it is. A function
    /// pointer rather than a closure: what maps a pending answer is compiled once per type, not
    /// for every caller's closure (every cached function's, issue 38).
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn map<U: 'a, W: Send + 'a>(self, f: fn(T, W) -> U, with: W) -> Answer<'a, U> {
        match self {
            Answer::Ready(value) => Answer::Ready(f(value, with)),
            Answer::Pending(pending) => Answer::Pending(map_pending(pending, f, with)),
            Answer::Taken => Answer::Taken,
        }
    }
}

/// `pending` with `f` applied to its value and `with` when it is ready. Out of line: every
/// cached function's call of [`Answer::map`] shares it (issue 38).
#[inline(never)]
fn map_pending<'a, T: 'a, U: 'a, W: Send + 'a>(
    pending: Pin<Box<dyn Future<Output = T> + Send + 'a>>,
    f: fn(T, W) -> U,
    with: W,
) -> Pin<Box<dyn Future<Output = U> + Send + 'a>> {
    Box::pin(async move { f(pending.await, with) })
}

// The value is never pinned: it is moved out when ready.
impl<T> Unpin for Answer<'_, T> {}

impl<T> Future for Answer<'_, T> {
    type Output = T;

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let answer = self.get_mut();
        if let Answer::Pending(pending) = answer {
            return pending.as_mut().poll(cx);
        }
        match std::mem::replace(answer, Answer::Taken) {
            Answer::Ready(value) => Poll::Ready(value),
            _ => panic!("an answer polled after it was ready"),
        }
    }
}

/// A call of a cached free function, made when it is first polled, as an `async fn`'s call
/// would be: what the generated function returns instead of being an `async fn` (issue 38).
/// A coroutine is instantiated in every codegen unit that polls it, the lookup inlined in each
/// copy. `C` says which call (the runtime's `Call`: the function's, `refresh` or
/// `read_through`), `A` is the function's arguments, `T` what it returns, and `F` the
/// function's `answer` (its lookup and, on a miss, the boxed rest), as [`Deferred::new`] takes
/// it.
#[must_use = "a call of a cached function does nothing unless awaited"]
pub struct Deferred<F, C, A, T> {
    /// The call not yet made: which, the function that makes it, and its arguments.
    start: Option<(C, F, A)>,
    /// The call's answer once made, while it is pending.
    answer: Answer<'static, T>,
}

/// The `answer` of a [`Deferred`] call in a debug build: a `fn` pointer.
#[cfg(debug_assertions)]
type AnswerFn<C, A, T> = fn(C, A) -> Answer<'static, T>;

#[cfg(debug_assertions)]
impl<C, A, T> Deferred<AnswerFn<C, A, T>, C, A, T> {
    /// `call` of the function whose `answer` makes it, with `args`, when first polled.
    ///
    /// In a debug build `answer` is taken as a `fn` pointer: the `Deferred` is then the same
    /// type for every function with the same arguments and value, and its `poll`, drop and
    /// `await` are compiled once for all of them rather than once per function (issue 38: four
    /// items of a cached function's debug build). Optimized, the function itself is kept (see
    /// the other `new`), so that its lookup is inlined into the caller's poll.
    pub fn new(call: C, answer: AnswerFn<C, A, T>, args: A) -> Self {
        Deferred {
            start: Some((call, answer, args)),
            answer: Answer::Taken,
        }
    }
}

#[cfg(not(debug_assertions))]
impl<F, C, A, T> Deferred<F, C, A, T>
where
    F: FnOnce(C, A) -> Answer<'static, T>,
{
    /// `call` of the function whose `answer` makes it, with `args`, when first polled: the
    /// function itself, whose lookup the caller's poll inlines (a debug build takes a `fn`
    /// pointer, see the other `new`).
    #[inline(always)]
    pub fn new(call: C, answer: F, args: A) -> Self {
        Deferred {
            start: Some((call, answer, args)),
            answer: Answer::Taken,
        }
    }
}

// Nothing in it is pinned: the arguments are moved out to make the call, and what is pending
// is pinned in its own box.
impl<F, C, A, T> Unpin for Deferred<F, C, A, T> {}

impl<F, C, A, T> Future for Deferred<F, C, A, T>
where
    F: FnOnce(C, A) -> Answer<'static, T>,
{
    type Output = T;

    // Not `#[inline]`: an inline function is copied into every codegen unit that polls it.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        if let Some((call, answer, args)) = this.start.take() {
            match answer(call, args) {
                Answer::Ready(value) => return Poll::Ready(value),
                pending => this.answer = pending,
            }
        }
        Pin::new(&mut this.answer).poll(cx)
    }
}
