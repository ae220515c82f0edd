//! Tags: `#[cached(tags = ["user:{id}", "catalog"])]` gives each entry the templates rendered
//! from its key, and `stampede::invalidate_tag` drops every entry with a tag, whatever function
//! it belongs to.
//!
//! No key is scanned. The process keeps a tag *epoch*, bumped by every tag invalidation, and
//! for each invalidated tag the epoch of its last invalidation (its *mark*). A load stamps its
//! entry with its tags and the epoch read when the load began; a read serves the entry only
//! while no tag of its stamp has a mark above that epoch. While no tag was invalidated since an
//! entry's load began, that check is one atomic load; after one was, the stamp remembers the
//! epoch it was last found current at, so each entry pays for the slow check once per tag
//! invalidation.
//!
//! A load of a tagged key running when its tag is invalidated is detached like a key's
//! invalidation detaches it (`Cache::forget`): later callers start a new load. A mark is kept
//! as long as an entry stamped before it may live (the longest `ttl + stale + fail_safe` of the
//! tagged caches), then dropped: the per-tag state is bounded by the tags invalidated in that
//! window.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The tags of one entry, rendered from its key, and the tag epoch it is known current at.
#[derive(Debug)]
pub(crate) struct Stamp {
    /// The epoch at which the entry's load began, raised each time the entry is found current.
    epoch: AtomicU64,
    tags: Box<[Box<str>]>,
}

/// The process's tag invalidations.
struct Book {
    epoch: AtomicU64,
    marks: Mutex<Marks>,
}

#[derive(Default)]
struct Marks {
    by_tag: HashMap<Box<str>, Mark>,
    /// How long an entry may live: a mark older than this stamps nothing that is still held.
    keep_for: Duration,
    /// Marks set since the last pruning.
    since_pruned: usize,
}

struct Mark {
    epoch: u64,
    at: Instant,
}

static BOOK: LazyLock<Book> = LazyLock::new(|| Book {
    epoch: AtomicU64::new(0),
    marks: Mutex::new(Marks::default()),
});

/// Pruning scans the marks once per this many new ones, so its cost per mark is constant.
const PRUNE_EVERY: usize = 1024;

impl Stamp {
    /// The stamp of a load beginning now with these tags.
    pub(crate) fn new(tags: Vec<String>) -> Arc<Stamp> {
        Arc::new(Stamp {
            epoch: AtomicU64::new(BOOK.epoch.load(Ordering::Acquire)),
            tags: tags.into_iter().map(String::into_boxed_str).collect(),
        })
    }

    /// The entry's tags.
    pub(crate) fn tags(&self) -> &[Box<str>] {
        &self.tags
    }

    /// Whether no tag of the entry was invalidated since its load began.
    pub(crate) fn current(&self) -> bool {
        let now = BOOK.epoch.load(Ordering::Acquire);
        let seen = self.epoch.load(Ordering::Relaxed);
        if seen == now {
            return true;
        }
        // An invalidation after `now` was read sets a mark above `now`: this check sees it, or
        // a later one does, since the stamp is raised to `now` only.
        let marks = marks();
        let invalidated = self
            .tags
            .iter()
            .any(|tag| marks.by_tag.get(tag).is_some_and(|mark| mark.epoch > seen));
        drop(marks);
        if !invalidated {
            self.epoch.fetch_max(now, Ordering::Relaxed);
        }
        !invalidated
    }
}

/// Tagged entries of a cache live at most `longest_use` after their load began: marks are kept
/// at least that long.
pub(crate) fn keep_marks_for(longest_use: Duration) {
    let mut marks = marks();
    marks.keep_for = marks.keep_for.max(longest_use);
}

/// Marks `tag` invalidated now: entries stamped before this are no longer served.
pub(crate) fn mark(tag: &str) {
    let mut marks = marks();
    // Bumped under the lock that guards the marks, so a check that read the epoch before this
    // either sees the mark or leaves its stamp below it.
    let epoch = BOOK.epoch.fetch_add(1, Ordering::AcqRel) + 1;
    marks.set(tag, epoch, Instant::now());
}

impl Marks {
    fn set(&mut self, tag: &str, epoch: u64, now: Instant) {
        self.by_tag.insert(tag.into(), Mark { epoch, at: now });
        self.since_pruned += 1;
        if self.since_pruned >= PRUNE_EVERY {
            self.since_pruned = 0;
            let keep_for = self.keep_for;
            self.by_tag
                .retain(|_, mark| now.saturating_duration_since(mark.at) <= keep_for);
        }
    }
}

fn marks() -> MutexGuard<'static, Marks> {
    BOOK.marks.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stamp_is_current_until_one_of_its_tags_is_invalidated() {
        let user = Stamp::new(vec!["tags-test:user:1".into(), "tags-test:all".into()]);
        let other = Stamp::new(vec!["tags-test:user:2".into()]);
        assert!(user.current() && other.current());
        mark("tags-test:user:3");
        assert!(user.current() && other.current(), "another tag");
        mark("tags-test:all");
        assert!(!user.current(), "one of its tags");
        assert!(!user.current(), "and it stays so");
        assert!(other.current());
        let later = Stamp::new(vec!["tags-test:all".into()]);
        assert!(later.current(), "a load that began after the invalidation");
    }

    #[test]
    fn marks_are_dropped_once_no_entry_stamped_before_them_can_live() {
        let mut marks = Marks {
            keep_for: Duration::from_secs(60),
            ..Marks::default()
        };
        let start = Instant::now();
        for n in 0..PRUNE_EVERY {
            marks.set(&format!("old:{n}"), 1, start);
        }
        let later = start + Duration::from_secs(3600);
        for n in 0..PRUNE_EVERY {
            marks.set(&format!("new:{n}"), 2, later);
        }
        assert_eq!(
            marks.by_tag.len(),
            PRUNE_EVERY,
            "only the recent marks stay"
        );
        assert!(marks.by_tag.keys().all(|tag| tag.starts_with("new:")));
    }
}
