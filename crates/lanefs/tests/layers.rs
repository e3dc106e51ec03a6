//! The layering of docs/ARCHITECTURE.md, checked on the source: a module of the engine crate
//! refers (`crate::x` paths outside comments and test code) only to modules of its own layer or
//! below. The known departures are listed here with why they exist; a new one fails the test,
//! and so does a listed one that is gone (the list only shrinks).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module's layer, bottom first (docs/ARCHITECTURE.md, "The layers"). Modules in
/// one layer may use one another.
const LAYERS: &[(&str, u32)] = &[
    // Primitives every layer uses: per-CPU slots, the lock hierarchy.
    ("sync", 0),
    // Deterministic pseudo-random numbers for the harnesses and tests (lanefs-crashtest, the bench).
    ("rng", 0),
    ("device", 1),
    // The error type names device errors (a shut-down device's EIO).
    ("error", 2),
    ("format", 3),
    // Inode generation arithmetic: the checkpoint's counter is in the format.
    ("generation", 3),
    ("checkpoint", 4),
    ("seg", 5),
    ("nat", 5),
    ("node", 5),
    ("diskdir", 5),
    ("gc", 5),
    ("journal", 6),
    // The region keeps the NAT and the lane journals: it sits on the journal's records.
    ("pmem", 7),
    // DISKFS's state of a mount (`Disk`): the device, NAT, segments, lanes and journal chains,
    // the region's NAT and journals among them.
    ("disk", 8),
    ("oplog", 9),
    ("flush", 9),
    ("mem", 10),
    ("perm", 10),
    ("acl", 10),
    ("engine", 11),
    // Mount builds the engine.
    ("recovery", 12),
    ("fs", 13),
    ("fsctl", 13),
    ("fs_seek", 13),
    ("mkfs", 13),
    ("fsck", 13),
    ("inspect", 13),
    // Re-exports of internals for these integration tests (a hidden module, not API): it only
    // names modules below it.
    ("testing", 14),
];

/// Upward references that exist today: (from, to, why). Issue 15 split `Engine`'s state into
/// one part per layer (`disk::Disk`, `mem::Memfs`, `flush::checkpoint::Checkpointer`) and moved
/// what uses one part alone onto it; what is left joins the parts, so it needs the whole engine.
const KNOWN_DEPARTURES: &[(&str, &str, &str)] = &[
    (
        "mem",
        "engine",
        "MEMFS's operations (mem/ops/, atime.rs, perm.rs) are `impl Engine` blocks: besides MEMFS's \
         state they admit space against the disk, stamp with the engine's clock, load inodes from \
         disk and ask the checkpointer for checkpoints; they also take `engine::now`",
    ),
    (
        "flush",
        "engine",
        "fsync, writeback and checkpoints are `impl Engine` blocks: they write MEMFS's changes to the \
         disk's lanes under the checkpointer's gate, so they use all three parts",
    ),
    ("flush", "mem", "flush reads MEMFS's mnodes and page maps directly, not through an interface"),
    (
        "gc",
        "engine",
        "the cleaner's rounds are `impl Engine` blocks: they load and mark mnodes dirty in MEMFS and \
         wait for the checkpointer; its state (`Cleaner`) is in gc.rs, held by the `Checkpointer`",
    ),
];

/// The `crate::x` modules named by `src`, outside comments and after-`#[cfg(test)]` code.
fn referenced(src: &str) -> BTreeSet<String> {
    let code = src.split("#[cfg(test)]").next().unwrap_or("");
    let code: String =
        code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let ident =
        |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    // Bounded by the code's length: each step moves past one `crate::`.
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.insert(ident(rest));
            continue;
        };
        // `use crate::{a::b, c::{d, e}}`, over any number of lines: the first segment of each
        // item at the group's own depth.
        let mut depth = 0usize;
        let mut item_start = true;
        for (k, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => item_start = true,
                c if item_start && (c.is_ascii_alphanumeric() || c == '_') => {
                    out.insert(ident(&group[k..]));
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            // A crate's own build directory (the fuzz targets') holds no sources.
            if p.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn modules_refer_only_to_their_layer_and_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut found: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut modules = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_str().unwrap();
        let module = top.trim_end_matches(".rs");
        let name = f.file_name().unwrap().to_str().unwrap();
        // Test modules in files of their own.
        if module == "lib" || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let Some(&from) = layer.get(module) else {
            panic!("src/{top} is in no layer: add it to LAYERS (and to docs/ARCHITECTURE.md)");
        };
        modules.insert(module.to_string());
        for to in referenced(&std::fs::read_to_string(f).unwrap()) {
            match layer.get(to.as_str()) {
                Some(&l) if l > from => {
                    found.entry((module.to_string(), to)).or_default().push(rel.display().to_string());
                }
                _ => {}
            }
        }
    }
    assert!(modules.len() >= 20, "the walk found the crate's modules: {modules:?}");
    let known: BTreeSet<(String, String)> =
        KNOWN_DEPARTURES.iter().map(|(a, b, _)| (a.to_string(), b.to_string())).collect();
    let new: Vec<_> = found.iter().filter(|(k, _)| !known.contains(*k)).collect();
    assert!(
        new.is_empty(),
        "modules refer to layers above their own (docs/ARCHITECTURE.md, \"The layers\"): {new:#?}"
    );
    let gone: Vec<_> = known.iter().filter(|k| !found.contains_key(*k)).collect();
    assert!(gone.is_empty(), "departures no longer there: remove them from KNOWN_DEPARTURES: {gone:?}");
}

#[test]
fn the_reference_scanner_reads_paths_groups_and_skips_comments_and_tests() {
    let src = "use crate::seg::LaneSet;\nuse crate::{format::{node, sit}, journal};\nuse crate::{\n    nat::NatTable,\n    \
               oplog,\n};\n// crate::mem in a comment\nfn f() { crate::device::x(); }\n#[cfg(test)]\nmod tests { use \
               crate::fs; }\n";
    let got: Vec<String> = referenced(src).into_iter().collect();
    assert_eq!(got, ["device", "format", "journal", "nat", "oplog", "seg"]);
}

/// Issue 15's bound on a file a reader must hold in mind at once, over every crate's sources
/// and tests (scripts/structure counts the same).
const MAX_FILE_LINES: usize = 800;

#[test]
fn no_source_file_in_the_workspace_is_over_800_lines() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&crates, &mut files);
    // The walk must have found the workspace, not a stray directory.
    assert!(files.len() >= 100, "{} Rust files under {}", files.len(), crates.display());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > MAX_FILE_LINES).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_FILE_LINES} lines: split them by job: {long:?}");
}
