//! The import graph of the runtime: each module imports only modules below it, so the core's
//! modules form no circle. A module's place is its layer here; a `crate::` path in its sources
//! (tests aside) that names a module of its own layer or above fails the test, as does a
//! module missing from the table.

use std::collections::BTreeMap;
use std::path::Path;

/// Every module of the crate and its layer: a module may import modules of lower layers only.
const LAYERS: &[(&str, u8)] = &[
    // The leaves.
    ("kv", 0),
    ("error", 0),
    ("clock", 0),
    ("random", 0),
    ("budget", 0),
    ("order", 0),
    ("previous", 0),
    ("answer", 0),
    ("names", 0),
    ("config", 1),
    ("tuning", 2),
    ("given", 2),
    ("tags", 1),
    ("breaker", 1),
    ("checks", 1),
    ("telemetry", 2),
    ("hot", 2),
    ("entry", 2),
    ("load", 3),
    ("limit", 3),
    ("stats", 3),
    ("flight", 3),
    ("memory", 3),
    ("registry", 4),
    // The state lent to tiers, then what a tier reports and is lent.
    ("core", 5),
    ("tier", 6),
    // A shared tier, and the path of a call: beside each other, neither names the other.
    ("redis", 7),
    ("cache", 7),
    // What the generated code calls, and the public calls.
    ("slot", 8),
    ("witness", 9),
    ("api", 10),
    ("lib", 11),
];

/// Test-only modules, which may use anything.
const TESTS: &[&str] = &["layers", "testing"];

/// The modules of the Redis tier (`redis/`), in three folders that import downwards only: the
/// codec (a value's and a key's bytes, no Redis in it), the transport (a configured Redis, its
/// connections and feed), the protocol (what a key's calls do there). Within a folder, a module
/// imports modules of lower layers only. `redis/mod.rs`, the tier's face, may import any of them.
const REDIS_FOLDERS: &[&str] = &["codec", "transport", "protocol"];

/// Each module of the Redis tier: its folder and its layer there.
const REDIS_LAYERS: &[(&str, &str, u8)] = &[
    ("codec", "payload", 0),
    ("codec", "keys", 0),
    ("codec", "shape", 0),
    ("codec", "bounds", 0),
    ("codec", "envelope", 1),
    ("codec", "fuzz", 2),
    ("transport", "failure", 0),
    ("transport", "tls", 0),
    ("transport", "telemetry", 0),
    ("transport", "feed", 0),
    ("transport", "log", 0),
    ("transport", "refusal", 1),
    ("transport", "mode", 1),
    ("transport", "pubsub", 1),
    ("transport", "dirty", 1),
    ("transport", "config", 2),
    ("transport", "link", 2),
    ("transport", "health", 3),
    ("transport", "invalidate", 3),
    ("transport", "endpoint", 4),
    ("transport", "installed", 5),
    ("transport", "cleaning", 5),
    ("protocol", "scripts", 0),
    ("protocol", "ops", 1),
    ("protocol", "lock", 1),
    ("protocol", "preflight", 1),
    ("protocol", "tags", 2),
    ("protocol", "clear", 3),
    ("protocol", "shapes", 2),
    ("protocol", "tier", 3),
    ("protocol", "flow", 4),
    ("protocol", "calls", 5),
];

#[test]
fn every_module_imports_only_modules_below_it() {
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    let mut files = Vec::new();
    collect(&src, &mut files);
    assert!(files.len() > 20, "the sources were not found under {src:?}");
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let module = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs");
        if TESTS.contains(&module) {
            continue;
        }
        let Some(&layer) = layers.get(module) else {
            violations.push(format!("{module}: not in the table of layers"));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for named in crate_paths(without_tests(&text)) {
            if named == module || TESTS.contains(&named.as_str()) {
                continue;
            }
            match layers.get(named.as_str()) {
                Some(&other) if other < layer => {}
                Some(&other) => violations.push(format!(
                    "{} (layer {layer}) imports {named} (layer {other})",
                    relative.display()
                )),
                None => violations.push(format!(
                    "{} names crate::{named}, not in the table",
                    relative.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn every_module_of_the_redis_tier_imports_only_modules_below_it() {
    let place = |folder: &str, module: &str| {
        let rank = REDIS_FOLDERS.iter().position(|&f| f == folder)?;
        REDIS_LAYERS
            .iter()
            .find(|&&(f, m, _)| f == folder && m == module)
            .map(|&(_, _, layer)| (rank, layer))
    };
    let redis = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join("redis");
    let mut violations = Vec::new();
    let mut files = Vec::new();
    collect(&redis, &mut files);
    for file in files {
        let relative = file.strip_prefix(&redis).unwrap();
        let parts: Vec<&str> = relative
            .components()
            .map(|part| part.as_os_str().to_str().unwrap().trim_end_matches(".rs"))
            .collect();
        // `mod.rs`, the face; `codec.rs` and the like, which declare their folder's modules.
        if parts.len() == 1 || parts.contains(&"tests") {
            if parts.len() == 1 && parts[0] != "mod" && !REDIS_FOLDERS.contains(&parts[0]) {
                violations.push(format!("redis/{}: not in a folder", relative.display()));
            }
            continue;
        }
        let (folder, module) = (parts[0], parts[1]);
        let Some(own) = place(folder, module) else {
            violations.push(format!(
                "redis::{folder}::{module}: not in the table of layers"
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let code = without_tests(&text);
        let mut named: Vec<(&str, String)> = Vec::new();
        for &other in REDIS_FOLDERS {
            let start = format!("crate::redis::{other}::");
            named.extend(paths_after(code, &start).into_iter().map(|m| (other, m)));
        }
        // In a folder, `super::` is the folder's module; below a module, the module itself.
        if parts.len() == 2 {
            named.extend(
                paths_after(code, "super::")
                    .into_iter()
                    .map(|m| (folder, m)),
            );
        }
        for (other_folder, other) in named {
            if (other_folder, other.as_str()) == (folder, module)
                || other.chars().next().is_some_and(char::is_uppercase)
            {
                continue; // itself, or an item of its folder's parent (`super::Tls` in a test)
            }
            match place(other_folder, &other) {
                Some(theirs) if theirs < own => {}
                Some(_) => violations.push(format!(
                    "redis/{} ({folder}, layer {}) imports redis::{other_folder}::{other}",
                    relative.display(),
                    own.1
                )),
                None => violations.push(format!(
                    "redis/{} names redis::{other_folder}::{other}, not in the table",
                    relative.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

fn collect(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The text before the file's unit tests (`#[cfg(test)] mod tests`, last by convention).
fn without_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    }
}

/// The top-level modules named by `crate::` paths in `text`, comments aside; a `use crate::{a,
/// b}` group names each.
fn crate_paths(text: &str) -> Vec<String> {
    paths_after(text, "crate::")
}

/// The first names of the paths that start with `start` in `text` (`crate::`, `super::`),
/// comments aside; a `use start{a, b}` group names each.
fn paths_after(text: &str, start: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(start) {
        let before = rest[..at].chars().last();
        rest = &rest[at + start.len()..];
        // `$crate::`, `stampede_crate::` and the like are other paths.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                named.push(ident(item.trim()));
            }
        } else {
            named.push(ident(rest));
        }
    }
    named.retain(|name| !name.is_empty());
    named
}

fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}
