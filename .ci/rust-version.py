#!/usr/bin/env python3
"""Fails when a dependency needs a newer Rust than Cargo.toml's `rust-version` says.

Reads `cargo metadata` (every feature, dev-dependencies included: the tests must build too)
and compares each resolved package's `rust-version` with ours. Run from the repository root.
"""
import json
import subprocess
import sys


def version(text):
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--all-features"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
)
resolved = {node["id"] for node in meta["resolve"]["nodes"]}
ours = next(p for p in meta["packages"] if p["id"] == meta["resolve"]["root"])
declared = ours.get("rust_version")
if not declared:
    sys.exit("Cargo.toml has no rust-version: set it to the newest a dependency needs")
newer = sorted(
    (version(p["rust_version"]), p["name"], p["version"], p["rust_version"])
    for p in meta["packages"]
    if p["id"] in resolved
    and p["id"] != ours["id"]
    and p.get("rust_version")
    and version(p["rust_version"]) > version(declared)
)
if newer:
    for _, name, ver, needs in newer:
        print(f"{name} {ver} needs Rust {needs}, above our rust-version {declared}")
    sys.exit(f"raise rust-version in Cargo.toml (and the README) to {newer[-1][3]}")
print(f"rust-version {declared} covers every dependency")
