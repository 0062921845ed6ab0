//! One public path to each name, checked on the sources of the library crates. The rule that
//! makes it so: an item is public through one `pub use` (or where it is defined, in a public
//! module); a `pub use` never names an item that a public module already shows. So a `pub use`
//! in a public module's file (the root included) is a finding when:
//! * the module holding the item it names is another public module (`pub use
//!   crate::resource::X` at the root while `resource` is `pub mod`: two paths);
//! * it names another crate's item (a second path to a dependency's name); the facade (`rmm`)
//!   alone may re-export a whole crate as a module (`pub use rmm_allocator as allocator`);
//! * it is a glob (`pub use a::*`), which hides what it exports;
//! * it re-exports the same item as another `pub use` of the crate.
//!
//! The facade's inline `prelude` may re-export anything: a prelude is a second path by design.
//! Items are read at column 0 (rustfmt's layout), so test modules and the prelude are skipped.

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

/// `pub use` trees expanded into (path as written, name exported; `*` for a glob).
fn expand(tree: &str) -> Vec<(Vec<String>, String)> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let (path, alias) = match tree.split_once(" as ") {
            Some((p, a)) => (p.trim(), Some(a.trim())),
            None => (tree, None),
        };
        let path: Vec<String> = path.split("::").map(|s| s.trim().to_string()).collect();
        let name = alias.map_or_else(|| path[path.len() - 1].clone(), str::to_string);
        return vec![(path, name)];
    };
    let prefix: Vec<String> = tree[..open]
        .trim_end_matches("::")
        .split("::")
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().to_string())
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    let mut leaves = Vec::new();
    for part in parts.into_iter().filter(|p| !p.trim().is_empty()) {
        for (path, name) in expand(part) {
            if path == ["self"] {
                leaves.push((prefix.clone(), prefix[prefix.len() - 1].clone()));
            } else {
                leaves.push(([prefix.clone(), path].concat(), name));
            }
        }
    }
    leaves
}

/// One crate's findings. `facade`: the crate that may re-export its members as modules.
fn crate_findings(name: &str, root_file: &Path, facade: bool) -> Result<Vec<String>, String> {
    // Public modules (path from the root) and their files; the root is public.
    let mut public: BTreeMap<Vec<String>, PathBuf> = BTreeMap::new();
    let mut pending = vec![(Vec::new(), root_file.to_path_buf())];
    let mut uses = Vec::new();
    while let Some((module, file)) = pending.pop() {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let dir = match (module.is_empty(), file.file_name()) {
            (false, Some(f)) if f != "mod.rs" => file.with_extension(""),
            _ => file.parent().unwrap_or(Path::new(".")).to_path_buf(),
        };
        let mut declared = Vec::new();
        let mut statement = String::new();
        for line in text.lines() {
            if statement.is_empty() && !line.starts_with("pub use ") {
                let decl = line.trim_end_matches([';', '{', ' ']);
                if let Some(child) = decl.strip_prefix("pub mod ") {
                    let path = [module.clone(), vec![child.to_string()]].concat();
                    if !line.ends_with('{') {
                        let own = dir.join(format!("{child}.rs"));
                        let nested = dir.join(child).join("mod.rs");
                        pending.push((path, if own.exists() { own } else { nested }));
                    }
                    declared.push(child.to_string());
                } else if let Some(child) = decl
                    .split_once("mod ")
                    .filter(|(v, _)| v.is_empty() || v.starts_with("pub("))
                {
                    declared.push(child.1.to_string());
                }
                continue;
            }
            statement.push_str(line.trim_start_matches("pub use "));
            if line.ends_with(';') {
                let tree = std::mem::take(&mut statement);
                uses.push((
                    module.clone(),
                    declared.clone(),
                    tree.trim_end_matches(';').to_string(),
                ));
            }
        }
        public.insert(module, file);
    }
    let mut found = Vec::new();
    let mut targets: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for (module, declared, tree) in uses {
        for (path, exported) in expand(&tree) {
            let at = [
                vec![name.to_string()],
                module.clone(),
                vec![exported.clone()],
            ]
            .concat()
            .join("::");
            let (mut target, rest) = match path[0].as_str() {
                "crate" => (Vec::new(), 1),
                "self" => (module.clone(), 1),
                "super" => (module[..module.len().saturating_sub(1)].to_vec(), 1),
                first if declared.iter().any(|d| d == first) => (module.clone(), 0),
                _ if facade && module.is_empty() && path.len() == 1 => continue,
                _ => {
                    found.push(format!("{at} re-exports {}", path.join("::")));
                    continue;
                }
            };
            target.extend(path[rest..].iter().cloned());
            if exported == "*" {
                found.push(format!("{at}: a glob re-export ({})", path.join("::")));
                continue;
            }
            let holder = &target[..target.len() - 1];
            if holder != module.as_slice() && public.contains_key(holder) {
                found.push(format!(
                    "{at} is a second path to {name}::{}",
                    target.join("::")
                ));
            } else if let Some(first) = targets.insert(target.clone(), at.clone()) {
                found.push(format!("{at} and {first} re-export the same item"));
            }
        }
    }
    Ok(found)
}

/// Every finding of the library crates under the workspace root `root`.
pub fn check(root: &Path) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    for (i, (name, file)) in CRATES.iter().enumerate() {
        found.extend(crate_findings(
            name,
            &root.join(file),
            i + 1 == CRATES.len(),
        )?);
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

    /// A crate written into a scratch directory: its findings.
    fn findings(test: &str, files: &[(&str, &str)], facade: bool) -> Vec<String> {
        let dir = std::env::temp_dir().join(format!("xtask-paths-{test}-{}", std::process::id()));
        for (file, text) in files {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("scratch dir");
            std::fs::write(path, text).expect("scratch file");
        }
        let found = crate_findings("krate", &dir.join("lib.rs"), facade).expect("reads");
        std::fs::remove_dir_all(&dir).expect("scratch removed");
        found
    }

    #[test]
    fn a_public_module_and_a_root_reexport_are_two_paths() {
        let files = [
            ("lib.rs", "pub mod resource;\npub use resource::Pool;\n"),
            ("resource/mod.rs", "mod pool;\npub use pool::Pool;\n"),
            ("resource/pool.rs", "pub struct Pool;\n"),
        ];
        let found = findings("two", &files, false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("krate::Pool is a second path to krate::resource::Pool"));
    }

    #[test]
    fn private_modules_with_one_reexport_each_are_one_path() {
        let files = [
            (
                "lib.rs",
                "mod container;\npub mod resource;\npub use container::{Buffer, Scalar as S};\n",
            ),
            ("container.rs", "pub struct Buffer;\npub struct Scalar;\n"),
            (
                "resource.rs",
                "mod pool;\npub use self::pool::{Pool, self as pools};\n",
            ),
            ("resource/pool.rs", "pub struct Pool;\n"),
        ];
        assert_eq!(findings("one", &files, false), Vec::<String>::new());
    }

    #[test]
    fn two_reexports_of_one_item_are_two_paths() {
        let files = [
            ("lib.rs", "mod a;\npub mod b;\npub use a::X;\n"),
            ("a.rs", "pub struct X;\n"),
            ("b.rs", "pub use crate::a::X;\n"),
        ];
        let found = findings("dup", &files, false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("re-export the same item"), "{found:?}");
    }

    #[test]
    fn another_crates_items_and_globs_are_refused() {
        let files = [(
            "lib.rs",
            "mod a;\npub use bytemuck::Pod;\npub use a::*;\n#[cfg(test)]\nmod tests {\n    \
             pub use super::a::X;\n}\n",
        )];
        let found = findings("extern", &files, false);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("krate::Pod re-exports bytemuck::Pod"),
            "{found:?}"
        );
        assert!(found[1].contains("a glob re-export"), "{found:?}");
    }

    #[test]
    fn the_facade_has_its_crates_as_modules_and_a_prelude() {
        let files = [(
            "lib.rs",
            "pub use rmm_allocator as allocator;\npub use rmm_allocator::Buffer;\n\
             /// The prelude.\npub mod prelude {\n    pub use crate::allocator::{Buffer, Stream};\n    \
             pub use rmm_runtime::*;\n}\n",
        )];
        let found = findings("facade", &files, true);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("krate::Buffer re-exports rmm_allocator::Buffer"));
    }

    #[test]
    fn a_public_module_showing_its_public_childs_item_is_a_second_path() {
        let files = [
            ("lib.rs", "pub mod adaptor;\n"),
            (
                "adaptor/mod.rs",
                "pub mod hooks;\npub use hooks::{\n    Hook,\n};\n",
            ),
            ("adaptor/hooks.rs", "pub struct Hook;\n"),
        ];
        let found = findings("nested", &files, false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("krate::adaptor::Hook is a second path"),
            "{found:?}"
        );
    }

    #[test]
    fn use_trees_expand() {
        let shown: Vec<String> = expand("a::{b::{C, D as E}, self, F}")
            .into_iter()
            .map(|(p, name)| format!("{} {name}", p.join("::")))
            .collect();
        assert_eq!(shown, ["a::b::C C", "a::b::D E", "a a", "a::F F"]);
    }
}
