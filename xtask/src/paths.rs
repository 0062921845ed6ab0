//! One public path to each name (issue #25): a source scan of the library crates that fails
//! when an item can be named from outside its crate by two paths, e.g. a `pub use` at the crate
//! root of an item whose own module is `pub` as well (`rmm_allocator::DeviceBuffer` and
//! `rmm_allocator::container::DeviceBuffer`), or a `pub use` of another crate's item (a second
//! path to a dependency's name).
//!
//! The facade (`rmm`) may re-export its member crates as modules (`pub use rmm_allocator as
//! allocator`), and its `prelude` may re-export anything: a prelude is a second path by design.
//!
//! The scan reads the module tree as rustfmt lays it out: items of a file at column 0, those of
//! an inline module (`pub mod prelude {`) four spaces further in. It follows `mod` declarations
//! to their files, expands `pub use` trees (`a::{b::{C, D}, E as F}`), and resolves each
//! re-export through private modules' own re-exports to the item's definition; every public
//! path to that definition is counted. Glob re-exports (`pub use a::*`) are refused outside a
//! prelude, as they hide which names they export.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The library crates checked: the crate's name and its root file, relative to the workspace
/// root. The last one is the facade.
pub const CRATES: [(&str, &str); 5] = [
    ("rmm_allocator", "allocator/src/lib.rs"),
    ("rmm_config", "config/src/lib.rs"),
    ("rmm_runtime", "runtime/src/lib.rs"),
    ("rmm_cli", "cli/src/lib.rs"),
    ("rmm", "src/lib.rs"),
];

/// The facade's module that may re-export anything.
const PRELUDE: &str = "prelude";

/// One `pub use` leaf: the name it exports and the path it names, as written.
#[derive(Debug, Clone)]
struct Reexport {
    name: String,
    target: Vec<String>,
    glob: bool,
    at: String,
}

/// One module of a crate.
#[derive(Debug, Default)]
struct Module {
    /// Its path inside the crate (empty for the root).
    path: Vec<String>,
    /// Nameable from outside the crate: every module on its path is `pub`.
    public: bool,
    /// Its child modules by name (declared with `mod`, of any visibility).
    children: BTreeMap<String, usize>,
    reexports: Vec<Reexport>,
}

/// Where a re-exported name is defined.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Origin {
    /// Defined in this crate: the module's path and the item's name.
    Local(Vec<String>, String),
    /// Another crate's item (the path as written, from the crate name).
    Extern(Vec<String>),
}

/// A crate's modules, read from its sources.
struct CrateTree {
    name: String,
    /// The workspace root, which file names in findings are relative to.
    base: PathBuf,
    modules: Vec<Module>,
}

impl CrateTree {
    fn read(name: &str, base: &Path, root_file: &Path) -> Result<CrateTree, String> {
        let mut tree = CrateTree {
            name: name.to_string(),
            base: base.to_path_buf(),
            modules: vec![Module {
                public: true,
                ..Module::default()
            }],
        };
        let dir = root_file
            .parent()
            .map_or_else(PathBuf::new, Path::to_path_buf);
        tree.read_file(0, root_file, &dir)?;
        Ok(tree)
    }

    /// Reads `file` as the module `index`, whose child modules' files lie in `dir`.
    fn read_file(&mut self, index: usize, file: &Path, dir: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let lines: Vec<&str> = text.lines().collect();
        let mut at = 0;
        self.read_items(index, &lines, &mut at, 0, file, dir)
    }

    /// Reads the items of module `index` from `lines[*at..]` at `indent` spaces, up to the
    /// line that closes an inline module (or the end of the file).
    fn read_items(
        &mut self,
        index: usize,
        lines: &[&str],
        at: &mut usize,
        indent: usize,
        file: &Path,
        dir: &Path,
    ) -> Result<(), String> {
        let pad = " ".repeat(indent);
        // An inline module ends at the brace under its `mod` line.
        let close = format!("{}}}", " ".repeat(indent.saturating_sub(4)));
        while *at < lines.len() {
            let line = lines[*at];
            let number = *at + 1;
            *at += 1;
            if indent > 0 && line == close {
                return Ok(());
            }
            let Some(item) = line.strip_prefix(&pad) else {
                continue;
            };
            if item.starts_with(' ') {
                continue;
            }
            let shown_file = file.strip_prefix(&self.base).unwrap_or(file);
            let where_ = format!("{}:{number}", shown_file.display());
            if let Some((public, name, inline)) = module_declaration(item) {
                let child = self.add_child(index, &name, public);
                if inline {
                    self.read_items(child, lines, at, indent + 4, file, &dir.join(&name))?;
                } else {
                    let (child_file, child_dir) = module_file(dir, &name).ok_or_else(|| {
                        format!(
                            "{where_}: no file for module {name} under {}",
                            dir.display()
                        )
                    })?;
                    self.read_file(child, &child_file, &child_dir)?;
                }
            } else if let Some(rest) = item.strip_prefix("pub use ") {
                let mut statement = rest.to_string();
                while !statement.trim_end().ends_with(';') && *at < lines.len() {
                    statement.push(' ');
                    statement.push_str(lines[*at].trim());
                    *at += 1;
                }
                let body = statement.trim_end().trim_end_matches(';');
                let leaves =
                    parse_use_tree(body).map_err(|e| format!("{where_}: pub use {body}: {e}"))?;
                for (target, alias, glob) in leaves {
                    let name = alias.or_else(|| target.last().cloned()).unwrap_or_default();
                    self.modules[index].reexports.push(Reexport {
                        name,
                        target,
                        glob,
                        at: where_.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    fn add_child(&mut self, parent: usize, name: &str, public: bool) -> usize {
        let mut path = self.modules[parent].path.clone();
        path.push(name.to_string());
        let index = self.modules.len();
        self.modules.push(Module {
            path,
            public: public && self.modules[parent].public,
            ..Module::default()
        });
        self.modules[parent]
            .children
            .insert(name.to_string(), index);
        index
    }

    /// The module at `path`, if the crate declares it.
    fn module(&self, path: &[String]) -> Option<usize> {
        let mut index = 0;
        for segment in path {
            index = *self.modules[index].children.get(segment)?;
        }
        Some(index)
    }

    /// `target` as written in module `from`, made absolute (`None`: another crate's path).
    fn absolute(&self, from: usize, target: &[String]) -> Option<Vec<String>> {
        let here = &self.modules[from];
        let first = target.first()?;
        match first.as_str() {
            "crate" => Some(target[1..].to_vec()),
            "self" => Some([here.path.as_slice(), &target[1..]].concat()),
            "super" => {
                let mut base = here.path.clone();
                let mut rest = target;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                Some([base.as_slice(), rest].concat())
            }
            name if here.children.contains_key(name) => {
                Some([here.path.as_slice(), target].concat())
            }
            _ => None,
        }
    }

    /// Where the name that `target` (written in module `from`) names is defined, following
    /// re-exports (at most `depth` more).
    fn origin(&self, from: usize, target: &[String], depth: usize) -> Origin {
        let Some(path) = self.absolute(from, target) else {
            return Origin::Extern(target.to_vec());
        };
        let Some((name, modules)) = path.split_last() else {
            return Origin::Local(Vec::new(), String::new());
        };
        // Walk down the modules; a segment that is a re-export (a module renamed or from
        // another crate) continues from what it re-exports.
        let mut index = 0;
        for (i, segment) in modules.iter().enumerate() {
            if let Some(&child) = self.modules[index].children.get(segment) {
                index = child;
                continue;
            }
            if let Some(r) = self.find_reexport(index, segment)
                && depth > 0
            {
                let mut rest = r.target.clone();
                rest.extend(path[i + 1..].iter().cloned());
                return self.origin(index, &rest, depth - 1);
            }
            return Origin::Local(modules.to_vec(), name.clone());
        }
        match self.find_reexport(index, name) {
            Some(r) if depth > 0 => self.origin(index, &r.target.clone(), depth - 1),
            _ => Origin::Local(self.modules[index].path.clone(), name.clone()),
        }
    }

    fn find_reexport(&self, module: usize, name: &str) -> Option<&Reexport> {
        self.modules[module]
            .reexports
            .iter()
            .find(|r| !r.glob && r.name == name)
    }

    /// The ways this crate breaks "one public path to each name", one line each.
    fn findings(&self, facade: bool) -> Vec<String> {
        let mut paths: BTreeMap<Origin, Vec<String>> = BTreeMap::new();
        let mut found = Vec::new();
        for (index, module) in self.modules.iter().enumerate() {
            if !module.public {
                continue;
            }
            let in_prelude = facade && module.path.first().is_some_and(|m| m == PRELUDE);
            for r in &module.reexports {
                if in_prelude {
                    continue;
                }
                let shown = self.shown(&module.path, &r.name);
                if r.glob {
                    found.push(format!(
                        "{}: `pub use {}::*` in {}: a glob re-export; name the items",
                        r.at,
                        r.target.join("::"),
                        self.shown(&module.path, "")
                    ));
                    continue;
                }
                let origin = self.origin(index, &r.target, 16);
                if let Origin::Extern(path) = &origin {
                    // The facade's member crates as modules: `pub use rmm_allocator as allocator`.
                    let crate_alias = facade && module.path.is_empty() && path.len() == 1;
                    if !crate_alias {
                        found.push(format!(
                            "{}: {shown} re-exports {}, another crate's item: a second path to \
                             it (name it by its own crate's path)",
                            r.at,
                            path.join("::")
                        ));
                        continue;
                    }
                }
                paths
                    .entry(origin)
                    .or_default()
                    .push(format!("{shown} ({})", r.at));
            }
        }
        for (origin, shown) in &mut paths {
            if let Origin::Local(module, name) = origin
                && let Some(index) = self.module(module)
                && self.modules[index].public
            {
                shown.insert(0, format!("{} (its definition)", self.shown(module, name)));
            }
            if shown.len() > 1 {
                let name = match origin {
                    Origin::Local(_, name) => name.clone(),
                    Origin::Extern(path) => path.join("::"),
                };
                found.push(format!(
                    "{}: `{name}` has {} public paths: {} (keep one: make the module private, or \
                     drop the re-export)",
                    self.name,
                    shown.len(),
                    shown.join(", ")
                ));
            }
        }
        found
    }

    /// `crate::module::name` as a user writes it.
    fn shown(&self, module: &[String], name: &str) -> String {
        let mut parts = vec![self.name.clone()];
        parts.extend(module.iter().cloned());
        if !name.is_empty() {
            parts.push(name.to_string());
        }
        parts.join("::")
    }
}

/// `pub mod x;` / `mod x {` / `pub(crate) mod x;`: (public, name, inline).
fn module_declaration(item: &str) -> Option<(bool, String, bool)> {
    let (public, rest) = if let Some(rest) = item.strip_prefix("pub mod ") {
        (true, rest)
    } else if let Some(rest) = item.strip_prefix("mod ") {
        (false, rest)
    } else if item.starts_with("pub(") {
        let close = item.find(") mod ")?;
        (false, &item[close + ") mod ".len()..])
    } else {
        return None;
    };
    let rest = rest.trim_end();
    let (name, inline) = if let Some(name) = rest.strip_suffix(';') {
        (name, false)
    } else if let Some(name) = rest.strip_suffix('{') {
        (name.trim_end(), true)
    } else {
        return None;
    };
    let name = name.strip_prefix("r#").unwrap_or(name);
    let is_ident = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    is_ident.then(|| (public, name.to_string(), inline))
}

/// The file of module `name` declared with its files in `dir`, and its children's directory.
fn module_file(dir: &Path, name: &str) -> Option<(PathBuf, PathBuf)> {
    let flat = dir.join(format!("{name}.rs"));
    let nested = dir.join(name).join("mod.rs");
    if flat.is_file() {
        Some((flat, dir.join(name)))
    } else if nested.is_file() {
        Some((nested, dir.join(name)))
    } else {
        None
    }
}

/// The leaves of a use tree: (path, alias, glob).
type Leaves = Vec<(Vec<String>, Option<String>, bool)>;

/// Expands `a::{b::{C, D as E}, self, *}` into its leaves.
fn parse_use_tree(text: &str) -> Result<Leaves, String> {
    let tokens = tokenize(text);
    let mut at = 0;
    let mut leaves = Vec::new();
    parse_tree(&tokens, &mut at, &[], &mut leaves)?;
    if at != tokens.len() {
        return Err(format!("unexpected {:?}", tokens[at]));
    }
    Ok(leaves)
}

fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' || c == '#' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            tokens.push(std::mem::take(&mut word));
        }
        match c {
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                tokens.push("::".into());
            }
            '{' | '}' | ',' | '*' => tokens.push(c.to_string()),
            _ => {}
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

fn parse_tree(
    tokens: &[String],
    at: &mut usize,
    prefix: &[String],
    leaves: &mut Leaves,
) -> Result<(), String> {
    let mut path = prefix.to_vec();
    loop {
        let token = tokens.get(*at).ok_or("unexpected end")?;
        match token.as_str() {
            "{" => {
                *at += 1;
                loop {
                    if tokens.get(*at).is_some_and(|t| t == "}") {
                        *at += 1;
                        return Ok(());
                    }
                    parse_tree(tokens, at, &path, leaves)?;
                    match tokens.get(*at).map(String::as_str) {
                        Some(",") => *at += 1,
                        Some("}") => {}
                        other => return Err(format!("expected , or }} and found {other:?}")),
                    }
                }
            }
            "*" => {
                *at += 1;
                leaves.push((path, None, true));
                return Ok(());
            }
            // `a::{self, B}`: `a` itself (a leading `self::` is kept and resolved later).
            "self" if !path.is_empty() => {
                *at += 1;
            }
            word => {
                let word = word.strip_prefix("r#").unwrap_or(word);
                path.push(word.to_string());
                *at += 1;
            }
        }
        if tokens.get(*at).is_some_and(|t| t == "::") {
            *at += 1;
            continue;
        }
        let alias = if tokens.get(*at).is_some_and(|t| t == "as") {
            let alias = tokens.get(*at + 1).ok_or("`as` without a name")?.clone();
            *at += 2;
            Some(alias)
        } else {
            None
        };
        leaves.push((path, alias, false));
        return Ok(());
    }
}

/// Checks every crate of [`CRATES`] under `root`: the findings, one line each (none: clean).
pub fn check(root: &Path) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    for (i, (name, file)) in CRATES.iter().enumerate() {
        let tree = CrateTree::read(name, root, &root.join(file))?;
        found.extend(tree.findings(i + 1 == CRATES.len()));
    }
    Ok(found)
}

/// The lint step: an error listing the findings.
pub fn one_path(root: &Path) -> Result<(), String> {
    eprintln!("xtask: one public path to each name (allocator, config, runtime, cli, rmm)");
    let found = check(root)?;
    if found.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} public name(s) reachable by more than one path, or re-exported from another \
             crate:\n  {}",
            found.len(),
            found.join("\n  ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch crate tree under the system's temporary directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str, files: &[(&str, &str)]) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("xtask-paths-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for (path, text) in files {
                let path = dir.join(path);
                std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
                std::fs::write(path, text).expect("write");
            }
            Scratch(dir)
        }

        fn findings(&self, facade: bool) -> Vec<String> {
            CrateTree::read("krate", &self.0, &self.0.join("lib.rs"))
                .expect("reads")
                .findings(facade)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_public_module_and_a_root_reexport_are_two_paths() {
        let s = Scratch::new(
            "dup",
            &[
                (
                    "lib.rs",
                    "pub mod container;\npub use container::{\n    Buffer,\n};\n",
                ),
                ("container.rs", "pub struct Buffer;\n"),
            ],
        );
        let found = s.findings(false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("`Buffer` has 2 public paths"),
            "{found:?}"
        );
        assert!(found[0].contains("krate::container::Buffer (its definition)"));
        assert!(found[0].contains("krate::Buffer (") && found[0].contains("lib.rs:2"));
    }

    #[test]
    fn a_private_module_with_root_reexports_is_one_path() {
        let s = Scratch::new(
            "private",
            &[
                (
                    "lib.rs",
                    "mod container;\npub mod resource;\npub use container::Buffer;\n",
                ),
                ("container/mod.rs", "mod buffer;\npub use buffer::Buffer;\n"),
                ("container/buffer.rs", "pub struct Buffer;\n"),
                (
                    "resource.rs",
                    "mod pool;\npub use self::pool::{Pool, PoolSize as Size};\n",
                ),
                (
                    "resource/pool.rs",
                    "pub struct Pool;\npub struct PoolSize;\n",
                ),
            ],
        );
        assert_eq!(s.findings(false), Vec::<String>::new());
    }

    #[test]
    fn a_reexport_through_a_private_module_is_followed() {
        let s = Scratch::new(
            "chain",
            &[
                (
                    "lib.rs",
                    "mod error;\npub mod resource;\npub use error::{Error, Usage};\n",
                ),
                (
                    "error.rs",
                    "pub use crate::resource::Usage;\npub enum Error {}\n",
                ),
                ("resource.rs", "pub struct Usage;\n"),
            ],
        );
        let found = s.findings(false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("krate::resource::Usage (its definition)"),
            "{found:?}"
        );
        assert!(found[0].contains("krate::Usage ("), "{found:?}");
    }

    #[test]
    fn two_reexports_of_a_private_item_are_two_paths() {
        let s = Scratch::new(
            "twice",
            &[
                (
                    "lib.rs",
                    "mod host;\npub mod resource;\npub use host::Block;\n",
                ),
                ("host.rs", "pub struct Block;\n"),
                ("resource.rs", "pub use crate::host::Block;\n"),
            ],
        );
        let found = s.findings(false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("krate::resource::Block"), "{found:?}");
    }

    #[test]
    fn another_crates_item_is_refused_outside_the_facade_prelude() {
        let s = Scratch::new(
            "extern",
            &[
                ("lib.rs", "pub mod container;\n"),
                ("container.rs", "pub use bytemuck::{Pod, Zeroable};\n"),
            ],
        );
        let found = s.findings(false);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("krate::container::Pod re-exports bytemuck::Pod"));
    }

    #[test]
    fn the_facade_has_its_crates_as_modules_and_a_prelude() {
        let s = Scratch::new(
            "facade",
            &[(
                "lib.rs",
                "pub use rmm_allocator as allocator;\n\
                 pub use rmm_allocator::Buffer;\n\
                 /// The prelude.\n\
                 pub mod prelude {\n    \
                     pub use crate::allocator::{Buffer, Stream};\n    \
                     pub use rmm_runtime::*;\n\
                 }\n",
            )],
        );
        let found = s.findings(true);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("krate::Buffer re-exports rmm_allocator::Buffer"));
    }

    #[test]
    fn globs_and_private_modules_inline() {
        let s = Scratch::new(
            "glob",
            &[(
                "lib.rs",
                "pub mod a {\n    pub use super::b::*;\n}\nmod b {\n    pub struct X;\n}\n\
                 #[cfg(test)]\nmod tests {\n    pub use super::a::X;\n}\n",
            )],
        );
        let found = s.findings(false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("a glob re-export"), "{found:?}");
    }

    #[test]
    fn use_trees_expand() {
        let leaves = parse_use_tree("a::{b::{C, D as E}, self, F}").expect("parses");
        let shown: Vec<String> = leaves
            .iter()
            .map(|(p, alias, _)| {
                format!(
                    "{}{}",
                    p.join("::"),
                    alias.as_ref().map_or(String::new(), |a| format!(" as {a}"))
                )
            })
            .collect();
        assert_eq!(shown, ["a::b::C", "a::b::D as E", "a", "a::F"]);
    }
}
