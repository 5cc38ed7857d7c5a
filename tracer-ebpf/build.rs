use which::which;

/// The bpf object depends on the `bpf-linker` binary, which cargo cannot see:
/// rebuild whenever it changes (as aya-template does).
fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!("cargo:warning=bpf-linker not on PATH; run `cargo xtask setup` (it installs it)"),
    }
}
