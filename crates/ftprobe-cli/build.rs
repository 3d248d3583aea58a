//! Release builds carry the agent inside the `ftprobe` binary, so that an installed or copied
//! `ftprobe` (`cargo install --path crates/ftprobe-cli`, `cp target/release/ftprobe ~/bin`)
//! traces without a `libftprobe_agent.so` beside it: this script builds the agent crate
//! (`cargo build --release -p ftprobe-agent`, in a target directory of its own under
//! `OUT_DIR`) and `session::agent_path` writes it out when no agent file is found
//! (README, "Installing").
//!
//! `FTPROBE_EMBED_AGENT=0` leaves it out, `=1` puts it in a debug build too; debug builds
//! (the tests') find the agent the workspace builds next to them.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FTPROBE_EMBED_AGENT");
    println!("cargo:rustc-check-cfg=cfg(ftprobe_embedded_agent)");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    let embed = match env::var("FTPROBE_EMBED_AGENT").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => release,
    };
    if !embed {
        return;
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    // What the agent is built from: its crate, the engine, the workspace's manifest and lock.
    for p in [
        "crates/ftprobe-agent",
        "crates/ftprobe/src",
        "crates/ftprobe/build.rs",
        "crates/ftprobe/Cargo.toml",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    let target = out.join("agent-target");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .args(["-p", "ftprobe-agent", "--lib"])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        // This build's own settings would be taken for the agent's.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("FTPROBE_EMBED_AGENT");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        status.success(),
        "building the agent to embed: {cmd:?}: {status}"
    );
    let so = target.join("release/libftprobe_agent.so");
    let bytes = std::fs::read(&so).unwrap_or_else(|e| panic!("reading {}: {e}", so.display()));
    std::fs::write(out.join("libftprobe_agent.so"), &bytes)
        .unwrap_or_else(|e| panic!("writing the agent's copy: {e}"));
    // Names the directory it is written out to: one per agent.
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    println!(
        "cargo:rustc-env=FTPROBE_EMBEDDED_AGENT_HASH={:016x}",
        h.finish()
    );
    println!("cargo:rustc-cfg=ftprobe_embedded_agent");
}
