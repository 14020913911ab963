//! The `idemstore` tool, built with the service (`cargo run --release -p edge-service --bin
//! idemstore-cli -- stats idemstore-data/edge_service`), so the README's walkthrough needs no
//! second build of the library with other features. The same source as the library's own
//! `idemstore` binary (`idemstore::cli`); the name differs only so that a build of the whole
//! workspace does not make two files called `idemstore`.

fn main() -> std::process::ExitCode {
    idemstore::cli::run()
}
