//! Configuration-driven set-up: an `rmm.toml` (here a string), environment overrides and
//! overrides in code are layered by `ConfigLoader`; the result is resolved against the devices
//! present into one resource-stack plan per device (what `rmm info` prints); the runtime is
//! started from the same configuration and every worker checks that it runs on the planned
//! stack. Last, a few bad configurations show that each error names its key (and its file or
//! variable); those errors are expected, so the example still exits 0.
//!
//! `cargo run --release --example config_setup` (every device: try `RMM_SIM_DEVICES=2`)

use std::collections::BTreeMap;

use rmm::allocator::fmt_bytes;
use rmm::config::{ConfigLoader, Source};
use rmm::runtime::{Runtime, StackPlan, TaskHandle, device_facts, open_backend};

const MIB: u64 = 1 << 20;

/// The file, as it could be saved as `rmm.toml`.
const RMM_TOML: &str = r#"
devices = "all"
workers_per_device = 1      # the code below overrides this

[pool]
enabled = true
initial_size = "256MiB"     # the environment below overrides this
maximum_size = "1GiB"

[stats]
enabled = true

# Device 0 only: a hard cap, which adds a LimitingResourceAdaptor to its stack.
[device.0]
limits.device_memory_limit = "768MiB"
"#;

/// The environment override the example applies (as if exported in the shell).
const ENV_OVERRIDE: (&str, &str) = ("RMM_POOL__INITIAL_SIZE", "192MiB");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The process's own RMM_* variables (RMM_BACKEND, RMM_DEVICES, ...) still apply, with the
    // example's override added: `env_from` takes the environment as a list, so nothing here
    // changes the process environment.
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("RMM_") && k != ENV_OVERRIDE.0)
        .collect();
    env.push((ENV_OVERRIDE.0.into(), ENV_OVERRIDE.1.into()));

    let config = ConfigLoader::new()
        .toml_str("example.toml", RMM_TOML)
        .env_from(env)
        .set("workers_per_device", 2)
        .load()?;

    println!("== settings that are not at their default (key = value, source)");
    for row in config.effective_values() {
        if row.source != Source::Default {
            println!("  {:<40} = {:<10} ({})", row.key, row.value, row.source);
        }
    }
    // Each layer won where it should.
    let expect_source = |key: &str, want: Source| -> Result<(), String> {
        let got = config.source(key);
        if got == want {
            Ok(())
        } else {
            Err(format!("{key}: source is {got}, expected {want}"))
        }
    };
    expect_source("pool.maximum_size", Source::File("example.toml".into()))?;
    expect_source("pool.initial_size", Source::Env(ENV_OVERRIDE.0.into()))?;
    expect_source("workers_per_device", Source::Code)?;
    if config.workers_per_device != 2 {
        return Err(format!(
            "workers_per_device is {}, the code override says 2",
            config.workers_per_device
        )
        .into());
    }

    // Resolve against the devices, as `rmm info` and the runtime do.
    let backend = open_backend(config.backend)?;
    println!();
    println!("== backend: {}", backend.describe());
    // What resolving this configuration needs (free memory only for a default initial pool:
    // "unknown" below otherwise).
    let facts = device_facts(backend, &config)?;
    let resolved = config.resolve(&facts)?;
    let mut planned: BTreeMap<u32, String> = BTreeMap::new();
    for d in &resolved.devices {
        let plan = StackPlan::new(&resolved, d);
        println!(
            "device {} ({}, {} total, {} free): {} worker(s), stack top first:",
            d.ordinal,
            d.uuid,
            fmt_bytes(d.total_memory as usize),
            d.free_memory
                .map_or_else(|| "unknown".into(), |f| fmt_bytes(f as usize)),
            resolved.workers_per_device
        );
        for layer in plan.layers() {
            println!("    {layer}");
        }
        let pool = plan
            .pool
            .ok_or("the plan has no pool, but pool.enabled = true")?;
        if pool.initial_size != 192 * MIB || pool.maximum_size != Some(1024 * MIB) {
            return Err(format!(
                "device {}: pool planned with initial {} and maximum {:?}, expected 192 MiB \
                 (environment) and 1 GiB (file)",
                d.ordinal, pool.initial_size, pool.maximum_size
            )
            .into());
        }
        let want_limit = (d.ordinal == 0).then_some(768 * MIB);
        if plan.limit != want_limit {
            return Err(format!(
                "device {}: limit {:?} planned, expected {want_limit:?}",
                d.ordinal, plan.limit
            )
            .into());
        }
        // The built stack names its layers without their settings.
        let names: Vec<String> = plan
            .layers()
            .iter()
            .map(|l| l.split('(').next().unwrap_or(l).trim().to_string())
            .collect();
        planned.insert(d.ordinal, names.join(" > "));
    }

    // Start the runtime from the same configuration; every worker reports its stack.
    let runtime = Runtime::start(&config)?;
    println!();
    println!("== runtime started ({})", runtime.report().start);
    let seen = TaskHandle::wait_all(runtime.run_on_all(|ctx| {
        (
            ctx.worker().to_string(),
            ctx.device().ordinal(),
            ctx.stack().describe(),
        )
    }))?;
    if seen.len() != resolved.devices.len() * 2 {
        return Err(format!(
            "{} workers answered, expected 2 on each of {} device(s)",
            seen.len(),
            resolved.devices.len()
        )
        .into());
    }
    for (worker, device, stack) in &seen {
        let want = planned
            .get(device)
            .ok_or_else(|| format!("worker {worker} runs on device {device}, not planned"))?;
        let verdict = if stack == want {
            "as planned"
        } else {
            "DIFFERS"
        };
        println!("worker {worker}: {stack}  [{verdict}]");
        if stack != want {
            return Err(format!("worker {worker}: stack {stack}, planned {want}").into());
        }
    }
    runtime.shutdown()?;

    // Bad configurations: each error names the key, and the file or the variable.
    println!();
    println!("== bad configurations (each error below is expected)");
    let bad: [(&str, ConfigLoader, &[&str]); 5] = [
        (
            "a value that is not a size, in the file",
            ConfigLoader::new()
                .toml_str("bad.toml", "[pool]\ninitial_size = \"2GB0\"\n")
                .no_env(),
            &["bad.toml", "pool.initial_size", "2GB0"],
        ),
        (
            "a misspelt key, in the file",
            ConfigLoader::new()
                .toml_str("bad.toml", "[pool]\nintial_size = \"2GiB\"\n")
                .no_env(),
            &["bad.toml", "pool.intial_size", "pool.initial_size"],
        ),
        (
            "a value that is not a boolean, in the environment",
            ConfigLoader::new()
                .no_file()
                .env_from([("RMM_POOL__ENABLED", "maybe")]),
            &["RMM_POOL__ENABLED", "maybe"],
        ),
        (
            "a value that is not a size, in code",
            ConfigLoader::new()
                .no_file()
                .no_env()
                .set("spill.device_memory_limit", "lots"),
            &["spill.device_memory_limit", "lots"],
        ),
        (
            "an initial pool size above the maximum",
            ConfigLoader::new()
                .no_file()
                .no_env()
                .set("pool.enabled", true)
                .set("pool.initial_size", "2GiB")
                .set("pool.maximum_size", "1GiB"),
            &["pool.initial_size", "pool.maximum_size"],
        ),
    ];
    for (what, loader, must_name) in bad {
        let message = match loader.load() {
            Ok(_) => return Err(format!("{what}: loaded without an error").into()),
            Err(e) => e.to_string(),
        };
        println!("{what}:\n    error: {message}");
        if let Some(missing) = must_name.iter().find(|s| !message.contains(*s)) {
            return Err(format!("{what}: the error does not name {missing:?}: {message}").into());
        }
    }
    // Some mistakes show only against the devices: resolving names them too.
    let too_many = ConfigLoader::new()
        .no_file()
        .no_env()
        .set("devices", vec![facts.len() as i64 + 7])
        .load()?;
    match too_many.resolve(&facts) {
        Ok(_) => return Err("a device that is not present resolved without an error".into()),
        Err(e) => {
            let message = e.to_string();
            println!("a device that is not present:\n    error: {message}");
            if !message.contains("devices") {
                return Err(format!("the error does not name `devices`: {message}").into());
            }
        }
    }
    println!();
    println!("configuration example: every check passed");
    Ok(())
}
