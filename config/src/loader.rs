//! Layering ([`ConfigLoader`]): each layer is checked key by key against the schema (so an
//! error names its file or variable, key and value), merged into one flat `key → value` map,
//! then deserialized into [`Config`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, Source};
use crate::schema::{self, ENV_PREFIX, KeySpec, Lookup};
use crate::types::{Config, Provenance};

/// Builds a [`Config`] from layers, later layers winning key by key:
///
/// 1. built-in defaults ([`Config::default`]);
/// 2. a TOML file: [`file`](Self::file), [`optional_file`](Self::optional_file) or
///    [`toml_str`](Self::toml_str), else `RMM_CONFIG` (must exist), else `./rmm.toml` (if any);
/// 3. environment variables `RMM_<SECTION>__<KEY>` ([`crate::env_var_name`]), from the process
///    or [`env_from`](Self::env_from);
/// 4. code overrides in call order: [`set`](Self::set) (a TOML value), [`set_str`](Self::set_str)
///    (text, read as an environment value).
///
/// ```
/// # mod rmm { pub use rmm_config as config; }
/// use rmm::config::ConfigLoader;
/// let config = ConfigLoader::new()
///     .no_file()
///     .env_from([("RMM_POOL__INITIAL_SIZE", "2GiB")])
///     .set("pool.enabled", true)
///     .set_str("devices", "0,1")
///     .load()?;
/// assert!(config.pool.enabled);
/// # Ok::<(), rmm::config::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ConfigLoader {
    file: FileChoice,
    /// `None`: the process environment, read by `load`.
    env: Option<Vec<(String, String)>>,
    overrides: Vec<(String, Override)>,
}

#[derive(Debug, Clone, Default)]
enum FileChoice {
    /// `RMM_CONFIG`, else `./rmm.toml` if present.
    #[default]
    Auto,
    Required(PathBuf),
    Optional(PathBuf),
    Text {
        name: PathBuf,
        text: String,
        /// A whole written configuration ([`Config::to_toml`]): sizes kept whatever is on.
        complete: bool,
    },
    Skip,
    /// A loaded configuration, every key of it, in place of the defaults and the file.
    Base(Box<Config>),
}

#[derive(Debug, Clone)]
enum Override {
    Toml(toml::Value),
    Text(String),
}

/// How deeply a value may nest tables and arrays (a top-level key's value is level 1; the
/// schema needs 4). Deeper is refused with [`Error::TooDeep`] before any recursive walk, so
/// hostile or cyclic input (from Python, say) cannot overflow the stack.
pub const MAX_NESTING: usize = 32;

/// [`Error::TooDeep`], naming the path (`key.name`, `key[0]`) of the first table or array
/// deeper than [`MAX_NESTING`]; iterative.
fn check_depth(origin: &Source, key: &str, value: &toml::Value) -> Result<()> {
    let nests = |v: &toml::Value| matches!(v, toml::Value::Table(_) | toml::Value::Array(_));
    // Plain values: nothing to walk or allocate.
    if !nests(value) {
        return Ok(());
    }
    let mut stack: Vec<(String, &toml::Value, usize)> = vec![(key.to_string(), value, 1)];
    while let Some((path, value, depth)) = stack.pop() {
        if depth > MAX_NESTING && nests(value) {
            return Err(Error::TooDeep {
                origin: origin.clone(),
                key: path,
                limit: MAX_NESTING,
            });
        }
        match value {
            toml::Value::Table(table) => stack.extend(
                table
                    .iter()
                    .map(|(name, inner)| (format!("{path}.{name}"), inner, depth + 1)),
            ),
            toml::Value::Array(items) => stack.extend(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, inner)| (format!("{path}[{i}]"), inner, depth + 1)),
            ),
            _ => {}
        }
    }
    Ok(())
}

/// The variable naming the configuration file.
pub const CONFIG_PATH_VAR: &str = "RMM_CONFIG";

/// The file read when neither code nor `RMM_CONFIG` names one.
pub const DEFAULT_FILE: &str = "rmm.toml";

impl ConfigLoader {
    /// Defaults + (`RMM_CONFIG` or `./rmm.toml`) + the process environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts from `config` (every key, with its source) instead of defaults, file and
    /// environment: [`set`](Self::set) then changes only what it names.
    ///
    /// ```
    /// # mod rmm { pub use rmm_config as config; }
    /// use rmm::config::ConfigLoader;
    /// let running = ConfigLoader::new().no_file().no_env()
    ///     .set("workers_per_device", 2)
    ///     .set("spill.enabled", true)
    ///     .load()?;
    /// let next = ConfigLoader::from_config(&running).set("pool.enabled", false).load()?;
    /// assert_eq!(next.workers_per_device, 2);
    /// assert!(next.spill.enabled && !next.pool.enabled);
    /// # Ok::<(), rmm::config::Error>(())
    /// ```
    pub fn from_config(config: &Config) -> Self {
        ConfigLoader {
            file: FileChoice::Base(Box::new(config.clone())),
            env: Some(Vec::new()),
            overrides: Vec::new(),
        }
    }

    /// Reads this file; an error if it is missing. Takes precedence over `RMM_CONFIG`.
    pub fn file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = FileChoice::Required(path.into());
        self
    }

    /// Reads this file if it exists. Takes precedence over `RMM_CONFIG`.
    pub fn optional_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = FileChoice::Optional(path.into());
        self
    }

    /// Uses `text` as the file; `name` stands for it in messages and sources.
    pub fn toml_str(self, name: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        self.text_file(name.into(), text.into(), false)
    }

    /// As [`toml_str`](Self::toml_str), for a whole configuration ([`Config::to_toml`]): as with
    /// [`from_config`](Self::from_config), its sizes are kept, even a disabled feature's.
    pub(crate) fn complete_toml_str(
        self,
        name: impl Into<PathBuf>,
        text: impl Into<String>,
    ) -> Self {
        self.text_file(name.into(), text.into(), true)
    }

    fn text_file(mut self, name: PathBuf, text: String, complete: bool) -> Self {
        self.file = FileChoice::Text {
            name,
            text,
            complete,
        };
        self
    }

    /// Reads no file (not even `RMM_CONFIG`).
    pub fn no_file(mut self) -> Self {
        self.file = FileChoice::Skip;
        self
    }

    /// Uses these variables, not the process environment's (also for `RMM_CONFIG`): for tests.
    pub fn env_from<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.env = Some(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        );
        self
    }

    /// Reads no environment variable.
    pub fn no_env(self) -> Self {
        self.env_from(std::iter::empty::<(String, String)>())
    }

    /// Overrides a key (`"device.1.pool.initial_size"`) or table (`"pool"`) with a TOML value.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<toml::Value>) -> Self {
        self.overrides
            .push((key.into(), Override::Toml(value.into())));
        self
    }

    /// Overrides a key with text read as an environment value (a CLI's `--set key=value`).
    pub fn set_str(mut self, key: impl Into<String>, text: impl Into<String>) -> Self {
        self.overrides
            .push((key.into(), Override::Text(text.into())));
        self
    }

    /// Reads and checks every layer, reporting all bad keys and values at once, then conflicts.
    ///
    /// # Errors
    /// [`Error::ReadFile`] or [`Error::ConfigFileMissing`] for the file; [`Error::Parse`],
    /// [`Error::UnknownKey`], [`Error::InvalidValue`] or [`Error::TooDeep`] for a bad layer
    /// ([`Error::Several`] when more than one); then what [`Config::validate`] finds.
    pub fn load(&self) -> Result<Config> {
        let env = self.env_vars();
        let mut layers = Layers::default();
        self.read_file(&env, &mut layers)?;
        layers.layer = Layer::Env;
        read_env(&env, &mut layers);
        layers.layer = Layer::Code;
        for (key, value) in &self.overrides {
            match value {
                Override::Toml(value) => match check_depth(&Source::Code, key, value) {
                    Ok(()) => layers.walk_value(schema::canonical_path(key), value, &Source::Code),
                    Err(e) => layers.errors.push(e),
                },
                Override::Text(text) => {
                    layers.text(&schema::canonical_path(key), text, Source::Code);
                }
            }
        }
        Error::from_list(layers.errors)?;
        let last = last_layers(&layers.entries);
        let config = merge(layers.entries)?;
        config.validate()?;
        config.check_unused_sizes(&last)?;
        Ok(config)
    }

    /// The `RMM_*` variables, sorted by name for a stable error order.
    fn env_vars(&self) -> Vec<(String, String)> {
        let mut vars: Vec<(String, String)> = match &self.env {
            Some(vars) => vars.clone(),
            None => std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into())))
                .collect(),
        };
        vars.retain(|(name, _)| name.starts_with(ENV_PREFIX));
        vars.sort();
        vars
    }

    fn read_file(&self, env: &[(String, String)], layers: &mut Layers) -> Result<()> {
        let from_env = || {
            env.iter()
                .find(|(name, value)| name == CONFIG_PATH_VAR && !value.is_empty())
                .map(|(_, value)| PathBuf::from(value))
        };
        let (path, required, named_by_env) = match &self.file {
            FileChoice::Skip => return Ok(()),
            FileChoice::Base(config) => return layers.base(config),
            FileChoice::Text {
                name,
                text,
                complete,
            } => {
                if *complete {
                    layers.layer = Layer::Base;
                }
                return layers.parse(name, text);
            }
            FileChoice::Required(path) => (path.clone(), true, false),
            FileChoice::Optional(path) => (path.clone(), false, false),
            FileChoice::Auto => match from_env() {
                Some(path) => (path, true, true),
                None => (PathBuf::from(DEFAULT_FILE), false, false),
            },
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => layers.parse(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && named_by_env => {
                Err(Error::ConfigFileMissing { path })
            }
            Err(source) => Err(Error::ReadFile { path, source }),
        }
    }
}

/// When a key was last set: its layer and, in the code layer, the override's order (a file
/// or the environment is one statement: its entries rank alike).
pub(crate) type SetAt = (Layer, usize);

pub(crate) fn last_layers(entries: &[Entry]) -> BTreeMap<String, SetAt> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let order = if e.layer == Layer::Code { i } else { 0 };
            (e.key.clone(), (e.layer, order))
        })
        .collect()
}

pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) value: toml::Value,
    pub(crate) origin: Source,
    /// The layer that gave it: later layers override earlier ones.
    pub(crate) layer: Layer,
}

/// The layers of a load, in the order they apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum Layer {
    /// The running configuration a loader starts from ([`ConfigLoader::from_config`]).
    Base,
    #[default]
    File,
    Env,
    Code,
}

#[derive(Default)]
struct Layers {
    entries: Vec<Entry>,
    errors: Vec<Error>,
    layer: Layer,
}

impl Layers {
    /// Every key of `config` (loaded, so checked already), with its source.
    fn base(&mut self, config: &Config) -> Result<()> {
        let value = toml::Value::try_from(config).map_err(|e| {
            Error::Internal(format!("serializing the configuration to start from: {e}"))
        })?;
        let mut flat = BTreeMap::new();
        flatten(&value, "", &mut flat);
        for (key, value) in flat {
            let origin = config.source(&key);
            self.entries.push(Entry {
                key,
                value,
                origin,
                layer: Layer::Base,
            });
        }
        Ok(())
    }

    fn parse(&mut self, path: &Path, text: &str) -> Result<()> {
        let table: toml::Table = toml::from_str(text).map_err(|e| Error::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let origin = Source::File(path.to_path_buf());
        // The TOML parser stops at its own depth (80); the schema's walk stays shallower.
        for (key, value) in &table {
            check_depth(&origin, key, value)?;
        }
        self.walk(&table, "", &origin);
        Ok(())
    }

    /// Checks a TOML table against the schema, below the dotted `prefix`.
    fn walk(&mut self, table: &toml::Table, prefix: &str, origin: &Source) {
        for (name, value) in table {
            let path = match prefix {
                "" => schema::canonical_path(name),
                prefix => schema::canonical_path(&format!("{prefix}.{name}")),
            };
            self.walk_value(path, value, origin);
        }
    }

    /// The value at canonical dotted `path`: a key's value is checked, a section's table walked.
    fn walk_value(&mut self, path: String, value: &toml::Value, origin: &Source) {
        match schema::lookup(&path) {
            Lookup::Leaf(spec) => {
                self.check(spec, path, value.clone(), origin.clone(), false, || {
                    value.to_string()
                });
            }
            Lookup::Section => match value.as_table() {
                Some(table) => self.walk(table, &path, origin),
                None => self.errors.push(Error::InvalidValue {
                    origin: origin.clone(),
                    value: value.to_string(),
                    problem: match path.as_str() {
                        "device" => "expected tables keyed by ordinal, e.g. [device.1]".into(),
                        path => format!("expected a table, e.g. [{path}]"),
                    },
                    key: path,
                }),
            },
            Lookup::Unknown => self.errors.push(Error::UnknownKey {
                origin: origin.clone(),
                suggestions: schema::suggest(&path),
                hint: schema::hint(&path),
                key: path,
            }),
        }
    }

    /// A value given as text (environment, [`ConfigLoader::set_str`]).
    fn text(&mut self, path: &str, text: &str, origin: Source) {
        match schema::lookup(path) {
            Lookup::Leaf(spec) => {
                let value = spec.kind.parse_text(text);
                self.check(spec, path.into(), value, origin, true, || {
                    format!("\"{text}\"")
                });
            }
            Lookup::Section | Lookup::Unknown => {
                let suggestions = match &origin {
                    Source::Env(name) => schema::suggest_env(name, path).into_iter().collect(),
                    _ => schema::suggest(path),
                };
                self.errors.push(Error::UnknownKey {
                    origin,
                    key: path.into(),
                    suggestions,
                    hint: schema::hint(path),
                });
            }
        }
    }

    /// Keeps `value` for `key` if the schema accepts it, else records the error (value as `shown`).
    fn check(
        &mut self,
        spec: &KeySpec,
        key: String,
        value: toml::Value,
        origin: Source,
        text: bool,
        shown: impl FnOnce() -> String,
    ) {
        match spec.kind.check(&value, text) {
            Ok(()) => self.entries.push(Entry {
                key,
                value,
                origin,
                layer: self.layer,
            }),
            Err(problem) => self.errors.push(Error::InvalidValue {
                origin,
                key,
                value: shown(),
                problem,
            }),
        }
    }
}

fn read_env(env: &[(String, String)], layers: &mut Layers) {
    for (name, text) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if schema::env_is_not_a_key(name) {
            continue;
        }
        if schema::ENV_RAPIDS_IGNORED.contains(&name.as_str()) {
            tracing::warn!(
                "environment {name} is RAPIDS RMM's, not an rmm-rs setting: ignored (rmm-rs \
                 logs allocations with logging.enabled and logging.directory)"
            );
            continue;
        }
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        let path = schema::canonical_path(&path.join("."));
        layers.text(&path, text, Source::Env(name.clone()));
    }
}

/// Defaults overlaid with the entries in order; `#[serde(default)]` fills keys not given.
fn merge(entries: Vec<Entry>) -> Result<Config> {
    let mut root = toml::Table::new();
    let mut sources = BTreeMap::new();
    for entry in entries {
        insert_dotted(&mut root, &entry.key, entry.value)?;
        if entry.origin == Source::Default {
            sources.remove(&entry.key);
        } else {
            sources.insert(entry.key, entry.origin);
        }
    }
    let mut config: Config = toml::Value::Table(root)
        .try_into()
        .map_err(|e| Error::Internal(format!("deserializing checked values: {e}")))?;
    config.sources = Provenance(sources);
    Ok(config)
}

pub(crate) fn flatten(value: &toml::Value, prefix: &str, out: &mut BTreeMap<String, toml::Value>) {
    match value {
        toml::Value::Table(table) => {
            for (name, value) in table {
                let key = match prefix {
                    "" => name.clone(),
                    prefix => format!("{prefix}.{name}"),
                };
                flatten(value, &key, out);
            }
        }
        leaf => {
            out.insert(prefix.to_string(), leaf.clone());
        }
    }
}

fn insert_dotted(root: &mut toml::Table, key: &str, value: toml::Value) -> Result<()> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().unwrap_or(key);
    let mut table = root;
    for part in parts {
        table = table
            .entry(part)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| Error::Internal(format!("{key}: {part} is both a value and a table")))?;
    }
    table.insert(leaf.to_string(), value);
    Ok(())
}
