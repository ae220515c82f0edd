//! Resident memory per entry (issue 14): 1,000,000 entries of a `u64` key and a 100-byte
//! `String` value, in raw moka, raw quick_cache and stampede's memory tier (a
//! `#[stampede::cached]` function called for each key once).
//!
//! Each store is measured in a process of its own (this program runs itself once per store), as
//! the growth of the resident set (`/proc/self/statm`) from before the first insert to after
//! the last, divided by the entries held at the end. Every figure includes the value's own
//! heap block (100 bytes, 112 with the allocator's header), the same for every store. Linux
//! only.
//!
//! Run: `cargo bench -p stampede-benches --bench memory` (about 20 seconds).

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes live (as requested, before the allocator's own
/// rounding and headers): the heap figure next to the resident one.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Entries stored, and the capacity of every store.
const ENTRIES: u64 = 1_000_000;

const STORES: [&str; 3] = ["moka", "quick_cache", "stampede"];

fn value() -> String {
    "v".repeat(100)
}

/// The resident set of this process, in bytes.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux: /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("statm's second field: resident pages");
    pages * 4096
}

#[stampede::cached(ttl = "1h", capacity = 1_000_000, name = "memory::stampede")]
async fn stampede_value(id: u64) -> String {
    std::hint::black_box(id);
    value()
}

/// Fills one store and prints `store bytes_per_entry entries`.
fn measure(store: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    // Runtime, statics and the first allocations in place before the baseline.
    let before;
    let heap_before;
    // The store is kept (`_kept`) until it is measured.
    let (entries, _kept) = match store {
        "moka" => {
            let cache = moka::future::Cache::new(ENTRIES);
            before = resident();
            heap_before = LIVE.load(Ordering::Relaxed);
            rt.block_on(async {
                for key in 0..ENTRIES {
                    cache.insert(key, value()).await;
                }
                cache.run_pending_tasks().await;
            });
            (
                cache.entry_count(),
                Box::new(cache) as Box<dyn std::any::Any>,
            )
        }
        "quick_cache" => {
            let cache = quick_cache::sync::Cache::new(ENTRIES as usize);
            before = resident();
            heap_before = LIVE.load(Ordering::Relaxed);
            for key in 0..ENTRIES {
                cache.insert(key, value());
            }
            (
                cache.len() as u64,
                Box::new(cache) as Box<dyn std::any::Any>,
            )
        }
        "stampede" => {
            rt.block_on(stampede_value(u64::MAX));
            before = resident();
            heap_before = LIVE.load(Ordering::Relaxed);
            rt.block_on(async {
                for key in 0..ENTRIES {
                    stampede_value(key).await;
                }
            });
            let held = stampede::stats("memory::stampede").map_or(0, |stats| stats.entries) - 1;
            (held, Box::new(()) as Box<dyn std::any::Any>)
        }
        other => panic!("no store `{other}`"),
    };
    let grown = resident().saturating_sub(before);
    if let Some(cache) = _kept.downcast_ref::<quick_cache::sync::Cache<u64, String>>() {
        // What an invalidation announced by another process would cost as a scan of the store
        // (`retain`); the memory tier looks the key up by name instead (`Memory::invalidate_named`).
        let started = std::time::Instant::now();
        cache.retain(|key, _| key % 1_000 != 7);
        eprintln!(
            "quick_cache retain over {entries} entries (a scan per remote invalidation, which the memory tier avoids): {:.1?}",
            started.elapsed()
        );
    }
    let heap = LIVE.load(Ordering::Relaxed).saturating_sub(heap_before);
    println!(
        "{store} {:.1} {entries} {:.1}",
        grown as f64 / entries as f64,
        heap as f64 / entries as f64
    );
}

fn main() {
    if let Some(store) =
        std::env::args().find_map(|arg| arg.strip_prefix("--store=").map(str::to_owned))
    {
        measure(&store);
        return;
    }
    let exe = std::env::current_exe().expect("this program's path");
    let mut figures = Vec::new();
    for store in STORES {
        let out = Command::new(&exe)
            .arg(format!("--store={store}"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("runs itself");
        assert!(out.status.success(), "{store} failed");
        let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let mut fields = line.split_whitespace().skip(1);
        let bytes: f64 = fields
            .next()
            .and_then(|f| f.parse().ok())
            .expect("bytes per entry");
        let held: u64 = fields
            .next()
            .and_then(|f| f.parse().ok())
            .expect("entries held");
        figures.push((store, bytes, held));
    }
    let smaller = figures
        .iter()
        .filter(|(store, ..)| *store != "stampede")
        .map(|(_, bytes, _)| *bytes)
        .fold(f64::INFINITY, f64::min);
    println!("resident bytes per entry, {ENTRIES} inserts of u64 -> 100-byte String");
    println!(
        "{:<12} {:>12} {:>10} {:>22}",
        "store", "bytes/entry", "entries", "/ smaller raw store"
    );
    for (store, bytes, held) in figures {
        println!(
            "{store:<12} {bytes:>12.1} {held:>10} {:>21.2}x",
            bytes / smaller
        );
    }
}
