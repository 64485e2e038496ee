//! Compiles `pdwarden/v1/*.proto` with `protox` (pure Rust), so a fresh
//! `cargo build` needs no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["pdwarden/v1/pdwarden.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
