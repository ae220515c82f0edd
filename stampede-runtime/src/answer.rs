//! What a call of a cached function gets when it is made: its value at once (a hit), or a
//! future to await (a miss, a `refresh`, a `read_through`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A call's answer: ready when the call was made, or pending.
///
/// A hit is looked up when the generated code makes the call, which it awaits at once: so a hit
/// polls this and nothing else, inlined into the caller's future, instead of the nested futures
/// of the miss path (issue 38). What is pending is boxed: the miss path's future is compiled
/// once per key, value, error and tier rather than into every cached function's future, for one
/// allocation on a path that makes several.
#[must_use = "an answer does nothing unless awaited"]
pub enum Answer<'a, T> {
    /// The value, taken by the first poll.
    Ready(Option<T>),
    /// What to await for it.
    Pending(Pin<Box<dyn Future<Output = T> + Send + 'a>>),
}

impl<'a, T: 'a> Answer<'a, T> {
    /// This answer with `f` applied to its value and `with`, ready or when it is. A function
    /// pointer rather than a closure: what maps a pending answer is compiled once per type, not
    /// for every caller's closure (every cached function's, issue 38).
    #[inline(always)]
    pub(crate) fn map<U: 'a, W: Send + 'a>(self, f: fn(T, W) -> U, with: W) -> Answer<'a, U> {
        match self {
            Answer::Ready(value) => Answer::Ready(value.map(|value| f(value, with))),
            Answer::Pending(pending) => {
                Answer::Pending(Box::pin(async move { f(pending.await, with) }))
            }
        }
    }
}

// The value is never pinned: it is moved out when ready.
impl<T> Unpin for Answer<'_, T> {}

impl<T> Future for Answer<'_, T> {
    type Output = T;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.get_mut() {
            Answer::Ready(value) => {
                Poll::Ready(value.take().expect("an answer polled after it was ready"))
            }
            Answer::Pending(pending) => pending.as_mut().poll(cx),
        }
    }
}
