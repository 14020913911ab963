#!/usr/bin/env python3
"""The floor checker (.ci/floors.py) against each way a path used to get past it.

A small crate is written to a temporary directory: three floors (`api` above `engine` above
`model`), an engine with two floors inside (`upkeep` above `tables`), and a root that
re-exports `api::Store`. With only downward paths it passes; each case then adds one file
whose path points up, written the way the old checker missed, and the check must name that
arrow. Run by .ci/run; exits 1 on the first case that gets through.
"""
import importlib.util
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("floors", HERE / "floors.py")
floors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(floors)

LIB = """//! A crate.
//!
//! ## Layout
//!
//! 1. `api`: what a caller holds (`Store`).
//! 2. `engine` (the storage): below the facade.
//! 3. `model`: values.

mod api;
mod engine;
mod model;

pub use api::Store;
pub use model::Value;
"""

ENGINE = """//! The engine.
//!
//! 1. `upkeep` (what runs in the background);
//! 2. `tables`: the tables.

mod tables;
mod upkeep;
"""

BASE = {
    "lib.rs": LIB,
    "api/mod.rs": "//! The facade.\nuse crate::engine::tables::Table;\nuse crate::Value;\npub struct Store;\n",
    "engine/mod.rs": ENGINE,
    "engine/upkeep.rs": "//! Upkeep.\nuse super::tables::Table;\npub struct Run;\n",
    "engine/tables.rs": "//! Tables.\nuse crate::model::Value;\npub struct Table;\n",
    "model/mod.rs": "//! Values.\nmod deep;\npub struct Value;\n",
    "model/deep/mod.rs": "//! Deeper values.\nmod inner;\n",
    "model/deep/inner.rs": "//! The deepest.\nuse super::super::Value;\n",
}

# name: (file, its text, the arrow the check must report)
EVASIONS = {
    "a path through the crate root's re-export": (
        "model/a.rs",
        "use crate::Store;\n",
        ("model", "api"),
    ),
    "a nested group": (
        "model/b.rs",
        "use crate::{model::{Value}, api::{Store as S}};\n",
        ("model", "api"),
    ),
    "super::super:: out of a nested module": (
        "model/deep/c.rs",
        "fn f() -> super::super::super::api::Store { todo!() }\n",
        ("model", "api"),
    ),
    "inside the engine, through super::": (
        "engine/tables/d.rs",
        "use super::super::upkeep::Run;\n",
        ("engine::tables", "engine::upkeep"),
    ),
    "a path written inline, not in a use": (
        "engine/tables/e.rs",
        "fn f() { let _ = crate::engine::upkeep::Run; }\n",
        ("engine::tables", "engine::upkeep"),
    ),
}


def write(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    src = root / "src"
    for name, text in files.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return src


def main() -> int:
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        clean = floors.check(write(pathlib.Path(tmp) / "clean", BASE))
        if clean:
            print(f"the crate with only downward paths was refused: {clean}")
            failed += 1
    for i, (name, (file, text, expected)) in enumerate(EVASIONS.items()):
        with tempfile.TemporaryDirectory() as tmp:
            files = dict(BASE)
            files[file] = text
            # The file's module is declared where its parent declares modules.
            parent = pathlib.PurePosixPath(file).parent
            module = pathlib.PurePosixPath(file).stem
            holder = f"{parent}/mod.rs" if f"{parent}/mod.rs" in files else f"{parent}.rs"
            files[holder] = files.get(holder, "//! A module.\n") + f"mod {module};\n"
            seen = floors.check(write(pathlib.Path(tmp) / str(i), files))
            if expected not in seen:
                print(f"got past the check: {name} ({file}: {text.strip()}); it saw {sorted(seen)}")
                failed += 1
            else:
                print(f"caught: {name}: {expected[0]} -> {expected[1]}")
    if floors.check(floors.SRC):
        print("the repository's own src/ fails the check: run .ci/floors.py")
        failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
