#!/usr/bin/env python3
"""Fails when a path in src/ points up (or sideways) on the floor map.

The floors are read from the maps themselves: "Layout" in src/lib.rs for the crate's
top-level modules, and the numbered list in src/engine/mod.rs for the engine's inside. Code on
a floor may name only modules on floors below it (and itself). Every path is resolved before it
is judged: `use` trees with nested groups and renames, `super::` (any number of them), `self::`,
a child module named without a prefix, paths written inline in code, and names the crate root
re-exports (`crate::Store` is `api`'s). Comments are skipped: a doc link may point anywhere.

Not judged: the crate root and binaries, unit tests (modules named `tests`), the engine's door
(src/engine/mod.rs),
and items of the engine's door named from inside it (`Engine`, `Shared`: what the door defines
rather than a floor; narrowing the door is its own work).

`python3 .ci/floors_test.py` feeds this checker the ways a path used to get past it.
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def code_of(text: str) -> str:
    """The text without comments and without the contents of string literals."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return "\n".join(re.sub(r"//.*", "", line) for line in text.splitlines())


def exists(folder: pathlib.Path, name: str) -> bool:
    return (folder / f"{name}.rs").exists() or (folder / name).is_dir()


def floors_of(doc: str, folder: pathlib.Path) -> list[list[str]]:
    """The numbered list of a map (`//! 1. ...`; its `- ...` sub-items are on the same floor).
    An item's modules are the backticked names before its first colon, outside parentheses,
    that are modules of `folder`: "1. `testing` (feature `testing`): the harness" is `testing`,
    "7. `counters`, `poison` (...) and `watchers` (...)" is three."""
    items: list[tuple[str, str]] = []  # (kind, text): "item" starts a floor, "sub" joins it
    for line in doc.splitlines():
        m = re.match(r"//!\s*\d+\.\s(.*)", line)
        sub = re.match(r"//!\s+-\s(.*)", line)
        if m:
            items.append(("item", m.group(1)))
        elif sub and items:
            items.append(("sub", sub.group(1)))
        elif items and re.match(r"//!\s{3,}\S", line):
            kind, text = items[-1]
            items[-1] = (kind, text + " " + line[3:].strip())
        elif items and not line.startswith("//!"):
            break
        elif items and line.strip() == "//!":
            break
    floors: list[list[str]] = []
    for kind, text in items:
        if kind == "item":
            floors.append([])
        depth = 0
        outside = []
        for ch in text:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth = max(depth - 1, 0)
            elif depth == 0:
                if ch == ":":
                    break
                outside.append(ch)
        for name in re.findall(r"`([a-z_]+)`", "".join(outside)):
            if exists(folder, name) and name not in floors[-1]:
                floors[-1].append(name)
    return [f for f in floors if f]


def module_path(src: pathlib.Path, path: pathlib.Path) -> list[str]:
    """The module a file is: src/engine/writer/mod.rs is ["engine", "writer"]."""
    parts = list(path.relative_to(src).parts)
    last = parts.pop().removesuffix(".rs")
    if last not in ("mod", "lib", "main"):
        parts.append(last)
    return parts


def use_trees(code: str) -> list[str]:
    """The text of every `use` declaration's tree."""
    return [m.group(1) for m in re.finditer(r"\buse\s+([^;]*);", code)]


def expand(tree: str) -> list[list[str]]:
    """Every path a `use` tree names: `a::{b::{c, d as e}, f}` is a::b::c, a::b::d, a::f."""
    tree = re.sub(r"\s+as\s+", "@", tree)
    tree = re.sub(r"\s+", "", tree)

    def parse(s: str, i: int, prefix: list[str]) -> tuple[list[list[str]], int]:
        paths: list[list[str]] = []
        segs = list(prefix)
        while i < len(s):
            if s[i] == "{":
                i += 1
                while s[i] != "}":
                    inner, i = parse(s, i, segs)
                    paths.extend(inner)
                    if s[i] == ",":
                        i += 1
                return paths, i + 1
            m = re.match(r"(::)?([A-Za-z_][A-Za-z0-9_]*|\*)(@[A-Za-z_][A-Za-z0-9_]*)?", s[i:])
            if not m:
                break
            name = m.group(2)
            i += m.end()
            if name != "self":
                segs.append(name)
            if i < len(s) and s[i : i + 2] == "::":
                i += 2
                continue
            break
        if len(segs) > len(prefix) or not paths:
            paths.append(segs)
        return paths, i

    out: list[list[str]] = []
    i = 0
    while i < len(tree):
        got, i = parse(tree, i, [])
        out.extend(got)
        if i < len(tree) and tree[i] == ",":
            i += 1
        else:
            break
    return out


def inline_paths(code: str) -> list[list[str]]:
    """Paths written in code outside `use` declarations: `crate::a::b(..)`, `super::x`."""
    rest = re.sub(r"\buse\s+[^;]*;", "", code)
    return [
        m.group(0).split("::")
        for m in re.finditer(r"\b(?:crate|super|self)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))+", rest)
    ]


def resolve(src: pathlib.Path, here: list[str], path: list[str]) -> list[str] | None:
    """`path` as named in module `here`, from the crate root; None if it leaves the crate."""
    if not path:
        return None
    if path[0] == "crate":
        return path[1:]
    if path[0] in ("super", "self"):
        at = list(here)
        i = 0
        while i < len(path) and path[i] in ("super", "self"):
            if path[i] == "super":
                if not at:
                    return None
                at.pop()
            i += 1
        return at + path[i:]
    folder = src.joinpath(*here)
    if here and exists(folder, path[0]):  # a child module named without `self::`
        return here + path
    return None  # another crate, or a name in scope


def root_exports(src: pathlib.Path) -> dict[str, list[str]]:
    """What the crate root re-exports: `pub use api::Store` makes `crate::Store` api's."""
    code = code_of((src / "lib.rs").read_text())
    found: dict[str, list[str]] = {}
    for tree in use_trees(code):
        for path in expand(tree):
            path = path[1:] if path and path[0] == "crate" else path
            if len(path) >= 2 and exists(src, path[0]):
                found.setdefault(path[-1], path[:-1])
    return found


def check(src: pathlib.Path) -> dict[tuple[str, str], set[str]]:
    """Every arrow that points up or sideways, by (from, to), with the files that draw it."""
    crate_floors = floors_of((src / "lib.rs").read_text(), src)
    floor = {m: level for level, mods in enumerate(crate_floors) for m in mods}
    engine_dir = src / "engine"
    engine_floor: dict[str, int] = {}
    if (engine_dir / "mod.rs").exists():
        engine_floors = floors_of((engine_dir / "mod.rs").read_text(), engine_dir)
        engine_floor = {m: level for level, mods in enumerate(engine_floors) for m in mods}
    exports = root_exports(src)
    seen: dict[tuple[str, str], set[str]] = {}

    def arrow(source: str, target: str, path: pathlib.Path) -> None:
        seen.setdefault((source, target), set()).add(str(path.relative_to(src.parent)))

    for path in sorted(src.rglob("*.rs")):
        here = module_path(src, path)
        if not here or here[0] in ("bin", "main"):
            continue  # the crate root; binaries are crates of their own
        if here[0] not in floor:
            arrow(here[0], "(no floor: add it to the Layout in src/lib.rs)", path)
            continue
        if "tests" in here:
            continue  # unit tests drive their module through anything above it
        code = code_of(path.read_text())
        named = [p for tree in use_trees(code) for p in expand(tree)] + inline_paths(code)
        for raw in named:
            target = resolve(src, here, raw)
            if not target:
                continue
            if target[0] not in floor and target[0] in exports:
                target = exports[target[0]] + target[1:]
            if target[0] not in floor:
                continue
            if target[0] != here[0]:
                if floor[target[0]] <= floor[here[0]]:
                    arrow(here[0], target[0], path)
                continue
            if here[0] != "engine" or len(here) < 2:
                continue  # the engine's door names any of its floors
            inner = here[1]
            if inner not in engine_floor:
                arrow(f"engine::{inner}", "(no floor: add it to src/engine/mod.rs)", path)
                continue
            if len(target) < 2 or target[1] not in engine_floor or target[1] == inner:
                continue  # the door's own items, or itself
            if engine_floor[target[1]] <= engine_floor[inner]:
                arrow(f"engine::{inner}", f"engine::{target[1]}", path)
    return seen


def main() -> int:
    seen = check(SRC)
    for (source, target), files in sorted(seen.items()):
        print(f"{source} -> {target} points up or sideways on the floor map: {', '.join(sorted(files))}")
    if not seen:
        print(f"floors: {sum(1 for _ in SRC.rglob('*.rs'))} files, every import points down")
    return 1 if seen else 0


if __name__ == "__main__":
    sys.exit(main())
