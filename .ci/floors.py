#!/usr/bin/env python3
"""Fails when a `crate::` path in src/ points up (or sideways) on the floor map in src/lib.rs.

Each top-level module of src/ has a floor; code on a floor may name only modules on floors
below it (and itself). Doc comments are skipped: a link may point anywhere. Paths through
the crate root (`crate::Store`, re-exports) are not checked: name the module instead.
"""
import pathlib
import re
import sys

# Top to bottom. Keep in step with "Layout" in src/lib.rs.
FLOORS = [
    ["testing"],
    ["http", "relay", "cli"],
    ["api", "postgres", "inspect", "replica"],
    ["protocol"],
    ["engine"],
    ["wal"],
    ["storage"],
    ["error"],
    ["model"],
    ["metrics"],
]
FLOOR = {module: level for level, modules in enumerate(FLOORS) for module in modules}

# The engine's own floors, top to bottom: its folders and the files at its root. Keep in step
# with the list in src/engine/mod.rs. The engine's mod.rs (its door) and tests name any.
ENGINE_FLOORS = [
    ["upkeep", "sweeper", "backup", "shipping", "rebuild"],
    ["reads"],
    ["requests"],
    ["writer"],
    ["recovery"],
    ["tables"],
    ["counters", "poison", "watchers"],
]
ENGINE_FLOOR = {module: level for level, modules in enumerate(ENGINE_FLOORS) for module in modules}
ENGINE_PATH = re.compile(r"\bcrate::engine::([a-z_]+)")

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
PATH = re.compile(r"\bcrate::([a-z_]+)")
GROUP = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


def module_of(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC).parts
    return parts[0].removesuffix(".rs") if len(parts) > 1 or parts[0] != "lib.rs" else "lib"


def code_of(text: str) -> str:
    """The text without comments (line comments, doc comments)."""
    return "\n".join(re.sub(r"//.*", "", line) for line in text.splitlines())


def targets(code: str) -> set[str]:
    found = set(PATH.findall(code))
    for group in GROUP.findall(code):
        found.update(re.findall(r"(?:^|,)\s*([a-z_]+)", group))
    return found


def main() -> int:
    seen: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.rs")):
        source = module_of(path)
        if source in ("lib", "bin"):  # the crate root; binaries are crates of their own
            continue
        if source not in FLOOR:
            print(f"{path}: module `{source}` has no floor: add it to FLOORS and to src/lib.rs")
            return 1
        for target in targets(code_of(path.read_text())):
            if target == source or target not in FLOOR:
                continue  # itself, or an item re-exported at the root (crate::Store)
            if FLOOR[target] <= FLOOR[source]:
                seen.setdefault((source, target), []).append(str(path.relative_to(SRC.parent)))
    seen.update(engine_floors())
    for (source, target), files in sorted(seen.items()):
        print(f"{source} -> {target} points up or sideways on the floor map: {', '.join(sorted(set(files)))}")
    if not seen:
        print(f"floors: {sum(1 for _ in SRC.rglob('*.rs'))} files, every import points down")
    return 1 if seen else 0


def engine_floors() -> dict[tuple[str, str], list[str]]:
    """The same check inside the engine, over `crate::engine::…` paths."""
    seen: dict[tuple[str, str], list[str]] = {}
    engine = SRC / "engine"
    for path in sorted(engine.rglob("*.rs")):
        source = path.relative_to(engine).parts[0].removesuffix(".rs")
        if source in ("mod", "tests"):
            continue
        if source not in ENGINE_FLOOR:
            seen[(f"engine::{source}", "(no floor)")] = [str(path.relative_to(SRC.parent))]
            continue
        for target in set(ENGINE_PATH.findall(code_of(path.read_text()))):
            if target == source or target not in ENGINE_FLOOR:
                continue  # itself, or an item of the engine's door (crate::engine::Engine)
            if ENGINE_FLOOR[target] <= ENGINE_FLOOR[source]:
                key = (f"engine::{source}", f"engine::{target}")
                seen.setdefault(key, []).append(str(path.relative_to(SRC.parent)))
    return seen


if __name__ == "__main__":
    sys.exit(main())
