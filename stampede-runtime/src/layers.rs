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
    ("config", 1),
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

/// The modules of the Redis tier (`redis/`) and their layers, by the same rule: the codec (no
/// Redis in it), the transport (a configured Redis, its connections and feed), the protocol
/// (what a key's calls do there). `redis/mod.rs`, the tier's face, may import any of them.
const REDIS_LAYERS: &[(&str, u8)] = &[
    // The codec: a value's and a key's bytes.
    ("payload", 0),
    ("keys", 0),
    ("shape", 0),
    ("bounds", 0),
    ("envelope", 1),
    ("fuzz", 2),
    // The transport.
    ("failure", 0),
    ("tls", 0),
    ("telemetry", 0),
    ("scripts", 0),
    ("feed", 0),
    ("refusal", 1),
    ("mode", 1),
    ("pubsub", 1),
    ("dirty", 1),
    ("config", 2),
    ("link", 2),
    ("health", 3),
    ("invalidate", 3),
    ("endpoint", 4),
    ("installed", 5),
    ("cleaning", 5),
    // The protocol.
    ("ops", 5),
    ("lock", 5),
    ("preflight", 5),
    ("tier", 5),
    ("tags", 6),
    ("flow", 7),
    ("calls", 8),
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
    let layers: BTreeMap<&str, u8> = REDIS_LAYERS.iter().copied().collect();
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
        if parts == ["mod"] || parts.contains(&"tests") {
            continue;
        }
        let module = parts[0];
        let Some(&layer) = layers.get(module) else {
            violations.push(format!("redis::{module}: not in the table of layers"));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let code = without_tests(&text);
        let mut named = paths_after(code, "crate::redis::");
        // In `redis/`, `super::` is the tier's module; in a folder below, the module itself.
        if parts.len() == 1 {
            named.extend(paths_after(code, "super::"));
        }
        for named in named {
            if named == module || named.chars().next().is_some_and(char::is_uppercase) {
                continue; // itself, or an item of `redis/mod.rs` (`Busy`, `RedisConfig`)
            }
            match layers.get(named.as_str()) {
                Some(&other) if other < layer => {}
                Some(&other) => violations.push(format!(
                    "redis/{} (layer {layer}) imports redis::{named} (layer {other})",
                    relative.display()
                )),
                None if named.chars().all(|c| c.is_lowercase() || c == '_') && !is_item(&named) => {
                    violations.push(format!(
                        "redis/{} names redis::{named}, not in the table",
                        relative.display()
                    ));
                }
                None => {}
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Functions of `redis/mod.rs` that its modules call (`super::not_configured`).
fn is_item(name: &str) -> bool {
    ["not_configured"].contains(&name)
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
