//! The module layering of `docs/architecture.md`, checked on the source: every
//! `crate::` path of a top-level module of `src/` must name a module that the table in
//! that document allows it to import, the imports must form no cycle, and no two files
//! of one module import each other. The table is read from the document itself, so the
//! document and the check cannot disagree.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `module -> modules it may import`, from the "may import" table of the document.
fn allowed() -> BTreeMap<String, BTreeSet<String>> {
    let doc = fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let mut table = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `module` | `a`, `b` | ... |
        if cells.len() < 4 || !cells[1].starts_with('`') {
            continue;
        }
        let module = cells[1].trim_matches('`').to_string();
        let imports = cells[2]
            .split(',')
            .map(|m| m.trim().trim_matches('`').to_string())
            .filter(|m| !m.is_empty() && m != "none")
            .collect();
        table.insert(module, imports);
    }
    assert!(
        !table.is_empty(),
        "docs/architecture.md has no module table"
    );
    table
}

/// Every `.rs` file of a top-level module: `src/<m>.rs` or everything under `src/<m>/`.
fn files_of(module: &str) -> Vec<PathBuf> {
    let src = Path::new(ROOT).join("src");
    let file = src.join(format!("{module}.rs"));
    let mut files = Vec::new();
    if file.exists() {
        files.push(file);
    }
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The top-level modules named by the `crate::` paths in `text`, including the
/// entries of grouped imports (`crate::{a::B, c}`).
fn imports(text: &str) -> BTreeSet<String> {
    names_after(text, "crate::")
}

/// The first path segments after each `prefix` in `text` (`crate::`, `super::`),
/// including the entries of grouped imports.
fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Names at brace depth 0 of the group, each at the start of an item.
            let mut depth = 0;
            let mut item_start = true;
            let mut name = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !name.is_empty() {
                            found.insert(std::mem::take(&mut name));
                        }
                        item_start = true;
                    }
                    c if depth == 0 && item_start && (c.is_alphanumeric() || c == '_') => {
                        name.push(c)
                    }
                    _ if depth == 0 && item_start && !name.is_empty() => {
                        found.insert(std::mem::take(&mut name));
                        item_start = false;
                    }
                    _ => {}
                }
            }
            if !name.is_empty() {
                found.insert(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(ROOT).join("src");
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if name != "lib" && name != "main" {
            modules.insert(name);
        }
    }
    modules
        .into_iter()
        .map(|module| {
            let mut used = BTreeSet::new();
            for file in files_of(&module) {
                used.extend(imports(&fs::read_to_string(file).unwrap()));
            }
            used.remove(&module);
            (module, used)
        })
        .collect()
}

#[test]
fn every_module_imports_only_what_the_architecture_allows() {
    let allowed = allowed();
    let graph = graph();
    let mut breaches = Vec::new();
    for (module, used) in &graph {
        let Some(may) = allowed.get(module) else {
            breaches.push(format!(
                "`{module}` is not in the table of docs/architecture.md"
            ));
            continue;
        };
        for import in used.difference(may) {
            breaches.push(format!("`{module}` imports `{import}`"));
        }
    }
    for module in allowed.keys() {
        if !graph.contains_key(module) {
            breaches.push(format!(
                "docs/architecture.md lists `{module}`, which src/ lacks"
            ));
        }
    }
    assert!(breaches.is_empty(), "{}", breaches.join("\n"));
}

#[test]
fn the_modules_form_no_cycle() {
    let graph = graph();
    // Depth-first search with the path on the stack: a back edge is a cycle.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        let mut path = Vec::new();
        if let Some(cycle) = visit(module, &graph, &mut path, &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

/// The code of a file without its comments (a doc link is no import) and its unit
/// tests, which may import anything.
fn without_tests(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    code.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pairs of sibling files of the module folder `dir` (not its mod.rs, which
/// declares them) that import each other, by `super::x` or `crate::<module>::x`.
fn mutual_imports(dir: &Path) -> Vec<String> {
    let module = dir.file_name().unwrap().to_string_lossy().to_string();
    let mut siblings = BTreeMap::new();
    for file in fs::read_dir(dir).unwrap() {
        let path = file.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            let code = without_tests(&fs::read_to_string(&path).unwrap());
            let mut used = names_after(&code, "super::");
            used.extend(names_after(&code, &format!("crate::{module}::")));
            siblings.insert(name, used);
        }
    }
    let mut pairs = Vec::new();
    for (a, used) in &siblings {
        for b in used {
            if a < b && siblings.get(b).is_some_and(|theirs| theirs.contains(a)) {
                pairs.push(format!("src/{module}/{a}.rs <-> src/{module}/{b}.rs"));
            }
        }
    }
    pairs
}

#[test]
fn no_two_files_of_a_module_import_each_other() {
    let src = Path::new(ROOT).join("src");
    let mut pairs = Vec::new();
    for entry in fs::read_dir(&src).unwrap() {
        let dir = entry.unwrap().path();
        if dir.is_dir() {
            pairs.extend(mutual_imports(&dir));
        }
    }
    assert!(
        pairs.is_empty(),
        "files that import each other:\n{}",
        pairs.join("\n")
    );
}

#[test]
fn two_files_that_import_each_other_are_found() {
    let dir = std::env::temp_dir()
        .join(format!("arch-{}", std::process::id()))
        .join("core");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("mod.rs"),
        "pub mod decide;\npub mod store;\npub mod key;\n",
    )
    .unwrap();
    fs::write(
        dir.join("decide.rs"),
        "use super::{Fingerprint, store::Stored};\n",
    )
    .unwrap();
    fs::write(
        dir.join("store.rs"),
        "//! Reads what [`super::key`] parsed.\nuse super::{\n    decide::{Record, State},\n};\n",
    )
    .unwrap();
    fs::write(
        dir.join("key.rs"),
        "#[cfg(test)]\nmod tests { use super::super::store; }\n",
    )
    .unwrap();
    assert_eq!(
        mutual_imports(&dir),
        ["src/core/decide.rs <-> src/core/store.rs"]
    );
    fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}

#[test]
fn grouped_imports_are_read_at_their_first_level() {
    let found = imports(
        "use crate::{api::{self, AppState}, auth::Verifier,\n    config::{self, Config}, db, tenant};\nlet x = crate::metrics::install();",
    );
    let want: BTreeSet<String> = ["api", "auth", "config", "db", "metrics", "tenant"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, want);
}

/// Every `.rs` file under `src/`: each top-level module's, and `lib.rs` and `main.rs`.
fn all_sources() -> Vec<PathBuf> {
    let src = Path::new(ROOT).join("src");
    let mut files: Vec<PathBuf> = graph().keys().flat_map(|m| files_of(m)).collect();
    files.extend(["lib.rs", "main.rs"].map(|f| src.join(f)));
    files
}

/// `file: needle` for each of `needles` that the code of each of `files` (without
/// comments and unit tests) contains.
fn mentions(files: impl IntoIterator<Item = PathBuf>, needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = without_tests(&fs::read_to_string(&file).unwrap());
        for needle in needles {
            if text.contains(needle) {
                found.push(format!("{}: {needle}", file.display()));
            }
        }
    }
    found
}

/// SQL reaches PostgreSQL one way, through `db::Sql`, which carries the statement mode
/// (named directly, unnamed behind a transaction pooler): a statement built anywhere
/// else could be sent the wrong way and would fail only behind PgBouncer. The `db`
/// module itself is the exception: it is the executor, and its listener's round trip
/// runs on the `LISTEN` session, which is always direct.
#[test]
fn sql_is_sent_only_through_the_executor() {
    let db_module = Path::new(ROOT).join("src/db");
    let found = mentions(
        all_sources()
            .into_iter()
            .filter(|f| !f.ends_with("src/db.rs") && !f.starts_with(&db_module)),
        &[
            "sqlx::query",
            "sqlx::raw_sql",
            ".persistent(",
            "Statements::",
        ],
    );
    assert!(
        found.is_empty(),
        "build statements with db::Sql instead:\n{}",
        found.join("\n")
    );
}

/// The source files of the module at `path` below `src/` (`["outbox", "sink"]`): its
/// file, or its folder's `mod.rs`.
fn module_file(path: &[&str]) -> Option<PathBuf> {
    let base = Path::new(ROOT).join("src").join(path.join("/"));
    let file = base.with_extension("rs");
    let folder = base.join("mod.rs");
    [file, folder].into_iter().find(|f| f.exists())
}

/// Whether the module source `text` declares or re-exports `name`.
fn declares(text: &str, name: &str) -> bool {
    let kinds = [
        "fn",
        "struct",
        "enum",
        "const",
        "static",
        "trait",
        "type",
        "mod",
        "macro_rules!",
    ];
    kinds
        .iter()
        .any(|kind| text.contains(&format!("{kind} {name}")))
        || text.contains(&format!("{name},")) && text.contains("pub use")
        || text.contains(&format!("{name}}};"))
        || text.contains(&format!("::{name};"))
        // `label_enum!` and `settings!` declare `pub Name {` and `pub struct Name {`.
        || text.contains(&format!("pub {name} {{"))
}

/// Every `a::b::c` path `docs/architecture.md` names in backticks: each leading segment
/// a module of `src/`, the last one a module or something its parent declares, so the
/// document cannot send a reader to code that moved.
#[test]
fn every_path_the_architecture_names_exists() {
    let doc = fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let mut missing = Vec::new();
    for token in doc.split('`').skip(1).step_by(2) {
        let segments: Vec<&str> = token.split("::").collect();
        let is_path = segments.len() > 1
            && segments
                .iter()
                .all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            && segments[0]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_');
        if !is_path || segments[0] == "crate" {
            continue;
        }
        let (last, parents) = segments.split_last().unwrap();
        let Some(parent) = module_file(parents) else {
            missing.push(format!("`{token}`: no module {}", parents.join("::")));
            continue;
        };
        if module_file(&segments).is_none() && !declares(&fs::read_to_string(parent).unwrap(), last)
        {
            missing.push(format!(
                "`{token}`: {} declares no `{last}`",
                parents.join("::")
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The application layer is transport-neutral: no HTTP types (statuses, headers), no
/// media types and no server framework in `service`; the transports map its problems
/// to theirs and hand it the statuses and media types of what it stores
/// (`service::Framing`).
#[test]
fn the_application_layer_names_no_http_type() {
    let found = mentions(
        files_of("service"),
        &[
            "http::",
            "poem::",
            "HeaderName",
            "HeaderValue",
            "StatusCode",
            "application/json",
            "application/problem+json",
        ],
    );
    assert!(
        found.is_empty(),
        "HTTP in the application layer:\n{}",
        found.join("\n")
    );
}

/// The database's layout is looked at in one place, where a concern's two forms are
/// picked (`db::layout`): a test of it anywhere else is a third form in the making,
/// and the two forms of a concern drift apart when they live in branches far apart.
#[test]
fn the_layout_is_looked_at_only_where_a_form_is_picked() {
    let layout = Path::new(ROOT).join("src/db/layout.rs");
    let found = mentions(
        all_sources().into_iter().filter(|f| *f != layout),
        &[
            "distributed()",
            "== Layout::",
            "!= Layout::",
            "Layout::of(",
            "Layout::DISTRIBUTED",
            "Layout::ONE_SERVER",
            ".replace(\"e.tenant_id",
        ],
    );
    assert!(
        found.is_empty(),
        "declare the concern's two forms as a db::Forms and pick one with Layout::pick:\n{}",
        found.join("\n")
    );
}

/// Every task runs under a supervisor, so that shutdown waits for it (`supervisor`):
/// a task spawned any other way is cut off half-way at shutdown. Aside: the HTTP
/// server's per-connection tasks (the server drains them itself), and the pool's
/// settling of a connection dropped unfinished (spawned from a `Drop`, bounded by the
/// database deadline, and over once the pool is).
#[test]
fn every_task_is_spawned_through_a_supervisor() {
    let src = Path::new(ROOT).join("src");
    let allowed = [
        src.join("supervisor.rs"),
        src.join("api/server.rs"),
        src.join("db/pool.rs"),
    ];
    let found = mentions(
        all_sources().into_iter().filter(|f| !allowed.contains(f)),
        &[
            "tokio::spawn",
            "task::spawn(",
            "Handle::current",
            "Handle::try_current",
            "JoinSet",
        ],
    );
    assert!(
        found.is_empty(),
        "spawn through supervisor::Supervisor or supervisor::Jobs:\n{}",
        found.join("\n")
    );
}

/// The HTTP crate stays in the transports: below `api` (and the `app` and `cli` that
/// compose it) nothing names `poem::`. The views' and problems' OpenAPI schemas
/// (`poem_openapi` derives on data types) are descriptions of data, not HTTP, and stay
/// with the types they describe (docs/adr).
#[test]
fn nothing_below_the_transports_names_the_http_crate() {
    // `fuzzing` drives the transports' parsers as a client would, so it stands above
    // them with the binary's own modules.
    let above = ["api", "app", "cli", "fuzzing"];
    let files = graph()
        .keys()
        .filter(|m| !above.contains(&m.as_str()))
        .flat_map(|m| files_of(m))
        .collect::<Vec<_>>();
    let found = mentions(files, &["poem::"]);
    assert!(
        found.is_empty(),
        "HTTP below the transports:\n{}",
        found.join("\n")
    );
}

/// A newcomer finds every part from the documents: each top-level module of `src/` is
/// described in `docs/architecture.md` (as `**`module`**`) and placed in the README's
/// layout (`src/module.rs` or `src/module/`), and every subcommand of `orderd` has its
/// row in the README's command table (`| `orderd outbox stats ...`).
#[test]
fn every_module_and_subcommand_is_in_the_documents() {
    use clap::CommandFactory;
    let architecture = fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let readme = fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let mut missing = Vec::new();
    for module in graph().keys() {
        if !architecture.contains(&format!("**`{module}`**")) {
            missing.push(format!("docs/architecture.md describes no **`{module}`**"));
        }
        let (file, folder) = (format!("src/{module}.rs "), format!("src/{module}/ "));
        if !readme.contains(&file) && !readme.contains(&folder) {
            missing.push(format!("the README's layout has no src/{module}"));
        }
    }
    let mut commands = Vec::new();
    for command in orderd::cli::Cli::command().get_subcommands() {
        let name = command.get_name().to_string();
        let subs: Vec<String> = command
            .get_subcommands()
            .map(|s| format!("{name} {}", s.get_name()))
            .collect();
        if subs.is_empty() {
            commands.push(name);
        } else {
            commands.extend(subs);
        }
    }
    for command in commands {
        if !readme.contains(&format!("| `orderd {command}")) {
            missing.push(format!(
                "the README's command table has no `orderd {command}`"
            ));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
